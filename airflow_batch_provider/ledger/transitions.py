"""The ledger's transitions room: the one guarded function that writes an item's state.

:func:`guarded_transition` is the only code of the package that writes ``abp_items.state``
(a test walks every module of the ledger to hold it so). It checks each move against
:mod:`airflow_batch_provider.core.states` in SQL (``WHERE state IN <sources of the target>``,
plus a compare-and-set on the state the caller read) and counts what moved and what was refused;
a move the states do not allow raises
:class:`~airflow_batch_provider.exceptions.InvalidTransitionError` instead of corrupting the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Table,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
)
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.states import (
    ITEM_STATES,
    sources_of,
)
from airflow_batch_provider.exceptions import (
    InvalidTransitionError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import pair_filter

ITEM_ROW = and_(
    s.items.c.workload == bindparam("b_workload"),
    s.items.c.item_key == bindparam("b_key"),
    s.items.c.prompt_version == bindparam("b_version"),
)


def word(name: str) -> Any:
    """A word of the fixed vocabulary (a state, an outcome, a verdict) inlined as an SQL literal."""
    return literal_column(f"'{name}'")


def words(names: Iterable[str]) -> list[Any]:
    """State names inlined as SQL literals."""
    return [word(name) for name in sorted(names)]


@dataclass(frozen=True)
class Moved:
    """What one guarded transition did.

    :param moved: items now in the target state (including those already there)
    :param refused: items addressed whose state may not reach the target; left as they were
    """

    moved: int = 0
    refused: int = 0

    def __add__(self, other: Moved) -> Moved:
        return Moved(self.moved + other.moved, self.refused + other.refused)


def state_guard(target: str, from_states: Iterable[str] | None, reopen: bool) -> Any:
    """``state IN (...)``: the states that may reach ``target`` (intersected with ``from_states``).

    The states are inlined (they come from the fixed vocabulary) so the filter also works in an
    ``executemany``, where an expanding ``IN`` parameter cannot.
    """
    return s.items.c.state.in_(
        [literal_column(f"'{st}'") for st in sorted(_sources(target, from_states, reopen))]
    )


def _sources(target: str, from_states: Iterable[str] | None, reopen: bool) -> frozenset[str]:
    """The states that may reach ``target``, intersected with ``from_states``.

    :raises InvalidTransitionError: ``target`` is unknown, or a state in ``from_states`` cannot reach it
    """
    allowed = sources_of(target, reopen=reopen)
    if not allowed:
        raise InvalidTransitionError(f"{target!r} is not an item state; known: {', '.join(ITEM_STATES)}.")
    chosen = allowed if from_states is None else frozenset(from_states)
    bad = sorted(chosen - allowed)
    if bad:
        raise InvalidTransitionError(
            f"items cannot move from {bad} to {target!r} (see DESIGN.md item states); "
            f"only from {sorted(allowed)}."
        )
    return chosen


def guarded_transition(
    conn: Connection,
    now: datetime,
    *,
    target: str | None = None,
    where: Any = None,
    values: Mapping[str, Any] | None = None,
    rows: Sequence[Mapping[str, Any]] | None = None,
    from_states: Iterable[str] | None = None,
    reopen: bool = False,
    staged: Table | None = None,
    workload: str | None = None,
    targets: Iterable[str] = (),
) -> Moved:
    """The one place that writes ``abp_items.state``; the move is guarded in SQL.

    Three forms. Staged form (``staged``, ``workload``, ``targets``, optional ``values``): one
    set-based ``UPDATE abp_items ... FROM <staged>`` for every staged row whose ``state`` is not
    null; the staged table has ``b_key``, ``b_version``, ``b_from`` (a compare-and-set on the state
    the caller read) and ``state`` (the target, one of ``targets``), at most one row per item;
    ``values`` maps other columns to SQL expressions over both tables. The guard is in the
    statement: ``state = b_from`` and, per target, ``state IN <sources of the target>``;
    ``refused`` counts the staged rows that did not move. Set form (``target``, ``where``, ``values``): one ``UPDATE ... WHERE <where> AND state
    IN <sources of target>``; ``refused`` counts the rows ``where`` addresses that stayed out. Row
    form (``rows``): one ``executemany`` per target and set of columns; each row carries ``state``
    (its target), its address as ``b_workload``/``b_key``/``b_version`` (and any other ``b_*``
    parameter ``where`` uses) and, optionally, ``b_from``: the state the caller read, so the write
    is a compare-and-set against a concurrent writer (``WHERE state = b_from``, each ``b_from``
    checked against the sources of the target first; a row whose ``b_from`` is not one is refused
    without being sent). Rows without ``b_from`` get ``state IN <sources>`` in SQL.

    :param conn: an open transaction
    :param now: the ``updated_at`` to write
    :param target: set form: the new state
    :param where: set form: the rows to move; row form: the row filter (default: primary key)
    :param values: set form: other columns to set
    :param rows: row form: one dict per item
    :param from_states: only from these states (each must reach the target)
    :param reopen: a new run's prepare: the item goes back to ``pending`` and on in one write
    :param staged: staged form: the temporary table of moves
    :param workload: staged form: the workload of every staged item
    :param targets: staged form: the target states the staged rows use
    :raises InvalidTransitionError: a state in ``from_states`` cannot reach the target
    """
    c = s.items.c
    if staged is not None:
        if workload is None:
            raise TypeError("guarded_transition's staged form needs the workload")
        t = staged.c
        chosen = sorted(set(targets))
        if not chosen:
            return Moved()
        guard = or_(
            *(
                and_(t.state == literal_column(f"'{tg}'"), state_guard(tg, from_states, reopen))
                for tg in chosen
            )
        )
        res = conn.execute(
            s.items.update()
            .where(
                c.workload == workload,
                c.item_key == t.b_key,
                c.prompt_version == t.b_version,
                t.state.is_not(None),
                c.state == t.b_from,
                guard,
            )
            .values(**(values or {}), state=t.state, updated_at=now)
        )
        moved = int(res.rowcount or 0)
        addressed = conn.execute(
            select(func.count()).select_from(staged).where(t.state.is_not(None))
        ).scalar_one()
        return Moved(moved, int(addressed) - moved)
    if rows is None:
        if target is None or where is None:
            raise TypeError("guarded_transition needs target and where, or rows")
        res = conn.execute(
            s.items.update()
            .where(where, state_guard(target, from_states, reopen))
            .values(**(values or {}), state=target, updated_at=now)
        )
        moved = int(res.rowcount or 0)
        left = conn.execute(select(func.count()).where(where, c.state != target)).scalar_one()
        return Moved(moved, int(left))
    row_where = ITEM_ROW if where is None else where
    groups: dict[tuple[str, bool, tuple[str, ...]], list[Mapping[str, Any]]] = {}
    for row in rows:
        cols = tuple(sorted(k for k in row if not k.startswith("b_") and k not in ("state", "updated_at")))
        groups.setdefault((str(row["state"]), "b_from" in row, cols), []).append(row)
    total = Moved()
    exact = conn.dialect.supports_sane_multi_rowcount
    for (state, cas, cols), rows_of in groups.items():
        if cas:
            # Compare-and-set: ``state = b_from`` with every b_from checked against the sources
            # here, which is ``state IN (sources)`` without a long IN list in every statement of
            # the batch (PostgreSQL parses each one).
            sources = _sources(state, from_states, reopen)
            group = [r for r in rows_of if r["b_from"] in sources]
            refused_early = len(rows_of) - len(group)
            guard = c.state == bindparam("b_from")
        else:
            group, refused_early = list(rows_of), 0
            guard = state_guard(state, from_states, reopen)
        total = total + Moved(0, refused_early)
        if not group:
            continue
        stmt = (
            s.items.update()
            .where(row_where, guard)
            .values({**{col: bindparam(col) for col in cols}, "state": state, "updated_at": now})
        )
        res = conn.execute(stmt, group)
        if exact:
            moved = int(res.rowcount or 0)
        else:
            # psycopg2's batched executemany reports only its last page: count what now holds the
            # target with this write's timestamp (the rows are locked by this transaction).
            by_wl: dict[str, list[tuple[str, str]]] = {}
            for r in group:
                by_wl.setdefault(r["b_workload"], []).append((r["b_key"], r["b_version"]))
            moved = sum(
                int(
                    conn.execute(
                        select(func.count()).where(
                            c.workload == wl,
                            pair_filter(c.item_key, c.prompt_version, keys),
                            c.state == state,
                            c.updated_at == now,
                        )
                    ).scalar_one()
                )
                for wl, keys in by_wl.items()
            )
        total = total + Moved(moved, len(group) - moved)
    return total
