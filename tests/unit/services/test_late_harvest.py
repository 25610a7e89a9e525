"""The next run harvests a batch resolved after its run finished (services/late_harvest.py).

On SQLite and PostgreSQL (the ``ledger_url`` fixture), against the emulator: an Anthropic create
reply lost, the deadline while in doubt, the run published; then ``jobs resolve --batch-id``.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import httpx

from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.late_harvest import LATE_HARVEST
from airflow_batch_provider.ledger.runs import finished_run
from airflow_batch_provider.services import report, submit
from airflow_batch_provider.services.harvest import reconcile_job
from airflow_batch_provider.services.late_harvest import harvest_earlier_runs
from airflow_batch_provider.services.submit import submit_job
from tests.unit.services.workload import RUN, WORKLOAD, World, world

NEXT = "manual__2026-12-01T00:00:00+00:00"


def resolved_after_publish(w: World) -> tuple[str, str]:
    """A job in doubt past the deadline, its run published, then resolved to its batch: (job, batch)."""
    (manifest,) = w.stage(3)
    job_id = w.upload(str(manifest["job_id"]))
    w.arm("create:500_after")
    assert submit_job(
        ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1"
    ).in_doubt
    assert submit.settle_in_doubt(w.ledger, job_id, "the deadline came") == 3
    published = report.build_report(w.ledger, WORKLOAD, RUN, "anthropic", None)
    w.ledger.finish_run(WORKLOAD, RUN, published)
    (batch,) = httpx.get(f"{w.url}/_emulator/record").json()["batches"]["anthropic"]
    w.ledger.resolve_job(job_id, batch["id"], "ops", "found in the console")
    return job_id, str(batch["id"])


def harvest(w: World) -> list[dict[str, object]]:
    w.ledger.start_run(WORKLOAD, NEXT, w.adapter.name, w.prompt.model)
    pricer = lambda model: report.batch_pricer("anthropic", model, None)  # noqa: E731
    return harvest_earlier_runs(w.ledger, w.adapter, w.staging, WORKLOAD, NEXT, w.prompt, pricer, "prepare")


def test_the_next_run_harvests_a_batch_resolved_after_its_run_finished_and_prices_it_once(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, provider="anthropic", ledger_url=ledger_url, time_scale=1.0) as w:
        job_id, batch_id = resolved_after_publish(w)
        before = finished_run(w.ledger, WORKLOAD, RUN)
        assert before is not None
        w.wait_terminal(job_id)
        (done,) = harvest(w)
        assert done["complete"] and done["from_run"] == RUN
        assert harvest(w) == []  # harvested once; a second call finds nothing
        rows = list(w.ledger.iter_items(WORKLOAD, NEXT, columns=["state"]))
        assert [r["state"] for r in rows] == ["succeeded"] * 3
        assert w.ledger.get_job(job_id).run_id == NEXT
        # the finished run is history: its recorded report is the same; the next run prices the batch
        assert finished_run(w.ledger, WORKLOAD, RUN) == before
        got = report.build_report(w.ledger, WORKLOAD, NEXT, "anthropic", None)
        (late,) = got["late_harvest"]
        assert (late["job_id"], late["batch_id"], late["from_run"], late["items"]) == (
            job_id,
            batch_id,
            RUN,
            3,
        )
        assert "late_harvest" in got["table"]
        (batch,) = httpx.get(f"{w.url}/_emulator/record").json()["batches"]["anthropic"]
        billed = sum((Usage(**u) for u in batch["billed"].values()), Usage())
        assert (got["usage"]["input_tokens"], got["usage"]["output_tokens"]) == (
            billed.input_tokens,
            billed.output_tokens,
        )
        assert Decimal(got["paid"]) > 0
        assert [r.action for r in w.ledger.audit_log(WORKLOAD)].count(LATE_HARVEST) == 1


def test_a_resolved_batch_that_has_not_ended_stays_with_its_run_guarded_and_nothing_moves(
    tmp_path: Path, ledger_url: str
) -> None:
    slow = {"validating_s": 600.0}
    with world(tmp_path, provider="anthropic", ledger_url=ledger_url, time_scale=1.0, timings=slow) as w:
        job_id, _ = resolved_after_publish(w)
        assert harvest(w) == []
        job = w.ledger.get_job(job_id)
        assert (job.run_id, job.state) == (RUN, "submitted")
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"]))
        assert sorted(r["state"] for r in rows) == ["submitted"] * 3
        with w.ledger.engine.connect() as conn:
            runs = {r[0] for r in conn.execute(s.attempts.select().with_only_columns(s.attempts.c.run_id))}
        assert runs == {RUN}


def test_a_finished_runs_own_reconcile_applies_nothing_and_the_next_run_harvests_the_batch_once(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, provider="anthropic", ledger_url=ledger_url, time_scale=1.0) as w:
        job_id, _ = resolved_after_publish(w)
        w.wait_terminal(job_id)
        pricer = report.batch_pricer("anthropic", w.prompt.model, None)
        refused = reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, pricer)
        assert not refused["complete"]
        assert f"run {RUN}" in refused["refused"] and "late_harvest" in refused["refused"]
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"]))
        assert [r["state"] for r in rows] == ["submitted"] * 3
        with w.ledger.engine.connect() as conn:
            outcomes = {
                r[0] for r in conn.execute(s.attempts.select().with_only_columns(s.attempts.c.outcome))
            }
        assert outcomes == {None}  # the finished run's attempts are as its publish left them
        (done,) = harvest(w)
        assert done["complete"] and done["from_run"] == RUN
        got = report.build_report(w.ledger, WORKLOAD, NEXT, "anthropic", None)
        assert got["usage"]["input_tokens"] == billed(w).input_tokens


def test_the_next_run_harvests_a_resolved_batch_whose_items_were_skipped_while_it_was_in_doubt(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, provider="anthropic", ledger_url=ledger_url, time_scale=1.0) as w:
        (manifest,) = w.stage(3)
        job_id = w.upload(str(manifest["job_id"]))
        w.arm("create:500_after")
        assert submit_job(
            ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1"
        ).in_doubt
        assert submit.settle_in_doubt(w.ledger, job_id, "the deadline came") == 3
        assert w.ledger.skip_review(WORKLOAD, error_code="in_doubt", actor="ops", reason="not needed") == 3
        w.ledger.finish_run(WORKLOAD, RUN, report.build_report(w.ledger, WORKLOAD, RUN, "anthropic", None))
        (batch,) = httpx.get(f"{w.url}/_emulator/record").json()["batches"]["anthropic"]
        w.ledger.resolve_job(job_id, batch["id"], "ops", "found in the console")
        w.wait_terminal(job_id)
        (done,) = harvest(w)
        assert done["complete"] and done["from_run"] == RUN
        # the skipped items move with their job and stay skipped; their billed answers are priced once
        assert list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])) == []
        rows = list(w.ledger.iter_items(WORKLOAD, NEXT, columns=["state"]))
        assert [r["state"] for r in rows] == ["skipped"] * 3
        got = report.build_report(w.ledger, WORKLOAD, NEXT, "anthropic", None)
        discarded = got["discarded_usage"]  # answers bought for items nobody wanted any more
        assert (discarded["input_tokens"], discarded["output_tokens"]) == (
            billed(w).input_tokens,
            billed(w).output_tokens,
        )
        assert Decimal(got["paid"]) > 0
        assert harvest(w) == []


def billed(w: World) -> Usage:
    """What the emulator billed for every batch of the test."""
    batches = httpx.get(f"{w.url}/_emulator/record").json()["batches"]["anthropic"]
    return sum((Usage(**u) for b in batches for u in b["billed"].values()), Usage())
