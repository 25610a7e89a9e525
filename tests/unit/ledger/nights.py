"""Nights of one workload driven through the ledger the way the tasks drive it (retention tests).

One night: start the run, prepare its items (skip-unchanged), stage the pending ones in one job,
submit it, apply the batch's answers (a success each, a permanent failure for the failing ones),
reconcile the job, publish, finish the run with a report.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import make_custom_id
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import UpsertStats
from tests.unit.ledger.jobs import job_row
from tests.unit.ledger.store_support import cost_of, prep


def stage_pending(
    ledger: Ledger, workload: str, run_id: str, states: tuple[str, ...] = ("pending",)
) -> tuple[str, dict[str, str]]:
    """Stage the run's items in ``states`` in one job; return its id and each app id's custom id."""
    rows = list(ledger.iter_items(workload, run_id, states=list(states), columns=["app_id", "attempts"]))
    job_id = f"{workload}:{run_id}:r1:c00000"
    cids: dict[str, str] = {}
    placements = []
    for row in rows:
        attempt = int(row["attempts"]) + 1
        cid = make_custom_id(row["item_key"], attempt, 0)
        cids[str(row["app_id"])] = cid
        placements.append((row["item_key"], row["prompt_version"], cid, attempt))
    if placements:
        ledger.record_job(job_row(workload, run_id, len(placements)), placements)
    return job_id, cids


def answer(
    ledger: Ledger,
    job_id: str,
    cids: Mapping[str, str],
    failing: Collection[str],
    outputs: Mapping[str, Any] | None = None,
) -> None:
    """Submit the job, apply an answer per line (``outputs``' or ``{"label": app_id}``) and reconcile it."""
    ledger.mark_submitted(job_id, f"batch-{job_id}", f"file-{job_id}")
    given = outputs or {}
    results = [
        ItemResult(cid, "failed_permanent", usage=Usage(7, 0), error_code="400", error_message="bad input")
        if app_id in failing
        else ItemResult(
            cid, "succeeded", output=given.get(app_id, {"label": app_id}), usage=Usage(100 + len(app_id), 10)
        )
        for app_id, cid in cids.items()
    ]
    ledger.apply_results(job_id, results, cost_of)
    ledger.update_job(job_id, state="reconciled", reconciled_at=utcnow())


def night(
    ledger: Ledger,
    workload: str,
    run_id: str,
    inputs: Mapping[str, str],
    failing: Collection[str] = (),
    outputs: Mapping[str, Any] | None = None,
    version: str = "v1",
) -> UpsertStats:
    """Run one whole night of ``workload`` over ``inputs`` (app id to its text); return prepare's counts.

    ``outputs``: the answer of each app id sent (default ``{"label": app_id}``); ``version``: the
    prompt version.
    """
    ledger.start_run(workload, run_id, "openai", "gpt-4o-mini")
    stats = ledger.upsert_items(
        workload, run_id, [prep(app_id, text, version) for app_id, text in sorted(inputs.items())]
    )
    job_id, cids = stage_pending(ledger, workload, run_id)
    if cids:
        answer(ledger, job_id, cids, failing, outputs)
    ledger.publish(workload, run_id)
    ledger.finish_run(workload, run_id, {"night": run_id, "cost": str(ledger.run_cost(workload, run_id))})
    return stats


def what_a_night_reads(ledger: Ledger, workload: str, run_id: str) -> dict[str, Any]:
    """Everything the next night's stages and the UI read of ``workload``, keyed for comparison."""
    items = {
        str(r["app_id"]): (r["state"], r["route"], r["output_json"], r["input_hash"], r["succeeded_hash"])
        for r in ledger.iter_items(workload, run_id)
    }
    with ledger.engine.connect() as conn:
        results = {
            str(r.app_id): (r.state, r.output_json)
            for r in conn.execute(select(s.published).where(s.published.c.workload == workload))
        }
    costs = sorted(
        (
            str(r["app_id"]),
            str(r["state"]),
            r["last_usage"],
            tuple((a["usage"], a["outcome"]) for a in r["attempts"]),
        )
        for r in ledger.iter_cost_rows(workload, run_id)
    )
    review = [(r.app_id, r.error_code) for r in ledger.review_items(workload, limit=10_000)]
    return {
        "items": items,
        "results": results,
        "costs": costs,
        "review": review,
        "run_cost": ledger.run_cost(workload, run_id) or Decimal(0),
        "reports": [(r["run_id"], r["report_json"]) for r in ledger.runs(workload, limit=1000)],
    }
