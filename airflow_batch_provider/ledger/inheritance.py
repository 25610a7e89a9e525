"""What a dead run harvested and never reported, priced once by the run that took its workload over.

A run killed after it reconciled some of its batches (a kill in round 2, or between the last
reconcile and publish) billed answers that its items hold, and no report priced them: the dead
run never publishes, and adoption (:mod:`~airflow_batch_provider.ledger.adoption`) takes only its
jobs in flight. So the run that took the lease over inherits the rest, in its prepare, in one
transaction per dead run, audited as :data:`INHERITED` (naming both runs):

Only from dead runs that never recorded a report (:func:`unreported`): a finished run reopened by
its cleared prepare keeps its recorded report, which priced what it had harvested.

- the dead run's settled items (:data:`~airflow_batch_provider.core.states.INHERITED_ITEM_STATES`: answered, in review, skipped) that
  hold a harvested attempt become its own, as they are (a succeeded item stays succeeded: that
  run reports it answered, and its attempts paid); an item in flight is adoption's (``staged``,
  ``submitted``) or a person's (``fallback``), and one to be sent again (``pending``, a retryable
  failure) is reopened by the prepare that reads the input, as from any other run;
- every harvested attempt (an outcome recorded) of the dead runs whose item is now its own, and
  every billed extra line of the dead runs (a second answer, an unreadable line).

The report (:func:`~airflow_batch_provider.services.report.build_report`) prices them with the
run's own, and lists them under ``inherited``. Called again (a cleared prepare, the second call
after the items are read), it moves only what is left; a second takeover (the inheriting run
dies in its turn) hands everything on to the next holder, since the first one's lines are its
own by then; and a dead run cleared and run again later owns none of them any more, so its
report prices nothing twice. An attempt stays with the dead run only while its item does: an
item left in ``fallback`` (settled by a person, ``airflow-batch fallback``) or one no longer in
the input that was waiting to be sent again.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import and_, exists, select

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.states import INHERITED_ITEM_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.adoption import dead_runs_taken_over
from airflow_batch_provider.ledger.late_harvest import moved_jobs
from airflow_batch_provider.ledger.review import write_audit as _audit

#: The audit action of a dead run's harvested answers and billed lines taken on by the lease holder.
INHERITED: Final = "inherit_harvested"


def inherit_harvested_lines(ledger: Ledger, workload: str, run_id: str, actor: str) -> list[dict[str, Any]]:
    """Make the dead runs' harvested, unreported answers and billed lines ``run_id``'s, audited.

    A no-op unless ``run_id`` holds the workload's lease it took over (see
    :func:`~airflow_batch_provider.ledger.adoption.dead_runs_taken_over`).

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that took the workload over
    :param actor: who takes them on (the task), for the audit row
    :return: one ``{from_run, items, attempts, extra_lines}`` per dead run something moved from now
    """
    dead = unreported_runs_taken_over(ledger, workload, run_id)
    if not dead:
        return []
    i, a, x = s.items.c, s.attempts.c, s.extra_lines.c
    harvested = exists().where(
        a.workload == i.workload,
        a.item_key == i.item_key,
        a.prompt_version == i.prompt_version,
        a.run_id.in_(dead),
        a.outcome.is_not(None),
    )
    done: list[dict[str, Any]] = []
    with ledger.engine.begin() as conn:
        for old in dead:
            items = conn.execute(
                s.items.update()
                .where(i.workload == workload, i.run_id == old, i.state.in_(INHERITED_ITEM_STATES), harvested)
                .values(run_id=run_id)
            ).rowcount
            owned = exists().where(
                and_(
                    i.workload == a.workload,
                    i.item_key == a.item_key,
                    i.prompt_version == a.prompt_version,
                    i.run_id == run_id,
                )
            )
            jobs = sorted(
                {
                    str(row[0])
                    for row in conn.execute(
                        select(a.job_id).where(
                            a.workload == workload, a.run_id == old, a.outcome.is_not(None), owned
                        )
                    )
                }
            )
            attempts = conn.execute(
                s.attempts.update()
                .where(a.workload == workload, a.run_id == old, a.outcome.is_not(None), owned)
                .values(run_id=run_id)
            ).rowcount
            extra = conn.execute(
                s.extra_lines.update().where(x.workload == workload, x.run_id == old).values(run_id=run_id)
            ).rowcount
            if not (items or attempts or extra):
                continue
            moved = {"from_run": old, "to_run": run_id, "jobs": jobs, "attempts": int(attempts)}
            moved["extra_lines"] = int(extra)
            why = (
                f"run {old} lost its workload (lease taken over by run {run_id}) after it harvested "
                f"{attempts} answers and {extra} other billed lines it never reported: run {run_id} prices them"
            )
            _audit(conn, utcnow(), actor, INHERITED, workload, int(items), moved, why)
            done.append({**moved, "items": int(items)})
    return done


def unreported_runs_taken_over(ledger: Ledger, workload: str, run_id: str) -> list[str]:
    """The dead runs ``run_id`` took the workload over from that never recorded a report.

    Empty unless ``run_id`` holds the workload's lease (it took nothing over otherwise).

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run that took the workload over
    """
    lease = ledger.workload_lease(workload)
    if lease is None or lease.run_id != run_id:
        return []
    return unreported(ledger, workload, dead_runs_taken_over(ledger, workload, run_id))


def unreported(ledger: Ledger, workload: str, runs: list[str]) -> list[str]:
    """Of ``runs``, those that never recorded a report (what a recorded report priced stays priced there).

    A finished run cleared and started again (its prepare reopens it when it is the newest run)
    is unfinished with its report still recorded; if it dies, that report has priced what it
    had harvested, so nothing of it is inherited (the search found it priced twice).

    :param ledger: the ledger
    :param workload: the workload
    :param runs: the dead runs
    """
    if not runs:
        return []
    r = s.runs.c
    with ledger.engine.connect() as conn:
        reported = {
            str(row[0])
            for row in conn.execute(
                select(r.run_id).where(r.workload == workload, r.run_id.in_(runs), r.report_json.is_not(None))
            )
        }
    return [run for run in runs if run not in reported]


def inherited(ledger: Ledger, workload: str, run_id: str) -> list[dict[str, Any]]:
    """What ``run_id`` inherited from dead runs: the run, its jobs, items, attempts and extra lines.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the inheriting run
    """
    return moved_jobs(ledger, workload, run_id, INHERITED)
