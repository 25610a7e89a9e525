"""What each sink wrote and each consumer was handed (table ``abp_deliveries``, schema version 5).

One row per workload, sink (or consumer), application id and prompt version. Every write goes
through one guarded upsert (:func:`write_deliveries`; a batch a sink took whole is staged directly
by :func:`record_delivered`): an ``INSERT ... ON CONFLICT DO UPDATE ... WHERE``
whose guard allows only the moves of :data:`MOVES` (a sink's row is rewritten only when the answer
it holds changed or its state did; an acknowledged hand-off is never offered again), so a cleared,
retried or killed delivery never adds a second row, and a changed answer updates the one it has.
A batch of rows is staged at the database's floor (``COPY`` on PostgreSQL) and written by one
``INSERT ... SELECT`` with that guard; on SQLite the same statement selects the rows from one
bound JSON array (``json_each``), or, where SQLite has no JSON functions, from rows staged by one
prepared ``executemany``.

A consumer's row moves ``offered`` -> ``acknowledged`` (it acted), ``refused`` (its function
failed: offered again by its next try, with the same key) or ``left_out`` (its filter left the
answer out: offered again only when the answer changes).

An item's key for a sink and the digest of its values come from
:mod:`airflow_batch_provider.ledger.digests`. A consumer's row keeps its key (``delivery_key``: a
hand-off is looked up by it); a sink's row, written by a delivery, keeps ``""`` there (nothing
looks a sink's row up by its key, and the key is a function of the row's own columns):
:func:`delivery_rows` gives every row its key. The answers a delivery reads (the run's published
final answers, ``abp_results`` in states ``succeeded`` and ``unchanged``), each with what the
sink was last given for it, come from :mod:`airflow_batch_provider.ledger.candidates`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any, Final, Literal, NamedTuple

from sqlalchemy import (
    Column,
    Integer,
    Table,
    Text,
    and_,
    func,
    literal,
    or_,
    select,
    true,
)
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import (
    STAGING_META,
    chunks,
    db_stamp,
    dialect_insert,
    sqlite_json,
    stage,
)
from airflow_batch_provider.ledger.digests import delivery_keys, json_writer
from airflow_batch_provider.ledger.store import Ledger

DeliveryState = Literal["delivered", "refused", "offered", "acknowledged", "left_out"]
#: For each state written, the states the row may hold before (``None``: no row yet). A sink's row
#: (``delivered``/``refused``) is rewritten only when its hash or state changes; see :func:`write_deliveries`.
#: A consumer's row is ``offered`` before it is handed out, then settled: ``acknowledged`` (final),
#: ``refused`` (its function failed on it) or ``left_out`` (its filter left the answer out).
MOVES: Final[dict[str, frozenset[str | None]]] = {
    "delivered": frozenset({None, "delivered", "refused"}),
    "refused": frozenset({None, "delivered", "refused", "offered"}),
    "offered": frozenset({None, "offered", "refused", "left_out"}),
    "acknowledged": frozenset({"offered"}),
    "left_out": frozenset({"offered"}),
}
PAGE: Final = 1000
#: The columns a delivery row's key is written with.
KEY_COLUMNS: Final = ("workload", "sink", "app_id", "prompt_version")

#: Per-connection staging table of :func:`write_deliveries`: what differs from row to row of one write (the
#: workload, sink, run, state and time are the same for all and travel as parameters).
DELIVERIES_STAGE: Final = Table(
    "abp_stage_deliveries",
    STAGING_META,
    Column("app_id", Text),
    Column("prompt_version", Text),
    Column("item_key", Text),
    Column("result_sha256", Text),
    Column("delivery_key", Text),
    Column("error", Text),
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
)


class Delivery(NamedTuple):
    """One row to record: what the sink did with one item.

    Immutable, and built once a row in a delivery's hot loop (a ``NamedTuple``, as
    :class:`~airflow_batch_provider.ledger.candidates.Candidate`).

    :param item_key: the item's ledger key
    :param app_id: the application id
    :param prompt_version: the prompt version of the answer
    :param state: ``delivered``, ``refused``, ``offered``, ``acknowledged`` or ``left_out``
    :param result_sha256: the digest of the values given to the sink (a consumer: of the answer)
    :param error: the sink's message or the consumer's failure (``refused``)
    """

    item_key: str
    app_id: str
    prompt_version: str
    state: DeliveryState
    result_sha256: str
    error: str | None = None


def record_deliveries(
    ledger: Ledger,
    workload: str,
    sink: str,
    run_id: str,
    rows: Sequence[Delivery],
    keyed: bool = True,
) -> None:
    """Record what the sink did with ``rows`` (one transaction; repeating it changes nothing).

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's or consumer's name
    :param run_id: the run that delivered them
    :param rows: one per item
    :param keyed: whether a row inserted gets its delivery key (a consumer's hand-off is looked up
        by it); ``False``: ``""``, as a sink's delivery writes (see :func:`delivery_rows`)
    """
    if not rows:
        return
    states = sorted({row.state for row in rows})
    with ledger.engine.begin() as conn:
        for state in states:
            alike = rows if len(states) == 1 else [row for row in rows if row.state == state]
            write_deliveries(conn, workload, sink, run_id, state, alike, keyed)


def write_deliveries(
    conn: Connection,
    workload: str,
    sink: str,
    run_id: str,
    state: str,
    rows: Sequence[Delivery],
    keyed: bool = True,
) -> None:
    """The one write of a delivery row: an upsert guarded by :data:`MOVES`.

    A row is inserted when none exists (unless ``state`` needs one first, as ``acknowledged``
    does) and updated only when the row's current state may move to ``state`` and the move changes
    something (another state, or another digest of the values). An update leaves the row's
    delivery key as it is; an inserted row gets its key where ``keyed``, else ``""``.
    """
    allowed = MOVES[state]
    now = utcnow()
    d = s.deliveries.c
    if None not in allowed:  # an update only: the row must exist in one of the allowed states
        for row in rows:
            conn.execute(
                s.deliveries.update()
                .where(
                    d.workload == workload,
                    d.sink == sink,
                    d.app_id == row.app_id,
                    d.prompt_version == row.prompt_version,
                    d.state.in_(sorted(str(a) for a in allowed)),
                )
                .values(state=state, run_id=run_id, delivered_at=now, writes=d.writes + 1)
            )
        return
    # one statement per slice writes each row once: a row given twice goes with its later values
    last = {(row.app_id, row.prompt_version): row for row in rows}
    key = delivery_keys(workload, sink)
    staged = [
        (app_id, version, item_key, digest, key(app_id, version) if keyed else "", error)
        for item_key, app_id, version, _, digest, error in last.values()
    ]
    _write_staged(conn, workload, sink, run_id, state, staged, now)


def record_delivered(
    ledger: Ledger, workload: str, sink: str, run_id: str, rows: Sequence[tuple[str, str, str, str]]
) -> None:
    """Record a batch the sink wrote whole as ``delivered``: :func:`record_deliveries` of them, built once.

    A sink's rows go without their delivery key (``""``, as ``keyed=False``): storing it cost a
    delivery about a tenth of its time (the key's hash a row, and its text through the record's JSON),
    for a value nothing reads from a sink's row (:func:`delivery_rows` derives it).

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's name
    :param run_id: the run that delivered them
    :param rows: (item key, application id, prompt version, digest), each application id and
        version once (one page's answers)
    """
    if not rows:
        return
    staged = [(app_id, version, item_key, digest, "", None) for item_key, app_id, version, digest in rows]
    with ledger.engine.begin() as conn:
        _write_staged(conn, workload, sink, run_id, "delivered", staged, utcnow())


def _write_staged(
    conn: Connection,
    workload: str,
    sink: str,
    run_id: str,
    state: str,
    staged: Sequence[tuple[str, str, str, str, str, str | None]],
    now: datetime,
) -> None:
    """The guarded upsert of :func:`write_deliveries` for rows staged as :data:`DELIVERIES_STAGE`'s columns."""
    if conn.dialect.name == "sqlite" and sqlite_json():
        sql = _json_upsert(state)
        for part in chunks(staged, PAGE):
            conn.exec_driver_sql(sql, (workload, sink, state, run_id, db_stamp(conn, now), _rows_json(part)))
        return
    allowed = MOVES[state]
    d = s.deliveries.c
    st = DELIVERIES_STAGE.c
    written = select(
        literal(workload, Text),
        literal(sink, Text),
        st.app_id,
        st.prompt_version,
        st.item_key,
        literal(state, Text),
        st.result_sha256,
        st.delivery_key,
        literal(run_id, Text),
        st.error,
        literal(1, Integer),
        literal(now, s.deliveries.c.delivered_at.type),
    ).where(true())  # SQLite reads ``SELECT ... ON CONFLICT`` as a join without a WHERE
    ins = dialect_insert(conn)(s.deliveries).from_select(
        [
            *KEY_COLUMNS,
            "item_key",
            "state",
            "result_sha256",
            "delivery_key",
            "run_id",
            "error",
            "writes",
            "delivered_at",
        ],
        written,
    )
    changed = or_(d.state != ins.excluded.state, d.result_sha256 != ins.excluded.result_sha256)
    before = d.state.in_(sorted(str(a) for a in allowed if a is not None))
    stmt = ins.on_conflict_do_update(
        index_elements=list(KEY_COLUMNS),
        set_={
            "item_key": ins.excluded.item_key,
            "state": ins.excluded.state,
            "result_sha256": ins.excluded.result_sha256,
            "run_id": ins.excluded.run_id,
            "error": ins.excluded.error,
            "writes": d.writes + 1,
            "delivered_at": ins.excluded.delivered_at,
        },
        where=and_(before, changed),
    )
    for part in chunks(staged, PAGE):
        stage(conn, DELIVERIES_STAGE, part, analyze=False)
        conn.execute(stmt)


#: A batch's rows as the JSON array :func:`_json_upsert` reads (compact; text as is).
_rows_json: Final = json_writer(",", ":", sort_keys=False)


@cache
def _json_upsert(state: str) -> str:
    """SQLite: :func:`write_deliveries`' upsert of the rows staged as one JSON array (``json_each``).

    The same statement as the staged one (the same columns, guard and updates), reading the rows
    from one bound JSON text: one call into SQLite a slice, where staging them took one call a
    row (each a hand-off of the interpreter lock). Parameters: workload, sink, state, run id,
    time, the rows (:data:`DELIVERIES_STAGE`' columns in order, one array each).

    :param state: the state written (its :data:`MOVES` are the guard)
    """
    table = s.deliveries.name
    app_id, version, item_key, digest, key, error = (
        f"json_extract(j.value, '$[{i}]')" for i in range(len(DELIVERIES_STAGE.c))
    )
    before = ", ".join(f"'{a}'" for a in sorted(str(a) for a in MOVES[state] if a is not None))
    return (
        f"INSERT INTO {table} ({', '.join(KEY_COLUMNS)}, item_key, state, result_sha256, delivery_key, "
        "run_id, error, writes, delivered_at) "
        f"SELECT ?, ?, {app_id}, {version}, {item_key}, ?, {digest}, {key}, ?, {error}, 1, ? "
        "FROM json_each(?) AS j WHERE true "  # SQLite reads ``SELECT ... ON CONFLICT`` as a join without a WHERE
        f"ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET item_key = excluded.item_key, "
        "state = excluded.state, result_sha256 = excluded.result_sha256, run_id = excluded.run_id, "
        f"error = excluded.error, writes = {table}.writes + 1, delivered_at = excluded.delivered_at "
        f"WHERE {table}.state IN ({before}) "
        f"AND ({table}.state != excluded.state OR {table}.result_sha256 != excluded.result_sha256)"
    )


def delivery_rows(ledger: Ledger, workload: str, sink: str) -> list[dict[str, Any]]:
    """Every delivery row of one sink or consumer, in application id order (for reports and tests).

    Each with its delivery key, where the row keeps none (a sink's: ``""``) derived as
    :func:`~airflow_batch_provider.ledger.digests.delivery_key` makes it.

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's or consumer's name
    """
    d = s.deliveries.c
    q = (
        select(s.deliveries)
        .where(d.workload == workload, d.sink == sink)
        .order_by(d.app_id, d.prompt_version)
    )
    with ledger.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(q).mappings()]
    key = delivery_keys(workload, sink)
    for row in rows:
        row["delivery_key"] = row["delivery_key"] or key(row["app_id"], row["prompt_version"])
    return rows


def refused_rows(ledger: Ledger, workload: str, limit: int = 100) -> list[dict[str, Any]]:
    """The rows a sink refused and no later delivery wrote, newest first (the review queue shows them).

    A refused row is tried again by every later delivery of its answer; it leaves this list when
    one writes it, or when the sink was given a newer answer for the same item since. A consumer's
    hand-off its function failed on is listed the same way, until it is acknowledged or a newer
    answer of the item is acknowledged or left out.

    :param ledger: the ledger
    :param workload: workload name
    :param limit: at most this many
    """
    d = s.deliveries.c
    later = s.deliveries.alias("later")
    superseded = (
        select(literal(1))
        .where(
            later.c.workload == d.workload,
            later.c.sink == d.sink,
            later.c.app_id == d.app_id,
            later.c.state.in_(("delivered", "acknowledged", "left_out")),
            later.c.delivered_at >= d.delivered_at,
        )
        .exists()
    )
    q = (
        select(d.sink, d.app_id, d.prompt_version, d.item_key, d.error, d.run_id, d.delivered_at)
        .where(d.workload == workload, d.state == "refused", ~superseded)
        .order_by(d.delivered_at.desc(), d.sink, d.app_id)
        .limit(limit)
    )
    with ledger.engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings()]


def delivery_counts(ledger: Ledger, workload: str, run_id: str) -> dict[str, dict[str, int]]:
    """Per sink, how many of the run's delivery rows are in each state.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    """
    d = s.deliveries.c
    q = (
        select(d.sink, d.state, func.count())
        .where(d.workload == workload, d.run_id == run_id)
        .group_by(d.sink, d.state)
    )
    out: dict[str, dict[str, int]] = {}
    with ledger.engine.connect() as conn:
        for sink, state, n in conn.execute(q):
            out.setdefault(sink, {})[state] = int(n)
    return out


def note_in_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    sink: str,
    counts: Mapping[str, Any],
    then: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any] | None:
    """Put a delivery's counts in the run's stored report, under ``deliveries``/``sink``; return it.

    The counts are the ledger's: the run's delivery rows per state (``delivered``, ``refused``),
    ``unchanged`` (rows the latest try left out because the sink holds them), the refusal messages
    of the latest try, and what it wrote; a rerun replaces them. A run without a report (not
    published) is left alone (``None``).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param sink: the sink's name
    :param counts: what the latest try did (written, unchanged, refused, messages)
    :param then: called with the updated report before it is committed, the run's row locked
        (the delivery task writes ``report.json`` there, so that two sinks' writes do not cross)
    """
    totals = delivery_counts(ledger, workload, run_id).get(sink, {})
    entry = {
        "delivered": totals.get("delivered", 0),
        "unchanged": int(counts.get("unchanged", 0)),
        "refused": totals.get("refused", 0),
        "messages": list(counts.get("messages", ())),
        "last_try": {k: counts[k] for k in ("written", "unchanged", "refused") if k in counts},
    }
    return put_in_report(ledger, workload, run_id, sink, entry, then)


def put_in_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    name: str,
    entry: dict[str, Any],
    then: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any] | None:
    """Set ``deliveries``/``name`` of the run's stored report to ``entry``, the run's row locked.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param name: the sink's or consumer's name
    :param entry: its counts
    :param then: called with the updated report before it is committed (see :func:`note_in_report`)
    """
    r = s.runs.c
    with ledger.engine.begin() as conn:
        found = conn.execute(
            select(r.report_json).where(r.workload == workload, r.run_id == run_id).with_for_update()
        ).scalar()
        if not found:
            return None
        report: dict[str, Any] = json.loads(found)
        report.setdefault("deliveries", {})[name] = entry
        conn.execute(
            s.runs.update()
            .where(r.workload == workload, r.run_id == run_id)
            .values(report_json=json.dumps(report, default=str))
        )
        if then is not None:
            then(report)
    return report
