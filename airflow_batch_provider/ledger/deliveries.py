"""What each sink wrote and each consumer was handed (table ``abp_deliveries``, schema version 5).

One row per workload, sink (or consumer), application id and prompt version. Every write goes
through one guarded function, :func:`_write`: an ``INSERT ... ON CONFLICT DO UPDATE ... WHERE``
whose guard allows only the moves of :data:`MOVES` (a sink's row is rewritten only when the answer
it holds changed or its state did; an acknowledged hand-off is never offered again), so a cleared,
retried or killed delivery never adds a second row, and a changed answer updates the one it has.
A batch of rows is staged at the database's floor (``COPY`` on PostgreSQL, one prepared
``executemany`` on SQLite) and written by one ``INSERT ... SELECT`` with that guard.

A consumer's row moves ``offered`` -> ``acknowledged`` (it acted), ``refused`` (its function
failed: offered again by its next try, with the same key) or ``left_out`` (its filter left the
answer out: offered again only when the answer changes).

The answers a delivery reads (the run's published final answers, ``abp_results`` in states
``succeeded`` and ``unchanged``), each with what the sink was last given for it, come from
:mod:`airflow_batch_provider.ledger.candidates`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final, Literal

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
    tuple_,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.selectable import Join

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import STAGING_META, chunks, dialect_insert, stage
from airflow_batch_provider.ledger.store import Ledger

DeliveryState = Literal["delivered", "refused", "offered", "acknowledged", "left_out"]
#: For each state written, the states the row may hold before (``None``: no row yet). A sink's row
#: (``delivered``/``refused``) is rewritten only when its hash or state changes; see :func:`_write`.
#: A consumer's row is ``offered`` before it is handed out, then settled: ``acknowledged`` (final),
#: ``refused`` (its function failed on it) or ``left_out`` (its filter left the answer out).
MOVES: Final[dict[str, frozenset[str | None]]] = {
    "delivered": frozenset({None, "delivered", "refused"}),
    "refused": frozenset({None, "delivered", "refused", "offered"}),
    "offered": frozenset({None, "offered", "refused", "left_out"}),
    "acknowledged": frozenset({"offered"}),
    "left_out": frozenset({"offered"}),
}
#: The consumer's states after an offer (:func:`settle`).
Settled = Literal["acknowledged", "refused", "left_out"]
PAGE: Final = 1000
#: The columns a delivery row's key is written with.
KEY_COLUMNS: Final = ("workload", "sink", "app_id", "prompt_version")

#: Per-connection staging table of :func:`_write`: what differs from row to row of one write (the
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
#: The digest's JSON: keys sorted, text as is, anything else as ``str`` (built once, not per row).
_DIGEST_JSON: Final = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)
#: The same JSON from the C encoder itself, made once (``JSONEncoder.encode`` makes one per call,
#: half a digest's time); ``None`` where the interpreter has no C encoder.
_DIGEST_C: Final = (
    c_make_encoder(None, str, encode_basestring, None, ": ", ", ", True, False, True)
    if c_make_encoder is not None
    else None
)


def delivery_key(workload: str, sink: str, app_id: str, prompt_version: str) -> str:
    """The stable idempotency key of one item and prompt version for one sink or consumer.

    :param workload: workload name
    :param sink: the sink's or consumer's name
    :param app_id: the item's application id
    :param prompt_version: the prompt version of the answer
    """
    raw = "\x1f".join((workload, sink, app_id, prompt_version)).encode("utf-8")
    return hashlib.sha256(raw).hexdigest()[:32]


def values_sha256(values: Mapping[str, Any]) -> str:
    """The digest of the values a sink writes for one item (keys sorted, JSON).

    :param values: column -> value
    """
    found = values if isinstance(values, dict) else dict(values)
    raw = "".join(_DIGEST_C(found, 0)) if _DIGEST_C is not None else _DIGEST_JSON.encode(found)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Delivery:
    """One row to record: what the sink did with one item.

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


def _published_with(sink: str) -> Join:
    """The published answers, each with the sink's (or consumer's) delivery row where it has one."""
    r, d = s.published.c, s.deliveries.c
    return s.published.outerjoin(
        s.deliveries,
        and_(
            d.workload == r.workload,
            d.sink == sink,
            d.app_id == r.app_id,
            d.prompt_version == r.prompt_version,
        ),
    )


def record_deliveries(
    ledger: Ledger, workload: str, sink: str, run_id: str, rows: Sequence[Delivery]
) -> None:
    """Record what the sink did with ``rows`` (one transaction; repeating it changes nothing).

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's or consumer's name
    :param run_id: the run that delivered them
    :param rows: one per item
    """
    if not rows:
        return
    with ledger.engine.begin() as conn:
        for state in sorted({row.state for row in rows}):
            _write(conn, workload, sink, run_id, state, [row for row in rows if row.state == state])


def _write(
    conn: Connection, workload: str, sink: str, run_id: str, state: str, rows: Sequence[Delivery]
) -> None:
    """The one write of a delivery row: an upsert guarded by :data:`MOVES`.

    A row is inserted when none exists (unless ``state`` needs one first, as ``acknowledged``
    does) and updated only when the row's current state may move to ``state`` and the move changes
    something (another state, or another digest of the values).
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
    staged = [
        (
            row.app_id,
            row.prompt_version,
            row.item_key,
            row.result_sha256,
            delivery_key(workload, sink, row.app_id, row.prompt_version),
            row.error,
        )
        for row in last.values()
    ]
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


def delivery_rows(ledger: Ledger, workload: str, sink: str) -> list[dict[str, Any]]:
    """Every delivery row of one sink or consumer, in application id order (for reports and tests).

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
        return [dict(r) for r in conn.execute(q).mappings()]


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


@dataclass(frozen=True)
class HandOff:
    """A result handed to a consumer, with the idempotency key to pass on to the external system.

    :param key: stable for this item and prompt version: the same until it is acknowledged
    :param app_id: the application id
    :param prompt_version: the prompt version of the answer
    :param output: the parsed answer
    :param item_key: the item's ledger key (with ``prompt_version``, where the next page starts)
    """

    key: str
    app_id: str
    prompt_version: str
    output: Any
    item_key: str


def _answer_sha256(output_json: str | None) -> str:
    return hashlib.sha256((output_json or "").encode("utf-8")).hexdigest()


def pending_for(
    ledger: Ledger,
    workload: str,
    consumer: str,
    run_id: str | None = None,
    limit: int = PAGE,
    after: tuple[str, str] | None = None,
) -> list[HandOff]:
    """Offer a consumer the published final answers it has not acknowledged, at most ``limit``.

    The offer is recorded (``offered``) before it is returned: a consumer that crashes before
    :func:`acknowledge` is offered the same items again with the same keys; an acknowledged item
    is never offered again, and one its filter left out (:func:`settle`) only once its answer
    changed. Answers come in item key order; ``after`` starts past the last one of a page, so that
    a consumer pages past the ones it leaves unacknowledged (failed) in this try.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param run_id: only this run's answers (``None``: every published answer of the workload)
    :param limit: at most this many
    :param after: ``(item_key, prompt_version)`` of the last hand-off of the previous page
    """
    r, d = s.published.c, s.deliveries.c
    found: list[tuple[Any, ...]] = []
    while len(found) < limit:
        q = (
            select(r.item_key, r.app_id, r.prompt_version, r.output_json, r.run_id, d.state, d.result_sha256)
            .select_from(_published_with(consumer))
            .where(
                r.workload == workload,
                r.state.in_(sorted(USABLE_STATES)),
                or_(d.state.is_(None), d.state != "acknowledged"),
            )
            .order_by(r.item_key, r.prompt_version)
            .limit(limit)
        )
        if run_id is not None:
            q = q.where(r.run_id == run_id)
        if after is not None:
            q = q.where(tuple_(r.item_key, r.prompt_version) > tuple_(*after))
        with ledger.engine.connect() as conn:
            rows = conn.execute(q).all()
        for row in rows:  # left out, and the same answer still: not offered again
            if not (row[5] == "left_out" and row[6] == _answer_sha256(row[3])):
                found.append(tuple(row[:5]))
        if len(rows) < limit:
            break
        after = (rows[-1][0], rows[-1][2])
    found = found[:limit]
    by_run: dict[str, list[Delivery]] = {}
    for key, app_id, version, out, run in found:
        by_run.setdefault(run, []).append(Delivery(key, app_id, version, "offered", _answer_sha256(out)))
    for run, group in by_run.items():
        record_deliveries(ledger, workload, consumer, run, group)
    return [
        HandOff(
            delivery_key(workload, consumer, app_id, version),
            app_id,
            version,
            json.loads(out) if out else None,
            key,
        )
        for key, app_id, version, out, _ in found
    ]


def acknowledge(ledger: Ledger, workload: str, consumer: str, keys: Iterable[str]) -> int:
    """Record that a consumer acted on the hand-offs with these keys; return how many moved.

    Only an offered hand-off is acknowledged (a key never offered, or acknowledged already, is not
    counted); repeating the call changes nothing.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param keys: keys from :func:`pending_for`
    """
    return settle(ledger, workload, consumer, keys, "acknowledged")


def settle(
    ledger: Ledger,
    workload: str,
    consumer: str,
    keys: Iterable[str],
    state: Settled,
    error: str | None = None,
) -> int:
    """Move offered hand-offs to ``state``; return how many moved (one transaction).

    ``acknowledged``: the consumer acted (never offered again). ``refused``: its function failed,
    with ``error`` (offered again by its next try, with the same key; listed by
    :func:`refused_rows` meanwhile). ``left_out``: its filter left the answer out (offered again
    only when the answer changes). A key that is not offered is not counted; repeating the call
    changes nothing.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param keys: keys from :func:`pending_for`
    :param state: where they move
    :param error: the failure's message (``refused``)
    """
    wanted = sorted(set(keys))
    if not wanted:
        return 0
    d = s.deliveries.c
    moved = 0
    with ledger.engine.begin() as conn:
        for start in range(0, len(wanted), PAGE):
            found = conn.execute(
                select(d.item_key, d.app_id, d.prompt_version, d.result_sha256, d.run_id).where(
                    d.workload == workload,
                    d.sink == consumer,
                    d.state == "offered",
                    d.delivery_key.in_(wanted[start : start + PAGE]),
                )
            ).all()
            for key, app_id, version, sha, run in found:
                _write(
                    conn, workload, consumer, run, state, [Delivery(key, app_id, version, state, sha, error)]
                )
            moved += len(found)
    return moved


def handoff_states(ledger: Ledger, workload: str, consumer: str, run_id: str) -> dict[str, int]:
    """How many of the run's published final answers the consumer's rows hold in each state.

    ``pending``: never offered. An answer acknowledged in an earlier run (the same item and prompt
    version, unchanged since) counts as ``acknowledged``.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param run_id: the run
    """
    r, d = s.published.c, s.deliveries.c
    q = (
        select(d.state, func.count())
        .select_from(_published_with(consumer))
        .where(r.workload == workload, r.run_id == run_id, r.state.in_(sorted(USABLE_STATES)))
        .group_by(d.state)
    )
    with ledger.engine.connect() as conn:
        return {str(state or "pending"): int(n) for state, n in conn.execute(q)}


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
    return _put_in_report(ledger, workload, run_id, sink, entry, then)


def note_handoffs_in_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    consumer: str,
    counts: Mapping[str, Any],
    then: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any] | None:
    """Put a consumer's counts in the run's stored report, under ``deliveries``/``consumer``.

    ``kind`` is ``consumer``; of the run's answers: ``acted`` (acted on and acknowledged by the
    latest try), ``already_acknowledged`` (before it, by an earlier try or run), ``left_out`` (by
    its filter), ``failed`` (its function failed on them in the latest try: offered again by the
    next), ``pending`` (not offered yet), and the latest try's failure messages. A rerun replaces
    them; a run without a report is left alone (``None``).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param consumer: the consumer's name
    :param counts: what the latest try did (acted, failed, messages)
    :param then: as for :func:`note_in_report`
    """
    states = handoff_states(ledger, workload, consumer, run_id)
    acted = int(counts.get("acted", 0))
    entry = {
        "kind": "consumer",
        "acted": acted,
        "already_acknowledged": max(states.get("acknowledged", 0) - acted, 0),
        "left_out": states.get("left_out", 0),
        "failed": states.get("refused", 0),
        "pending": states.get("pending", 0) + states.get("offered", 0),
        "messages": list(counts.get("messages", ())),
    }
    return _put_in_report(ledger, workload, run_id, consumer, entry, then)


def _put_in_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    name: str,
    entry: dict[str, Any],
    then: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any] | None:
    """Set ``deliveries``/``name`` of the run's stored report to ``entry``, the run's row locked."""
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
