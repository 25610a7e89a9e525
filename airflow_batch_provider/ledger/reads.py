"""What the progress page and the operators' command line read from the ledger: frozen records.

The queries across runs and workloads that :class:`~airflow_batch_provider.ledger.Ledger` does
not need for a run itself: which DAGs recorded a workload's runs, the workloads and runs a set of
DAGs may see, the open review queue counted by error code, what each item's attempts cost so far,
and the items a dead run left in ``fallback``. Every function only reads (they work on a
read-only engine) and returns frozen records; SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, false, func, inspect, literal_column, or_, select

from airflow_batch_provider.ledger import schema as s

if TYPE_CHECKING:
    from airflow_batch_provider.ledger.store import Ledger

#: DAG ids whose runs a reader may see; ``None`` in it stands for runs recorded without a DAG.
DagSet = frozenset[str | None]


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


@dataclass(frozen=True)
class RunRecord:
    """One row of ``abp_runs``: a workload's run as prepare started it and publish finished it.

    :param workload: workload name
    :param run_id: the Airflow run id
    :param dag_id: the DAG that recorded it (``None``: recorded without one)
    :param provider: adapter name
    :param model: model name
    :param started_at: when prepare recorded it (UTC)
    :param finished_at: when publish wrote its report (UTC; ``None``: not yet)
    :param report_json: the cost report publish wrote, as stored (``None``: not yet)
    """

    workload: str
    run_id: str
    dag_id: str | None
    provider: str | None
    model: str | None
    started_at: datetime | None
    finished_at: datetime | None
    report_json: str | None

    @classmethod
    def from_row(cls, row: Any) -> RunRecord:
        """Build from an ``abp_runs`` row.

        :param row: a database row (mapping)
        """
        return cls(
            workload=str(row["workload"]),
            run_id=str(row["run_id"]),
            dag_id=row["dag_id"],
            provider=row["provider"],
            model=row["model"],
            started_at=_utc(row["started_at"]),
            finished_at=_utc(row["finished_at"]),
            report_json=row["report_json"],
        )


@dataclass(frozen=True)
class WorkloadSummary:
    """A workload as a set of DAGs sees it.

    :param workload: workload name
    :param runs: its runs recorded by those DAGs
    :param last_started: the latest of their starts (UTC)
    """

    workload: str
    runs: int
    last_started: datetime | None


@dataclass(frozen=True)
class StrandedFallback:
    """A run's items left in ``fallback``: sent (or about to be sent) to the real-time API.

    While the run lives they are its own; once it is dead nothing will finish them (a new run
    never takes over items in flight), and a person re-drives or resolves them.

    :param workload: workload name
    :param run_id: the run the items belong to
    :param items: how many
    :param holds_lease: the run still holds the workload's lease (it may be alive and sending)
    :param since: the latest move of one of them (UTC)
    """

    workload: str
    run_id: str
    items: int
    holds_lease: bool
    since: datetime | None


def has_tables(ledger: Ledger) -> bool:
    """Say whether the ledger has been created (a read-only reader creates nothing).

    :param ledger: the ledger
    """
    return bool(inspect(ledger.engine).has_table(s.runs.name))


def dag_clause(dags: DagSet) -> Any:
    """The SQL filter ``abp_runs.dag_id IN dags`` (``None`` in ``dags``: also runs without a DAG).

    :param dags: the DAGs
    """
    named = sorted(d for d in dags if d is not None)
    parts = [s.runs.c.dag_id.in_(named)] if named else []
    if None in dags:
        parts.append(s.runs.c.dag_id.is_(None))
    return or_(*parts) if parts else false()


def run_dags(ledger: Ledger, workload: str | None = None) -> list[tuple[str, str | None]]:
    """Return the distinct ``(workload, dag_id)`` pairs of the ledger's runs, sorted.

    :param ledger: the ledger
    :param workload: only this workload
    """
    if not has_tables(ledger):
        return []
    q = select(s.runs.c.workload, s.runs.c.dag_id).distinct()
    if workload is not None:
        q = q.where(s.runs.c.workload == workload)
    with ledger.engine.connect() as conn:
        pairs = [(str(r.workload), r.dag_id) for r in conn.execute(q)]
    return sorted(pairs, key=lambda p: (p[0], p[1] is not None, p[1] or ""))


def workload_summaries(ledger: Ledger, dags: DagSet) -> list[WorkloadSummary]:
    """Return each workload with its runs recorded by ``dags`` and its latest start, newest first.

    :param ledger: the ledger
    :param dags: only runs of these DAGs
    """
    if not has_tables(ledger):
        return []
    r = s.runs.c
    last = func.max(r.started_at)
    q = (
        select(r.workload, func.count().label("runs"), last.label("last_started"))
        .where(dag_clause(dags))
        .group_by(r.workload)
        .order_by(last.desc(), r.workload)
    )
    with ledger.engine.connect() as conn:
        return [
            WorkloadSummary(str(row.workload), int(row.runs), _utc(row.last_started))
            for row in conn.execute(q)
        ]


def _runs(ledger: Ledger, *where: Any, limit: int | None = None) -> list[RunRecord]:
    if not has_tables(ledger):
        return []
    q = select(s.runs).where(*where).order_by(s.runs.c.started_at.desc(), s.runs.c.workload, s.runs.c.run_id)
    if limit is not None:
        q = q.limit(limit)
    with ledger.engine.connect() as conn:
        return [RunRecord.from_row(row) for row in conn.execute(q).mappings()]


def recent_runs(
    ledger: Ledger, dags: DagSet, workload: str | None = None, limit: int = 20
) -> list[RunRecord]:
    """Return the latest runs recorded by ``dags``, newest first.

    :param ledger: the ledger
    :param dags: only runs of these DAGs
    :param workload: only this workload
    :param limit: at most this many (at least one)
    """
    where = [dag_clause(dags)]
    if workload:
        where.append(s.runs.c.workload == workload)
    return _runs(ledger, *where, limit=max(1, limit))


def find_run(ledger: Ledger, workload: str, run_id: str) -> RunRecord | None:
    """Return one run, or ``None`` when the ledger has no such run.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    found = _runs(ledger, s.runs.c.workload == workload, s.runs.c.run_id == run_id)
    return found[0] if found else None


def runs_of_dag_run(ledger: Ledger, dag_id: str, run_id: str) -> list[RunRecord]:
    """Return every workload's run recorded by one DAG run (matched on the DAG *and* the run id), by workload.

    :param ledger: the ledger
    :param dag_id: the DAG
    :param run_id: the Airflow run id
    """
    found = _runs(ledger, s.runs.c.dag_id == dag_id, s.runs.c.run_id == run_id)
    return sorted(found, key=lambda r: r.workload)


def review_counts(ledger: Ledger, workload: str) -> dict[str, int]:
    """Return a workload's open review queue counted by error code (``-``: none), largest first.

    Open: in ``review`` with no person's decision yet (what ``Ledger.review_items`` lists).

    :param ledger: the ledger
    :param workload: workload name
    """
    if not has_tables(ledger):
        return {}
    c = s.items.c
    q = (
        select(c.error_code, func.count().label("n"))
        .where(
            c.workload == workload, c.state == literal_column("'review'"), c.review_action.is_(None)
        )  # the partial review index
        .group_by(c.error_code)
    )
    with ledger.engine.connect() as conn:
        counts = {str(r.error_code or "-"): int(r.n) for r in conn.execute(q)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def item_costs(ledger: Ledger, workload: str, item_keys: Collection[str]) -> dict[tuple[str, str], int]:
    """Return what each item's attempts (every run's) cost so far, in nano-dollars.

    Keyed by ``(item_key, prompt_version)``; an item without a priced attempt is left out.

    :param ledger: the ledger
    :param workload: workload name
    :param item_keys: the items
    """
    keys = sorted(set(item_keys))
    if not keys:
        return {}
    a = s.attempts.c
    out: dict[tuple[str, str], int] = {}
    with ledger.engine.connect() as conn:
        for i in range(0, len(keys), 500):
            q = (
                select(a.item_key, a.prompt_version, func.sum(a.cost_nusd).label("nusd"))
                .where(a.workload == workload, a.item_key.in_(keys[i : i + 500]))
                .group_by(a.item_key, a.prompt_version)
            )
            out.update({(r.item_key, r.prompt_version): int(r.nusd or 0) for r in conn.execute(q)})
    return out


def stranded_fallback(ledger: Ledger, workload: str | None = None) -> list[StrandedFallback]:
    """Return, per run, the items left in ``fallback``, and whether that run still holds the workload.

    :param ledger: the ledger
    :param workload: only this workload
    """
    if not has_tables(ledger):
        return []
    c = s.items.c
    lease = s.leases.c
    q = (
        select(
            c.workload,
            c.run_id,
            func.count().label("n"),
            func.max(c.updated_at).label("since"),
            func.count(lease.run_id).label("held"),
        )
        .select_from(
            s.items.outerjoin(s.leases, and_(lease.workload == c.workload, lease.run_id == c.run_id))
        )
        .where(c.state == "fallback")
        .group_by(c.workload, c.run_id)
        .order_by(c.workload, c.run_id)
    )
    if workload is not None:
        q = q.where(c.workload == workload)
    with ledger.engine.connect() as conn:
        return [
            StrandedFallback(str(r.workload), str(r.run_id), int(r.n), int(r.held) > 0, _utc(r.since))
            for r in conn.execute(q)
        ]


def fallback_item_keys(ledger: Ledger, workload: str, run_id: str) -> list[tuple[str, str]]:
    """Return the ``(item_key, prompt_version)`` of a run's items in ``fallback``, sorted.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    """
    c = s.items.c
    q = (
        select(c.item_key, c.prompt_version)
        .where(c.workload == workload, c.run_id == run_id, c.state == "fallback")
        .order_by(c.item_key, c.prompt_version)
    )
    with ledger.engine.connect() as conn:
        return [(str(r.item_key), str(r.prompt_version)) for r in conn.execute(q)]


__all__: Sequence[str] = (
    "DagSet",
    "RunRecord",
    "StrandedFallback",
    "WorkloadSummary",
    "dag_clause",
    "fallback_item_keys",
    "find_run",
    "has_tables",
    "item_costs",
    "recent_runs",
    "review_counts",
    "run_dags",
    "runs_of_dag_run",
    "stranded_fallback",
    "workload_summaries",
)
