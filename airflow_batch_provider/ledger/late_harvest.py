"""A batch resolved after its run finished: found, and moved to the run that harvests it.

A job resolved to its batch (``airflow-batch jobs resolve JOB --batch-id ID``) after its run
published is ``submitted`` with its items, and the send guard keeps them from every other send
(:mod:`~airflow_batch_provider.ledger.unharvested`). Its own run is history: its publish is not
run again (a cleared one returns the report it recorded). So the next run of the workload
harvests it (:mod:`~airflow_batch_provider.services.late_harvest`): once the batch has ended and
its files are complete, the job, its items, its attempts and its billed extra lines move to that
run in one transaction (audited as ``late_harvest``, naming both runs), and that run applies the
answers and prices them in its own report. The finished run's report never changes, and its
harvested attempts stay with it: only the attempts it never harvested (no outcome) leave it.
"""

from __future__ import annotations

import json
from typing import Any, Final

from sqlalchemy import and_, exists, func, select

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.states import UNKNOWN_CREATE_JOB_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.ledger.review import write_audit as _audit

#: The audit action of a job moved to the run that harvests it.
LATE_HARVEST: Final = "late_harvest"


def resolved_jobs_of_finished_runs(ledger: Ledger, workload: str, run_id: str) -> list[JobRow]:
    """The workload's jobs of other, finished runs that hold a batch nobody harvested yet.

    These are jobs resolved to their batch after their run published (or whose batch outlived
    the run, or found by the finished run's own rerun, which applies nothing:
    :mod:`~airflow_batch_provider.services.finished_jobs`): a batch id, not reconciled, not in
    doubt, not sent through the real-time API, and an attempt of the job with no outcome yet (a
    line the batch may have answered and billed that nobody harvested), whatever became of the
    job's items meanwhile (still ``submitted``, or in review, skipped, re-driven while the job
    was in doubt). A ``downloaded`` one is among them: its files are complete and were never
    applied (fetched by a call that stopped before the move).

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that asks (its own jobs are its own tasks' concern)
    """
    j, r, a = s.jobs.c, s.runs.c, s.attempts.c
    query = (
        select(j.job_id)
        .select_from(s.jobs.join(s.runs, and_(r.workload == j.workload, r.run_id == j.run_id)))
        .where(
            j.workload == workload,
            j.run_id != run_id,
            j.batch_id.is_not(None),
            j.state.not_in(sorted({"reconciled", *UNKNOWN_CREATE_JOB_STATES, "sync"})),
            exists().where(a.job_id == j.job_id, a.outcome.is_(None)),
            r.finished_at.is_not(None),
            r.report_json.is_not(None),
        )
        .order_by(j.job_id)
    )
    with ledger.engine.connect() as conn:
        ids = [str(row[0]) for row in conn.execute(query)]
    return [ledger.get_job(job_id) for job_id in ids]


def move_job_to_run(
    ledger: Ledger,
    job_id: str,
    run_id: str,
    actor: str,
    *,
    action: str = LATE_HARVEST,
    only_from: frozenset[str] | None = None,
    into_first_round: bool = False,
    reason: str | None = None,
) -> int:
    """Move an unharvested job, its items, attempts and extra lines to ``run_id``, audited.

    In one transaction, and only while the job still is another run's (one of ``only_from``, when
    given) and unharvested (a second mover finds it moved and does nothing). The items moved are
    those still in the job and its old run, whatever their state (``submitted``, or in review or
    skipped while the job was in doubt: the run that harvests the batch prices every line of it
    through its items, an answer for an item nobody wants any more as discarded); the attempts are
    the job's own. A late harvest (:func:`resolved_jobs_of_finished_runs`, audited as
    :data:`LATE_HARVEST`) keeps the job's round; an adoption
    (:mod:`~airflow_batch_provider.ledger.adoption`) puts it into ``run_id``'s first round after
    that run's own chunks (so its round 1 waits on it, and its files never share a name with
    another job's) and drops the dead owner's claim (its count stays: the next claimer looks the
    batch up by its key before it creates anything).

    :param ledger: the ledger
    :param job_id: the job (see :func:`resolved_jobs_of_finished_runs`)
    :param run_id: the run that harvests it
    :param actor: who moves it (the task)
    :param action: the audit action (default :data:`LATE_HARVEST`)
    :param only_from: move it only while it is one of these runs'
    :param into_first_round: renumber it into ``run_id``'s round 1 and drop its claim
    :param reason: the audit reason (default: the late harvest's)
    :return: the items moved (``-1``: the job was no longer there to move)
    """
    j, i, a, x = s.jobs.c, s.items.c, s.attempts.c, s.extra_lines.c
    with ledger.engine.begin() as conn:
        job = conn.execute(select(s.jobs).where(j.job_id == job_id).with_for_update()).mappings().first()
        if job is None or job["run_id"] == run_id or job["state"] == "reconciled":
            return -1
        if only_from is not None and job["run_id"] not in only_from:
            return -1
        old = str(job["run_id"])
        values: dict[str, Any] = {"run_id": run_id}
        target = {"job_id": job_id, "batch_id": job["batch_id"], "from_run": old, "to_run": run_id}
        if into_first_round:
            last = conn.execute(
                select(func.max(j.chunk_index)).where(
                    j.workload == job["workload"], j.run_id == run_id, j.round == 1
                )
            ).scalar()
            values.update(round=1, chunk_index=(-1 if last is None else int(last)) + 1)
            values.update(claim_owner=None, claim_expires_at=None)
            target.update(from_round=int(job["round"]), from_chunk=int(job["chunk_index"]))
        conn.execute(s.jobs.update().where(j.job_id == job_id).values(**values))
        moved = conn.execute(
            s.items.update().where(i.job_id == job_id, i.run_id == old).values(run_id=run_id)
        ).rowcount
        conn.execute(s.attempts.update().where(a.job_id == job_id).values(run_id=run_id))
        conn.execute(s.extra_lines.update().where(x.job_id == job_id).values(run_id=run_id))
        why = (
            reason
            or f"run {old} finished before batch {job['batch_id']} was harvested; run {run_id} harvests it"
        )
        _audit(conn, utcnow(), actor, action, str(job["workload"]), int(moved), target, why)
    return int(moved)


def moved_jobs(
    ledger: Ledger, workload: str, run_id: str, action: str = LATE_HARVEST
) -> list[dict[str, Any]]:
    """The jobs moved to ``run_id`` (audited as ``action``): job, batch, the run it came from, items.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run they were moved to
    :param action: :data:`LATE_HARVEST`, or an adoption's action
    """
    c = s.audit.c
    query = select(c.target, c.item_count).where(c.workload == workload, c.action == action).order_by(c.id)
    out: list[dict[str, Any]] = []
    with ledger.engine.connect() as conn:
        for target, count in conn.execute(query):
            data = json.loads(target)
            if data.get("to_run") == run_id:
                out.append({**data, "items": int(count)})
    return out


def late_harvests(ledger: Ledger, workload: str, run_id: str) -> list[dict[str, Any]]:
    """The jobs moved to ``run_id`` to be harvested there: job, batch, the run it came from, items.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that harvested them
    """
    return moved_jobs(ledger, workload, run_id, LATE_HARVEST)
