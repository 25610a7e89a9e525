"""Finding and moving a finished run's unharvested job (ledger/late_harvest.py).

On SQLite and PostgreSQL (the ``ledger_url`` fixture). A job of a finished run that holds a batch
nobody harvested is found by its attempts with no outcome, whatever became of its items while it
was in doubt (back to ``submitted`` by the resolve, skipped by a person, ...), and moves to the
run that harvests it with every item it still holds.
"""

from __future__ import annotations

import pytest

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.late_harvest import move_job_to_run, resolved_jobs_of_finished_runs
from tests.unit.ledger.test_store import WL
from tests.unit.ledger.test_unharvested import IDS, in_doubt_at_the_deadline

NEXT = "r2"


def published_in_doubt(ledger: Ledger, skip: bool) -> str:
    """A job in doubt at the deadline (its items in review), maybe skipped, its run published, then resolved."""
    ledger.start_run(WL, "r1", "anthropic", "m")
    job_id, _ = in_doubt_at_the_deadline(ledger)
    if skip:
        assert ledger.skip_review(WL, error_code="in_doubt", actor="ops", reason="not needed") == len(IDS)
    ledger.finish_run(WL, "r1", {"in_doubt_jobs": [job_id]})
    ledger.resolve_job(job_id, "batch_late", "ops", "found in the console")
    ledger.start_run(WL, NEXT, "anthropic", "m")
    return job_id


@pytest.mark.parametrize("skip", [False, True], ids=["resolved back to submitted", "skipped while in doubt"])
def test_a_finished_runs_resolved_job_is_found_by_its_unharvested_attempts_whatever_its_items_became(
    ledger: Ledger, skip: bool
) -> None:
    job_id = published_in_doubt(ledger, skip)
    states = {r["state"] for r in ledger.iter_items(WL, "r1", columns=["state"])}
    assert states == ({"skipped"} if skip else {"submitted"})
    assert [j.job_id for j in resolved_jobs_of_finished_runs(ledger, WL, NEXT)] == [job_id]
    assert move_job_to_run(ledger, job_id, NEXT, "prepare") == len(IDS)
    assert list(ledger.iter_items(WL, "r1", columns=["state"])) == []
    assert resolved_jobs_of_finished_runs(ledger, WL, NEXT) == []  # the job is the next run's now
    assert move_job_to_run(ledger, job_id, NEXT, "prepare") == -1


def test_a_job_of_a_run_not_finished_yet_is_left_to_that_run(ledger: Ledger) -> None:
    ledger.start_run(WL, "r1", "anthropic", "m")
    job_id, _ = in_doubt_at_the_deadline(ledger)
    ledger.resolve_job(job_id, "batch_late", "ops", "found in the console")
    ledger.start_run(WL, NEXT, "anthropic", "m")
    assert resolved_jobs_of_finished_runs(ledger, WL, NEXT) == []
