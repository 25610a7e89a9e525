"""The pod task against the loopback Kubernetes API, through the real KubernetesPodOperator.

Each pod failure mode, the re-attach after a killed worker (sync, and deferrable with the
provider's own trigger run here), the one-pod-per-job rule, the run's deadline and staging on S3
and GCS through presigned URLs are tried one at a time. The whole DAG runs in
``tests/dags/test_nightly_eval_vllm.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from tests.support.kube_api import KubeApi, PodFault, run_kube_api

pytest.importorskip("airflow.providers.cncf.kubernetes")

from airflow_batch_provider.adapters.vllm import VllmKubernetesAdapter
from airflow_batch_provider.operators.vllm_pod import JOB_LABEL, VllmBatchPodOperator
from airflow_batch_provider.services.vllm_pod_outcome import gpu_cost_nusd

ROOT = Path(__file__).resolve().parents[3]
FAKE_VLLM_BIN = ROOT / "tests" / "support" / "fake_vllm" / "bin"
PROMPT = PromptTemplate(
    version="v1", model="Qwen/Qwen3-0.6B", user="{{ text }}", system="Give the sentiment."
)
RUN = "manual__2026-11-30T00:00:00+00:00"
KEY = "abp-0123456789abcdef0123456789abcdef"
JOB_ID = f"w:{RUN}:r1:c00000"
LINES = 5


class _TI(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        """KPO pushes the pod name; nothing reads it here."""


def context(try_number: int = 1) -> dict[str, Any]:
    ti = _TI(dag_id="d", task_id="run", map_index=0, try_number=try_number)
    return {"ti": ti, "run_id": RUN, "dag": SimpleNamespace(dag_id="d"), "task_state_store": None}


#: Environment no pod may inherit: object-store and cloud credentials stay on the worker.
CREDENTIAL_ENV = ("AWS_", "GOOGLE_", "GCE_", "CLOUDSDK_")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(CREDENTIAL_ENV)},
        "PATH": f"{FAKE_VLLM_BIN}{os.pathsep}{os.environ['PATH']}",
        "FAKE_VLLM_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "FAKE_VLLM_REQUIRE_ENV": "HF_TOKEN",
    }
    with run_kube_api(tmp_path / "kube", env) as server:
        server.add_secret("hf-token", {"token": "hf_secret_value"})
        yield server


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api: KubeApi) -> Ledger:
    return seed(monkeypatch, tmp_path, api, f"file://{tmp_path / 'staging'}", None)


def seed(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    api: KubeApi,
    staging_root: str,
    staging_conn_id: str | None,
    **extra_settings: Any,
) -> Ledger:
    """A ledger with one staged job of ``LINES`` items, its chunk written under ``staging_root``."""
    from airflow_batch_provider.staging import Staging

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    exchange = tmp_path / "exchange"
    exchange.mkdir(exist_ok=True)
    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps(api.kubeconfig()))
    extra = {
        "namespace": "llm",
        "image": "vllm/vllm-openai:v0.33.0",
        "gpu_count": 2,
        "gpu_type": "H100",
        "usd_per_gpu_hour": 3.6,
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "hub_token_secret": "hf-token",
        "model_cache_pvc": "hf-cache",
        "exchange_path": str(exchange),
        "kube_config_path": str(kubeconfig),
        "schedule_timeout_s": 2,
        "startup_timeout_s": 2,
        **extra_settings,
    }
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", url)
    monkeypatch.setenv("AIRFLOW_CONN_VLLM_TEST", json.dumps({"conn_type": "vllm_kubernetes", "extra": extra}))
    ledger = Ledger.from_url(url)
    items = [
        PreparedItem(item_key(f"i{n}"), PROMPT.render({"id": f"i{n}", "text": f"I love item {n}"}))
        for n in range(LINES)
    ]
    ledger.upsert_items("w", RUN, items)
    adapter = VllmKubernetesAdapter.__new__(VllmKubernetesAdapter)
    chunk = b"".join(adapter.format_line(it.request, f"{it.key}__a1c0") + b"\n" for it in items)
    staging = Staging(staging_root, staging_conn_id)
    chunk_path = staging.job_file("w", RUN, 1, 0, "chunk")
    with staging.writer(chunk_path) as fh:
        fh.write(chunk)
    ledger.record_job(
        {
            "job_id": JOB_ID,
            "workload": "w",
            "run_id": RUN,
            "round": 1,
            "chunk_index": 0,
            "provider": "vllm",
            "model": PROMPT.model,
            "kind": "chat",
            "idempotency_key": KEY,
            "staged_path": str(chunk_path),
            "input_sha256": hashlib.sha256(chunk).hexdigest(),
            "lines": LINES,
            "size_bytes": len(chunk),
        },
        [(it.key, "v1", f"{it.key}__a1c0", 1) for it in items],
    )
    return ledger


def operator(
    tmp_path: Path,
    *,
    staging_root: str | None = None,
    staging_conn_id: str | None = None,
    deferrable: bool = False,
    deadline: datetime | None = None,
) -> VllmBatchPodOperator:
    return VllmBatchPodOperator(
        task_id="run",
        job={"job_id": JOB_ID},
        workload="w",
        batch_conn_id="vllm_test",
        staging_root=staging_root or f"file://{tmp_path / 'staging'}",
        staging_conn_id=staging_conn_id,
        deferrable=deferrable,
        deadline=deadline,
        startup_check_interval_seconds=1,
        poll_interval=1,
    )


def output_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "exchange" / f"{KEY}.output.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_job_runs_in_one_gpu_pod_that_is_deleted_and_its_gpu_time_is_recorded(
    tmp_path: Path, api: KubeApi, ledger: Ledger, capfd: pytest.CaptureFixture[str]
) -> None:
    result = operator(tmp_path).execute(context())  # type: ignore[arg-type]
    assert (
        f"[base] Running batch: 100% Completed | {LINES}/{LINES}" in capfd.readouterr().out
    )  # the pod's log
    assert result["state"] == "completed", result
    assert len(output_lines(tmp_path)) == LINES
    [pod] = api.created_for(JOB_LABEL, KEY)
    assert api.live_pods() == []
    spec = pod["spec"]
    base = spec["containers"][0]
    assert base["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert base["command"][:2] == ["vllm", "run-batch"]
    assert base["command"][base["command"].index("--tensor-parallel-size") + 1] == "2"
    assert "hf_secret_value" not in json.dumps(pod)
    [token] = [e for e in base["env"] if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in spec["volumes"])
    [cache] = [v for v in spec["volumes"] if v["name"] == "model-cache"]
    assert cache["persistentVolumeClaim"]["claimName"] == "hf-cache"
    assert {"name": "model-cache", "mountPath": "/root/.cache/huggingface"}.items() <= next(
        m for m in base["volumeMounts"] if m["name"] == "model-cache"
    ).items()
    job = ledger.get_job(JOB_ID)
    assert (job.state, job.batch_state, job.batch_id) == ("submitted", "completed", f"pod:{KEY}")
    [cost] = ledger.infra_costs("w", RUN)
    assert cost["gpu_count"] == 2 and cost["outcome"] == "completed"
    assert cost["cost_nusd"] == gpu_cost_nusd(cost["gpu_seconds"], 2, 3.6)
    assert result["gpu_seconds"] == cost["gpu_seconds"] * 2


def templated_operator(tmp_path: Path) -> VllmBatchPodOperator:
    return VllmBatchPodOperator(
        task_id="run",
        job={"job_id": JOB_ID},
        workload="w",
        batch_conn_id="{{ params.conn }}",
        staging_root=f"file://{tmp_path / 'staging'}",
        deferrable=False,
        startup_check_interval_seconds=1,
        poll_interval=1,
    )


def test_a_templated_connection_is_rendered_when_the_task_runs_and_the_pod_runs_with_it(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    op = templated_operator(tmp_path)
    ctx = {**context(), "params": {"conn": "vllm_test"}}
    op.render_template_fields(ctx)  # type: ignore[arg-type]
    assert op.batch_conn_id == "vllm_test"
    result = op.execute(ctx)  # type: ignore[arg-type]
    assert result["state"] == "completed", result
    assert op.vllm_hook.batch_conn_id == "vllm_test"
    [pod] = api.created_for(JOB_LABEL, KEY)
    assert pod["metadata"]["namespace"] == "llm"  # the rendered connection's settings


def test_a_templated_connection_of_a_batch_api_is_refused_before_any_pod_or_ledger_change(
    tmp_path: Path, api: KubeApi, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.exceptions import ConfigurationError

    monkeypatch.setenv("AIRFLOW_CONN_OAI", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    op = templated_operator(tmp_path)
    ctx = {**context(), "params": {"conn": "oai"}}
    op.render_template_fields(ctx)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"'oai' is of type 'openai_batch'.*built the pod lane"):
        op.execute(ctx)  # type: ignore[arg-type]
    assert api.created == [] and not list((tmp_path / "exchange").iterdir())
    job = ledger.get_job(JOB_ID)
    assert (job.batch_id, job.batch_state) == (None, None)


def test_a_cleared_task_of_a_finished_job_starts_no_second_pod(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    first = operator(tmp_path).execute(context())  # type: ignore[arg-type]
    again = operator(tmp_path).execute(context(try_number=2))  # type: ignore[arg-type]
    assert again["state"] == first["state"] == "completed"
    assert len(api.created_for(JOB_LABEL, KEY)) == 1


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (PodFault("env", env={"FAKE_VLLM_CRASH_AFTER": "2"}), "exit_1"),
        (PodFault("oom_killed", after_lines=2, env={"FAKE_VLLM_DELAY_S": "0.3"}), "oom_killed"),
        (PodFault("evicted", after_lines=2, env={"FAKE_VLLM_DELAY_S": "0.3"}), "evicted"),
        (PodFault("image_pull_backoff"), "image_pull_failed"),
        (PodFault("pending"), "unschedulable_timeout"),
    ],
    ids=["crash", "oom", "evicted", "image-pull", "pending"],
)
def test_a_failed_pod_fails_its_job_with_a_reason_keeps_its_lines_and_is_deleted(
    tmp_path: Path, api: KubeApi, ledger: Ledger, fault: PodFault, reason: str
) -> None:
    api.add_fault(fault)
    result = operator(tmp_path).execute(context())  # type: ignore[arg-type]
    assert (result["state"], result["reason"].split(":")[0]) == ("failed", reason), result
    assert api.live_pods() == []
    lines = output_lines(tmp_path)
    if fault.kind in ("env", "oom_killed", "evicted"):
        assert 2 <= len(lines) < LINES  # the finished prefix stays for reconcile
    job = ledger.get_job(JOB_ID)
    assert job.batch_state == "failed" and job.error.startswith(reason)
    [cost] = ledger.infra_costs("w", RUN)
    assert cost["outcome"] == "failed" and cost["reason"] == reason
    # reconcile: the lines written count, every other item is retryable (the next round takes it)
    expected = {"succeeded": len(lines), "failed_retryable": LINES - len(lines)}
    assert reconcile(tmp_path) == {k: n for k, n in expected.items() if n}


def reconcile(tmp_path: Path) -> dict[str, int]:
    """Run the shared download and reconcile of the job; return its items by state."""
    from decimal import Decimal

    from airflow_batch_provider.hooks.ledger import LedgerHook
    from airflow_batch_provider.hooks.vllm_kubernetes import VllmKubernetesHook
    from airflow_batch_provider.services.harvest import reconcile_job
    from airflow_batch_provider.staging import Staging

    ledger = LedgerHook(None).get_conn()
    adapter = VllmKubernetesHook("vllm_test").get_adapter()
    staging = Staging(f"file://{tmp_path / 'staging'}")
    reconcile_job(ledger, adapter, staging, JOB_ID, PROMPT, lambda usage: Decimal(0))
    return {k: v for k, v in ledger.count_states("w", RUN).items() if v}


_CHILD = """
import sys
from tests.unit.operators.test_vllm_pod import context, operator
from pathlib import Path
operator(Path(sys.argv[1])).execute(context())
"""


def _start_worker(tmp_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_for(check: Any, what: str) -> None:
    # a bound, not a timing: a loaded machine starts the stand-in pod's process slowly (seen past 60 s)
    for _ in range(6000):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_a_killed_worker_s_retry_reattaches_to_the_running_pod_of_its_job(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    api.add_fault(PodFault("env", env={"FAKE_VLLM_DELAY_S": "0.4"}))
    worker = _start_worker(tmp_path)
    _wait_for(lambda: len(output_lines(tmp_path)) >= 1, "the pod to write its first line")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert len(api.live_pods()) == 1  # SIGKILL runs no on_kill: the pod keeps running
    result = operator(tmp_path).execute(context(try_number=2))  # type: ignore[arg-type]
    assert result["state"] == "completed"
    assert len(api.created_for(JOB_LABEL, KEY)) == 1
    assert len(output_lines(tmp_path)) == LINES
    assert api.live_pods() == []


def test_a_pod_that_finished_while_no_worker_watched_is_read_and_deleted_not_run_again(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    api.add_fault(PodFault("env", env={"FAKE_VLLM_DELAY_S": "0.2"}))
    worker = _start_worker(tmp_path)
    _wait_for(lambda: len(output_lines(tmp_path)) >= 1, "the pod to write its first line")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    _wait_for(lambda: len(output_lines(tmp_path)) == LINES and api.list("llm", "")["items"][0]["status"]["phase"]
              == "Succeeded", "the pod to finish")  # fmt: skip
    result = operator(tmp_path).execute(context(try_number=2))  # type: ignore[arg-type]
    assert result["state"] == "completed"
    assert len(api.created_for(JOB_LABEL, KEY)) == 1
    assert api.live_pods() == []


def test_killing_the_task_deletes_its_pod_and_the_job_keeps_the_lines_already_written(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    import threading

    api.add_fault(PodFault("env", env={"FAKE_VLLM_DELAY_S": "0.4"}))
    op = operator(tmp_path)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            op.execute(context())  # type: ignore[arg-type]
        except Exception as exc:  # the killed task's own run ends in an error: the pod is gone
            errors.append(exc)

    runner = threading.Thread(target=work)
    runner.start()
    _wait_for(lambda: len(output_lines(tmp_path)) >= 1, "the pod to write its first line")
    op.on_kill()
    runner.join(timeout=120)
    assert api.live_pods() == []
    written = len(output_lines(tmp_path))
    assert 1 <= written < LINES
    job = ledger.get_job(JOB_ID)
    assert job.batch_state == "failed" and job.error.startswith("killed")
    cleared = operator(tmp_path).execute(context(try_number=2))  # type: ignore[arg-type]
    assert (cleared["state"], len(api.created_for(JOB_LABEL, KEY))) == ("failed", 1)
    assert len(output_lines(tmp_path)) == written  # no second pod truncated and rewrote it


def test_a_pod_deleted_while_no_worker_watched_leaves_its_lines_and_no_second_pod_starts(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    api.add_fault(PodFault("env", env={"FAKE_VLLM_DELAY_S": "0.4"}))
    worker = _start_worker(tmp_path)
    _wait_for(lambda: len(output_lines(tmp_path)) >= 1, "the pod to write its first line")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    [name] = api.live_pods()
    live = api.find("llm", name)
    assert live is not None
    api.delete(live)  # e.g. the triggerer's cleanup after a kill in deferrable mode
    written = len(output_lines(tmp_path))
    result = operator(tmp_path).execute(context(try_number=2))  # type: ignore[arg-type]
    assert (result["state"], result["reason"].split(":")[0]) == ("failed", "pod_lost")
    assert len(api.created_for(JOB_LABEL, KEY)) == 1
    assert len(output_lines(tmp_path)) == written


# -- the run's deadline ---------------------------------------------------------------------------


def test_a_pod_still_running_at_the_deadline_is_stopped_and_deleted_and_keeps_the_lines_it_finished(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    # two lines at once, then a line every ten minutes; the stand-in kubelet, not the clock, says
    # when the deadline comes: once the pod wrote its two lines (and was active 2 s), it stops the
    # pod as its activeDeadlineSeconds would. The deadline itself is a bound far enough away that a
    # loaded machine reaches the pod before it (seen: 12 s passed before the pod was created).
    api.add_fault(
        PodFault(
            "deadline_exceeded",
            env={"FAKE_VLLM_SLOW_AFTER": "2", "FAKE_VLLM_DELAY_S": "600"},
            after_lines=2,
            after_s=2.0,
        )
    )
    deadline = datetime.now(UTC) + timedelta(seconds=600)
    result = operator(tmp_path, deadline=deadline).execute(context())  # type: ignore[arg-type]
    assert (result["state"], result["reason"].split(":")[0]) == ("failed", "deadline"), result
    [pod] = api.created_for(JOB_LABEL, KEY)
    assert 1 <= pod["spec"]["activeDeadlineSeconds"] <= 600  # Kubernetes stops it even with no worker
    assert api.live_pods() == []
    assert len(output_lines(tmp_path)) == 2  # the finished lines stay for reconcile
    job = ledger.get_job(JOB_ID)
    assert job.batch_state == "failed" and job.error.startswith("deadline")
    [cost] = ledger.infra_costs("w", RUN)
    assert cost["reason"] == "deadline" and cost["gpu_seconds"] >= 1


def test_a_job_reached_after_the_deadline_starts_no_pod_and_leaves_its_items_to_the_policy(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    deadline = datetime.now(UTC) - timedelta(seconds=1)
    result = operator(tmp_path, deadline=deadline).execute(context())  # type: ignore[arg-type]
    assert (result["state"], result["reason"].split(":")[0]) == ("failed", "deadline")
    assert api.created == []
    job = ledger.get_job(JOB_ID)
    assert job.batch_state == "failed" and job.error.startswith("deadline")


# -- deferrable: the provider's trigger, run here as the triggerer would ---------------------------


def fire(trigger: Any) -> dict[str, Any]:
    """Run a trigger until its first event, as the triggerer does; return the event's payload."""
    import asyncio

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(first())


def test_a_deferred_task_killed_after_its_pod_started_reattaches_to_that_pod_on_its_next_try(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    api.add_fault(PodFault("env", env={"FAKE_VLLM_DELAY_S": "0.3"}))
    with pytest.raises(TaskDeferred):
        operator(tmp_path, deferrable=True).execute(context())  # type: ignore[arg-type]
    assert len(api.live_pods()) == 1  # the pod runs; its task (and trigger) die with no on_kill
    again = operator(tmp_path, deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        again.execute(context(try_number=2))  # type: ignore[arg-type]
    assert len(api.created_for(JOB_LABEL, KEY)) == 1  # found by its job label, not created again
    event = fire(deferred.value.trigger)
    assert event["status"] == "success", event
    result = again.trigger_reentry(context(try_number=2), event)  # type: ignore[arg-type]
    assert result["state"] == "completed"
    assert len(output_lines(tmp_path)) == LINES
    assert len(api.created_for(JOB_LABEL, KEY)) == 1 and api.live_pods() == []
    assert ledger.get_job(JOB_ID).batch_state == "completed"


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_a_pull_the_registry_throttles_for_a_while_is_waited_out_and_the_job_completes_with_one_pod(
    tmp_path: Path, api: KubeApi, monkeypatch: pytest.MonkeyPatch, deferrable: bool
) -> None:
    """``ErrImagePull`` with a rate-limit message is transient (the kubelet pulls again): within the
    connection's ``startup_timeout_s`` it is waited out; only a missing image fails the job at once
    (``image_pull_failed`` above). The GPU node's one pod runs on."""
    from airflow.sdk.exceptions import TaskDeferred

    ledger = seed(monkeypatch, tmp_path, api, f"file://{tmp_path / 'staging'}", None, startup_timeout_s=60)
    api.add_fault(PodFault("image_pull_throttled", pull_retry_s=3.0))
    op = operator(tmp_path, deferrable=deferrable)
    if deferrable:
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(context())  # type: ignore[arg-type]
        result = op.trigger_reentry(context(), fire(deferred.value.trigger))  # type: ignore[arg-type]
    else:
        result = op.execute(context())  # type: ignore[arg-type]
    assert result["state"] == "completed", result
    assert len(output_lines(tmp_path)) == LINES
    assert len(api.created_for(JOB_LABEL, KEY)) == 1 and api.live_pods() == []
    assert ledger.get_job(JOB_ID).batch_state == "completed"


# -- s3:// and gs:// staging: presigned URLs, no credentials in the pod ---------------------------

AWS_SECRET = "abp-s3-secret-never-in-a-pod"
EXPIRY = 7200


@pytest.fixture
def s3_staging(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> tuple[str, str]:
    import boto3

    bucket = "abp-pods-" + os.urandom(4).hex()
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    conn = {
        "conn_type": "aws",
        "login": "AKIAABPTEST",
        "password": AWS_SECRET,
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_ABP_S3", json.dumps(conn))
    return f"s3://{bucket}/stage", "abp_s3"


@pytest.fixture
def gcs_staging(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, dict[str, str]]]:
    from batch_emulator.config import EmulatorConfig
    from batch_emulator.testing import run_emulator
    from tests.support.gcs import service_account_key, start_gcs

    with start_gcs() as gcs, run_emulator(EmulatorConfig()) as tokens:
        gcs.create_bucket("abp-pods")
        key = service_account_key(
            f"{tokens}/token"
        )  # a throwaway RSA key; the worker's tokens from the emulator
        conn = {
            "conn_type": "google_cloud_platform",
            "extra": {"keyfile_dict": json.dumps(key), "gcs.endpoint": gcs.endpoint_url},
        }
        monkeypatch.setenv("AIRFLOW_CONN_ABP_GCS", json.dumps(conn))
        yield "gs://abp-pods/stage", "abp_gcs", key


def _pod_text(api: KubeApi) -> str:
    """Everything the API server received about pods, and everything the pods printed."""
    logs = [text for pod in api.pods.values() for _, text in pod.log]
    return json.dumps(api.created) + "\n".join(logs)


def _urls(pod: dict[str, Any]) -> tuple[str, str]:
    command = pod["spec"]["containers"][0]["command"]
    return command[command.index("-i") + 1], command[command.index("-o") + 1]


def _verify_gcs_v4(url: str, method: str, key: dict[str, str]) -> None:
    """Check a GCS V4 signed URL against the service account's public key (the GCS server does not)."""
    import hashlib
    from urllib.parse import parse_qsl, quote, urlsplit

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    signature = bytes.fromhex(query.pop("X-Goog-Signature"))
    canonical_query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(query.items()))
    canonical = "\n".join(
        [method, parts.path, canonical_query, f"host:{parts.netloc}\n", "host", "UNSIGNED-PAYLOAD"]
    )
    scope = query["X-Goog-Credential"].split("/", 1)[1]
    to_sign = "\n".join(
        ["GOOG4-RSA-SHA256", query["X-Goog-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    private = serialization.load_pem_private_key(key["private_key"].encode(), password=None)
    private.public_key().verify(signature, to_sign.encode(), padding.PKCS1v15(), hashes.SHA256())  # type: ignore[union-attr, call-arg, arg-type]


def test_with_s3_staging_the_pod_reads_and_writes_through_presigned_urls_and_holds_no_credential(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    api: KubeApi,
    s3_staging: tuple[str, str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow_batch_provider.adapters.vllm import VllmKubernetesAdapter as Adapter
    from airflow_batch_provider.services.harvest import download_job
    from airflow_batch_provider.staging import Staging

    root, conn_id = s3_staging
    ledger = seed(monkeypatch, tmp_path, api, root, conn_id, presign_expiry_s=EXPIRY)
    op = operator(tmp_path, staging_root=root, staging_conn_id=conn_id)
    result = op.execute(context())  # type: ignore[arg-type]
    assert result["state"] == "completed", result
    [pod] = api.created_for(JOB_LABEL, KEY)
    source, target = _urls(pod)
    assert source.startswith("http://127.0.0.1") and "chunk-00000.jsonl?" in source
    assert target.startswith("http://127.0.0.1") and "output-00000.jsonl?" in target
    for url in (source, target):
        assert f"X-Amz-Expires={EXPIRY}" in url and "X-Amz-Security-Token" not in url
    assert not any(v.get("hostPath") for v in pod["spec"]["volumes"])  # nothing shared but the URLs
    assert not [e for e in pod["spec"]["containers"][0]["env"] if e["name"].startswith(CREDENTIAL_ENV)]
    logged = capfd.readouterr()
    assert "[base] INFO Uploading outputs" in logged.out  # the pod's log reached the task's
    assert AWS_SECRET not in _pod_text(api) and AWS_SECRET not in logged.out + logged.err
    from airflow.sdk._shared.secrets_masker import redact

    # vLLM logs its arguments: the task's log masks both URLs (the masker knows them)
    assert f"input_file='{source}'" in "\n".join(t for p in api.pods.values() for _, t in p.log)
    assert source not in str(redact(f"-i {source} -o {target}")) and target not in str(redact(target))
    # the pod PUT its output where download would write it; download finds it complete and keeps it
    staging = Staging(root, conn_id)
    output = staging.job_file("w", RUN, 1, 0, "output")
    assert len(output.read_text().splitlines()) == LINES
    adapter = Adapter.__new__(Adapter)  # never asked: the files are already in staging
    got = download_job(ledger, adapter, staging, JOB_ID)
    assert got.complete and not got.fetched and got.paths["output_path"] == str(output)


def test_with_gcs_staging_the_pod_gets_v4_urls_signed_by_the_connection_s_key_and_not_the_key(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    api: KubeApi,
    gcs_staging: tuple[str, str, dict[str, str]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow_batch_provider.staging import Staging

    root, conn_id, key = gcs_staging
    ledger = seed(monkeypatch, tmp_path, api, root, conn_id, presign_expiry_s=EXPIRY)
    result = operator(tmp_path, staging_root=root, staging_conn_id=conn_id).execute(context())  # type: ignore[arg-type]
    assert result["state"] == "completed", result
    [pod] = api.created_for(JOB_LABEL, KEY)
    source, target = _urls(pod)
    _verify_gcs_v4(source, "GET", key)
    _verify_gcs_v4(target, "PUT", key)
    from cryptography.exceptions import InvalidSignature

    with pytest.raises(InvalidSignature):
        _verify_gcs_v4(target, "GET", key)  # a write URL is not a read URL
    assert f"X-Goog-Expires={EXPIRY}" in source and "batch%40abp-project" in source
    pem_body = key["private_key"].splitlines()[1]
    logged = capfd.readouterr()
    assert pem_body not in _pod_text(api) and pem_body not in logged.out + logged.err
    output = Staging(root, conn_id).job_file("w", RUN, 1, 0, "output")
    assert len(output.read_text().splitlines()) == LINES
    assert ledger.get_job(JOB_ID).state == "downloaded"


def test_with_url_staging_a_pod_that_crashes_uploads_nothing_and_every_item_goes_to_the_next_round(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api: KubeApi, s3_staging: tuple[str, str]
) -> None:
    from airflow_batch_provider.staging import Staging

    root, conn_id = s3_staging
    ledger = seed(monkeypatch, tmp_path, api, root, conn_id)
    api.add_fault(PodFault("env", env={"FAKE_VLLM_CRASH_AFTER": "2"}))
    result = operator(tmp_path, staging_root=root, staging_conn_id=conn_id).execute(context())  # type: ignore[arg-type]
    assert (result["state"], result["reason"].split(":")[0]) == ("failed", "exit_1")
    output = Staging(root, conn_id).job_file("w", RUN, 1, 0, "output")
    assert output.read_bytes() == b""  # vLLM uploads an output URL only when the whole file is done
    job = ledger.get_job(JOB_ID)
    assert (job.state, job.output_path) == ("downloaded", str(output))
