"""A task of a finished run applies nothing to its jobs: the next run's late harvest does.

A run is finished once its publish recorded its report (``abp_runs.finished_at``). Its report is
history, and so are its attempts: a batch that ends after that (a job in doubt past the deadline,
found when the run's tasks are cleared and run again) is priced by no report if the finished
run's own rerun applies it in place, since its publish only returns the report it recorded. So
reconcile refuses a job of a finished run (it applies nothing, and says why) and submit creates
no batch for one (its items were settled by its publish; creating would pay for them again);
the next run of the workload takes the job over and prices its batch once, under
``late_harvest`` (:mod:`~airflow_batch_provider.services.late_harvest`). A finished run that is
the workload's newest, its prepare cleared, is reopened (not finished) and applies as usual.
"""

from __future__ import annotations

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.ledger.runs import finished_run


def finished_run_refusal(ledger: Ledger, job: JobRow, task: str) -> str | None:
    """Why ``task`` may not write ``job``'s results or batches: its run finished (``None``: it may).

    :param ledger: the ledger
    :param job: the job
    :param task: what the task would do (``reconcile``, ``create a batch``), for the message
    """
    finished = finished_run(ledger, job.workload, job.run_id)
    if finished is None:
        return None
    batch = f"batch {job.batch_id}" if job.batch_id else "no batch yet"
    return (
        f"job {job.job_id} (round {job.round}, {batch}) belongs to run {job.run_id} of workload "
        f"{job.workload}, which finished at {finished.finished_at.isoformat()} (its report is history); "
        f"a task of a finished run does not {task}. The next run of the workload harvests the job's "
        "batch once it has ended and prices it in its own report under late_harvest: start that run "
        "(or clear the prepare of this run, when it is the workload's newest, to reopen it)."
    )
