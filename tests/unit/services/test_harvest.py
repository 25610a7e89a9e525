"""Harvest, download and reconcile against the emulator: complete files only, convergent reruns,
failed batches as an outcome, kills at the fail points."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.services import harvest
from airflow_batch_provider.services.harvest import download_job, reconcile_job
from tests.unit.services.workload import PROMPT, RUN, WORKLOAD, World, world

FAST = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05)
REPO = Path(__file__).resolve().parents[3]


def price(usage: Usage) -> Decimal:
    return Decimal(usage.input_tokens + usage.output_tokens) / 1000


def submitted(w: World, n: int, max_requests: int | None = None) -> list[str]:
    """Stage ``n`` items and create their batches (straight through the adapter)."""
    jobs = []
    for manifest in w.stage(n, max_requests):
        job = w.ledger.get_job(manifest["job_id"])
        with w.staging.at(job.staged_path).open("rb") as fh:
            ref = w.adapter.submit(
                w.adapter.stage(fh, "x.jsonl", int(job.size_bytes)), job.idempotency_key, {}
            )
        w.ledger.mark_submitted(job.job_id, ref.batch_id, "file")
        jobs.append(job.job_id)
    return jobs


def test_a_batch_not_yet_terminal_is_not_downloaded_and_a_later_reconcile_fetches_its_files(
    tmp_path: Path,
) -> None:
    with world(tmp_path, time_scale=1.0) as w:
        (job_id,) = submitted(w, 4)
        early = download_job(w.ledger, w.adapter, w.staging, job_id)
        assert (early.complete, early.fetched) == (False, False)
        assert w.ledger.get_job(job_id).output_path is None
        assert reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price) == {
            "job_id": job_id,
            "complete": False,
        }
        assert w.ledger.count_states(WORKLOAD, RUN) == {"submitted": 4}  # open, not "missing"
        w.config(time_scale=0.01)
        w.wait_terminal(job_id)
        summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        assert summary["complete"] is True and summary["missing"] == 0
        assert w.ledger.count_states(WORKLOAD, RUN) == {"succeeded": 4}
        assert w.ledger.get_job(job_id).state == "reconciled"


def test_a_partial_file_in_staging_does_not_make_a_later_download_skip(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        (job_id,) = submitted(w, 3)
        w.wait_terminal(job_id)
        job = w.ledger.get_job(job_id)
        target = w.staging.run_dir(WORKLOAD, RUN) / "round-1" / "output-00000.jsonl"
        with w.staging.writer(target) as fh:
            fh.write(b'{"custom_id": "half')  # what a download killed half way leaves
        w.ledger.update_job(job_id, output_path=str(target))
        got = download_job(w.ledger, w.adapter, w.staging, job_id)
        assert got.fetched and got.complete
        summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        assert summary["malformed"] == 0 and summary["outcomes"] == {"succeeded": 3}
        assert job.state == "submitted"


def test_reconciling_twice_converges_to_the_same_ledger(tmp_path: Path) -> None:
    with world(tmp_path, faults={"rate_500": 0.3, "rate_duplicate": 0.3, "rate_missing": 0.2}) as w:
        (job_id,) = submitted(w, 20)
        w.wait_terminal(job_id)
        first = reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        once = w.snapshot()
        second = reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        assert w.snapshot() == once
        assert first == second


def test_a_failed_batch_settles_its_items_by_cause_instead_of_leaving_them_submitted(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.config(faults={"fail_validation": 1})
        (job_id,) = submitted(w, 5)
        assert w.wait_terminal(job_id) == "failed"
        summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        job = w.ledger.get_job(job_id)
        assert job.batch_state == "failed" and job.state == "reconciled"
        states = w.ledger.count_states(WORKLOAD, RUN)
        assert sum(states.values()) == 5 and "submitted" not in states
        code = str(job.error).partition(": ")[0]
        expected = harvest.FAILED_BATCH_CAUSES.get(code, "failed_retryable")
        assert set(states) == {expected}
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["error_code"]))
        assert {r["error_code"] for r in rows} == {code}
        assert summary["missing"] == 0


def test_the_harvest_waits_for_the_terminal_state_with_the_runs_poll_policy(tmp_path: Path) -> None:
    with world(tmp_path, time_scale=1.0, timings={"in_progress_s": 60.0, "cancelling_s": 1.0}) as w:
        (job_id,) = submitted(w, 6)
        policy = harvest.harvest_policy(FAST, timeout=30)
        waited = harvest.cancel_and_wait(w.ledger, w.adapter, job_id, w.ref(job_id), policy)
        assert waited.action == "done" and waited.status is not None
        assert waited.status.state == "cancelled"
        assert w.ledger.get_job(job_id).batch_state == "cancelled"
        assert download_job(w.ledger, w.adapter, w.staging, job_id).complete


def test_a_harvest_that_runs_out_of_time_reports_the_state_it_saw(tmp_path: Path) -> None:
    with world(tmp_path, time_scale=1.0, timings={"in_progress_s": 60.0, "cancelling_s": 600.0}) as w:
        (job_id,) = submitted(w, 2)
        policy = harvest.harvest_policy(FAST, timeout=0.3)
        waited = harvest.cancel_and_wait(w.ledger, w.adapter, job_id, w.ref(job_id), policy)
        assert waited.action == "timeout"
        assert waited.status is not None and waited.status.state == "cancelling"


def test_the_harvest_policy_keeps_the_runs_intervals_and_drops_its_deadline() -> None:
    run = PollPolicy(initial_interval=3, factor=2, max_interval=30, deadline=1.0, deadline_margin=5)
    got = harvest.harvest_policy(run, 600)
    assert (got.initial_interval, got.factor, got.max_interval, got.timeout) == (3, 2, 30, 600)
    assert got.deadline is None


KILLED = """
import sys
from decimal import Decimal
from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.harvest import download_job, reconcile_job
from airflow_batch_provider.staging import Staging
from tests.unit.services.workload import PROMPT
url, ledger_url, root, job_id, step = sys.argv[1:]
adapter = OpenAIBatchAdapter(AdapterSettings(api_key="k", base_url=url + "/v1"))
ledger, staging = Ledger.from_url(ledger_url), Staging(root)
if step == "download":
    download_job(ledger, adapter, staging, job_id)
else:
    reconcile_job(ledger, adapter, staging, job_id, PROMPT, lambda u: Decimal(u.input_tokens + u.output_tokens) / 1000)
"""


def _killed_at(w: World, point: str, step: str, job_id: str) -> None:
    env = {**os.environ, "ABP_FAILPOINTS": point, "PYTHONPATH": str(REPO)}
    args = [w.url, f"sqlite:///{w.root / 'ledger.sqlite'}", f"file://{w.root / 'staging'}", job_id, step]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED), *args], env=env, cwd=REPO, check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.returncode


@pytest.mark.parametrize(("point", "step"), [("download.mid", "download"), ("reconcile.mid", "reconcile")])
def test_a_rerun_after_a_kill_inside_download_or_reconcile_converges_to_the_same_ledger(
    tmp_path: Path, point: str, step: str
) -> None:
    results: list[dict[str, list[tuple[object, ...]]]] = []
    for case in ("clean", "killed"):
        with world(tmp_path / case, seed=5, faults={"rate_500": 0.2, "rate_missing": 0.1}) as w:
            (job_id,) = submitted(w, 30)
            w.wait_terminal(job_id)
            if case == "killed":
                if step == "reconcile":
                    download_job(w.ledger, w.adapter, w.staging, job_id)
                _killed_at(w, point, step, job_id)
            reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
            snap = w.snapshot()
            # ids and paths differ between the two emulators and folders; states and counts must not
            snap["jobs"] = [row[3:4] + row[9:10] + row[11:13] for row in snap["jobs"]]
            results.append(snap)
    assert results[0]["items"] == results[1]["items"]
    assert results[0]["attempts"] == results[1]["attempts"]
    assert results[0]["jobs"] == results[1]["jobs"]


def test_the_failpoint_sink_passes_the_data_through() -> None:
    buf = io.BytesIO()
    sink = harvest._FailpointSink(buf)
    sink.write(b"abc")
    sink.write(b"def")
    assert buf.getvalue() == b"abcdef"


def test_results_that_arrive_after_the_fallback_answered_are_kept_as_discarded_cost(tmp_path: Path) -> None:
    with world(tmp_path, time_scale=1.0) as w:
        (job_id,) = submitted(w, 3)
        assert not download_job(w.ledger, w.adapter, w.staging, job_id).complete  # harvest ran out of time
        for row in list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])):  # the deadline fallback
            cid = w.ledger.begin_sync_attempt(
                WORKLOAD, RUN, row["item_key"], row["prompt_version"], ["submitted"]
            )
            assert cid is not None
            w.ledger.record_sync_result(
                WORKLOAD, RUN, ItemResult(cid, "succeeded", output="sync", usage=Usage(5, 1)), 7
            )
        w.advance(3600)
        w.wait_terminal(job_id)
        late = reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        assert late["complete"] is True and late["late"] == 3
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state", "route", "output_json"]))
        assert {(r["state"], r["route"], r["output_json"]) for r in rows} == {
            ("succeeded", "fallback", '"sync"')
        }
        totals = w.ledger.attempt_totals(WORKLOAD, RUN)
        discarded = [t for t in totals if t["mode"] == "batch" and t["discarded"]]
        assert sum(t["lines"] for t in discarded) == 3 and all(t["cost_nusd"] > 0 for t in discarded)
