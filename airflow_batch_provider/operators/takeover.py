"""What the batch tasks do about a workload taken over from a dead run (bug 8).

Prepare adopts the dead run's jobs in flight (:func:`adopt_dead_runs_jobs`, see
:mod:`~airflow_batch_provider.ledger.adoption`) and inherits what it harvested and never reported
(:func:`inherit_dead_runs_lines`, see :mod:`~airflow_batch_provider.ledger.inheritance`); a cleared task of the dead run (or of a finished
run whose batch a later run harvested late) that still names a job moved to another run leaves it
to that run (:func:`moved_to_another_run`), so nothing is uploaded, created, applied or priced twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.ledger.adoption import adopt_in_flight_jobs
from airflow_batch_provider.ledger.inheritance import inherit_harvested_lines
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.ledger.stranded_attempts import inherit_stranded_attempts
from airflow_batch_provider.task_glue import MOVED as MOVED
from airflow_batch_provider.task_glue import PASS_THROUGH_ROUTES as PASS_THROUGH_ROUTES
from airflow_batch_provider.task_glue import attempt_owner

log = logging.getLogger(__name__)


def adopt_dead_runs_jobs(task: Any, run_id: str, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Adopt into this run the jobs in flight of the dead runs whose workload it took over.

    Each job joins this run's round 1, whose tasks wait on it, download and reconcile it; its
    items are not staged again.

    :param task: the prepare task (its ledger and workload)
    :param run_id: the Airflow run id
    :param context: the task context
    """
    adopted = adopt_in_flight_jobs(task.ledger, task.workload, run_id, attempt_owner(context))
    for job in adopted:
        log.warning(
            "adopted job %s (%s, batch %s, %d items) of run %s, which lost workload %r to this run: "
            "this run's round 1 waits on it, harvests it and prices it in its report; its items are not "
            "sent again",
            job["job_id"],
            job["state"],
            job["batch_id"] or "none yet",
            job["items"],
            job["from_run"],
            task.workload,
        )
    inherit_dead_runs_lines(task, run_id, context)
    return adopted


def inherit_dead_runs_lines(
    task: Any, run_id: str, context: Mapping[str, Any], after_read: bool = False
) -> list[dict[str, Any]]:
    """Take on what the dead runs whose workload this run took over harvested and never reported.

    Called before the items are read (the dead runs' settled items become this run's as they are)
    and after (the harvested attempts of items the read reopened follow them, and those of items
    that stay with the dead run, in ``fallback`` or no longer in the input, are this run's to
    price); see :mod:`~airflow_batch_provider.ledger.inheritance` and
    :mod:`~airflow_batch_provider.ledger.stranded_attempts`. This run's report prices them once.

    :param task: the prepare task (its ledger and workload)
    :param run_id: the Airflow run id
    :param context: the task context
    :param after_read: the run has read its input
    """
    moved = inherit_harvested_lines(task.ledger, task.workload, run_id, attempt_owner(context))
    if after_read:
        for left in inherit_stranded_attempts(task.ledger, task.workload, run_id, attempt_owner(context)):
            log.warning(
                "run %s lost workload %r to this run holding %d billed answers of items that stay with "
                "it (in fallback, or no longer in the input; jobs %s): this run's report prices them, once",
                left["from_run"],
                task.workload,
                left["attempts"],
                ", ".join(left["jobs"]),
            )
    for part in moved:
        log.warning(
            "run %s lost workload %r to this run after it harvested %d answers (%d items, jobs %s) and "
            "%d other billed lines it never reported: this run's report prices them, once",
            part["from_run"],
            task.workload,
            part["attempts"],
            part["items"],
            ", ".join(part["jobs"]) or "-",
            part["extra_lines"],
        )
    return moved


def moved_to_another_run(job: JobRow, context: Mapping[str, Any]) -> bool:
    """Whether ``job`` now belongs to another run, so this run's task leaves it alone (and says so).

    A job moves only when another run took it on: adopted after a takeover of this run's workload
    or harvested late after this run finished. A cleared task of this run that still names it acts
    on nothing: the run that owns it now uploads, creates, downloads, applies and prices it, once.

    :param job: the job the task was given
    :param context: the task context
    """
    if job.run_id == context["run_id"]:
        return False
    log.warning(
        "job %s is run %s's now (adopted or harvested late; see the audit log): this task of run %s "
        "leaves it to that run, which applies and prices it once",
        job.job_id,
        job.run_id,
        context["run_id"],
    )
    return True
