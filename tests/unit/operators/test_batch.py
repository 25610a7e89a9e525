"""Operator behaviour that a whole DAG run does not isolate (the DAG tests cover the rest)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from airflow.sdk import BaseNotifier

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.options import BudgetOptions, ChunkOptions
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import WorkloadLeasedError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.notifications import BatchAlerts
from airflow_batch_provider.operators import batch as batch_module
from airflow_batch_provider.operators.batch import (
    BatchDownloadOperator,
    BatchPrepareOperator,
    BatchPublishOperator,
    BatchReconcileOperator,
    BatchResubmitOperator,
    BatchSubmitOperator,
    BatchUploadOperator,
    take_workload_lease,
)
from airflow_batch_provider.sensors.batch import BatchStatusSensor
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator
from tests.unit.operators.operator_env import PROMPT, RUN, configure


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    ledger = configure(monkeypatch, tmp_path)
    seed_failed_round(ledger, RUN, 3, succeeded=1)
    return ledger


def seed_failed_round(
    ledger: Ledger, run_id: str, n: int, *, succeeded: int = 0, words: int = 50, prefix: str = "i"
) -> None:
    """Record a submitted first round of items ``{prefix}0``.. in ``run_id``: the first ``succeeded`` cost $0.01, the rest failed (5xx)."""
    ids = [f"{prefix}{k}" for k in range(n)]
    items = [PreparedItem(item_key(i), PROMPT.render({"id": i, "text": "word " * words})) for i in ids]
    ledger.upsert_items("w", run_id, items)
    job_id = f"w:{run_id}:r1:c00000"
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": "w",
            "run_id": run_id,
            "round": 1,
            "chunk_index": 0,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "kind": "chat",
            "idempotency_key": f"abp-{run_id}",
            "staged_path": "file:///x",
            "input_sha256": "0" * 64,
            "lines": n,
            "size_bytes": 1,
        },
        [(it.key, "v1", f"{it.key}__a1c0", 1) for it in items],
    )
    ledger.mark_submitted(job_id, f"batch_{run_id}", "file-1")
    usage = Usage(input_tokens=100_000, output_tokens=10_000)
    results = [
        ItemResult(f"{i}__a1c0", "succeeded", output="ok", usage=usage)
        if k < succeeded
        else ItemResult(f"{i}__a1c0", "failed_retryable", error_code="server_error", usage=Usage())
        for k, i in enumerate(ids)
    ]
    ledger.apply_results(job_id, results, lambda u: Decimal("0.01") if u.input_tokens else Decimal(0))


def resubmit(budget: float | None, **kw: Any) -> BatchResubmitOperator:
    return BatchResubmitOperator(
        task_id="resubmit_2",
        workload="w",
        batch_conn_id="ops_test",
        round_number=2,
        max_attempts=3,
        budget=BudgetOptions(budget_usd=budget),
        **kw,
    )


def test_a_round_that_would_pass_the_budget_is_not_started_and_its_items_go_to_review(ledger: Ledger) -> None:
    assert ledger.run_cost("w", RUN) == Decimal("0.01")
    assert resubmit(0.010001).execute({"run_id": RUN}) == []  # type: ignore[arg-type]
    rows = {r["app_id"]: r for r in ledger.iter_items("w", RUN)}
    assert {rows["i1"]["state"], rows["i2"]["state"]} == {"review"}
    assert rows["i1"]["error_code"] == "budget_exceeded"
    assert (
        "exceeds the run's budget of $0.010001; raise BudgetOptions(budget_usd=...)"
        in rows["i1"]["error_message"]
    )
    assert rows["i0"]["state"] == "succeeded"
    assert ledger.get_jobs("w", RUN, 2) == []


def test_a_round_within_the_budget_is_staged_and_a_rerun_is_not_checked_again(ledger: Ledger) -> None:
    manifests = resubmit(1.0).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert [m["lines"] for m in manifests] == [2]
    # cleared and rerun after the money was spent elsewhere: the round already exists, same jobs
    assert resubmit(0.0).execute({"run_id": RUN}) == manifests  # type: ignore[arg-type]
    assert ledger.count_states("w", RUN) == {"succeeded": 1, "staged": 2}


def test_without_a_budget_every_retryable_item_is_staged(ledger: Ledger) -> None:
    manifests = resubmit(None).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert sum(m["lines"] for m in manifests) == 2


def resubmit_peak(ledger: Ledger, run_id: str, n: int, budget: float | None) -> int:
    """Seed ``n`` failed 1 KB items in ``run_id`` and return the resubmit task's peak traced memory."""
    seed_failed_round(ledger, run_id, n, words=200, prefix=f"{run_id}-")
    # a chunk's own bookkeeping is bounded by its size, not by the round's
    op = resubmit(budget, chunking=ChunkOptions(max_requests=500))
    tracemalloc.start()
    try:
        op.execute({"run_id": run_id})  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("budget", [None, 1e6, 1e-9], ids=["no budget", "within budget", "refused"])
def test_the_resubmit_tasks_peak_memory_does_not_grow_with_the_items_it_resubmits(
    ledger: Ledger, budget: float | None
) -> None:
    resubmit_peak(ledger, "warm", 50, budget)  # lazy imports and caches are paid here, not below
    small = resubmit_peak(ledger, "small", 2_000, budget)
    large = resubmit_peak(ledger, "large", 8_000, budget)
    moved = "review" if budget == 1e-9 else "staged"
    assert ledger.count_states("w", "large") == {moved: 8_000}
    assert large / small < 1.5, f"peak {large} bytes at 8,000 items against {small} at 2,000"


def test_resubmit_cuts_its_round_by_the_chunk_size_the_template_renders_to(ledger: Ledger) -> None:
    op = resubmit(None, chunking=ChunkOptions(max_requests="{{ params.chunk }}"))
    manifests = op.execute({"run_id": RUN, "params": {"chunk": "1"}})  # type: ignore[arg-type]
    assert [m["lines"] for m in manifests] == [1, 1]


# ---------------------------------------------------------------------------- the run, task by task


class Flow:
    """The batch operators run one after the other in-process against the emulator, as a DAG would."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.common: dict[str, Any] = {"workload": "flow", "batch_conn_id": "flow_emu"}
        self.tmp_path = tmp_path
        self.xcom: dict[tuple[str, str], Any] = {}
        self.extra: dict[str, Any] = {}  # more context (outlet_events)
        self.run_id = RUN  # the run the next task belongs to
        self.prompt = PROMPT  # the prompt the next task renders (as a prompt file would be read)

    def context(self, task_id: str, map_index: int = -1) -> Any:
        def xcom_push(key: str, value: Any) -> None:
            self.xcom[(task_id, key)] = value

        from airflow.sdk import DAG

        ti = SimpleNamespace(
            dag_id="flow_dag", task_id=task_id, map_index=map_index, try_number=1, xcom_push=xcom_push
        )
        return {"run_id": self.run_id, "ti": ti, "dag": DAG("flow_dag", schedule=None), **self.extra}

    def fault(self, **faults: Any) -> None:
        httpx.put(f"{self.url}/_emulator/config", json={"faults": faults}).raise_for_status()

    def prepare(self, n: int, **kw: Any) -> list[dict[str, Any]]:
        records = [{"id": f"r{k}", "text": f"text {k}"} for k in range(n)]
        op = BatchPrepareOperator(
            task_id="prepare", records=lambda ctx: records, prompt=self.prompt, **self.common, **kw
        )
        return op.execute(self.context("prepare"))  # type: ignore[no-any-return]

    def upload(self, manifest: dict[str, Any], i: int = 0, suffix: str = "") -> dict[str, Any]:
        op = BatchUploadOperator(task_id=f"upload{suffix}", job=manifest, **self.common)
        return op.execute(self.context(f"upload{suffix}", i))

    def round(self, manifests: list[dict[str, Any]], suffix: str = "") -> list[dict[str, Any]]:
        out = []
        for i, manifest in enumerate(manifests):
            submitted = BatchSubmitOperator(
                task_id=f"submit{suffix}",
                job=self.upload(manifest, i, suffix),
                prompt=self.prompt,
                **self.common,
            )
            sub = submitted.execute(self.context(f"submit{suffix}", i))
            wait = BatchStatusSensor(
                task_id=f"wait{suffix}",
                batch=sub,
                batch_conn_id="flow_emu",
                poll=FAST,
                deferrable=False,
                alerts=self.common.get("alerts"),
            )
            waited = wait.execute(self.context(f"wait{suffix}", i))
            got = BatchDownloadOperator(task_id=f"download{suffix}", batch=waited, **self.common).execute(
                self.context(f"download{suffix}", i)
            )
            out.append(
                BatchReconcileOperator(
                    task_id=f"reconcile{suffix}", batch=got, prompt=self.prompt, **self.common
                ).execute(self.context(f"reconcile{suffix}", i))
            )
        return out

    def resubmit(self, round_number: int, **kw: Any) -> list[dict[str, Any]]:
        kw.setdefault("max_attempts", 3)
        op = BatchResubmitOperator(
            task_id=f"resubmit_{round_number}", round_number=round_number, **self.common, **kw
        )
        return op.execute(self.context(op.task_id))  # type: ignore[no-any-return]

    def publish(self, **kw: Any) -> dict[str, Any]:
        kw.setdefault("max_attempts", 3)
        op = BatchPublishOperator(task_id="publish", prompt=self.prompt, **self.common, **kw)
        return op.execute(self.context("publish"))


FAST = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05)


@pytest.fixture
def flow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Flow]:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", f"sqlite:///{tmp_path / 'flow.sqlite'}")
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", f"file://{tmp_path / 'staging'}")
    with run_emulator(EmulatorConfig(time_scale=0.02)) as url:
        conn = {"conn_type": "openai_batch", "host": f"{url}/v1", "password": "k"}
        monkeypatch.setenv("AIRFLOW_CONN_FLOW_EMU", json.dumps(conn))
        yield Flow(url, tmp_path)


def test_a_batch_refused_as_an_invalid_file_does_not_fail_the_run_its_items_go_to_review_and_publish_reports_it(
    flow: Flow,
) -> None:
    manifests = flow.prepare(6, chunking=ChunkOptions(max_requests=3))
    assert len(manifests) == 2
    flow.fault(fail_validation=1)  # the first batch created fails validation at the provider
    first = flow.round(manifests)
    assert [r["complete"] for r in first] == [True, True]
    assert flow.resubmit(2) == []  # a permanent cause: nothing to send again
    out = flow.publish()
    assert out["items_by_state"] == {"succeeded": 3, "review": 3}
    assert out["failed_batches"] == 1
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    codes = {
        r["error_code"] for r in ledger.iter_items("flow", RUN, states=["review"], columns=["error_code"])
    }
    assert codes == {"invalid_file"}
    report = json.loads(Path(out["report"].removeprefix("file://")).read_text())
    (failed,) = report["failed_batches"]
    assert failed["lines"] == 3 and failed["error"].startswith("invalid_file: ")
    assert "failed batches: 1" in report["table"]


def test_after_a_token_limit_failure_the_next_round_sends_the_items_in_half_size_chunks(flow: Flow) -> None:
    (manifest,) = flow.prepare(8)
    flow.fault(fail_token_limit=1)
    flow.round([manifest])
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    rows = list(ledger.iter_items("flow", RUN, columns=["state", "error_code"]))
    assert {(r["state"], r["error_code"]) for r in rows} == {("failed_retryable", "token_limit_exceeded")}
    second = flow.resubmit(2)
    assert [m["lines"] for m in second] == [4, 4]
    flow.round(second, "_2")
    out = flow.publish()
    assert out["items_by_state"] == {"succeeded": 8}
    assert out["failed_batches"] == 1


# ------------------------------------------------- what a run keeps, what a rerun may change (issue 18)

PROMPT_V2 = PromptTemplate(
    version="v2",
    model="gpt-4o-mini",
    user="{{ text }}",
    system="Label it as JSON.",
    output_format="json",
    output_schema={"type": "object", "required": ["label"]},
)


def test_a_prompt_edited_while_the_batches_run_stops_the_next_task_naming_both_and_judges_nothing(
    flow: Flow,
) -> None:
    from airflow_batch_provider.exceptions import ConfigurationError

    (manifest,) = flow.prepare(4)
    flow.prompt = PROMPT_V2  # the prompt file is edited while v1's batch runs
    with pytest.raises(ConfigurationError) as caught:
        flow.round([manifest])
    message = str(caught.value)
    assert "renders prompt 'v2'" in message and "started with prompt 'v1'" in message
    assert "Put prompt 'v1' back and clear this task" in message
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    states = {r["state"] for r in ledger.iter_items("flow", RUN, columns=["state"])}
    assert states == {"staged"}  # submit refused before anything was sent, nothing judged
    flow.prompt = PROMPT  # put back: the run goes on with v1
    flow.round([manifest])
    assert flow.publish()["items_by_state"] == {"succeeded": 4}


def test_the_same_version_with_other_content_is_another_prompt_too(flow: Flow) -> None:
    from airflow_batch_provider.exceptions import ConfigurationError

    (manifest,) = flow.prepare(4)
    flow.round([manifest])
    flow.prompt = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", system="Other rubric.")
    with pytest.raises(ConfigurationError, match="renders prompt 'v1' with other content"):
        flow.publish()


def test_a_cleared_prepare_and_publish_of_a_finished_run_change_neither_its_items_nor_its_report(
    flow: Flow, capfd: pytest.CaptureFixture[str]
) -> None:
    older, newer = "scheduled__2026-11-01T00:00:00+00:00", "scheduled__2026-11-02T00:00:00+00:00"
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    flow.run_id = older
    flow.round(flow.prepare(4))
    first = flow.publish()
    assert first["items_by_state"] == {"succeeded": 4}
    flow.run_id = newer
    assert flow.prepare(4) == []  # every item unchanged: nothing to send
    assert flow.publish()["items_by_state"] == {"unchanged": 4}
    older_report = json.loads(Path(first["report"].removeprefix("file://")).read_text())

    flow.run_id = older  # a person clears the older run
    assert flow.prepare(4) == []
    again = flow.publish()
    assert again == first
    logged = "".join(capfd.readouterr())
    assert logged.count("it is history") == 2 and "cleared prepare reads nothing" in logged
    assert json.loads(Path(again["report"].removeprefix("file://")).read_text()) == older_report
    [run] = [r for r in ledger.runs("flow") if r["run_id"] == older]
    assert json.loads(run["report_json"])["items_by_state"] == {"succeeded": 4}
    assert {r["state"] for r in ledger.iter_items("flow", newer, columns=["state"])} == {"unchanged"}
    assert list(ledger.iter_items("flow", older, columns=["state"])) == []


def test_a_cleared_prepare_of_the_newest_finished_run_prepares_a_record_fixed_after_its_review_again(
    flow: Flow, capfd: pytest.CaptureFixture[str]
) -> None:
    records: list[dict[str, str]] = [{"id": f"r{k}", "text": f"text {k}"} for k in range(3)] + [{"id": "r3"}]

    def prepare() -> list[dict[str, Any]]:
        op = BatchPrepareOperator(
            task_id="prepare",
            records=lambda ctx: [dict(r) for r in records],
            prompt=flow.prompt,
            chunking=ChunkOptions(max_reject_ratio=0.5),
            **flow.common,
        )
        return op.execute(flow.context("prepare"))  # type: ignore[no-any-return]

    flow.round(prepare())
    assert flow.publish()["items_by_state"] == {"succeeded": 3, "review": 1}
    records[3]["text"] = "fixed"  # the record is fixed, then a person clears the run
    flow.round(prepare())
    assert flow.publish()["items_by_state"] == {"succeeded": 4}
    assert "this cleared prepare re-reads the input" in "".join(capfd.readouterr())


# ---------------------------------------------------------------------------- the workload lease


def lease_context(run_id: str) -> Any:
    return {
        "run_id": run_id,
        "ti": SimpleNamespace(dag_id="nightly", task_id="w.lease", map_index=-1, try_number=1),
    }


@pytest.mark.parametrize("holder_state", ["running", "queued", None])
def test_a_second_run_fails_fast_naming_the_run_that_holds_the_workload(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, holder_state: str | None
) -> None:
    monkeypatch.setattr(batch_module, "dagrun_state", lambda dag_id, run_id: holder_state)
    take_workload_lease(ledger, "w", lease_context("scheduled__1"))
    with pytest.raises(WorkloadLeasedError, match="held by DAG 'nightly', run 'scheduled__1'"):
        take_workload_lease(ledger, "w", lease_context("manual__2"))
    take_workload_lease(ledger, "w", lease_context("scheduled__1"))  # the holder again: no-op
    lease = ledger.workload_lease("w")
    assert lease is not None and lease.run_id == "scheduled__1"


def test_a_run_takes_over_the_workload_from_a_run_that_is_no_longer_running(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(batch_module, "dagrun_state", lambda d, r: asked.append((d, r)) or "failed")
    take_workload_lease(ledger, "w", lease_context("scheduled__1"))
    take_workload_lease(ledger, "w", lease_context("manual__2"))
    assert asked == [("nightly", "scheduled__1")]
    lease = ledger.workload_lease("w")
    assert lease is not None and lease.run_id == "manual__2"


def test_a_run_marked_running_with_no_live_task_instance_loses_the_workload_and_a_live_one_keeps_it(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.operators import liveness

    now = datetime.now(timezone.utc)
    killed = [liveness.TaskInstanceSign("w.submit", 0, "running", now - timedelta(seconds=400))]
    alive = [liveness.TaskInstanceSign("w.submit", 0, "running", now - timedelta(seconds=5))]
    signs = {"scheduled__1": alive, "manual__2": killed}
    monkeypatch.setattr(batch_module, "dagrun_state", lambda d, r: "running")
    monkeypatch.setattr(liveness, "holder_task_instances", lambda d, r: signs[r])
    monkeypatch.setenv("AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT", "300")
    take_workload_lease(ledger, "w", lease_context("scheduled__1"))
    with pytest.raises(WorkloadLeasedError, match="run 'scheduled__1'"):
        take_workload_lease(ledger, "w", lease_context("manual__2"))  # its holder heartbeats
    signs["scheduled__1"] = killed
    take_workload_lease(ledger, "w", lease_context("manual__2"))  # its holder was killed
    lease = ledger.workload_lease("w")
    assert lease is not None and lease.run_id == "manual__2" and lease.taken_over_from == "scheduled__1"


def test_publish_gives_the_workload_back(flow: Flow) -> None:
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    take_workload_lease(ledger, "flow", flow.context("lease"))
    flow.round(flow.prepare(2))
    flow.publish()
    assert ledger.workload_lease("flow") is None


def test_publish_settles_an_item_whose_real_time_answer_was_lost_in_a_crash(flow: Flow) -> None:
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    take_workload_lease(ledger, "flow", flow.context("lease"))
    flow.prepare(3)
    (row, *_) = list(ledger.iter_items("flow", RUN, columns=["prompt_version"]))
    # a fallback task was killed after the provider answered and before the answer was recorded
    assert ledger.begin_sync_attempt("flow", RUN, row["item_key"], row["prompt_version"], ["staged"])
    assert ledger.count_states("flow", RUN)["fallback"] == 1
    out = flow.publish()
    states = ledger.count_states("flow", RUN)
    assert "fallback" not in states, "fallback is not a final state: publish must settle it"
    assert sum(states.values()) == 3
    assert out["items_by_state"] == states


def test_prepare_records_the_dag_of_the_run_so_the_ui_can_check_who_may_see_it(flow: Flow) -> None:
    flow.prepare(2)
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    (run,) = ledger.runs("flow")
    assert run["dag_id"] == "flow_dag"


# ---------------------------------------------------------------------------- links, alerts, metrics, the asset event


class FileNotifier(BaseNotifier):
    """A real Airflow notifier (templated like Slack's and SMTP's) that appends each message to a file."""

    template_fields = ("text",)

    def __init__(self, path: Path, text: str) -> None:
        super().__init__()
        self.path = path
        self.text = text

    def notify(self, context: Any) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(self.text + "\n")


class DownNotifier(BaseNotifier):
    def notify(self, context: Any) -> None:
        raise ConnectionError("the chat server is down")


class Recorder:
    """A Stats backend (installed through the Task SDK's ``stats.initialize``) that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any, dict[str, Any]]] = []

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict[str, Any] | None = None) -> None:
        self.sent.append(("incr", stat, count, dict(tags or {})))

    def gauge(
        self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: Any = None
    ) -> None:
        self.sent.append(("gauge", stat, value, dict(tags or {})))

    def __getattr__(self, name: str) -> Any:  # timers and the rest behave as Airflow's no-op logger
        from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

        return getattr(NoStatsLogger(), name)

    def names(self) -> list[str]:
        return [stat for _, stat, _, _ in self.sent]


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    from airflow.sdk._shared.observability.metrics import stats as backend
    from airflow.sdk.observability import stats as sdk_stats

    monkeypatch.setattr(backend, "_factory", backend._factory)
    monkeypatch.setattr(backend, "_backend", backend._backend)
    recorder = Recorder()
    sdk_stats.initialize(factory=lambda: recorder, export_legacy_names=False)  # type: ignore[arg-type,return-value]
    return recorder


def alerts_to(path: Path, **kw: Any) -> BatchAlerts:
    return BatchAlerts(
        notifiers=[DownNotifier(), FileNotifier(path, "{{ batch_event.kind }}|{{ batch_event.message }}")],
        **kw,
    )


def sent(path: Path) -> list[str]:
    return [line.split("|", 1)[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_failed_batch_is_told_once_counted_and_the_run_summary_and_review_growth_follow_publish(
    flow: Flow, stats: Recorder
) -> None:
    mail = flow.tmp_path / "alerts.txt"
    flow.common["alerts"] = alerts_to(mail, review_growth_threshold=3)
    manifests = flow.prepare(6, chunking=ChunkOptions(max_requests=3))
    flow.fault(fail_validation=1)
    flow.round(manifests)
    assert sent(mail) == ["batch_failed"]  # the broken notifier beside it changed nothing
    flow.round(manifests)  # cleared and rerun: the same batches, no second alert
    assert sent(mail) == ["batch_failed"]
    flow.publish()
    assert sent(mail) == ["batch_failed", "run_summary", "review_growth"]
    summary = mail.read_text().splitlines()[1]
    assert "succeeded 3" in summary and "review 3" in summary
    names = stats.names()
    assert names.count("batch_provider.batches.failed") == 1
    assert names.count("batch_provider.batches.completed") == 1
    assert "batch_provider.items.succeeded" in names and "batch_provider.cost.micro_usd" in names
    assert names.count("batch_provider.alerts.batch_failed") == 1
    tags = next(t for _, stat, _, t in stats.sent if stat == "batch_provider.batches.failed")
    assert tags == {"workload": "flow", "provider": "openai"}


def test_the_submit_task_stores_the_console_link_of_its_batch(flow: Flow) -> None:
    from airflow_batch_provider.links.batch import BatchConsoleLink

    (manifest,) = flow.prepare(2)
    uploaded = flow.upload(manifest)
    out = BatchSubmitOperator(task_id="submit", job=uploaded, prompt=PROMPT, **flow.common).execute(
        flow.context("submit", 0)
    )
    link = flow.xcom[("submit", BatchConsoleLink().xcom_key)]
    # the emulator is not api.openai.com: the run's page, never platform.openai.com
    assert out["batch_id"] and "platform.openai.com" not in link and "/llm-batch/dag-run?" in link


def test_a_refused_resubmit_round_is_a_budget_alert_and_a_broken_notifier_does_not_fail_it(
    ledger: Ledger, tmp_path: Path
) -> None:
    from airflow.sdk import DAG

    mail = tmp_path / "alerts.txt"
    op = resubmit(0.010001, alerts=alerts_to(mail))
    assert op.execute({"run_id": RUN, "dag": DAG("d", schedule=None)}) == []  # type: ignore[arg-type]
    assert sent(mail) == ["budget_refused"]
    assert "a round of 2 items" in mail.read_text()


def test_prepare_over_its_budget_is_a_budget_alert_before_it_fails(flow: Flow) -> None:
    from airflow_batch_provider.exceptions import BudgetExceededError

    mail = flow.tmp_path / "alerts.txt"
    flow.common["alerts"] = alerts_to(mail)
    with pytest.raises(BudgetExceededError):
        flow.prepare(5, budget=BudgetOptions(budget_usd=0.0000001))
    assert sent(mail) == ["budget_refused"]
    assert "Nothing was paid" in mail.read_text()


def test_the_published_asset_event_carries_the_runs_counts_cost_and_results_location(flow: Flow) -> None:
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import OutletEventAccessors

    asset = Asset(name="flow_results", uri="abp://flow/results")
    events = OutletEventAccessors()
    flow.extra["outlet_events"] = events
    flow.round(flow.prepare(3))
    out = flow.publish(outlets=[asset])
    extra = events[asset].extra
    assert extra["items_by_state"] == {"succeeded": 3}
    assert extra["paid_usd"] == str(out["paid_usd"]) and extra["report"] == out["report"]
    assert (
        str(extra["results"]).endswith("results.jsonl")
        and Path(str(extra["results"]).removeprefix("file://")).exists()
    )
    json.dumps(extra)  # JSON-safe, as the API server stores it


def test_items_that_exhaust_their_batch_attempts_go_to_the_real_time_api_when_the_workload_says_sync(
    flow: Flow,
) -> None:
    (manifest,) = flow.prepare(4)
    flow.fault(fail_token_limit=1)  # the only batch attempt fails for every item (retryable)
    flow.round([manifest])
    out = flow.publish(max_attempts=1, exhausted="sync")
    assert out["items_by_state"] == {"succeeded": 4}
    report = json.loads(Path(out["report"].removeprefix("file://")).read_text())
    assert report["exhausted_sync"]["items"] == 4 and Decimal(report["exhausted_sync"]["paid"]) > 0
    assert report["items_by_route"]["exhausted_sync"] == 4 and report["items_by_route"]["fallback"] == 0
    assert "exhausted_sync" in report["table"]


def test_exhausted_items_sent_in_real_time_share_the_connections_rate_window_like_the_deadline_fallback(
    flow: Flow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import func, select

    from airflow_batch_provider.ledger import schema as s

    (manifest,) = flow.prepare(4)
    flow.fault(fail_token_limit=1)
    flow.round([manifest])
    conn = {
        "conn_type": "openai_batch",
        "host": f"{flow.url}/v1",
        "password": "k",
        "extra": {"rpm_limit": 600},
    }
    monkeypatch.setenv("AIRFLOW_CONN_FLOW_EMU", json.dumps(conn))
    out = flow.publish(max_attempts=1, exhausted="sync")
    assert out["items_by_state"] == {"succeeded": 4}
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    with ledger.engine.connect() as c:
        shared = c.execute(
            select(func.count()).select_from(s.rate_log).where(s.rate_log.c.quota_key == "flow_emu")
        )
        assert shared.scalar() == 4  # each send took its slot in the connection's window in the ledger


def test_by_default_exhausted_items_go_to_review_and_sync_over_the_budget_is_refused(flow: Flow) -> None:
    mail = flow.tmp_path / "alerts.txt"
    flow.common["alerts"] = alerts_to(mail, on={"budget_refused"})
    (manifest,) = flow.prepare(4)
    flow.fault(fail_token_limit=1)
    flow.round([manifest])
    out = flow.publish(max_attempts=1, exhausted="sync", budget=BudgetOptions(budget_usd=0.0000001))
    assert out["items_by_state"] == {"review": 4}
    assert sent(mail) == ["budget_refused"]


def test_an_unknown_exhausted_route_is_refused_when_the_dag_is_parsed() -> None:
    from airflow_batch_provider.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="exhausted='retry'; use 'review'"):
        BatchPublishOperator(
            task_id="publish", workload="w", max_attempts=3, exhausted="retry", prompt=PROMPT
        )


# ---------------------------------------------------------------------------- distributed executors


@pytest.mark.parametrize("executor", ["CeleryExecutor", "KubernetesExecutor", "LocalExecutor,CeleryExecutor"])
def test_prepare_under_a_distributed_executor_refuses_the_embedded_ledger_and_local_staging(
    flow: Flow, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    from airflow_batch_provider.exceptions import ConfigurationError

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    with pytest.raises(ConfigurationError) as refused:
        flow.prepare(2)
    message = str(refused.value)
    assert executor.split(",")[-1] in message
    assert "ledger_conn_id" in message and "staging_root" in message and "s3://" in message
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    assert ledger.runs("flow") == []  # refused before anything was recorded


def test_a_submit_killed_during_its_look_up_sends_nothing_and_its_retry_need_not_wait_for_the_lease(
    flow: Flow,
) -> None:
    from airflow_batch_provider.exceptions import SubmitError

    (manifest,) = flow.prepare(2)
    flow.upload(manifest)
    op = BatchSubmitOperator(task_id="submit", job=manifest, prompt=PROMPT, **flow.common)
    real_find = op.adapter.find

    def find_then_sigterm(*args: Any, **kwargs: Any) -> Any:
        found = real_find(*args, **kwargs)
        op.on_kill()  # the task runner's SIGTERM handler runs here, between two statements
        return found

    op.adapter.find = find_then_sigterm  # type: ignore[method-assign]
    with pytest.raises(SubmitError, match="killed before the create"):
        op.execute(flow.context("submit", 0))
    ledger = Ledger.from_url(f"sqlite:///{flow.tmp_path / 'flow.sqlite'}")
    job = ledger.get_job(manifest["job_id"])
    assert job.batch_id is None and job.claim_owner is None
    assert httpx.get(f"{flow.url}/_emulator/stats").json()["counters"].get("openai.batches_created", 0) == 0
    retry = BatchSubmitOperator(task_id="submit", job=manifest, prompt=PROMPT, **flow.common)
    assert retry.execute(flow.context("submit", 0))["batch_id"]  # claimed at once, created once


def test_the_upload_task_stages_a_chunk_once_and_a_cleared_one_reuses_the_recorded_file(flow: Flow) -> None:
    (manifest,) = flow.prepare(2)
    first = flow.upload(manifest)
    cleared = flow.upload(manifest)
    assert (first["upload"], cleared["upload"]) == ("uploaded", "recorded")
    assert first["input_ref"] == cleared["input_ref"] and first["job_id"] == manifest["job_id"]
    stats = httpx.get(f"{flow.url}/_emulator/stats").json()
    assert (stats["files_uploaded"], stats["batches_created"]) == (1, 0)  # an upload never creates a batch
    out = BatchSubmitOperator(task_id="submit", job=cleared, prompt=PROMPT, **flow.common).execute(
        flow.context("submit", 0)
    )
    again = BatchSubmitOperator(task_id="submit", job=cleared, prompt=PROMPT, **flow.common).execute(
        flow.context("submit", 0)
    )
    assert out["batch_id"] == again["batch_id"]
    stats = httpx.get(f"{flow.url}/_emulator/stats").json()
    assert (stats["files_uploaded"], stats["batches_created"]) == (1, 1)  # a cleared submit uploads nothing


def test_a_submit_over_the_connections_enqueued_tokens_defers_on_a_timer_and_creates_once_admitted(
    flow: Flow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
    from airflow.sdk.exceptions import TaskDeferred

    first, second = flow.prepare(4, chunking=ChunkOptions(max_requests=2))
    conn = {
        "conn_type": "openai_batch",
        "host": f"{flow.url}/v1",
        "password": "k",
        "extra": {"enqueued_token_limit": 50, "admission_retry_s": 5},  # one chunk at a time
    }
    monkeypatch.setenv("AIRFLOW_CONN_FLOW_EMU", json.dumps(conn))
    # the emulator, not the clock, keeps the first batch in flight until the test ends it
    flow.fault(stuck_batches=[0])
    batch_id = BatchSubmitOperator(
        task_id="submit", job=flow.upload(first, 0), prompt=PROMPT, **flow.common
    ).execute(flow.context("submit", 0))["batch_id"]
    assert batch_id
    waiting = BatchSubmitOperator(task_id="submit", job=flow.upload(second, 1), prompt=PROMPT, **flow.common)
    with pytest.raises(TaskDeferred) as deferred:
        waiting.execute(flow.context("submit", 1))
    assert isinstance(deferred.value.trigger, TimeDeltaTrigger)
    assert deferred.value.method_name == "resume"
    assert httpx.get(f"{flow.url}/_emulator/stats").json()["counters"]["openai.batches_created"] == 1
    httpx.post(
        f"{flow.url}/v1/batches/{batch_id}/cancel", headers={"Authorization": "Bearer k"}
    ).raise_for_status()
    flow.round([first])  # the first batch ends (the wait, download and reconcile tasks)
    assert waiting.resume(flow.context("submit", 1))["batch_id"]
    assert httpx.get(f"{flow.url}/_emulator/stats").json()["counters"]["openai.batches_created"] == 2
