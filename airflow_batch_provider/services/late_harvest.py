"""The next run harvests what an earlier, finished run left unharvested (a batch resolved late).

Issue 18: "Resolving a job must harvest what its batch answered". A job resolved to its batch
after its run published holds its items ``submitted`` and guarded, and its run is history (its
publish is never run again). Each new run's prepare, and its publish, call
:func:`harvest_earlier_runs`: for every such job whose batch has ended, the files are fetched
(:func:`~airflow_batch_provider.services.harvest.download_job`), the job moves to this run
(:func:`~airflow_batch_provider.ledger.late_harvest.move_job_to_run`) and is reconciled
(:func:`~airflow_batch_provider.services.harvest.reconcile_job`): its items get their answers
(succeeded, retryable, permanent as usual) and are this run's from there, and this run's report
prices the batch once and names it under ``late_harvest``. A batch that has not ended stays with
its run, guarded, and the log says so; a later call harvests it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.late_harvest import move_job_to_run, resolved_jobs_of_finished_runs
from airflow_batch_provider.services.harvest import download_job, reconcile_job
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)


def harvest_earlier_runs(
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    workload: str,
    run_id: str,
    template: PromptTemplate,
    pricer: Callable[[str], Callable[[Usage], Decimal]],
    actor: str,
) -> list[dict[str, Any]]:
    """Harvest, into ``run_id``, the ended batches that finished runs of the workload left unharvested.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area
    :param workload: the workload
    :param run_id: the run that harvests them
    :param template: the workload's prompt (output validation)
    :param pricer: the batch line pricer of a model
    :param actor: who harvests (the task), for the audit row
    :return: one reconcile summary per job harvested (with ``from_run``)
    """
    done: list[dict[str, Any]] = []
    for job in resolved_jobs_of_finished_runs(ledger, workload, run_id):
        if not download_job(ledger, adapter, staging, job.job_id).complete:
            log.warning(
                "job %s of finished run %s holds batch %s, which has not ended (or whose files are not "
                "complete yet): its items stay with that run, guarded (never sent again); the next run "
                "of the workload, or this run's publish, harvests it once it has ended",
                job.job_id,
                job.run_id,
                job.batch_id,
            )
            continue
        moved = move_job_to_run(ledger, job.job_id, run_id, actor)
        if moved < 0:
            continue  # another task moved or harvested it meanwhile
        summary = reconcile_job(ledger, adapter, staging, job.job_id, template, pricer(job.model))
        log.info(
            "late harvest: job %s of finished run %s (batch %s, %d items) harvested into run %s: %s",
            job.job_id,
            job.run_id,
            job.batch_id,
            moved,
            run_id,
            summary,
        )
        done.append({**summary, "from_run": job.run_id})
    return done
