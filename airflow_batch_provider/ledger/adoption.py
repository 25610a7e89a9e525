"""A dead run's work in flight, adopted by the run that took its workload over.

A run killed where no scheduler marks it failed (``airflow dags test``, a lost worker), or one
Airflow marked failed, keeps its jobs: created batches, billed at the provider, perhaps finished,
that none of its tasks will ever wait on again. When another run takes the workload's lease over
(:meth:`Ledger.acquire_workload_lease` with ``takeover``, audited as :data:`TAKEOVER`), that run
adopts them in its prepare (:func:`adopt_in_flight_jobs`): every job of the dead run (and of the
dead runs that one had taken over in turn) that is not reconciled and not sent through the
real-time API, and still has items ``staged`` or ``submitted`` under it, moves to the new run with
its items, attempts and extra lines in one transaction, audited as :data:`ADOPTED` (naming both
runs), into the new run's round 1 after that run's own chunks. The new run's round-1 tasks then
take each job up where the dead run left it, with the rules every job already follows: a staged
job is uploaded and created (the create looks its batch up by key first), a job in doubt is
resolved by the wait task, a submitted one is waited on, downloaded and reconciled. Its items are
never staged again meanwhile: they are the new run's, in flight, and the send guard
(:mod:`~airflow_batch_provider.ledger.unharvested`) keeps them out of every other send. The new
run's report prices the adopted batches once (their attempts are its own) and lists them under
``adopted``. The dead run never published; if it is cleared and run again later, its jobs are
no longer its own, so it applies and pays nothing twice.

Items a dead run left in ``fallback`` (a real-time send cut short) are not adopted: their answer
may be lost after the provider billed it, which a person settles (``airflow-batch fallback``).
"""

from __future__ import annotations

import json
from typing import Any, Final

from sqlalchemy import exists, select

from airflow_batch_provider.core.states import ADOPTABLE_ITEM_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.late_harvest import move_job_to_run, moved_jobs
from airflow_batch_provider.ledger.records import JobRow

#: The audit action of a lease taken over from a run that is no longer alive.
TAKEOVER: Final = "takeover_lease"
#: The audit action of a dead run's job in flight moved to the run that took its workload over.
ADOPTED: Final = "adopt_job"


def dead_runs_taken_over(ledger: Ledger, workload: str, run_id: str) -> list[str]:
    """The unfinished runs whose workload lease ``run_id`` took over, directly or through another dead run.

    Read from the audit table's :data:`TAKEOVER` rows (``from_run`` to ``to_run``), followed back
    from ``run_id``; a finished run is left out (what it left is the late harvest's).

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that holds the lease now
    """
    c, r = s.audit.c, s.runs.c
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(c.target).where(c.workload == workload, c.action == TAKEOVER).order_by(c.id)
        ).all()
        finished = {
            str(row[0])
            for row in conn.execute(
                select(r.run_id).where(r.workload == workload, r.finished_at.is_not(None))
            )
        }
    edges: dict[str, set[str]] = {}
    for (target,) in rows:
        data = json.loads(target)
        if data.get("from_run") and data.get("to_run"):
            edges.setdefault(str(data["to_run"]), set()).add(str(data["from_run"]))
    found: list[str] = []
    todo = sorted(edges.get(run_id, ()))
    while todo:
        run = todo.pop(0)
        if run == run_id or run in found:
            continue
        found.append(run)
        todo.extend(sorted(edges.get(run, ())))
    return [run for run in found if run not in finished]


def in_flight_jobs(ledger: Ledger, workload: str, runs: list[str]) -> list[JobRow]:
    """The jobs of ``runs`` that still hold items in flight: not reconciled, not real-time.

    :param ledger: the ledger
    :param workload: the workload
    :param runs: the dead runs (:func:`dead_runs_taken_over`)
    """
    if not runs:
        return []
    j, i = s.jobs.c, s.items.c
    query = (
        select(j.job_id)
        .where(
            j.workload == workload,
            j.run_id.in_(runs),
            j.state.not_in(("reconciled", "sync")),
            exists().where(i.job_id == j.job_id, i.run_id == j.run_id, i.state.in_(ADOPTABLE_ITEM_STATES)),
        )
        .order_by(j.run_id, j.round, j.chunk_index)
    )
    with ledger.engine.connect() as conn:
        ids = [str(row[0]) for row in conn.execute(query)]
    return [ledger.get_job(job_id) for job_id in ids]


def adopt_in_flight_jobs(ledger: Ledger, workload: str, run_id: str, actor: str) -> list[dict[str, Any]]:
    """Move the dead runs' jobs in flight to ``run_id`` (which holds the workload's lease), audited.

    A no-op unless ``run_id`` holds the lease it took over; a second call finds nothing left to
    move (a cleared prepare), so it returns what this call moved, not everything adopted.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that took the workload over
    :param actor: who adopts them (the task), for the audit row
    :return: one ``{job_id, batch_id, state, from_run, items}`` per job moved now
    """
    lease = ledger.workload_lease(workload)
    if lease is None or lease.run_id != run_id:
        return []
    dead = dead_runs_taken_over(ledger, workload, run_id)
    done: list[dict[str, Any]] = []
    for job in in_flight_jobs(ledger, workload, dead):
        reason = (
            f"run {job.run_id} lost its workload (lease taken over by run {run_id}) with job {job.job_id} "
            f"{job.state} (batch {job.batch_id or 'none yet'}): run {run_id} carries it on"
        )
        moved = move_job_to_run(
            ledger,
            job.job_id,
            run_id,
            actor,
            action=ADOPTED,
            only_from=frozenset(dead),
            into_first_round=True,
            reason=reason,
        )
        if moved >= 0:
            done.append(
                {
                    "job_id": job.job_id,
                    "batch_id": job.batch_id,
                    "state": job.state,
                    "from_run": job.run_id,
                    "items": moved,
                }
            )
    return done


def adopted_jobs(ledger: Ledger, workload: str, run_id: str) -> list[dict[str, Any]]:
    """The jobs ``run_id`` adopted from dead runs: job, batch, the run it came from, items.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the adopting run
    """
    return moved_jobs(ledger, workload, run_id, ADOPTED)
