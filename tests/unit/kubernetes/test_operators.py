"""The pod task against the loopback Kubernetes API, through the real KubernetesPodOperator (sync).

The deferrable path runs in ``tests/dags/test_nightly_eval_vllm.py``. Here each pod failure mode,
the re-attach after a killed worker and the one-pod-per-job rule are tried one at a time.
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
from airflow_batch_provider.kubernetes.operators import (
    JOB_LABEL,
    VllmBatchPodOperator,
    gpu_cost_nusd,
)

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


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    env = {
        **os.environ,
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
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    staging = tmp_path / "staging"
    exchange = tmp_path / "exchange"
    exchange.mkdir()
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
        "exchange_path": str(exchange),
        "kube_config_path": str(kubeconfig),
        "schedule_timeout_s": 2,
        "startup_timeout_s": 2,
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
    staging.mkdir()
    (staging / "chunk-00000.jsonl").write_bytes(chunk)
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
            "staged_path": str(staging / "chunk-00000.jsonl"),
            "input_sha256": hashlib.sha256(chunk).hexdigest(),
            "lines": LINES,
            "size_bytes": len(chunk),
        },
        [(it.key, "v1", f"{it.key}__a1c0", 1) for it in items],
    )
    return ledger


def operator(tmp_path: Path) -> VllmBatchPodOperator:
    return VllmBatchPodOperator(
        task_id="run",
        job={"job_id": JOB_ID},
        workload="w",
        batch_conn_id="vllm_test",
        staging_root=f"file://{tmp_path / 'staging'}",
        deferrable=False,
        startup_check_interval_seconds=1,
        poll_interval=1,
    )


def output_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "exchange" / f"{KEY}.output.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_job_runs_in_one_gpu_pod_that_is_deleted_and_its_gpu_time_is_recorded(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    result = operator(tmp_path).execute(context())  # type: ignore[arg-type]
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
    job = ledger.get_job(JOB_ID)
    assert (job.state, job.batch_state, job.batch_id) == ("submitted", "completed", f"pod:{KEY}")
    [cost] = ledger.infra_costs("w", RUN)
    assert cost["gpu_count"] == 2 and cost["outcome"] == "completed"
    assert cost["cost_nusd"] == gpu_cost_nusd(cost["gpu_seconds"], 2, 3.6)
    assert result["gpu_seconds"] == cost["gpu_seconds"] * 2


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


_CHILD = """
import sys
from tests.unit.kubernetes.test_operators import context, operator
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
    for _ in range(1200):
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
