"""A dead run's billed answers whose items stay with it, priced once by the run that took its workload over.

:mod:`~airflow_batch_provider.ledger.inheritance` moves a dead run's harvested attempts with their
items. Some items stay with the dead run after the takeover: one in ``fallback`` (a real-time
send cut short, a person's to settle with ``airflow-batch fallback``) and one waiting to be sent
again (``pending``, a retryable failure such as an answer that failed the prompt's schema) whose
record is no longer in the input, so no prepare reopens it. Their earlier answers were billed,
and no report priced them: the dead run never publishes.

So, once the taking run has read its input (prepare, after the items), every harvested attempt
(an outcome recorded) of the dead runs whose item is not the taking run's moves to it, in one
transaction per dead run, audited as :data:`STRANDED` (naming both runs, the jobs and the count).
The items stay where they are. The taking run's report prices those attempts as discarded lines
(:func:`stranded_records`: paid, their answers not this run's) and lists them under ``stranded``;
the dead run, cleared and published later, no longer holds them, so nothing is priced twice.
Only from dead runs that never recorded a report, as for the inheritance.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import and_, exists, select

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.cost import AttemptRecord
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.inheritance import unreported_runs_taken_over
from airflow_batch_provider.ledger.late_harvest import moved_jobs
from airflow_batch_provider.ledger.review import write_audit as _audit

#: The audit action of a dead run's billed answers taken on, for pricing, with its items left behind.
STRANDED: Final = "inherit_stranded"
#: ``AttemptRecord.reason`` of such an answer in the taking run's report.
LEFT_WITH_DEAD_RUN: Final = "left_with_dead_run"


def _held_by(run_id: str) -> Any:
    """SQL over ``abp_attempts``: the attempt's item belongs to ``run_id``."""
    i, a = s.items.c, s.attempts.c
    return exists().where(
        and_(
            i.workload == a.workload,
            i.item_key == a.item_key,
            i.prompt_version == a.prompt_version,
            i.run_id == run_id,
        )
    )


def inherit_stranded_attempts(ledger: Ledger, workload: str, run_id: str, actor: str) -> list[dict[str, Any]]:
    """Make the dead runs' harvested attempts whose items stay with them ``run_id``'s, audited.

    Call it after ``run_id`` read its input (the items the read reopened are its own by then). A
    no-op unless ``run_id`` holds the workload's lease it took over.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that took the workload over
    :param actor: who takes them on (the task), for the audit row
    :return: one ``{from_run, to_run, jobs, attempts}`` per dead run something moved from now
    """
    dead = unreported_runs_taken_over(ledger, workload, run_id)
    a = s.attempts.c
    done: list[dict[str, Any]] = []
    with ledger.engine.begin() as conn:
        for old in dead:
            where = and_(a.workload == workload, a.run_id == old, a.outcome.is_not(None), ~_held_by(run_id))
            jobs = sorted({str(row[0]) for row in conn.execute(select(a.job_id).where(where).distinct())})
            if not jobs:
                continue
            count = int(conn.execute(s.attempts.update().where(where).values(run_id=run_id)).rowcount)
            moved: dict[str, Any] = {"from_run": old, "to_run": run_id, "jobs": jobs, "attempts": count}
            why = (
                f"run {old} lost its workload (lease taken over by run {run_id}) holding {count} billed "
                f"answers of items that stay with it (in fallback, or to be sent again and no longer in "
                f"the input): run {run_id} prices them; the items stay with run {old}"
            )
            _audit(conn, utcnow(), actor, STRANDED, workload, 0, moved, why)
            done.append(moved)
    return done


def stranded_records(ledger: Ledger, workload: str, run_id: str) -> list[AttemptRecord]:
    """The run's billed attempts whose items are another run's, as discarded lines for its report.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that took them on
    """
    a, j = s.attempts.c, s.jobs.c
    query = (
        select(s.attempts, j.provider, j.model)
        .join(s.jobs, j.job_id == a.job_id)
        .where(a.workload == workload, a.run_id == run_id, a.outcome.is_not(None), ~_held_by(run_id))
        .order_by(a.job_id, a.custom_id)
    )
    with ledger.engine.connect() as conn:
        return [
            AttemptRecord(
                usage=Usage(
                    input_tokens=int(row["input_tokens"]),
                    output_tokens=int(row["output_tokens"]),
                    cached_input_tokens=int(row["cached_input_tokens"]),
                    cache_write_tokens=int(row["cache_write_tokens"]),
                ),
                mode="sync" if row["mode"] == "sync" else "batch",
                discarded=True,
                reason=LEFT_WITH_DEAD_RUN,
                provider=row["provider"],
                model=row["model"],
            )
            for row in conn.execute(query).mappings()
        ]


def stranded(ledger: Ledger, workload: str, run_id: str) -> list[dict[str, Any]]:
    """What ``run_id`` took on from dead runs whose items stay with them: the run, jobs, attempts.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the taking run
    """
    return moved_jobs(ledger, workload, run_id, STRANDED)
