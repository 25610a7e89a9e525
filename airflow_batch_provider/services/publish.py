"""What publish does to close a run, without Airflow: settle every item, write the results and the report.

:func:`settle_run` puts every item of the run in a final state (an interrupted real-time send
closed, items at the attempts cap and permanent failures to review, the rest where ``unfinished``
says); :func:`publish_run` builds the report, upserts the results table, writes
``results.jsonl`` and ``report.json`` to the run's staging folder, records the run as finished
and gives the workload back. The publish operator tells about it afterwards (alerts, metrics,
the Asset event's extra from :func:`run_event_extra`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batch_provider.core.states import UNFINISHED_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import ItemOutcome, JobRow
from airflow_batch_provider.services import harvest, report
from airflow_batch_provider.services.fallback import ANSWER_LOST, close_interrupted_sends
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """A run publish closed.

    :param summary: the run's report
    :param items: how many items went to the results table
    :param results: where ``results.jsonl`` is
    :param report: where ``report.json`` is
    """

    summary: dict[str, Any]
    items: int
    results: str
    report: str


def late_jobs(ledger: Ledger, workload: str, run_id: str) -> list[JobRow]:
    """The run's jobs with a batch whose files were not complete (a harvest that ran out of time).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    """
    return [
        j
        for j in ledger.get_jobs(workload, run_id)
        if j.batch_id and j.state not in (*harvest.COMPLETE_STATES, "sync")
    ]


def settle_run(
    ledger: Ledger, workload: str, run_id: str, max_attempts: int, unfinished: str
) -> tuple[int, int]:
    """Put every item of the run in a final state; return (items to review, unfinished items settled).

    A real-time send that crashed before its answer was recorded leaves its item in ``fallback``,
    which is not final: it is closed first (the item becomes retryable, then settled).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param max_attempts: the attempts cap (items at it go to review)
    :param unfinished: where items still open go (``review``, ``pending`` or ``skipped``)
    """
    close_interrupted_sends(ledger, workload, run_id, ANSWER_LOST)
    _, to_review = ledger.retry_candidates(workload, run_id, max_attempts)
    settled = ledger.transition(
        workload, run_id, unfinished, UNFINISHED_STATES, error_message="not finished when the run closed"
    )
    if to_review or settled:
        log.info(
            "%d items to review (attempts exhausted or permanent), %d unfinished -> %s",
            to_review,
            settled,
            unfinished,
        )
    return to_review, settled


def write_results(ledger: Ledger, staging: Staging, workload: str, run_id: str) -> str:
    """Write one line per item of the run (id, state, route, output, error) to its ``results.jsonl``.

    :param ledger: the ledger
    :param staging: the staging area
    :param workload: workload name
    :param run_id: the run
    """
    path = staging.run_dir(workload, run_id) / "results.jsonl"
    with staging.writer(path) as fh:
        for row in ledger.iter_item_rows(workload, run_id, shape=ItemOutcome):
            line = {
                "id": row.app_id,
                "state": row.state,
                "route": row.route,
                "output": json.loads(row.output_json) if row.output_json else None,
                "error_code": row.error_code,
                "error_message": row.error_message,
            }
            fh.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
    return str(path)


def publish_run(
    ledger: Ledger,
    staging: Staging,
    workload: str,
    run_id: str,
    provider: str,
    pricing_override: Any,
    max_attempts: int,
) -> Published:
    """Report the settled run, publish its results, write its files, finish it and give the workload back.

    :param ledger: the ledger
    :param staging: the staging area
    :param workload: workload name
    :param run_id: the run
    :param provider: the adapter name
    :param pricing_override: the run's price overrides (``BudgetOptions.pricing_override``)
    :param max_attempts: the attempts cap (the report names it)
    """
    summary = report.build_report(
        ledger, workload, run_id, provider, pricing_override, max_attempts=max_attempts
    )
    items = ledger.publish(workload, run_id)
    results = write_results(ledger, staging, workload, run_id)
    report_path = staging.run_dir(workload, run_id) / "report.json"
    with staging.writer(report_path) as fh:
        fh.write(json.dumps(summary, indent=2).encode("utf-8"))
    ledger.finish_run(workload, run_id, summary)
    ledger.release_workload_lease(workload, run_id)
    log.info("published %d items to the results table and %s", items, results)
    return Published(summary, items, results, str(report_path))


def publish_outcome(summary: Mapping[str, Any], report_path: str) -> dict[str, Any]:
    """What publish returns (its XCom): the counts of the report and where it is.

    :param summary: the run's report
    :param report_path: where ``report.json`` is
    """
    return {
        "items_by_state": summary["items_by_state"],
        "paid_usd": summary["paid"],
        "cost_per_usable_result_usd": summary["cost_per_usable_result"],
        "failed_batches": len(summary["failed_batches"]),
        "in_doubt_jobs": len(summary["in_doubt_jobs"]),
        "possibly_paid_twice": summary["possibly_paid_twice"],
        "report": report_path,
    }


def run_event_extra(workload: str, run_id: str, out: Mapping[str, Any], results: str) -> dict[str, Any]:
    """The ``extra`` of a published run's Asset event: counts, cost and where the results are (JSON-safe).

    :param workload: the workload
    :param run_id: the run
    :param out: the publish task's result
    :param results: where ``results.jsonl`` is
    """
    return {
        "workload": workload,
        "run_id": run_id,
        "items_by_state": {str(k): int(v) for k, v in dict(out["items_by_state"]).items()},
        "paid_usd": None if out["paid_usd"] is None else str(out["paid_usd"]),
        "cost_per_usable_result_usd": None
        if out["cost_per_usable_result_usd"] is None
        else str(out["cost_per_usable_result_usd"]),
        "results": results,
        "report": str(out["report"]),
    }
