"""The ledger's operations. No Airflow imports: give it a SQLAlchemy URL or engine.

Every write is a transaction; bulk writes go in slices of :data:`BATCH` rows (result lines in
slices of :data:`APPLY_SLICE`). Bulk writes go at the database's floor: new rows and staged moves
travel by ``COPY`` on PostgreSQL and one prepared ``executemany`` on SQLite, into the table or a
per-connection temporary table that one set-based ``UPDATE ... FROM`` then applies. Every write of an
item's state goes through one function, :func:`_transition`, which checks the move against
:mod:`airflow_batch_provider.core.states` in SQL (``WHERE state IN <sources of the target>``,
plus a compare-and-set on the state the caller read) and counts what moved and what was refused;
a move the states do not allow raises
:class:`~airflow_batch_provider.exceptions.InvalidTransitionError` instead of corrupting the run.
Job claims and the workload lease are compare-and-set in one statement each, so two task
attempts (or two runs) never both win. Every operation is safe to repeat: a cleared task that
runs again converges to the same rows.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final, TypeVar, overload

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    create_engine,
    event,
    func,
    inspect,
    literal_column,
    not_,
    null,
    or_,
    select,
    text,
    tuple_,
)
from sqlalchemy.engine import Connection, Row, RowMapping
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateTable

from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.core.states import (
    IN_DOUBT_CODE,
    IN_FLIGHT_STATES,
    ITEM_STATES,
    REDRIVABLE_STATES,
    RETRYABLE_STATES,
    USABLE_STATES,
    can_transition,
    sources_of,
)
from airflow_batch_provider.exceptions import (
    InvalidTransitionError,
    JobClaimedError,
    JobNotClaimableError,
    LedgerError,
    WorkloadLeasedError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger import unharvested
from airflow_batch_provider.ledger.indexes import add_missing_indexes
from airflow_batch_provider.ledger.prompt_changes import (
    changed_prompt,
    record_prompt_changes,
    run_prompt_digests,
)
from airflow_batch_provider.ledger.records import (
    ITEM_SHAPES,
    AuditRow,
    ItemRow,
    JobClaim,
    JobRow,
    WorkloadLease,
    sync_job_id,
)
from airflow_batch_provider.ledger.runs import newer_runs

BATCH = 1000
_Shape = TypeVar("_Shape")
#: At most this many item keys (and application ids) of one action are written to the audit row.
AUDIT_KEYS_SHOWN = 1000
NANO = Decimal(1_000_000_000)


def utcnow() -> datetime:
    """Return the current UTC time (timezone-aware)."""
    return datetime.now(timezone.utc)


def to_nusd(amount: Decimal) -> int:
    """Convert dollars to integer nano-dollars (rounded half-up).

    :param amount: dollars
    """
    return int((amount * NANO).to_integral_value(rounding="ROUND_HALF_UP"))


def from_nusd(nusd: int) -> Decimal:
    """Convert integer nano-dollars to dollars.

    :param nusd: nano-dollars
    """
    return Decimal(nusd) / NANO


@dataclass(frozen=True)
class PreparedItem:
    """An item ready for the ledger.

    :param key: item key (charset-safe)
    :param request: the canonical request
    """

    key: str
    request: CanonicalRequest


@dataclass(frozen=True)
class UpsertStats:
    """What :meth:`Ledger.upsert_items` did.

    :param new: items seen for the first time
    :param changed: items whose input changed (or that had not succeeded) and go out again
    :param unchanged: items whose input matches an earlier success; not sent again
    :param already_in_run: items this run had recorded before (a rerun of the task)
    :param in_review: unchanged items held in review (or resolved/skipped by a person); not sent
        again until their input changes or someone re-drives them
    :param in_flight_elsewhere: items staged or sent by another run that may already be at a
        provider; they stay with that run (never sent twice)
    :param owned_by_newer_run: items a run that started later owns; a rerun of an older run leaves
        them (and that run's history) alone
    :param prompt_changed: of the ``changed``, items sent again only because the prompt's content
        changed under the same version (an in-place edit; recorded in ``abp_prompt_changes``)
    """

    new: int = 0
    changed: int = 0
    unchanged: int = 0
    already_in_run: int = 0
    in_review: int = 0
    in_flight_elsewhere: int = 0
    owned_by_newer_run: int = 0
    prompt_changed: int = 0


@dataclass
class ReconcileStats:
    """What one reconcile pass did.

    :param applied: results that changed an item's state
    :param late: results for an attempt that is no longer the item's current one (kept as cost)
    :param duplicates: result lines seen twice in this pass
    :param unknown: result lines whose custom id this job never sent
    :param outcomes: results by outcome
    """

    applied: int = 0
    late: int = 0
    duplicates: int = 0
    unknown: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


# The item state each neutral outcome leads to.
_OUTCOME_STATE: dict[str, str] = {
    "succeeded": "succeeded",
    "failed_retryable": "failed_retryable",
    "failed_permanent": "failed_permanent",
    "expired": "expired",
    "cancelled": "cancelled",
    "invalid_output": "failed_retryable",
    "missing": "failed_retryable",
}


def _chunks(rows: Iterable[Any], size: int = BATCH) -> Iterator[list[Any]]:
    buf: list[Any] = []
    for row in rows:
        buf.append(row)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


def _pairs(key_col: Any, version_col: Any, pairs: Iterable[tuple[str, str]]) -> Any:
    """An index-friendly filter on (key, version) pairs: ``version = v AND key IN (...)`` per version.

    A row-value ``IN`` of pairs makes PostgreSQL scan the workload; this uses the primary key.
    """
    by_version: dict[str, list[str]] = {}
    for key, version in pairs:
        by_version.setdefault(version, []).append(key)
    return or_(*(and_(version_col == v, key_col.in_(ks)) for v, ks in by_version.items()))


_ITEM_ROW = and_(
    s.items.c.workload == bindparam("b_workload"),
    s.items.c.item_key == bindparam("b_key"),
    s.items.c.prompt_version == bindparam("b_version"),
)
_ATTEMPT_ROW = and_(s.attempts.c.job_id == bindparam("b_job"), s.attempts.c.custom_id == bindparam("b_cid"))


#: The columns :meth:`Ledger.upsert_items` fills for a new item, in order (the benchmark floor writes the same).
NEW_ITEM_COLUMNS: Final = (
    "workload",
    "item_key",
    "prompt_version",
    "app_id",
    "model",
    "input_hash",
    "request_json",
    "state",
    "attempts",
    "run_id",
    "created_at",
    "updated_at",
)

#: What one result line writes to its attempt row besides its outcome (staging columns of that name).
_ATTEMPT_USAGE_COLUMNS: Final = (
    "error_code",
    "error_message",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "cost_nusd",
)


def _bulk_update(conn: Connection, table: Any, where: Any, rows: list[dict[str, Any]]) -> None:
    """One ``executemany`` UPDATE per set of columns; ``b_*`` keys address the row.

    :param conn: an open transaction
    :param table: the table
    :param where: the row filter, written with ``b_*`` bind parameters
    :param rows: one dict per row
    """
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(k for k in row if not k.startswith("b_"))), []).append(row)
    for columns, group in groups.items():
        conn.execute(table.update().where(where).values({c: bindparam(c) for c in columns}), group)


#: Lines of one :meth:`Ledger.apply_results` transaction (staged in a temporary table, applied
#: set-based); bounded so that memory stays flat however long the result file is.
APPLY_SLICE = 5000

_staging_meta = MetaData()
#: Per-connection staging table of :meth:`Ledger.apply_results`: one row per result line of a slice.
#: Python fills what the line says (``seq`` to ``output_json``); one set-based statement then
#: decides, against the line's attempt and item, what the line does (``b_key`` to ``route``).
RESULTS_STAGE = Table(
    "abp_stage_results",
    _staging_meta,
    Column("seq", Integer),  # the line's place in the slice (several lines for one item apply in order)
    # The job's id on every line: joined through it, each line looks its attempt up by key (a
    # constant would let the planner walk every attempt of the job for each line instead).
    Column("job_id", String(250)),
    Column("custom_id", Text),  # no key and no length: a hostile line's id is staged too, then unknown
    Column("outcome", String(32)),
    Column("target", String(32)),  # the item state the outcome leads to
    Column("error_code", String(100)),
    Column("error_message", Text),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("cached_input_tokens", BigInteger),
    Column("cache_write_tokens", BigInteger),
    Column("cost_nusd", BigInteger),
    Column("output_json", Text),  # succeeded lines only
    # decided in SQL (NULL b_key: the job never sent this custom id)
    Column("b_key", String(64)),
    Column("b_version", String(100)),
    Column("b_from", String(32)),  # the item's state as read (NULL: the item is gone)
    Column("state", String(32)),  # the item's new state, NULL: the item does not move
    Column("verdict", String(8)),  # applied | late | discard (a paid-for success that is not used)
    Column("att_write", String(8)),  # full | discard (discarded flag only) | NULL (recorded already)
    Column("succeeded_hash", String(64)),
    Column("route", String(32)),
    Column("rnk", Integer),  # the line's turn among this slice's lines for its item (1 almost always)
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
)
#: Per-connection staging table of :meth:`Ledger.upsert_items`: one row per item a new run takes
#: over (``kind``: ``held`` in review, ``unchanged``, or ``changed`` and sent again).
ITEMS_STAGE = Table(
    "abp_stage_items",
    _staging_meta,
    Column("b_key", String(64)),  # no key: a key given twice is refused by the move, as before
    Column("b_version", String(100)),
    Column("b_from", String(32)),
    Column("state", String(32)),
    Column("kind", String(16)),
    Column("run_id", String(250)),
    Column("app_id", Text),
    Column("model", String(200)),
    Column("input_hash", String(64)),
    Column("request_json", Text),
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
)
#: The columns a changed item starts over without (its last attempt's news).
_CLEARED_ON_CHANGE: Final = (
    "job_id",
    "custom_id",
    "output_json",
    "error_code",
    "error_message",
    "review_action",
    "review_note",
)


def _stage(
    conn: Connection, table: Table, rows: Sequence[tuple[Any, ...]], columns: Sequence[str] | None = None
) -> None:
    """Fill a per-connection temporary table with ``rows`` (tuples in column order), emptied first.

    The floor of each database: PostgreSQL gets ``COPY ... FROM STDIN``, SQLite one prepared
    ``executemany`` on the driver's cursor (no per-row SQLAlchemy work). Values must be ``None``,
    ``bool``, ``int`` or ``str``.

    :param conn: an open transaction
    :param table: the staging table (``TEMPORARY``)
    :param rows: the rows
    :param columns: the columns the tuples fill (default: every column, in order); the others stay NULL
    """
    if conn.dialect.name == "sqlite":
        # Take the ledger's write lock first (waiting out the busy timeout): a transaction whose
        # first write is to a temporary table reads the ledger before it writes it, and SQLite
        # refuses that write at once if another process committed in between (a stale snapshot).
        conn.execute(text("DELETE FROM abp_meta WHERE 0"))
    conn.execute(CreateTable(table, if_not_exists=True))
    conn.execute(table.delete())
    _insert_rows(conn, table, [c.name for c in table.c] if columns is None else columns, rows)
    if conn.dialect.name == "postgresql":
        # Autovacuum never sees a temporary table: without statistics the planner may pick a
        # hash join that scans the whole items table for a slice of a few thousand rows.
        conn.execute(text(f"ANALYZE {table.name}"))


def _insert_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """Insert ``rows`` (tuples in ``columns`` order) at the database's floor, in the caller's transaction.

    PostgreSQL: ``COPY ... FROM STDIN`` (text format); SQLite: one prepared ``executemany`` on the
    driver's cursor. Values are ``None``, ``bool``, ``int``, ``str``, or a timestamp as
    :func:`_db_stamp` gives it.

    :param conn: an open transaction
    :param table: the table
    :param columns: the columns the tuples fill
    :param rows: the rows
    """
    if not rows:
        return
    names = ", ".join(columns)
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.name == "postgresql":
            buf = io.StringIO()
            buf.writelines("\t".join(map(_copy_text, row)) + "\n" for row in rows)
            buf.seek(0)
            cur.copy_expert(f"COPY {table.name} ({names}) FROM STDIN", buf)
        else:
            marks = ", ".join("?" for _ in columns)
            cur.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({marks})", rows)
    finally:
        cur.close()


def _db_stamp(conn: Connection, moment: datetime) -> Any:
    """``moment`` as a bulk insert passes it.

    SQLite gets the DATETIME text of the UTC wall clock (what ``UTCDateTime`` writes), PostgreSQL
    the aware datetime itself.
    """
    utc = moment.astimezone(timezone.utc)
    return utc if conn.dialect.name == "postgresql" else utc.strftime("%Y-%m-%d %H:%M:%S.%f")


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: Any) -> str:
    """One value in PostgreSQL's COPY text format."""
    if value is None:
        return "\\N"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, int):
        return str(value)
    return str(value).translate(_COPY_ESCAPES)


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


def _guard(target: str, from_states: Iterable[str] | None, reopen: bool) -> Any:
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


def _transition(
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
            raise TypeError("_transition's staged form needs the workload")
        t = staged.c
        chosen = sorted(set(targets))
        if not chosen:
            return Moved()
        guard = or_(
            *(and_(t.state == literal_column(f"'{tg}'"), _guard(tg, from_states, reopen)) for tg in chosen)
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
            raise TypeError("_transition needs target and where, or rows")
        res = conn.execute(
            s.items.update()
            .where(where, _guard(target, from_states, reopen))
            .values(**(values or {}), state=target, updated_at=now)
        )
        moved = int(res.rowcount or 0)
        left = conn.execute(select(func.count()).where(where, c.state != target)).scalar_one()
        return Moved(moved, int(left))
    row_where = _ITEM_ROW if where is None else where
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
            guard = _guard(state, from_states, reopen)
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
                            _pairs(c.item_key, c.prompt_version, keys),
                            c.state == state,
                            c.updated_at == now,
                        )
                    ).scalar_one()
                )
                for wl, keys in by_wl.items()
            )
        total = total + Moved(moved, len(group) - moved)
    return total


#: What Python stages per result line, in :data:`RESULTS_STAGE`'s column order.
_RESULT_LINE_COLUMNS: Final = (
    "seq",
    "job_id",
    "custom_id",
    "outcome",
    "target",
    *_ATTEMPT_USAGE_COLUMNS,
    "output_json",
)


def _word(name: str) -> Any:
    """A word of the fixed vocabulary (a state, an outcome, a verdict) inlined as an SQL literal."""
    return literal_column(f"'{name}'")


def _states(names: Iterable[str]) -> list[Any]:
    """State names inlined as SQL literals."""
    return [_word(name) for name in sorted(names)]


@dataclass(frozen=True)
class _ResultRules:
    """The statements that decide and apply a staged slice of one job's result lines.

    :param decide: fills each line's item, verdict and writes (lines whose item exists)
    :param decide_gone: the same for lines whose attempt exists but whose item is gone (``late``)
    :param twice: finds an item addressed by more than one line of the slice
    :param rank: numbers each item's lines in slice order (``rnk``)
    :param write_full: records outcome, usage and cost on the lines' attempts
    :param write_discard: marks the attempts of unused successes discarded
    :param item_values: what the items' move sets besides the state
    :param tally: (outcome, verdict, count) of the known lines
    :param workload: the job's workload
    """

    decide: Any
    decide_gone: Any
    twice: Any
    rank: Any
    write_full: Any
    write_discard: Any
    item_values: Mapping[str, Any]
    tally: Any
    workload: str

    def apply(self, conn: Connection, now: datetime, several: bool) -> None:
        """Decide and apply the staged slice (its lines' custom ids are distinct).

        Lines for distinct items are decided at once. Should several lines of the slice address one
        item (two attempts of it in one job), they go in turns, each decided against the item as
        the turn before left it, as if applied one after another.

        :param conn: the open transaction that staged the slice
        :param now: the ``updated_at`` to write
        :param several: more than one line is staged
        """
        t = RESULTS_STAGE.c
        conn.execute(self.decide)
        conn.execute(self.decide_gone)
        turns = 1
        if several and conn.execute(self.twice).first() is not None:
            conn.execute(self.rank)
            turns = int(conn.execute(select(func.max(t.rnk))).scalar_one())
            later = and_(t.rnk > 1, t.b_from.is_not(None))
            conn.execute(RESULTS_STAGE.update().where(later).values(verdict=None, att_write=None, state=None))
        for turn in range(1, turns + 1):
            if turn > 1:
                done = or_(t.rnk < turn, t.b_from.is_(None))
                conn.execute(RESULTS_STAGE.update().where(done).values(att_write=None, state=None))
                conn.execute(self.decide.where(t.rnk == turn))
            conn.execute(self.write_full.values(updated_at=now))
            conn.execute(self.write_discard.values(updated_at=now))
            _transition(
                conn,
                now,
                staged=RESULTS_STAGE,
                workload=self.workload,
                targets=set(_OUTCOME_STATE.values()),
                values=self.item_values,
            )


def _result_rules(job_id: str, workload: str) -> _ResultRules:
    """Build the statements of :class:`_ResultRules` for one job.

    The rules (decided per line in Python until 30 Nov, now one ``CASE`` in SQL):

    - a line is *taken* when it answers the item's current attempt (``custom_id`` matches), or is
      a late success while the item has no usable result and may still succeed, **and** the item's
      state may reach the line's target (:func:`~airflow_batch_provider.core.states.sources_of`);
    - a taken line is ``applied`` and moves the item unless it is there already; a line not taken
      is ``discard`` (a paid-for success not used) or ``late`` (kept as cost only);
    - the attempt is written in full unless it holds this outcome and cost already (a rerun), and
      an unused success marks it discarded;
    - a line for an item that is gone is ``late`` and only its attempt is written.

    :param job_id: the job
    :param workload: its workload
    """
    a, c, t = s.attempts.c, s.items.c, RESULTS_STAGE.c
    success = t.outcome == _word("succeeded")
    late = or_(c.custom_id.is_(None), c.custom_id != t.custom_id)
    late_success_taken = and_(success, c.state.in_(_states(sources_of("succeeded") - USABLE_STATES)))
    reaches = or_(
        *(
            and_(t.target == _word(target), c.state.in_(_states(sources_of(target))))
            for target in sorted(set(_OUTCOME_STATE.values()))
        )
    )
    taken = and_(or_(not_(late), late_success_taken), reaches)
    recorded = and_(a.outcome == t.outcome, a.cost_nusd == t.cost_nusd)
    this_attempt = and_(a.job_id == t.job_id, a.custom_id == t.custom_id)
    decide = (
        RESULTS_STAGE.update()
        .where(
            this_attempt,
            c.workload == workload,
            c.item_key == a.item_key,
            c.prompt_version == a.prompt_version,
        )
        .values(
            b_key=a.item_key,
            b_version=a.prompt_version,
            b_from=c.state,
            verdict=case((taken, _word("applied")), (success, _word("discard")), else_=_word("late")),
            att_write=case(
                (recorded, case((and_(not_(taken), success, not_(a.discarded)), _word("discard")))),
                else_=_word("full"),
            ),
            state=case((and_(taken, c.state != t.target), t.target)),
            succeeded_hash=c.input_hash,
            route=case((a.attempt <= 1, _word("batch")), else_=_word("resubmitted")),
        )
    )
    decide_gone = (
        RESULTS_STAGE.update()
        .where(this_attempt, t.b_key.is_(None))
        .values(
            b_key=a.item_key,
            b_version=a.prompt_version,
            verdict=_word("late"),
            att_write=case((recorded, null()), else_=_word("full")),
        )
    )
    twice = (
        select(t.b_key)
        .where(t.b_key.is_not(None))
        .group_by(t.b_key, t.b_version)
        .having(func.count() > 1)
        .limit(1)
    )
    turns = (
        select(
            t.seq.label("line"),
            func.row_number().over(partition_by=(t.b_key, t.b_version), order_by=t.seq).label("turn"),
        )
        .where(t.b_key.is_not(None))
        .subquery("turns")
    )
    rank = RESULTS_STAGE.update().where(t.seq == turns.c.line).values(rnk=turns.c.turn)
    write_full = (
        s.attempts.update()
        .where(this_attempt, t.att_write == _word("full"))
        .values(
            outcome=t.outcome,
            discarded=or_(t.outcome == _word("invalid_output"), t.verdict == _word("discard")),
            **{name: t[name] for name in _ATTEMPT_USAGE_COLUMNS},
        )
    )
    write_discard = (
        s.attempts.update().where(this_attempt, t.att_write == _word("discard")).values(discarded=True)
    )
    moved_success = t.state == _word("succeeded")
    item_values = {
        "error_code": t.error_code,
        "error_message": t.error_message,
        "output_json": case((moved_success, t.output_json), else_=c.output_json),
        "succeeded_hash": case((moved_success, t.succeeded_hash), else_=c.succeeded_hash),
        "route": case((moved_success, t.route), else_=c.route),
        "custom_id": case((moved_success, t.custom_id), else_=c.custom_id),
        "job_id": case((moved_success, job_id), else_=c.job_id),
    }
    tally = (
        select(t.outcome, t.verdict, func.count()).where(t.b_key.is_not(None)).group_by(t.outcome, t.verdict)
    )
    return _ResultRules(
        decide, decide_gone, twice, rank, write_full, write_discard, item_values, tally, workload
    )


#: PostgreSQL advisory lock held while the schema is created or upgraded (any constant will do;
#: this one is "abp:ledger" in ASCII).
SCHEMA_LOCK_KEY: Final = 0x6162703A6C6564


class Ledger:
    """The per-item store.

    :param engine: a SQLAlchemy engine (SQLite or PostgreSQL)
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_url(cls, url: str, **engine_kwargs: Any) -> Ledger:
        """Open a ledger from a SQLAlchemy URL; SQLite gets WAL mode and a busy timeout.

        :param url: e.g. ``sqlite:////data/ledger.sqlite`` or ``postgresql+psycopg2://...``
        :param engine_kwargs: passed to :func:`sqlalchemy.create_engine`
        """
        if url.startswith("sqlite"):
            engine_kwargs.setdefault("connect_args", {"timeout": 30})
        elif url.startswith("postgresql+psycopg2"):
            # batched round trips for the executemany UPDATEs of reconcile and staging
            engine_kwargs.setdefault("executemany_mode", "values_plus_batch")
        engine = create_engine(url, future=True, **engine_kwargs)
        if engine.dialect.name == "sqlite":

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()

        ledger = cls(engine)
        ledger.ensure_schema()
        return ledger

    # ------------------------------------------------------------------ schema
    def ensure_schema(self) -> None:
        """Create missing tables and check the schema version.

        Safe when many processes open a new ledger at once (the first lease and prepare tasks of
        concurrent runs do).

        On PostgreSQL the whole step runs under a session advisory lock, so a second process
        waits and then finds the tables (``CREATE TABLE`` of two sessions at once fails on the
        catalogue's unique index). On SQLite a racing creator's "already exists" is retried.

        :raises LedgerError: the database holds a newer schema than this package knows
        """
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as lock:
                lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
                try:
                    self._ensure_schema()
                finally:
                    lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
                    lock.commit()
            return
        for attempt in range(5):
            try:
                self._ensure_schema()
                return
            except DBAPIError:
                if attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def _ensure_schema(self) -> None:
        s.metadata.create_all(self.engine)
        with self.engine.connect() as conn:
            found = conn.execute(select(s.meta.c.value).where(s.meta.c.key == "schema_version")).scalar()
        if found is not None and int(found) > s.SCHEMA_VERSION:
            raise LedgerError(
                f"ledger schema version {found} is newer than this package's {s.SCHEMA_VERSION}; "
                "upgrade airflow-batch-provider on every worker."
            )
        self._add_missing_columns()
        add_missing_indexes(self.engine)
        with self.engine.begin() as conn:
            if found is None:
                conn.execute(s.meta.insert().values(key="schema_version", value=str(s.SCHEMA_VERSION)))
            elif int(found) < s.SCHEMA_VERSION:
                conn.execute(
                    s.meta.update()
                    .where(s.meta.c.key == "schema_version", s.meta.c.value == found)
                    .values(value=str(s.SCHEMA_VERSION))
                )

    def _add_missing_columns(self) -> None:
        """Upgrade an older ledger in place: add the columns of :data:`schema.ADDED_COLUMNS` it lacks.

        Safe when several workers open the ledger at once: a column another one added meanwhile
        is accepted.
        """
        dialect = self.engine.dialect
        for table_name, names in s.ADDED_COLUMNS.items():
            present = {col["name"] for col in inspect(self.engine).get_columns(table_name)}
            for name in names:
                if name in present:
                    continue
                col = s.metadata.tables[table_name].c[name]
                ddl = f"ALTER TABLE {table_name} ADD COLUMN {name} {col.type.compile(dialect=dialect)}"
                if col.server_default is not None:
                    ddl += f" DEFAULT {col.server_default.arg} NOT NULL"  # type: ignore[attr-defined]
                try:
                    with self.engine.begin() as conn:
                        conn.execute(text(ddl))
                except DBAPIError:
                    now_present = {c["name"] for c in inspect(self.engine).get_columns(table_name)}
                    if name not in now_present:
                        raise

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the database."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(s.meta.c.value).where(s.meta.c.key == "schema_version")).scalar_one()
            )

    # ------------------------------------------------------------------ runs
    def start_run(
        self,
        workload: str,
        run_id: str,
        provider: str,
        model: str,
        dag_id: str | None = None,
        batch_conn_id: str | None = None,
    ) -> str | None:
        """Record that a run started (idempotent); return the batch connection it started on.

        The first call records ``batch_conn_id``; a later one never changes it (a run started
        before the column existed takes the first one given).

        :param workload: workload name
        :param run_id: the Airflow run id
        :param provider: adapter name
        :param model: model name
        :param dag_id: the DAG of the run, when known
        :param batch_conn_id: the batch connection id the run starts on, as rendered
        """
        key = (s.runs.c.workload == workload, s.runs.c.run_id == run_id)
        with self.engine.begin() as conn:
            found = conn.execute(select(s.runs.c.dag_id, s.runs.c.batch_conn_id).where(*key)).first()
            if found is None:
                conn.execute(
                    s.runs.insert().values(
                        workload=workload,
                        run_id=run_id,
                        provider=provider,
                        model=model,
                        started_at=utcnow(),
                        dag_id=dag_id,
                        batch_conn_id=batch_conn_id,
                    )
                )
                return batch_conn_id
            if dag_id and found.dag_id != dag_id:
                conn.execute(s.runs.update().where(*key).values(dag_id=dag_id))
            if found.batch_conn_id is None and batch_conn_id is not None:
                conn.execute(
                    s.runs.update()
                    .where(*key, s.runs.c.batch_conn_id.is_(None))
                    .values(batch_conn_id=batch_conn_id)
                )
                return str(conn.execute(select(s.runs.c.batch_conn_id).where(*key)).scalar_one())
            return None if found.batch_conn_id is None else str(found.batch_conn_id)

    def run_batch_conn_id(self, workload: str, run_id: str) -> str | None:
        """The batch connection id a run started on (``None``: no such run, or none recorded).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        with self.engine.connect() as conn:
            value = conn.execute(
                select(s.runs.c.batch_conn_id).where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
            ).scalar()
        return None if value is None else str(value)

    def finish_run(self, workload: str, run_id: str, report: Mapping[str, Any]) -> None:
        """Store the run's report.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param report: JSON-safe report
        """
        with self.engine.begin() as conn:
            conn.execute(
                s.runs.update()
                .where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
                .values(finished_at=utcnow(), report_json=json.dumps(report, default=str))
            )

    def runs(self, workload: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Return the latest runs, newest first.

        :param workload: only this workload
        :param limit: how many
        """
        q = select(s.runs).order_by(s.runs.c.started_at.desc()).limit(limit)
        if workload:
            q = q.where(s.runs.c.workload == workload)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    # ------------------------------------------------------------------ items
    def upsert_items(self, workload: str, run_id: str, items: Iterable[PreparedItem]) -> UpsertStats:
        """Bring this run's items into the ledger.

        A new item, or one whose input changed or that never succeeded, becomes ``pending``. An item
        whose input hash matches its last success becomes ``unchanged`` and keeps its output. An
        item this run already recorded with the same input is left alone, so rerunning the task
        changes nothing; one whose input changed since (a record fixed after its reject, an edited
        input) is prepared again (``pending``) unless it is staged or sent. An item a run that
        started later owns stays with that run (a rerun of an older run).

        Sticky, when the input is unchanged: an item in ``review`` (or that a person resolved or
        skipped) stays there, and a ``failed_permanent`` one goes to ``review``: neither is paid for
        again until its input or prompt version changes or someone re-drives it. An item another
        run has staged or sent (or may have: its job was claimed, is in doubt or has a batch)
        stays with that run, whatever its input.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param items: the prepared items (streamed)
        :raises LedgerError: two application ids map to the same key
        """
        stats = Counter[str]()
        now = utcnow()
        c = s.items.c
        for batch in _chunks(items):
            with self.engine.begin() as conn:
                keys = [(it.key, it.request.prompt_version) for it in batch]
                existing = {
                    (r["item_key"], r["prompt_version"]): r
                    for r in conn.execute(
                        select(
                            c.item_key,
                            c.prompt_version,
                            c.app_id,
                            c.run_id,
                            c.state,
                            c.input_hash,
                            c.succeeded_hash,
                            c.review_action,
                            c.job_id,
                        ).where(c.workload == workload, _pairs(c.item_key, c.prompt_version, keys))
                    ).mappings()
                }
                newer = newer_runs(conn, workload, run_id, {str(r["run_id"]) for r in existing.values()})
                prompts = run_prompt_digests(
                    conn, workload, {run_id, *(str(r["run_id"]) for r in existing.values())}
                )
                prompt_edits: list[tuple[str, str, str, str, str]] = []
                unsent = self._unsent_jobs(
                    conn,
                    {
                        r["job_id"]
                        for r in existing.values()
                        if r["state"] == "staged" and r["run_id"] != run_id and r["job_id"]
                    },
                )
                # the send guard: an item whose job holds a batch not yet harvested, that may
                # still answer (and bill) it, stays with its run
                guarded = unharvested.guarded_items(
                    conn, and_(c.workload == workload, _pairs(c.item_key, c.prompt_version, keys))
                )
                inserts: list[tuple[Any, ...]] = []
                stamp = _db_stamp(conn, now)
                reopened: list[tuple[Any, ...]] = []
                first_ids: dict[tuple[str, str], str] = {}
                for it in batch:
                    req = it.request
                    row = existing.get((it.key, req.prompt_version))
                    # Also across this slice: two ids inserted together would otherwise surface as a
                    # bare unique-constraint error.
                    first_id = first_ids.setdefault(
                        (it.key, req.prompt_version), row["app_id"] if row is not None else req.app_id
                    )
                    if first_id != req.app_id:
                        raise LedgerError(
                            f"application ids {first_id!r} and {req.app_id!r} map to the same item key "
                            f"{it.key!r}; rename one of them."
                        )
                    input_hash = req.input_hash  # computed once: it serialises the request

                    if row is None:
                        inserts.append(
                            (
                                workload,
                                it.key,
                                req.prompt_version,
                                req.app_id,
                                req.model,
                                input_hash,
                                json.dumps(req.to_dict(), ensure_ascii=False),
                                "pending",
                                0,
                                run_id,
                                stamp,
                                stamp,
                            )
                        )
                        stats["new"] += 1
                        continue
                    state = row["state"]
                    if row["run_id"] == run_id and (
                        row["input_hash"] == input_hash or state in IN_FLIGHT_STATES
                    ):
                        stats["already_in_run"] += 1
                        continue
                    if row["run_id"] in newer:
                        stats["owned_by_newer_run"] += 1
                        continue
                    in_flight = state in IN_FLIGHT_STATES and not (
                        state == "staged" and row["job_id"] in unsent
                    )
                    if in_flight or (it.key, req.prompt_version) in guarded:
                        stats["in_flight_elsewhere"] += 1
                        continue
                    address = (it.key, req.prompt_version, state)
                    same_input = row["input_hash"] == input_hash
                    if same_input and (
                        state in ("review", "failed_permanent") or row["review_action"] is not None
                    ):
                        held = "review" if state == "failed_permanent" else state
                        reopened.append((*address, held, "held", run_id, None, None, None, None))
                        stats["in_review"] += 1
                    elif row["succeeded_hash"] == input_hash and state in USABLE_STATES:
                        reopened.append((*address, "unchanged", "unchanged", run_id, None, None, None, None))
                        stats["unchanged"] += 1
                    else:
                        edit = changed_prompt(prompts, str(row["run_id"]), run_id, req.prompt_version)
                        if edit is not None and (
                            row["succeeded_hash"] is not None
                            or state in ("review", "failed_permanent")
                            or row["review_action"] is not None
                        ):
                            # kept but for the prompt's in-place edit: the recorded reason it is paid again
                            prompt_edits.append((it.key, req.prompt_version, str(row["run_id"]), *edit))
                            stats["prompt_changed"] += 1
                        reopened.append(
                            (
                                *address,
                                "pending",
                                "changed",
                                run_id,
                                req.app_id,
                                req.model,
                                input_hash,
                                json.dumps(req.to_dict(), ensure_ascii=False),
                            )
                        )
                        stats["changed"] += 1
                if reopened:
                    _stage(conn, ITEMS_STAGE, reopened)
                    t = ITEMS_STAGE.c
                    changed = t.kind == literal_column("'changed'")
                    moved = _transition(
                        conn,
                        now,
                        staged=ITEMS_STAGE,
                        workload=workload,
                        targets={r[3] for r in reopened},
                        reopen=True,
                        values={
                            "run_id": t.run_id,
                            "route": case(
                                (t.kind == literal_column("'unchanged'"), literal_column("'unchanged'")),
                                (changed, None),
                                else_=c.route,
                            ),
                            "attempts": case((changed, 0), else_=c.attempts),
                            **{
                                name: case((changed, t[name]), else_=c[name])
                                for name in ("app_id", "model", "input_hash", "request_json")
                            },
                            **{name: case((changed, None), else_=c[name]) for name in _CLEARED_ON_CHANGE},
                        },
                    )
                    if moved.refused:
                        raise LedgerError(
                            f"{moved.refused} item(s) of workload {workload!r} changed state while run "
                            f"{run_id!r} was preparing them (another run of the workload is active?); "
                            "retry the task, and let one run hold the workload at a time."
                        )
                record_prompt_changes(conn, workload, run_id, now, prompt_edits)
                # New items start pending, at the database's bulk-insert floor.
                _insert_rows(conn, s.items, NEW_ITEM_COLUMNS, inserts)
        if (
            self.engine.dialect.name == "postgresql"
            and stats["new"] + stats["changed"] + stats["unchanged"] >= 5000
        ):
            # Fresh statistics, so that the run's keyset pages use the (workload, run_id, key) index
            # right away instead of sorting the run on every page until autovacuum analyses.
            with self.engine.begin() as conn:
                conn.execute(text("ANALYZE abp_items"))
        return UpsertStats(**stats)

    @staticmethod
    def _unsent_jobs(conn: Connection, job_ids: set[str]) -> set[str]:
        """Of ``job_ids``, those proven never sent: staged, never claimed, not in doubt, no batch."""
        if not job_ids:
            return set()
        j = s.jobs.c
        q = select(j.job_id).where(
            j.job_id.in_(sorted(job_ids)), j.state == "staged", j.claim_count == 0, j.batch_id.is_(None)
        )
        unsent = {str(r) for r in conn.execute(q).scalars()}
        known = {
            str(r) for r in conn.execute(select(j.job_id).where(j.job_id.in_(sorted(job_ids)))).scalars()
        }
        return unsent | (job_ids - known)

    def reject_items(
        self, workload: str, run_id: str, rejected: Iterable[tuple[PreparedItem | None, str, str, str]]
    ) -> int:
        """Record items that cannot be sent, in ``review`` with the reason; others go on.

        An item a run that started later owns is left with it.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param rejected: (item or ``None`` when it could not be rendered, app id, code, message)
        """
        now = utcnow()
        count = 0
        with self.engine.begin() as conn:
            for prepared, app_id, code, message in rejected:
                from airflow_batch_provider.core.custom_ids import item_key

                key = prepared.key if prepared else item_key(app_id)
                version = prepared.request.prompt_version if prepared else "-"
                where = and_(
                    s.items.c.workload == workload,
                    s.items.c.item_key == key,
                    s.items.c.prompt_version == version,
                )
                found = conn.execute(select(s.items.c.run_id).where(where)).first()
                values = {"run_id": run_id, "error_code": code, "error_message": message, "route": None}
                if found and found.run_id != run_id and newer_runs(conn, workload, run_id, [found.run_id]):
                    continue  # a newer run owns it: a rerun of an older run does not take it back
                if found:
                    # An item another run has in flight stays with it; anything else is reopened.
                    moved = _transition(
                        conn,
                        now,
                        target="review",
                        where=where,
                        values=values,
                        from_states=(
                            ITEM_STATES if found.run_id == run_id else set(ITEM_STATES) - IN_FLIGHT_STATES
                        ),
                        reopen=True,
                    )
                    count += moved.moved
                else:
                    req = prepared.request if prepared else None
                    conn.execute(
                        s.items.insert().values(
                            workload=workload,
                            item_key=key,
                            prompt_version=version,
                            app_id=app_id,
                            model=req.model if req else "-",
                            input_hash=req.input_hash if req else "-",
                            request_json=json.dumps(req.to_dict()) if req else "{}",
                            attempts=0,
                            created_at=now,
                            updated_at=now,
                            state="review",
                            **values,
                        )
                    )
                    count += 1
        return count

    def iter_items(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        page: int = BATCH,
    ) -> Iterator[RowMapping]:
        """Stream this run's items in key order, a page per short read (keyset pagination).

        No cursor stays open between pages, so the caller may write to the ledger while iterating.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param states: only these states
        :param columns: only these columns (the key columns are always included)
        :param page: rows per read
        """
        wanted = list(
            dict.fromkeys(["item_key", "prompt_version", *(columns or [col.name for col in s.items.c])])
        )
        for rows in self._item_pages(workload, run_id, states, wanted, page):
            yield from (row._mapping for row in rows)

    @overload
    def iter_item_rows(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        *,
        job_id: str | None = None,
        page: int = BATCH,
    ) -> Iterator[ItemRow]: ...

    @overload
    def iter_item_rows(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        *,
        shape: type[_Shape],
        job_id: str | None = None,
        page: int = BATCH,
    ) -> Iterator[_Shape]: ...

    def iter_item_rows(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        *,
        shape: type[Any] = ItemRow,
        job_id: str | None = None,
        page: int = BATCH,
    ) -> Iterator[Any]:
        """Stream this run's items as typed, frozen rows, in key order, a page per short read.

        Only the columns of ``shape`` are read (``OpenItem`` for sending, ``ItemRef`` without the
        bodies, ``ItemOutcome`` for results, ``ItemRow`` for all). No cursor stays open between
        pages, so the caller may write to the ledger while iterating.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param states: only these states
        :param shape: the record to build (one of ``ledger.records.ITEM_SHAPES``)
        :param job_id: only the items placed on this job
        :param page: rows per read
        :raises LedgerError: ``shape`` is not one of the item shapes
        """
        if shape not in ITEM_SHAPES:
            raise LedgerError(
                f"iter_item_rows reads items as one of {[c.__name__ for c in ITEM_SHAPES]}, not "
                f"{getattr(shape, '__name__', shape)!r}; add the shape to ledger/records.py's ITEM_SHAPES."
            )
        # Selected in the shape's field order, so each row builds its record positionally.
        for rows in self._item_pages(
            workload, run_id, states, [f.name for f in dataclass_fields(shape)], page, job_id
        ):
            yield from (shape(*row) for row in rows)

    def _item_pages(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None,
        wanted: Sequence[str],
        page: int,
        job_id: str | None = None,
    ) -> Iterator[list[Row[Any]]]:
        """Pages of this run's items (``wanted`` columns, which include the key), in key order."""
        c = s.items.c
        key_at = (wanted.index("item_key"), wanted.index("prompt_version"))
        last: tuple[str, str] | None = None
        while True:
            q = select(*[c[name] for name in wanted]).where(c.workload == workload, c.run_id == run_id)
            if states is not None:
                q = q.where(c.state.in_(list(states)))
            if job_id is not None:
                q = q.where(c.job_id == job_id)
            if last is not None:
                q = q.where(tuple_(c.item_key, c.prompt_version) > tuple_(*last))
            q = q.order_by(c.item_key, c.prompt_version).limit(page)
            with self.engine.connect() as conn:
                rows = list(conn.execute(q))
            yield rows
            if len(rows) < page:
                return
            last = (rows[-1][key_at[0]], rows[-1][key_at[1]])

    def count_states(self, workload: str, run_id: str) -> dict[str, int]:
        """Return this run's items by state.

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        q = (
            select(s.items.c.state, func.count())
            .where(s.items.c.workload == workload, s.items.c.run_id == run_id)
            .group_by(s.items.c.state)
        )
        with self.engine.connect() as conn:
            return {state: int(n) for state, n in conn.execute(q)}

    def transition(
        self,
        workload: str,
        run_id: str,
        target: str,
        from_states: Sequence[str],
        keys: Sequence[tuple[str, str]] | None = None,
        *,
        attempts_below: int | None = None,
        **values: Any,
    ) -> int:
        """Move this run's items in ``from_states`` (optionally only ``keys``) to ``target``.

        Through the guarded transition: an item that left ``from_states`` meanwhile is not moved.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param target: the new state
        :param from_states: states to move from; each must connect to ``target``
        :param keys: (item key, prompt version) pairs to restrict to
        :param attempts_below: only items with fewer attempts than this (one statement, however
            many items: no list of keys)
        :param values: extra columns to set
        :raises InvalidTransitionError: a source state does not connect to ``target``
        """
        _guard(target, from_states, reopen=False)  # refuse a bad move before touching anything
        total = Moved()
        base = and_(
            s.items.c.workload == workload, s.items.c.run_id == run_id, s.items.c.state.in_(list(from_states))
        )
        if attempts_below is not None:
            base = and_(base, s.items.c.attempts < attempts_below)
        with self.engine.begin() as conn:
            now = utcnow()
            for batch in [None] if keys is None else _chunks(keys):
                where = (
                    base
                    if batch is None
                    else and_(base, _pairs(s.items.c.item_key, s.items.c.prompt_version, batch))
                )
                total = total + _transition(
                    conn, now, target=target, where=where, values=values, from_states=from_states
                )
        return total.moved

    # ------------------------------------------------------------------ jobs
    def record_job(
        self,
        job: Mapping[str, Any],
        placements: Iterable[tuple[str, str, str, int]],
    ) -> None:
        """Record a staged job and move its items to ``staged`` in one transaction (idempotent).

        :param job: the job row (``job_id``, ``workload``, ``run_id``, ``round``, ``chunk_index``,
            ``provider``, ``model``, ``idempotency_key``, ``staged_path``, ``input_sha256``, ``lines``,
            ``size_bytes``)
        :param placements: (item key, prompt version, custom id, attempt) per line of the chunk
        """
        now = utcnow()
        with self.engine.begin() as conn:
            found = conn.execute(select(s.jobs.c.job_id).where(s.jobs.c.job_id == job["job_id"])).first()
            if found is not None:
                return
            conn.execute(s.jobs.insert().values(**job, state="staged", created_at=now))
            for batch in _chunks(placements):
                conn.execute(
                    s.attempts.insert(),
                    [
                        {
                            "job_id": job["job_id"],
                            "custom_id": cid,
                            "workload": job["workload"],
                            "item_key": key,
                            "prompt_version": version,
                            "run_id": job["run_id"],
                            "attempt": attempt,
                            "mode": "batch",
                            "created_at": now,
                            "updated_at": now,
                        }
                        for key, version, cid, attempt in batch
                    ],
                )
                moved = _transition(
                    conn,
                    now,
                    rows=[
                        {
                            "b_workload": job["workload"],
                            "b_key": key,
                            "b_version": version,
                            "state": "staged",
                            "job_id": job["job_id"],
                            "custom_id": cid,
                            "attempts": attempt,
                            "error_code": None,
                            "error_message": None,
                        }
                        for key, version, cid, attempt in batch
                    ],
                )
                if moved.refused:
                    raise InvalidTransitionError(
                        f"job {job['job_id']!r}: {moved.refused} of its items are no longer in a state "
                        "that may be staged (settled, in review or in flight elsewhere); nothing was "
                        "recorded. Clear the prepare task so that it chunks the open items again."
                    )

    def job(self, job_id: str) -> dict[str, Any]:
        """Return one job as a dict, for the ledger's own code (the glue reads :meth:`get_job`).

        :param job_id: the job id
        :raises LedgerError: no such job
        """
        with self.engine.connect() as conn:
            row = conn.execute(select(s.jobs).where(s.jobs.c.job_id == job_id)).mappings().first()
        if row is None:
            raise LedgerError(
                f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
            )
        return dict(row)

    def get_job(self, job_id: str) -> JobRow:
        """Return one job as a typed row.

        :param job_id: the job id
        :raises LedgerError: no such job
        """
        return JobRow.from_row(self.job(job_id))

    def get_jobs(self, workload: str, run_id: str, round_: int | None = None) -> list[JobRow]:
        """Return this run's jobs (optionally one round's), by round and chunk, as typed rows.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param round_: only this round
        """
        q = select(s.jobs).where(s.jobs.c.workload == workload, s.jobs.c.run_id == run_id)
        if round_ is not None:
            q = q.where(s.jobs.c.round == round_)
        q = q.order_by(s.jobs.c.round, s.jobs.c.chunk_index)
        with self.engine.connect() as conn:
            return [JobRow.from_row(r) for r in conn.execute(q).mappings()]

    # ------------------------------------------------------------------ job claims
    def claim_job(self, job_id: str, owner: str, lease_s: float) -> JobClaim:
        """Claim a job's create call: a compare-and-set in one statement, so two attempts never both win.

        The claim is taken when the job is unclaimed, already claimed by ``owner`` (a retry of the
        same attempt), or its previous claim expired. Each claim increments the job's claim count,
        so a later claimer knows that an earlier one may have reached the provider and must look
        the batch up by its idempotency key before creating.

        :param job_id: the job
        :param owner: who claims (unique per task attempt, e.g. ``dag/run/task/try/pid``)
        :param lease_s: seconds the claim holds before another owner may take it over
        :raises JobClaimedError: another owner holds an unexpired claim
        :raises JobNotClaimableError: the job has a batch id or is in doubt
        :raises LedgerError: no such job
        """
        now = utcnow()
        expires = now + timedelta(seconds=lease_s)
        j = s.jobs.c
        stmt = (
            s.jobs.update()
            .where(
                j.job_id == job_id,
                j.batch_id.is_(None),
                j.state != "in_doubt",
                or_(j.claim_owner.is_(None), j.claim_owner == owner, j.claim_expires_at < now),
            )
            .values(claim_owner=owner, claim_count=j.claim_count + 1, claim_expires_at=expires)
            .returning(j.claim_count, j.claim_expires_at)
        )
        with self.engine.begin() as conn:
            won = conn.execute(stmt).first()
            if won is not None:
                return JobClaim(job_id, owner, int(won.claim_count), won.claim_expires_at)
            job = conn.execute(select(s.jobs).where(j.job_id == job_id)).mappings().first()
        if job is None:
            raise LedgerError(
                f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
            )
        if job["batch_id"] is not None:
            raise JobNotClaimableError(job_id, "submitted", str(job["batch_id"]))
        if job["state"] == "in_doubt":
            raise JobNotClaimableError(job_id, "in_doubt", str(job["in_doubt_reason"]))
        raise JobClaimedError(job_id, str(job["claim_owner"]), _iso(job["claim_expires_at"]))

    def release_job_claim(self, job_id: str, owner: str) -> bool:
        """Give up a claim (after the batch id is recorded, or when nothing was sent).

        Returns whether ``owner`` held it; a claim taken over by someone else is left alone. The
        claim count stays: it is the job's history.

        :param job_id: the job
        :param owner: who claimed it
        """
        j = s.jobs.c
        with self.engine.begin() as conn:
            res = conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, j.claim_owner == owner)
                .values(claim_owner=None, claim_expires_at=None)
            )
        return bool(res.rowcount)

    # ------------------------------------------------------------------ jobs in doubt
    def mark_job_in_doubt(self, job_id: str, reason: str) -> None:
        """Record that a create call's outcome is unknown: nothing is created for the job until resolved.

        Its items stay ``staged`` under the job (never picked up by another job or run). The claim
        is dropped: no attempt may create while the job is in doubt.

        :param job_id: the job
        :param reason: what happened (e.g. ``timeout after create; provider cannot be listed``)
        :raises LedgerError: no such job, or it has a batch id already
        """
        j = s.jobs.c
        with self.engine.begin() as conn:
            res = conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, j.batch_id.is_(None))
                .values(
                    state="in_doubt",
                    in_doubt_reason=reason,
                    in_doubt_at=utcnow(),
                    claim_owner=None,
                    claim_expires_at=None,
                )
            )
        if not res.rowcount:
            job = self.job(job_id)
            raise LedgerError(
                f"job {job_id!r} has batch {job['batch_id']!r} already; it is not in doubt. Poll that batch."
            )

    def resolve_job(
        self,
        job_id: str,
        batch_id: str | None,
        actor: str,
        note: str,
        submitted_at: datetime | None = None,
        input_ref: str | None = None,
    ) -> JobRow:
        """Settle a job in doubt, and write the decision to the audit table.

        :param job_id: the job
        :param batch_id: the batch found for it: the job becomes ``submitted`` and its ``staged``
            items ``submitted``, and so do those sent to review while it was in doubt (code
            ``in_doubt``, no person's decision): the batch answered and billed them, so they are
            harvested from it (by the run's publish, or by the next run of the workload once the
            run is finished: :mod:`~airflow_batch_provider.services.late_harvest`),
            never sent again; ``None``: proven absent, the job goes back to ``staged`` and may be
            claimed again (its items stay staged under it; those in review may be re-driven)
        :param actor: who decided (a person, or ``provider-list`` when matched automatically)
        :param note: why (what was checked)
        :param submitted_at: when the batch was created, if known (keeps the poll timeout honest)
        :param input_ref: the provider's input file id, if known
        :raises LedgerError: no such job, or it is not in doubt
        """
        j = s.jobs.c
        now = utcnow()
        with self.engine.begin() as conn:
            job = conn.execute(select(s.jobs).where(j.job_id == job_id).with_for_update()).mappings().first()
            if job is None:
                raise LedgerError(
                    f"job {job_id!r} is not in the ledger; check the id (`airflow-batch jobs in-doubt`)."
                )
            if job["state"] != "in_doubt":
                raise LedgerError(
                    f"job {job_id!r} is {job['state']!r} (batch {job['batch_id']!r}), not in doubt; nothing to resolve."
                )
            if batch_id is not None:
                values: dict[str, Any] = {
                    "state": "submitted",
                    "batch_id": batch_id,
                    "submitted_at": submitted_at or job["in_doubt_at"] or now,
                }
                if input_ref is not None:
                    values["input_ref"] = input_ref
                conn.execute(s.jobs.update().where(j.job_id == job_id).values(**values))
                ic = s.items.c
                _transition(
                    conn,
                    now,
                    target="submitted",
                    where=and_(
                        ic.job_id == job_id,
                        or_(
                            ic.state == "staged",
                            # sent to review while the job was in doubt, no person's decision yet:
                            # the batch holds their answers, harvested from it, never sent again
                            and_(
                                ic.state == "review",
                                ic.error_code == IN_DOUBT_CODE,
                                ic.review_action.is_(None),
                            ),
                        ),
                    ),
                    values={"error_code": None, "error_message": None},
                )
            else:
                conn.execute(
                    s.jobs.update()
                    .where(j.job_id == job_id)
                    .values(state="staged", claim_owner=None, claim_expires_at=None)
                )
            _audit(
                conn,
                now,
                actor,
                "resolve_job",
                str(job["workload"]),
                int(job["lines"]),
                {"job_id": job_id, "batch_id": batch_id, "in_doubt_reason": job["in_doubt_reason"]},
                note,
            )
            row = conn.execute(select(s.jobs).where(j.job_id == job_id)).mappings().one()
        return JobRow.from_row(row)

    def jobs_in_doubt(self, workload: str | None = None) -> list[JobRow]:
        """Return the jobs whose create call's outcome is unknown, oldest first.

        :param workload: only this workload
        """
        q = select(s.jobs).where(s.jobs.c.state == "in_doubt").order_by(s.jobs.c.in_doubt_at, s.jobs.c.job_id)
        if workload is not None:
            q = q.where(s.jobs.c.workload == workload)
        with self.engine.connect() as conn:
            return [JobRow.from_row(r) for r in conn.execute(q).mappings()]

    # ------------------------------------------------------------------ workload lease
    def acquire_workload_lease(
        self,
        workload: str,
        run_id: str,
        owner: str,
        dag_id: str | None = None,
        takeover: bool = False,
    ) -> WorkloadLease:
        """Let one run at a time hold a workload (one statement: insert, or update when it is ours).

        The same run acquires again without effect but the new ``owner`` (a retried or cleared
        task). Another run gets :class:`WorkloadLeasedError`, unless ``takeover``: then the lease
        moves to this run (the caller decides that, e.g. from Airflow's own state of the holding
        run) and the takeover is written to the audit table. Items another run has in flight stay
        with that run here; the new run's prepare adopts them
        (:mod:`~airflow_batch_provider.ledger.adoption`).

        :param workload: workload name
        :param run_id: the Airflow run id
        :param owner: the task attempt acquiring it
        :param dag_id: the run's DAG (also recorded on the run's row)
        :param takeover: move the lease from another run
        :raises WorkloadLeasedError: another run holds the workload
        """
        lt = s.leases
        now = utcnow()
        with self.engine.begin() as conn:
            before = None
            if takeover:
                before = conn.execute(select(lt.c.run_id).where(lt.c.workload == workload)).scalar()
            ins = _dialect_insert(conn)(lt).values(
                workload=workload, run_id=run_id, dag_id=dag_id, owner=owner, acquired_at=now
            )
            mine = lt.c.run_id == ins.excluded.run_id
            stmt = ins.on_conflict_do_update(
                index_elements=[lt.c.workload],
                set_={
                    "run_id": ins.excluded.run_id,
                    "owner": ins.excluded.owner,
                    "dag_id": func.coalesce(ins.excluded.dag_id, lt.c.dag_id),
                    # a re-acquire by the holding run keeps its "since"
                    "acquired_at": case((mine, lt.c.acquired_at), else_=ins.excluded.acquired_at),
                    "taken_over_from": case((mine, lt.c.taken_over_from), else_=lt.c.run_id),
                },
                where=None if takeover else mine,
            ).returning(lt.c.run_id, lt.c.dag_id, lt.c.owner, lt.c.acquired_at, lt.c.taken_over_from)
            won = conn.execute(stmt).first()
            if won is None:
                held = conn.execute(select(lt).where(lt.c.workload == workload)).mappings().one()
                raise WorkloadLeasedError(workload, held["run_id"], held["dag_id"], _iso(held["acquired_at"]))
            if dag_id:
                conn.execute(
                    s.runs.update()
                    .where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
                    .values(dag_id=dag_id)
                )
            if takeover and before is not None and before != run_id:
                _audit(
                    conn,
                    now,
                    owner,
                    "takeover_lease",
                    workload,
                    0,
                    {"from_run": before, "to_run": run_id},
                    "",
                )
        return WorkloadLease(
            workload, won.run_id, won.dag_id, won.owner, won.acquired_at, won.taken_over_from
        )

    def workload_lease(self, workload: str) -> WorkloadLease | None:
        """Return who holds a workload, or ``None``.

        :param workload: workload name
        """
        lt = s.leases
        with self.engine.connect() as conn:
            row = conn.execute(select(lt).where(lt.c.workload == workload)).mappings().first()
        if row is None:
            return None
        return WorkloadLease(
            row["workload"],
            row["run_id"],
            row["dag_id"],
            row["owner"],
            row["acquired_at"],
            row["taken_over_from"],
        )

    def release_workload_lease(
        self, workload: str, run_id: str, actor: str | None = None, reason: str = ""
    ) -> bool:
        """Release a workload if ``run_id`` holds it; return whether it did.

        :param workload: workload name
        :param run_id: the run that holds it (a lease another run holds is left alone)
        :param actor: a person releasing a dead run's lease: the release is written to the audit table
        :param reason: why (with ``actor``)
        """
        lt = s.leases
        with self.engine.begin() as conn:
            res = conn.execute(lt.delete().where(lt.c.workload == workload, lt.c.run_id == run_id))
            released = bool(res.rowcount)
            if released and actor is not None:
                _audit(conn, utcnow(), actor, "release_lease", workload, 0, {"run_id": run_id}, reason)
        return released

    def update_job(self, job_id: str, **values: Any) -> None:
        """Set columns of one job.

        :param job_id: the job id
        :param values: columns to set
        """
        with self.engine.begin() as conn:
            conn.execute(s.jobs.update().where(s.jobs.c.job_id == job_id).values(**values))

    def record_infra_cost(self, row: Mapping[str, Any]) -> None:
        """Record (or replace) the infrastructure cost of one self-hosted job.

        :param row: the ``abp_infra_costs`` columns (``job_id``, ``workload``, ``run_id``,
            ``gpu_count``, ``gpu_seconds``, ``usd_per_gpu_hour_micros``, ``cost_nusd``, ``outcome`` ...)
        """
        with self.engine.begin() as conn:
            conn.execute(s.infra_costs.delete().where(s.infra_costs.c.job_id == row["job_id"]))
            conn.execute(s.infra_costs.insert().values(**row))

    def infra_costs(self, workload: str, run_id: str) -> list[dict[str, Any]]:
        """Return the infrastructure cost rows of a run, by job id.

        :param workload: the workload
        :param run_id: the run id
        """
        query = (
            select(s.infra_costs)
            .where(s.infra_costs.c.workload == workload, s.infra_costs.c.run_id == run_id)
            .order_by(s.infra_costs.c.job_id)
        )
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def record_upload(self, job_id: str, input_kind: str, input_ref: str | None) -> tuple[str, str | None]:
        """Record what the upload task staged at the provider; the first recorded upload wins.

        A compare-and-set: the job takes ``input_kind``/``input_ref`` (and state ``uploaded``)
        only while it has no recorded input and no batch. Returns what the job holds afterwards:
        the arguments when this call recorded them, else the upload recorded earlier (a second
        file for the same chunk is then not used: the caller reports it).

        :param job_id: the job
        :param input_kind: ``file``, ``uri`` or ``inline``
        :param input_ref: the file id or URI (``None`` for ``inline``)
        :raises LedgerError: no such job
        """
        j = s.jobs.c
        with self.engine.begin() as conn:
            conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, j.input_kind.is_(None), j.batch_id.is_(None))
                .values(input_kind=input_kind, input_ref=input_ref, state="uploaded")
            )
            held = conn.execute(select(j.input_kind, j.input_ref).where(j.job_id == job_id)).first()
        if held is None:
            raise LedgerError(
                f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
            )
        return str(held.input_kind or input_kind), held.input_ref

    def mark_submitted(
        self, job_id: str, batch_id: str, input_ref: str, submitted_at: datetime | None = None
    ) -> None:
        """Record the provider's batch id and move the job's items to ``submitted``.

        Repeating it with the same batch keeps the first ``submitted_at`` (a re-attach does not
        restart the poll timeout). A different batch for a job that has one is refused: two
        batches were created for one job and both are billed.

        :param job_id: the job id
        :param batch_id: the provider's batch id
        :param input_ref: where the input was staged at the provider
        :param submitted_at: when the provider created the batch, if known (default: now)
        :raises LedgerError: no such job, or it has another batch already
        """
        now = utcnow()
        j = s.jobs.c
        with self.engine.begin() as conn:
            res = conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, or_(j.batch_id.is_(None), j.batch_id == batch_id))
                .values(
                    state="submitted",
                    batch_id=batch_id,
                    input_ref=input_ref,
                    submitted_at=func.coalesce(j.submitted_at, submitted_at or now),
                )
            )
            if not res.rowcount:
                held = conn.execute(select(j.batch_id).where(j.job_id == job_id)).first()
                if held is None:
                    raise LedgerError(
                        f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
                    )
                raise LedgerError(
                    f"job {job_id!r} has batch {held.batch_id!r} already, and batch {batch_id!r} was "
                    "created for it too: both are billed. Nothing was recorded for the second; cancel "
                    "it at the provider, or reconcile it by hand."
                )
            _transition(
                conn,
                now,
                target="submitted",
                where=and_(s.items.c.job_id == job_id, s.items.c.state == "staged"),
            )

    # ------------------------------------------------------------------ results
    def apply_results(
        self,
        job_id: str,
        results: Iterable[ItemResult],
        cost_of: Callable[[Usage], Decimal],
    ) -> ReconcileStats:
        """Upsert result lines of one job by custom id, and move items accordingly.

        A result for the item's current attempt sets its state; a result for an older attempt is
        kept in the attempts table (its cost is real) and counted as ``late``; a success that
        comes too late to be used (the item settled meanwhile) is kept as discarded cost. A line
        seen twice in one pass is counted as a duplicate and applied once. Repeating the pass
        changes nothing.

        Set-based: Python prices each line; a slice of :data:`APPLY_SLICE` lines is staged in a
        temporary table (``COPY`` on PostgreSQL, one ``executemany`` on SQLite), one ``UPDATE ...
        FROM`` decides every line against its attempt and item (:func:`_result_rules`), and one
        ``UPDATE ... FROM`` per table applies them, the items' through :func:`_transition`.

        :param job_id: the job whose files these are
        :param results: parsed results (streamed)
        :param cost_of: prices one line's usage
        """
        stats = ReconcileStats()
        seen: set[str] = set()
        rules = _result_rules(job_id, self.job(job_id)["workload"])
        prices: dict[Usage, int] = {}
        for batch in _chunks(results, APPLY_SLICE):
            lines: list[tuple[Any, ...]] = []
            for res in batch:
                cid = res.custom_id
                if cid in seen:
                    stats.duplicates += 1
                    continue
                seen.add(cid)
                usage = res.usage
                cost = prices.get(usage)
                if cost is None:
                    if len(prices) >= APPLY_SLICE:
                        prices.clear()
                    cost = prices[usage] = to_nusd(cost_of(usage))
                lines.append(
                    (
                        len(lines),
                        job_id,
                        cid,
                        res.outcome,
                        _OUTCOME_STATE[res.outcome],
                        res.error_code,
                        res.error_message,
                        usage.input_tokens,
                        usage.output_tokens,
                        usage.cached_input_tokens,
                        usage.cache_write_tokens,
                        cost,
                        json.dumps(res.output, ensure_ascii=False) if res.outcome == "succeeded" else None,
                    )
                )
            if not lines:
                continue
            with self.engine.begin() as conn:
                _stage(conn, RESULTS_STAGE, lines, _RESULT_LINE_COLUMNS)
                rules.apply(conn, utcnow(), several=len(lines) > 1)
                known = 0
                for outcome, verdict, count in conn.execute(rules.tally):
                    known += count
                    stats.outcomes[outcome] += count
                    if verdict == "applied":
                        stats.applied += count
                    else:
                        stats.late += count
                stats.unknown += len(lines) - known
        return stats

    @staticmethod
    def _mark_discarded(conn: Connection, att: RowMapping, now: datetime) -> None:
        if att["discarded"]:
            return
        conn.execute(
            s.attempts.update()
            .where(s.attempts.c.job_id == att["job_id"], s.attempts.c.custom_id == att["custom_id"])
            .values(discarded=True, updated_at=now)
        )

    def mark_missing(self, job_id: str) -> int:
        """Mark every line of a finished job that no result file mentioned as ``missing``.

        Their items become ``failed_retryable`` (error code ``missing``) when the missing line is
        their current attempt. Returns how many lines of the job are missing in all (so a rerun
        reports the same figure).

        :param job_id: the job id
        """
        now = utcnow()
        job = self.job(job_id)
        with self.engine.begin() as conn:
            rows = list(
                conn.execute(
                    select(s.attempts).where(s.attempts.c.job_id == job_id, s.attempts.c.outcome.is_(None))
                ).mappings()
            )
            _bulk_update(
                conn,
                s.attempts,
                _ATTEMPT_ROW,
                [
                    {
                        "b_job": job_id,
                        "b_cid": a["custom_id"],
                        "outcome": "missing",
                        "error_code": "missing",
                        "updated_at": now,
                    }
                    for a in rows
                ],
            )
            if rows:
                # Only items whose current attempt is the missing line move; an item that went on to
                # a newer attempt keeps its state.
                _transition(
                    conn,
                    now,
                    where=and_(_ITEM_ROW, s.items.c.custom_id == bindparam("b_cid")),
                    from_states=["submitted"],
                    rows=[
                        {
                            "b_workload": job["workload"],
                            "b_key": a["item_key"],
                            "b_version": a["prompt_version"],
                            "b_cid": a["custom_id"],
                            "state": "failed_retryable",
                            "error_code": "missing",
                            "error_message": "absent from every result file of the batch",
                        }
                        for a in rows
                    ],
                )
            total = conn.execute(
                select(func.count()).where(s.attempts.c.job_id == job_id, s.attempts.c.outcome == "missing")
            ).scalar_one()
        return int(total)

    # ------------------------------------------------------------------ rounds
    def retry_candidates(self, workload: str, run_id: str, max_attempts: int) -> tuple[int, int]:
        """Send exhausted and permanent failures to ``review``; count what may go out again.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param max_attempts: attempts cap per item
        :return: (items that may be resubmitted, items sent to review now)
        """
        with self.engine.begin() as conn:
            base = and_(s.items.c.workload == workload, s.items.c.run_id == run_id)
            to_review = _transition(
                conn,
                utcnow(),
                target="review",
                where=and_(
                    base,
                    (s.items.c.state == "failed_permanent")
                    | (s.items.c.state.in_(list(RETRYABLE_STATES)) & (s.items.c.attempts >= max_attempts)),
                ),
            ).moved
            retry = conn.execute(
                select(func.count()).where(
                    base, s.items.c.state.in_(list(RETRYABLE_STATES)), s.items.c.attempts < max_attempts
                )
            ).scalar_one()
        return int(retry), int(to_review or 0)

    # ------------------------------------------------------------------ review and re-drive
    def review_items(
        self, workload: str, error_code: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[ItemRow]:
        """Return the open review queue of a workload (in review, no person's decision yet), by key.

        :param workload: workload name
        :param error_code: only items with this error code
        :param limit: at most this many
        :param offset: skip this many first
        """
        c = s.items.c
        # the state inline: the partial review index (ix_abp_items_review) serves it on SQLite too
        q = select(s.items).where(
            c.workload == workload, c.state == _word("review"), c.review_action.is_(None)
        )
        if error_code is not None:
            q = q.where(c.error_code == error_code)
        q = q.order_by(c.item_key, c.prompt_version).limit(limit).offset(offset)
        with self.engine.connect() as conn:
            return [ItemRow.from_row(r) for r in conn.execute(q).mappings()]

    def redrive(
        self,
        workload: str,
        *,
        item_keys: Sequence[str] | None = None,
        app_ids: Sequence[str] | None = None,
        error_code: str | None = None,
        actor: str,
        reason: str,
    ) -> int:
        """Send settled failures back to ``pending`` with attempts 0: the next run sends them again.

        Addresses items in review (the default), or any re-drivable state (review, failed,
        expired, cancelled, skipped) when keys, application ids or an error code are given.
        Items in flight or with a usable result are never moved. Returns how many moved; the
        action is written to the audit table.

        :param workload: workload name
        :param item_keys: only these item keys
        :param app_ids: only these application ids (with ``item_keys``: either)
        :param error_code: only items with this error code
        :param actor: who
        :param reason: why
        """
        return self._review_action(
            "redrive",
            workload,
            item_keys,
            app_ids,
            error_code,
            actor,
            reason,
            target="pending",
            from_states=REDRIVABLE_STATES,
            guard=True,
            values={
                "attempts": 0,
                "job_id": None,
                "custom_id": None,
                "route": None,
                "error_code": None,
                "error_message": None,
                "review_action": None,
                "review_note": None,
            },
        )

    def resolve_review(
        self,
        workload: str,
        *,
        item_keys: Sequence[str] | None = None,
        app_ids: Sequence[str] | None = None,
        error_code: str | None = None,
        actor: str,
        note: str,
    ) -> int:
        """Mark review items resolved by a person: they leave the queue and stay out of every run.

        They stay in ``review`` (no usable answer) until their input or prompt version changes or
        someone re-drives them. Returns how many; written to the audit table.

        :param workload: workload name
        :param item_keys: only these item keys
        :param app_ids: only these application ids
        :param error_code: only items with this error code
        :param actor: who
        :param note: how it was resolved
        """
        return self._review_action(
            "resolve_review",
            workload,
            item_keys,
            app_ids,
            error_code,
            actor,
            note,
            target="review",
            from_states={"review"},
            values={"review_action": "resolved", "review_note": note},
        )

    def skip_review(
        self,
        workload: str,
        *,
        item_keys: Sequence[str] | None = None,
        app_ids: Sequence[str] | None = None,
        error_code: str | None = None,
        actor: str,
        reason: str,
    ) -> int:
        """Skip review items: they become ``skipped`` (published so) and stay out of every run.

        Until their input or prompt version changes or someone re-drives them. Returns how many;
        written to the audit table.

        :param workload: workload name
        :param item_keys: only these item keys
        :param app_ids: only these application ids
        :param error_code: only items with this error code
        :param actor: who
        :param reason: why
        """
        return self._review_action(
            "skip_review",
            workload,
            item_keys,
            app_ids,
            error_code,
            actor,
            reason,
            target="skipped",
            from_states={"review"},
            values={"review_action": "skipped", "review_note": reason},
        )

    def _review_action(
        self,
        action: str,
        workload: str,
        item_keys: Sequence[str] | None,
        app_ids: Sequence[str] | None,
        error_code: str | None,
        actor: str,
        reason: str,
        *,
        target: str,
        from_states: Iterable[str],
        values: Mapping[str, Any],
        guard: bool = False,
    ) -> int:
        if not actor or not reason:
            raise LedgerError(f"{action} needs an actor and a reason, for the audit table.")
        c = s.items.c
        addressed = item_keys is not None or app_ids is not None or error_code is not None
        # Without an address only the open queue; an address may reach any state in from_states.
        wide = addressed and set(from_states) != {"review"}
        states = set(from_states) if wide else {"review"}
        base = [c.workload == workload, c.state.in_(sorted(states))]
        if not wide:
            base.append(c.review_action.is_(None))
        if error_code is not None:
            base.append(c.error_code == error_code)
        target_info: dict[str, Any] = {"error_code": error_code} if error_code is not None else {}
        now = utcnow()
        moved = 0
        with self.engine.begin() as conn:
            if item_keys is None and app_ids is None:
                if guard:
                    unharvested.refuse_unharvested(conn, "redrive", workload, and_(*base))
                moved = _transition(
                    conn, now, target=target, where=and_(*base), values=values, from_states=states
                ).moved
                target_info["filter"] = "review queue" if not addressed else "error_code"
            else:
                keys, ids = list(item_keys or []), list(app_ids or [])
                for i in range(0, max(len(keys), len(ids)), BATCH):
                    who = or_(c.item_key.in_(keys[i : i + BATCH]), c.app_id.in_(ids[i : i + BATCH]))
                    if guard:
                        unharvested.refuse_unharvested(conn, "redrive", workload, and_(*base, who))
                    moved += _transition(
                        conn, now, target=target, where=and_(*base, who), values=values, from_states=states
                    ).moved
                shown = AUDIT_KEYS_SHOWN
                target_info.update(item_keys=keys[:shown], app_ids=ids[:shown])
                if len(keys) > shown or len(ids) > shown:
                    target_info["truncated"] = {"item_keys": len(keys), "app_ids": len(ids)}
            _audit(conn, now, actor, action, workload, moved, target_info, reason)
        return moved

    def audit_log(self, workload: str | None = None, limit: int = 100) -> list[AuditRow]:
        """Return the latest audit rows, newest first.

        :param workload: only this workload
        :param limit: how many
        """
        q = select(s.audit).order_by(s.audit.c.id.desc()).limit(limit)
        if workload is not None:
            q = q.where(s.audit.c.workload == workload)
        with self.engine.connect() as conn:
            return [AuditRow.from_row(r) for r in conn.execute(q).mappings()]

    # ------------------------------------------------------------------ reporting
    def attempt_totals(self, workload: str, run_id: str) -> list[dict[str, Any]]:
        """Return usage and cost of this run's attempts, grouped by mode, outcome and discard.

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        a = s.attempts.c
        q = (
            select(
                a.mode,
                a.outcome,
                a.discarded,
                func.count().label("lines"),
                func.coalesce(func.sum(a.input_tokens), 0).label("input_tokens"),
                func.coalesce(func.sum(a.output_tokens), 0).label("output_tokens"),
                func.coalesce(func.sum(a.cached_input_tokens), 0).label("cached_input_tokens"),
                func.coalesce(func.sum(a.cache_write_tokens), 0).label("cache_write_tokens"),
                func.coalesce(func.sum(a.cost_nusd), 0).label("cost_nusd"),
            )
            .where(a.workload == workload, a.run_id == run_id)
            .group_by(a.mode, a.outcome, a.discarded)
        )
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def run_cost(self, workload: str, run_id: str) -> Decimal:
        """Return what this run's attempts have cost so far, in dollars.

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        a = s.attempts.c
        q = select(func.coalesce(func.sum(a.cost_nusd), 0)).where(a.workload == workload, a.run_id == run_id)
        with self.engine.connect() as conn:
            return from_nusd(int(conn.execute(q).scalar_one()))

    def count_routes(self, workload: str, run_id: str) -> dict[tuple[str, str], int]:
        """Return this run's items by (state, route).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        q = (
            select(s.items.c.state, s.items.c.route, func.count())
            .where(s.items.c.workload == workload, s.items.c.run_id == run_id)
            .group_by(s.items.c.state, s.items.c.route)
        )
        with self.engine.connect() as conn:
            return {(st, rt or "-"): int(n) for st, rt, n in conn.execute(q)}

    def publish(self, workload: str, run_id: str) -> int:
        """Copy this run's final items into the results table (upsert by item).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        now = utcnow()
        count = 0
        cols = ["item_key", "prompt_version", "app_id", "state", "output_json"]
        for batch in _chunks(self.iter_items(workload, run_id, columns=cols)):
            with self.engine.begin() as conn:
                keys = [(r["item_key"], r["prompt_version"]) for r in batch]
                p = s.published.c
                conn.execute(
                    s.published.delete().where(
                        p.workload == workload, _pairs(p.item_key, p.prompt_version, keys)
                    )
                )
                conn.execute(
                    s.published.insert(),
                    [{**dict(r), "workload": workload, "run_id": run_id, "published_at": now} for r in batch],
                )
                count += len(batch)
        return count

    def iter_cost_rows(self, workload: str, run_id: str) -> Iterator[dict[str, Any]]:
        """Yield one dict per item of the run with its attempts' usage, for the cost report.

        Keys: ``app_id``, ``state``, ``route``, ``model``, ``attempts`` (list of dicts with
        ``usage``, ``mode``, ``discarded``, ``outcome``, ``error_code``) and, for unchanged items,
        ``last_usage`` (the usage of the earlier success they reuse, or ``None``).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        a = s.attempts.c
        cols = ["app_id", "state", "route", "model", "attempts", "job_id", "custom_id"]
        for page in _chunks(self.iter_items(workload, run_id, columns=cols)):
            keys = [(r["item_key"], r["prompt_version"]) for r in page]
            by_item: dict[tuple[str, str], list[dict[str, Any]]] = {}
            by_version: dict[str, list[str]] = {}
            for key, version in keys:
                by_version.setdefault(version, []).append(key)
            with self.engine.connect() as conn:
                # One query per version, and ``run_id || ''`` rather than ``run_id``: otherwise
                # SQLite (no statistics) searches the (workload, run_id) index and reads every
                # attempt of the run for each page of 1,000 keys (quadratic: 0.33 s a page at a
                # million items, publish 555 s); this way each page is found by the
                # (workload, key, version) index (0.03 s a page at a million).
                rows = (
                    att
                    for version, ks in by_version.items()
                    for att in conn.execute(
                        select(s.attempts)
                        .where(
                            a.workload == workload,
                            a.run_id.concat("") == run_id,
                            a.prompt_version == version,
                            a.item_key.in_(ks),
                        )
                        .order_by(a.created_at, a.attempt)
                    ).mappings()
                )
                for att in rows:
                    if att["outcome"] is None:
                        continue
                    by_item.setdefault((att["item_key"], att["prompt_version"]), []).append(
                        {
                            "usage": _usage_of(att),
                            "mode": att["mode"],
                            "discarded": bool(att["discarded"]),
                            "outcome": att["outcome"],
                            "error_code": att["error_code"],
                        }
                    )
                earlier = [
                    (r["job_id"], r["custom_id"]) for r in page if r["state"] == "unchanged" and r["job_id"]
                ]
                last: dict[tuple[str, str], Usage] = {}
                if earlier:
                    for att in conn.execute(
                        select(s.attempts).where(
                            _pairs(a.custom_id, a.job_id, [(cid, jid) for jid, cid in earlier])
                        )
                    ).mappings():
                        last[(att["job_id"], att["custom_id"])] = _usage_of(att)
            for r in page:
                yield {
                    "app_id": r["app_id"],
                    "state": r["state"],
                    "route": r["route"],
                    "model": r["model"],
                    "attempts": by_item.get((r["item_key"], r["prompt_version"]), []),
                    "last_usage": last.get((r["job_id"], r["custom_id"]))
                    if r["state"] == "unchanged"
                    else None,
                }

    # ------------------------------------------------------------------ synchronous fallback
    def begin_sync_attempt(
        self, workload: str, run_id: str, item_key: str, prompt_version: str, from_states: Sequence[str]
    ) -> str | None:
        """Move one open item to ``fallback`` and record its synchronous attempt (mode ``sync``).

        Returns the attempt's custom id (``<item key>__s<attempt>``), or ``None`` when the item is
        no longer in ``from_states`` (e.g. a late batch result gave it a usable result): it is not
        sent again. An item already in ``fallback`` for this run (a fallback task that was
        interrupted mid-call) gets its recorded attempt back, so a rerun sends it once more
        without a second attempt row.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param item_key: the item key
        :param prompt_version: the prompt version
        :param from_states: states the item may be sent from
        """
        job_id = sync_job_id(workload, run_id)
        now = utcnow()
        where = and_(
            s.items.c.workload == workload,
            s.items.c.item_key == item_key,
            s.items.c.prompt_version == prompt_version,
            s.items.c.run_id == run_id,
        )
        with self.engine.begin() as conn:
            cols = (s.items.c.state, s.items.c.attempts, s.items.c.custom_id, s.items.c.job_id)
            item = conn.execute(select(*cols).where(where)).first()
            if item is None:
                return None
            if item.state == "fallback" and item.job_id == job_id and item.custom_id:
                return str(item.custom_id)
            if item.state not in from_states or not can_transition(item.state, "fallback"):
                return None
            attempt = int(item.attempts or 0) + 1
            custom_id = f"{item_key}__s{attempt}"
            moved = _transition(
                conn,
                now,
                target="fallback",
                where=and_(where, s.items.c.state == item.state),
                values={"route": "fallback", "job_id": job_id, "custom_id": custom_id, "attempts": attempt},
            )
            if not moved.moved:
                return None
            conn.execute(
                s.attempts.insert().values(
                    job_id=job_id,
                    custom_id=custom_id,
                    workload=workload,
                    item_key=item_key,
                    prompt_version=prompt_version,
                    run_id=run_id,
                    attempt=attempt,
                    mode="sync",
                    created_at=now,
                    updated_at=now,
                )
            )
        return custom_id

    def record_sync_result(self, workload: str, run_id: str, result: ItemResult, cost_nusd: int) -> str:
        """Record a synchronous attempt's final answer and settle its item; return the item's state.

        The attempt row keeps the usage and cost (priced by the caller at standard rates). A
        success makes the item ``succeeded`` (route ``fallback``); any failure sends it to
        ``review`` with the provider's error. When the item got a usable result elsewhere in the
        meantime (a late batch line), the answer is kept only as discarded cost, never a second row.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param result: the final result of the attempt (custom id from :meth:`begin_sync_attempt`)
        :param cost_nusd: its cost in nano-dollars
        """
        job_id = sync_job_id(workload, run_id)
        now = utcnow()
        with self.engine.begin() as conn:
            att = (
                conn.execute(
                    select(s.attempts).where(
                        s.attempts.c.job_id == job_id, s.attempts.c.custom_id == result.custom_id
                    )
                )
                .mappings()
                .first()
            )
            if att is None:
                raise LedgerError(
                    f"no synchronous attempt {result.custom_id!r} in run {run_id!r}; "
                    "call begin_sync_attempt before sending the item."
                )
            usage = result.usage
            conn.execute(
                s.attempts.update()
                .where(s.attempts.c.job_id == job_id, s.attempts.c.custom_id == result.custom_id)
                .values(
                    outcome=result.outcome,
                    discarded=result.outcome == "invalid_output",
                    error_code=result.error_code,
                    error_message=result.error_message,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cached_input_tokens=usage.cached_input_tokens,
                    cache_write_tokens=usage.cache_write_tokens,
                    cost_nusd=cost_nusd,
                    updated_at=now,
                )
            )
            where = and_(
                s.items.c.workload == workload,
                s.items.c.item_key == att["item_key"],
                s.items.c.prompt_version == att["prompt_version"],
            )
            item = conn.execute(
                select(s.items.c.state, s.items.c.custom_id, s.items.c.input_hash).where(where)
            ).first()
            if item is None:
                return "missing"
            if item.custom_id != result.custom_id or item.state != "fallback":
                if result.outcome == "succeeded":
                    self._mark_discarded(conn, att, now)
                return str(item.state)
            values: dict[str, Any] = {"route": "fallback"}
            if result.outcome == "succeeded":
                target = "succeeded"
                values.update(
                    output_json=json.dumps(result.output, ensure_ascii=False),
                    succeeded_hash=item.input_hash,
                    error_code=None,
                    error_message=None,
                )
            else:
                target = "review"
                values.update(
                    error_code=result.error_code or result.outcome,
                    error_message=result.error_message or f"synchronous fallback ended {result.outcome}",
                )
            moved = _transition(
                conn,
                now,
                target=target,
                where=and_(where, s.items.c.state == "fallback", s.items.c.custom_id == result.custom_id),
                values=values,
            )
            if not moved.moved:  # settled meanwhile by another writer: the answer is unused cost
                if result.outcome == "succeeded":
                    self._mark_discarded(conn, att, now)
                state = conn.execute(select(s.items.c.state).where(where)).scalar()
                return str(state)
            return target


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "unknown"


def _dialect_insert(conn: Connection) -> Any:
    """The dialect's ``INSERT`` with ``ON CONFLICT`` (SQLite and PostgreSQL)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


def _audit(
    conn: Connection,
    now: datetime,
    actor: str,
    action: str,
    workload: str,
    item_count: int,
    target: Mapping[str, Any],
    reason: str,
) -> None:
    """Write one row of the audit table (in the caller's transaction)."""
    conn.execute(
        s.audit.insert().values(
            at=now,
            actor=actor,
            action=action,
            workload=workload,
            item_count=item_count,
            target=json.dumps(dict(target), ensure_ascii=False, default=str),
            reason=reason,
        )
    )


def _usage_of(row: RowMapping) -> Usage:
    return Usage(
        input_tokens=int(row["input_tokens"] or 0),
        output_tokens=int(row["output_tokens"] or 0),
        cached_input_tokens=int(row["cached_input_tokens"] or 0),
        cache_write_tokens=int(row["cache_write_tokens"] or 0),
    )
