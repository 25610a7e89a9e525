"""The send guard: no item is sent again while its current job holds a batch not yet harvested.

DESIGN.md: "No path (a new run, re-drive, resolve, skip) sends an item whose current job holds a
batch that is live or billed and not yet harvested." A job *holds* such a batch when its create
may have reached the provider and its results are not all in the ledger:

- it is ``in_doubt`` (the create's outcome is unknown: a batch may exist and bill every item) or
  ``submitting`` (a create may be in flight);
- it has a batch id and is not harvested (not ``downloaded``/``reconciled``): the batch runs, or
  ended and billed answers nobody has applied yet.

Every path that makes an item sendable again asks this module, in the same transaction as its
write: :meth:`Ledger.redrive` (the CLI, the review page) refuses with
:class:`~airflow_batch_provider.exceptions.BatchNotHarvestedError`; a new run's prepare
(:meth:`Ledger.upsert_items`) leaves such items with their run, as in flight. A job resolved to its
batch (:meth:`Ledger.resolve_job`) takes its items back as ``submitted`` so the batch's answers
are harvested, never sent again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.states import HARVESTED_JOB_STATES, UNKNOWN_CREATE_JOB_STATES
from airflow_batch_provider.exceptions import BatchNotHarvestedError
from airflow_batch_provider.ledger import schema as s


def holds_unharvested_batch(jobs: Any = None) -> Any:
    """SQL: the job (a row of ``abp_jobs``, or an alias of it) holds a batch that is live or billed, not harvested.

    :param jobs: the jobs table or an alias (default: ``abp_jobs``)
    """
    j = (jobs if jobs is not None else s.jobs).c
    return or_(
        j.state.in_(sorted(UNKNOWN_CREATE_JOB_STATES)),
        and_(j.batch_id.is_not(None), j.state.not_in(sorted(HARVESTED_JOB_STATES))),
    )


def _guarded(where: Any) -> Any:
    """``abp_items`` joined to each item's current job and attempt, where the guard applies.

    An item is guarded when its job holds an unharvested batch and no outcome of its attempt in
    that job is recorded yet: the batch may still answer (and bill) it. An answer the ledger has
    already applied is harvested, whatever the job's state.
    """
    i, j, a = s.items.c, s.jobs.c, s.attempts.c
    joined = s.items.join(s.jobs, j.job_id == i.job_id).outerjoin(
        s.attempts, and_(a.job_id == i.job_id, a.custom_id == i.custom_id)
    )
    return joined, and_(where, holds_unharvested_batch(), a.outcome.is_(None))


def guarded_jobs(conn: Connection, where: Any) -> list[tuple[str, str, str | None, int]]:
    """Of the items ``where`` addresses, the jobs that hold an unharvested batch that may answer them.

    :param conn: an open transaction
    :param where: SQL over ``abp_items``: the items a path is about to make sendable
    :return: ``(job_id, job state, batch id, items addressed)`` per job, by job id
    """
    j = s.jobs.c
    joined, cond = _guarded(where)
    q = (
        select(j.job_id, j.state, j.batch_id, func.count())
        .select_from(joined)
        .where(cond)
        .group_by(j.job_id, j.state, j.batch_id)
        .order_by(j.job_id)
    )
    return [(str(r[0]), str(r[1]), r[2], int(r[3])) for r in conn.execute(q)]


def guarded_items(conn: Connection, where: Any) -> set[tuple[str, str]]:
    """Of the items ``where`` addresses, the ``(item key, prompt version)`` of those guarded.

    A new run's prepare leaves these with their run, whatever their input.

    :param conn: an open transaction
    :param where: SQL over ``abp_items``
    """
    i = s.items.c
    joined, cond = _guarded(where)
    q = select(i.item_key, i.prompt_version).select_from(joined).where(cond)
    return {(str(r[0]), str(r[1])) for r in conn.execute(q)}


def refuse_unharvested(conn: Connection, action: str, workload: str, where: Any) -> None:
    """Refuse ``action`` when any item ``where`` addresses belongs to a job holding an unharvested batch.

    :param conn: an open transaction (the caller's write follows in it)
    :param action: what is refused (``redrive``)
    :param workload: the workload
    :param where: SQL over ``abp_items``: the items the action would make sendable
    :raises BatchNotHarvestedError: such items exist; nothing may move
    """
    jobs = guarded_jobs(conn, where)
    if jobs:
        raise BatchNotHarvestedError(action, workload, jobs)
