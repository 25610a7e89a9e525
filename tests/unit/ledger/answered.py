"""Runs of a workload whose answers are given, driven through the ledger as the tasks drive it (chaining tests).

Each item's input text is its answer's JSON, so that a changed answer is a changed input: the item
is prepared again and answered again, and an unchanged one is ``unchanged`` with its earlier answer.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.runs import RunPrompt, record_run_prompt
from airflow_batch_provider.ledger.store import UpsertStats
from tests.unit.ledger.nights import stage_pending
from tests.unit.ledger.store_support import cost_of, prep


def answered_run(
    ledger: Ledger,
    workload: str,
    run_id: str,
    answers: Mapping[str, Any],
    *,
    failing: Collection[str] = (),
    version: str = "v1",
    finish: bool = True,
) -> UpsertStats:
    """Run ``workload`` over ``answers`` (app id -> the answer it gets); publish it, and finish it unless told.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run
    :param answers: app id -> its answer (the item's input is the answer's JSON)
    :param failing: app ids answered with a permanent failure instead
    :param version: the prompt version the run uses
    :param finish: record the run as finished (publish's report), as a publish that ended does
    """
    ledger.start_run(workload, run_id, "openai", "gpt-4o-mini")
    record_run_prompt(ledger, workload, run_id, RunPrompt(version, f"sha-{version}"))
    items = [prep(app_id, json.dumps(answer), version=version) for app_id, answer in sorted(answers.items())]
    stats = ledger.upsert_items(workload, run_id, items)
    job_id, cids = stage_pending(ledger, workload, run_id)
    if cids:
        ledger.mark_submitted(job_id, f"batch-{job_id}", f"file-{job_id}")
        results = [
            ItemResult(
                cid, "failed_permanent", usage=Usage(7, 0), error_code="400", error_message="bad input"
            )
            if app_id in failing
            else ItemResult(cid, "succeeded", output=answers[app_id], usage=Usage(100, 10))
            for app_id, cid in cids.items()
        ]
        ledger.apply_results(job_id, results, cost_of)
        ledger.update_job(job_id, state="reconciled", reconciled_at=utcnow())
    ledger.publish(workload, run_id)
    if finish:
        ledger.finish_run(workload, run_id, {"run": run_id})
    return stats
