"""A job of a finished run is refused to reconcile and submit, with the remedy; one of an open run is not."""

from __future__ import annotations

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.finished_jobs import finished_run_refusal
from tests.unit.ledger.jobs import job_row

WL, RUN = "wl", "run-1"


def test_a_job_of_an_open_run_may_be_applied_and_of_a_finished_one_is_refused_naming_the_run_and_the_remedy(
    ledger: Ledger,
) -> None:
    ledger.start_run(WL, RUN, "openai", "gpt-4o-mini")
    row = job_row(WL, RUN, 0)
    ledger.record_job(row, [])
    job = ledger.get_job(row["job_id"])
    assert finished_run_refusal(ledger, job, "reconcile") is None

    ledger.finish_run(WL, RUN, {"items": 0})
    refusal = finished_run_refusal(ledger, job, "create a batch")
    assert refusal is not None
    for part in (job.job_id, "no batch yet", f"run {RUN}", "does not create a batch", "late_harvest"):
        assert part in refusal, part
    assert "clear the prepare of this run" in refusal
