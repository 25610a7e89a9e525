"""Retention: how much of a workload's per-run history the ledger keeps, and the prune that applies it.

A workload's ledger grows every night by the rows of the run's jobs and attempts (one attempt per
line sent), its billed extra lines and its prompt changes. The rest is bounded by the workload's
items (one ``abp_items`` / ``abp_results`` / ``abp_deliveries`` row per item and prompt version,
whatever the number of nights) or small per run (``abp_runs``, ``abp_audit``, ``abp_infra_costs``).

A :class:`RetentionPolicy` keeps the newest ``keep_runs`` runs and those started in the last
``keep_days`` days (either, or both: a run goes only when every limit given lets it go; no limit,
the default, keeps everything). :func:`prune` removes the per-run detail of the runs past it, in
short transactions of at most ``batch_rows`` rows each, and only what no stage reads again:

- ``abp_attempts`` of a pruned run, except an item's current attempt (its last success: what
  ``iter_cost_rows`` reads for an unchanged item's saving) and every attempt of an item in review
  or decided by a person (the review page's cost per item);
- ``abp_extra_lines`` and ``abp_prompt_changes`` of a pruned run (read only for that run's report,
  which ``abp_runs.report_json`` keeps);
- ``abp_jobs`` of a pruned run that are harvested (``reconciled`` or ``sync``), no item points at and
  no attempt row is left for, with their released ``abp_enqueued`` rows.

A run is never pruned while it is the workload's newest, unfinished (no report), holds the
workload's lease, owns an item in flight, has a job that is not harvested (in doubt, submitting, a
batch not reconciled: what a late harvest or an adoption may still move) or an attempt without an
outcome. Everything else survives: every item row (its input hash and last success:
skip-unchanged), the review queue and the audit table, deliveries, results, runs and their reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import and_, delete, exists, select
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.states import IN_FLIGHT_STATES, PRUNABLE_JOB_STATES
from airflow_batch_provider.exceptions import LedgerError
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import pair_filter as _pairs
from airflow_batch_provider.ledger.review import write_audit as _audit
from airflow_batch_provider.ledger.store import Ledger

#: The audit action of a prune.
PRUNE: Final = "prune"
#: Rows one prune transaction deletes at most (short transactions: a night running meanwhile waits
#: for one of them at most).
BATCH_ROWS: Final = 2000


@dataclass(frozen=True)
class RetentionPolicy:
    """How much per-run history of a workload to keep (default: everything).

    :param keep_runs: keep the newest this many runs (at least 1)
    :param keep_days: keep the runs started in the last this many days (more than 0)
    """

    keep_runs: int | None = None
    keep_days: float | None = None

    def __post_init__(self) -> None:
        if self.keep_runs is not None and self.keep_runs < 1:
            raise LedgerError(
                f"retention keep_runs={self.keep_runs} keeps no run; give 1 or more "
                "(the newest run is always kept), or leave it unset to keep every run."
            )
        if self.keep_days is not None and not self.keep_days > 0:
            raise LedgerError(
                f"retention keep_days={self.keep_days} keeps no day; give more than 0, "
                "or leave it unset to keep every run."
            )

    @property
    def keeps_everything(self) -> bool:
        """No limit given: nothing is ever pruned."""
        return self.keep_runs is None and self.keep_days is None


@dataclass(frozen=True)
class HeldRun:
    """A run past the policy that the prune keeps whole, and why.

    :param run_id: the run
    :param reason: why it is kept
    """

    run_id: str
    reason: str


@dataclass(frozen=True)
class PruneReport:
    """What a prune removed (or, a dry run, would remove).

    :param workload: the workload
    :param dry_run: nothing was removed
    :param runs: the runs past the policy whose detail went (or had gone already)
    :param held: the runs past the policy kept whole, with why
    :param rows: rows removed per table
    """

    workload: str
    dry_run: bool
    runs: tuple[str, ...] = ()
    held: tuple[HeldRun, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Rows removed in all."""
        return sum(self.rows.values())


def _past_policy(ledger: Ledger, workload: str, policy: RetentionPolicy, now: datetime) -> list[str]:
    """The workload's runs the policy lets go, oldest first (never the newest run)."""
    if policy.keeps_everything:
        return []
    r = s.runs.c
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(r.run_id, r.started_at)
            .where(r.workload == workload)
            .order_by(r.started_at.desc(), r.run_id.desc())
        ).all()
    cutoff = None if policy.keep_days is None else now - timedelta(days=policy.keep_days)
    out: list[str] = []
    for rank, (run_id, started_at) in enumerate(rows):
        if rank == 0:
            continue
        if policy.keep_runs is not None and rank < policy.keep_runs:
            continue
        if cutoff is not None and started_at >= cutoff:
            continue
        out.append(str(run_id))
    return list(reversed(out))


def _why_held(conn: Connection, workload: str, run_id: str) -> str | None:
    """Why a run past the policy must be kept whole (``None``: its detail may go)."""
    r, j, a, i, lease = s.runs.c, s.jobs.c, s.attempts.c, s.items.c, s.leases.c
    run = conn.execute(
        select(r.finished_at, r.report_json).where(r.workload == workload, r.run_id == run_id)
    ).first()
    if run is None or run.finished_at is None or run.report_json is None:
        return "not finished (no report yet)"
    if conn.execute(select(lease.run_id).where(lease.workload == workload, lease.run_id == run_id)).first():
        return "holds the workload's lease"
    busy = conn.execute(
        select(i.state)
        .where(i.workload == workload, i.run_id == run_id, i.state.in_(sorted(IN_FLIGHT_STATES)))
        .limit(1)
    ).first()
    if busy is not None:
        return f"owns an item in flight ({busy.state})"
    open_job = conn.execute(
        select(j.job_id, j.state)
        .where(j.workload == workload, j.run_id == run_id, j.state.not_in(PRUNABLE_JOB_STATES))
        .limit(1)
    ).first()
    if open_job is not None:
        return f"job {open_job.job_id!r} is {open_job.state!r}, not harvested (a late harvest or adoption may need it)"
    unanswered = conn.execute(
        select(a.job_id).where(a.workload == workload, a.run_id == run_id, a.outcome.is_(None)).limit(1)
    ).first()
    if unanswered is not None:
        return f"an attempt of job {unanswered.job_id!r} has no outcome yet"
    return None


def _attempts_to_go(workload: str, run_id: str) -> Any:
    """SQL: the attempts of ``run_id`` that no stage reads again."""
    a, i = s.attempts.c, s.items.c
    current = exists().where(i.job_id == a.job_id, i.custom_id == a.custom_id)
    reviewed = exists().where(
        i.workload == a.workload,
        i.item_key == a.item_key,
        i.prompt_version == a.prompt_version,
        (i.state == "review") | i.review_action.is_not(None),
    )
    return and_(a.workload == workload, a.run_id == run_id, a.outcome.is_not(None), ~current, ~reviewed)


def _jobs_to_go(workload: str, run_id: str, attempts_left: Any = None) -> Any:
    """SQL: the jobs of ``run_id`` nothing points at any more.

    :param attempts_left: SQL over ``abp_attempts``: the attempts that stay (default: every one there)
    """
    j, i, a, e = s.jobs.c, s.items.c, s.attempts.c, s.enqueued.c
    kept = exists().where(a.job_id == j.job_id)
    if attempts_left is not None:
        kept = kept.where(attempts_left)
    return and_(
        j.workload == workload,
        j.run_id == run_id,
        j.state.in_(PRUNABLE_JOB_STATES),
        ~exists().where(i.job_id == j.job_id),
        ~kept,
        ~exists().where(e.job_id == j.job_id, e.released_at.is_(None)),
    )


def _by_batches(
    ledger: Ledger, table: Any, keys: Sequence[Any], where: Any, dry_run: bool, batch_rows: int
) -> int:
    """Delete the rows of ``table`` that ``where`` selects, ``batch_rows`` at a time; return how many."""
    total = 0
    after: tuple[Any, ...] | None = None
    while True:
        with ledger.engine.begin() as conn:
            q = select(*keys).where(where).order_by(*keys).limit(batch_rows)
            if after is not None:
                q = q.where(_after(keys, after))
            found = [tuple(row) for row in conn.execute(q)]
            if not found:
                return total
            if not dry_run:
                # grouped by the first key column: one ``first = v AND second IN (...)`` per value
                chosen = _pairs(keys[1], keys[0], [(second, first) for first, second in found])
                conn.execute(delete(table).where(where, chosen))
            total += len(found)
            after = found[-1]
        if len(found) < batch_rows:
            return total


def _after(keys: Sequence[Any], last: tuple[Any, ...]) -> Any:
    """SQL: the two-column key is past ``last`` (keyset paging; a dry run deletes nothing to page past)."""
    return (keys[0] > last[0]) | and_(keys[0] == last[0], keys[1] > last[1])


def prune(
    ledger: Ledger,
    workload: str,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    actor: str = "prune",
    now: datetime | None = None,
    batch_rows: int = BATCH_ROWS,
) -> PruneReport:
    """Remove the per-run detail of ``workload``'s runs past ``policy`` (see the module's rules).

    Each run is checked and pruned in transactions of at most ``batch_rows`` rows; every
    delete repeats its rule, so a row a running night made needed again in between stays. The
    prune is written to the audit table (action :data:`PRUNE`) unless nothing went.

    :param ledger: the ledger
    :param workload: the workload
    :param policy: what to keep
    :param dry_run: only count what would go
    :param actor: who prunes (the audit row)
    :param now: the time the days are counted back from (default: now)
    :param batch_rows: rows per transaction at most
    """
    if batch_rows < 1:
        raise LedgerError(f"prune batch_rows={batch_rows} deletes nothing; give 1 or more.")
    moment = now or utcnow()
    a, x, p = s.attempts.c, s.extra_lines.c, s.prompt_changes.c
    rows = {
        "abp_attempts": 0,
        "abp_extra_lines": 0,
        "abp_prompt_changes": 0,
        "abp_jobs": 0,
        "abp_enqueued": 0,
    }
    pruned: list[str] = []
    held: list[HeldRun] = []
    for run_id in _past_policy(ledger, workload, policy, moment):
        with ledger.engine.connect() as conn:
            reason = _why_held(conn, workload, run_id)
        if reason is not None:
            held.append(HeldRun(run_id, reason))
            continue
        counts = {
            "abp_attempts": _by_batches(
                ledger,
                s.attempts,
                (a.job_id, a.custom_id),
                _attempts_to_go(workload, run_id),
                dry_run,
                batch_rows,
            ),
            "abp_extra_lines": _by_batches(
                ledger,
                s.extra_lines,
                (x.job_id, x.ordinal),
                and_(x.workload == workload, x.run_id == run_id),
                dry_run,
                batch_rows,
            ),
            "abp_prompt_changes": _by_batches(
                ledger,
                s.prompt_changes,
                (p.prompt_version, p.item_key),
                and_(p.workload == workload, p.run_id == run_id),
                dry_run,
                batch_rows,
            ),
        }
        if dry_run:
            counts["abp_jobs"] = _count_jobs_after(ledger, workload, run_id)
        else:
            counts.update(_prune_jobs(ledger, workload, run_id, batch_rows))
        for name, n in counts.items():
            rows[name] += n
        pruned.append(run_id)
    report = PruneReport(workload, dry_run, tuple(pruned), tuple(held), rows)
    if not dry_run and report.total:
        with ledger.engine.begin() as conn:
            _audit(
                conn,
                moment,
                actor,
                PRUNE,
                workload,
                0,
                {"runs": pruned, "rows": rows, "keep_runs": policy.keep_runs, "keep_days": policy.keep_days},
                "retention policy",
            )
    return report


def _prune_jobs(ledger: Ledger, workload: str, run_id: str, batch_rows: int) -> dict[str, int]:
    """Delete ``run_id``'s jobs nothing points at, with their released enqueued rows."""
    j, e = s.jobs.c, s.enqueued.c
    jobs = 0
    released = 0
    while True:
        with ledger.engine.begin() as conn:
            ids = [
                str(r[0])
                for r in conn.execute(
                    select(j.job_id).where(_jobs_to_go(workload, run_id)).order_by(j.job_id).limit(batch_rows)
                )
            ]
            if not ids:
                break
            released += conn.execute(
                delete(s.enqueued).where(e.job_id.in_(ids), e.released_at.is_not(None))
            ).rowcount
            jobs += conn.execute(
                delete(s.jobs).where(_jobs_to_go(workload, run_id), j.job_id.in_(ids))
            ).rowcount
        if len(ids) < batch_rows:
            break
    return {"abp_jobs": jobs, "abp_enqueued": released}


def _count_jobs_after(ledger: Ledger, workload: str, run_id: str) -> int:
    """A dry run's count of the jobs that would go once their attempts have gone."""
    j = s.jobs.c
    where = _jobs_to_go(workload, run_id, attempts_left=~_attempts_to_go(workload, run_id))
    with ledger.engine.connect() as conn:
        return len(conn.execute(select(j.job_id).where(where)).all())


def describe(report: PruneReport) -> str:
    """The prune's report for a person: what went (or would go), per table, and the runs kept whole.

    :param report: what :func:`prune` returned
    """
    verb = "would remove" if report.dry_run else "removed"
    lines = [
        f"workload {report.workload!r}: {verb} {report.total} row(s) of {len(report.runs)} run(s) past the policy"
        + (" (dry run: nothing removed)" if report.dry_run else "")
    ]
    lines += [f"  {table}\t{n}" for table, n in report.rows.items() if n]
    lines += [f"  run\t{run}" for run in report.runs]
    lines += [f"  kept whole\t{held.run_id}\t{held.reason}" for held in report.held]
    return "\n".join(lines) + "\n"
