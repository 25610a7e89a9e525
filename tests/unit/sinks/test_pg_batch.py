"""A PostgreSQL sink's batch in one statement (one JSON array; else COPY on psycopg 3, multi-row on psycopg2), against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_batch_provider.services.delivery import SinkRow
from airflow_batch_provider.sinks import pg_batch
from airflow_batch_provider.sinks.pg_batch import PgBatchWriter, batch_json
from airflow_batch_provider.sinks.sql import SqlUpsertSink
from tests.unit.sinks.target import CONN_ID, Target, target_for

pytestmark = pytest.mark.postgres
TABLE = (
    "CREATE TABLE scores (ticket_id INTEGER PRIMARY KEY, label TEXT CHECK (label <> 'bad'),"
    " confidence DOUBLE PRECISION, due DATE, meta JSONB)"
)


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_server: object) -> Iterator[Target]:
    with target_for("postgresql", tmp_path, postgres_server) as found:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", found.conn_json)
        found.execute(TABLE)
        yield found


def sink(mode: str) -> SqlUpsertSink:
    return SqlUpsertSink(
        conn_id=CONN_ID,
        table="scores",
        key_columns=["ticket_id"],
        columns={"label": "$.label", "confidence": "$.confidence", "due": "$.due", "meta": "$.meta"},
        mode=mode,  # type: ignore[arg-type]
    )


def row(key: int, label: str, confidence: float = 0.5) -> SinkRow:
    return SinkRow(
        {"ticket_id": key},
        {"label": label, "confidence": confidence, "due": "2026-12-01", "meta": '{"n": 1}'},
    )


def test_a_postgresql_upsert_batch_is_written_by_the_batch_writer_and_a_key_given_twice_ends_with_its_later_values(
    target: Target,
) -> None:
    with sink("upsert").open() as writer:
        assert isinstance(writer, PgBatchWriter)
        assert writer.write([row(1, "a"), row(2, "b"), row(1, "c", 0.9)]) == {}
        assert writer.write([row(2, "d")]) == {}
    assert target.rows("SELECT ticket_id, label, confidence, due, meta->>'n' FROM scores ORDER BY 1") == [
        (1, "c", 0.9, dt.date(2026, 12, 1), "1"),
        (2, "d", 0.5, dt.date(2026, 12, 1), "1"),
    ]


def test_an_update_batch_casts_each_value_to_its_columns_type_and_adds_no_row(target: Target) -> None:
    target.execute("INSERT INTO scores (ticket_id) VALUES (1), (2), (3)")
    with sink("update").open() as writer:
        assert writer.write([row(1, "a", 0.25), row(3, "c"), row(7, "none")]) == {}
    assert target.rows("SELECT ticket_id, label, confidence, due, meta->>'n' FROM scores ORDER BY 1") == [
        (1, "a", 0.25, dt.date(2026, 12, 1), "1"),
        (2, None, None, None, None),
        (3, "c", 0.5, dt.date(2026, 12, 1), "1"),
    ]


@pytest.mark.parametrize("mode", ["upsert", "update"])
@pytest.mark.parametrize(
    "bad, message",
    [("bad", ("CheckViolation",)), ("nul \x00 inside", ("DataError", "UntranslatableCharacter"))],
    ids=["a CHECK", "a text the database cannot hold"],
)
def test_a_refused_row_in_a_batch_is_named_with_the_databases_message_and_the_others_are_written(
    target: Target, mode: str, bad: str, message: tuple[str, ...]
) -> None:
    target.execute("INSERT INTO scores (ticket_id) VALUES (1), (2), (3)")
    with sink(mode).open() as writer:
        refused = writer.write([row(1, "a"), row(2, bad), row(3, "c")])
    assert list(refused) == [1] and refused[1].startswith(message)
    assert target.rows("SELECT ticket_id, label FROM scores ORDER BY 1") == [(1, "a"), (2, None), (3, "c")]


def test_a_batch_after_a_refused_one_on_the_same_connection_is_written_and_a_value_of_the_wrong_type_is_refused(
    target: Target,
) -> None:
    with sink("upsert").open() as writer:
        refused = writer.write([row(1, "a"), row(2, "bad")])  # rolled back whole, then row by row
        assert list(refused) == [1]
        bad_date = SinkRow(
            {"ticket_id": 4}, {"label": "d", "confidence": 0.5, "due": "not a date", "meta": None}
        )
        refused = writer.write([row(3, "c"), bad_date, row(5, "e")])
        assert list(refused) == [1] and refused[1].startswith(("InvalidDatetimeFormat", "DataError"))
        assert writer.write([row(6, "f"), row(1, "g")]) == {}
    assert target.rows("SELECT ticket_id, label FROM scores ORDER BY 1") == [
        (1, "g"),
        (3, "c"),
        (5, "e"),
        (6, "f"),
    ]


@contextmanager
def psycopg2_writer(target: Target, into: SqlUpsertSink) -> Iterator[PgBatchWriter]:
    """The batch writer of ``into`` on a psycopg2 connection to the target (closed after)."""
    import psycopg2
    from sqlalchemy.engine import make_url

    from airflow_batch_provider.sinks.sql import _DbApiWriter

    url = make_url(target.url)
    conn = psycopg2.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    try:
        yield PgBatchWriter(into, conn, _DbApiWriter(into, conn, into.statement("%s")))
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["upsert", "update"])
def test_a_psycopg2_connection_gets_the_same_rows_as_the_hooks_psycopg_3_one(
    target: Target, mode: str
) -> None:
    target.execute("INSERT INTO scores (ticket_id) VALUES (1), (2)")
    with psycopg2_writer(target, sink(mode)) as writer:
        refused = writer.write([row(1, "a", 0.25), row(2, "bad"), row(3, "c")])
        assert list(refused) == [1] and refused[1].startswith("CheckViolation")
        assert writer.write([row(2, "b"), row(1, "x"), row(1, "y")]) == {}
        # values JSON does not carry (a Decimal, a date): one multi-row statement, psycopg2's adaptation
        other = {"label": "z", "confidence": Decimal("0.75"), "due": dt.date(2026, 1, 2), "meta": None}
        assert writer.write([SinkRow({"ticket_id": 2}, other), SinkRow({"ticket_id": 4}, other)]) == {}
    expected = [(1, "y", 0.5), (2, "z", 0.75)] + ([(3, "c", 0.5), (4, "z", 0.75)] if mode == "upsert" else [])
    assert target.rows("SELECT ticket_id, label, confidence FROM scores ORDER BY 1") == expected


class Mood(str, enum.Enum):
    """A ``str`` subclass: psycopg adapts it in its own way, so it goes by ``COPY``."""

    CALM = "calm"


def staging_tables(writer: PgBatchWriter) -> list[tuple[str, str]]:
    """The columns of this session's staging tables (``COPY``'s), with their types."""
    cursor = writer.conn.cursor()
    cursor.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_class c"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
        " WHERE c.relname LIKE 'abp_stage_%' AND c.relpersistence = 't' ORDER BY a.attnum"
    )
    found = cursor.fetchall()
    cursor.close()
    writer.conn.rollback()
    return [(str(name), str(kind)) for name, kind in found]


def test_a_batch_of_json_values_travels_as_one_json_array_with_no_staging_table_and_reads_back_exactly(
    target: Target,
) -> None:
    tricky = 'tab\t newline\n cr\r back\\slash "quote" \\N é 雪 \u2028 {"not": "json"}'
    rows = [
        SinkRow(
            {"ticket_id": 1},
            {"label": tricky, "confidence": -0.0, "due": "2026-12-01", "meta": '{"n": [1, 2]}'},
        ),
        SinkRow({"ticket_id": 2}, {"label": "", "confidence": 0.1 + 0.2, "due": None, "meta": None}),
        SinkRow({"ticket_id": 3}, {"label": None, "confidence": 1e-310, "due": "2026-02-28", "meta": "[]"}),
        # a bool into a text column: what the one-row statement writes (COPY's text would be 't')
        SinkRow({"ticket_id": 4}, {"label": True, "confidence": 7, "due": None, "meta": "true"}),
        SinkRow(
            {"ticket_id": 2147483647},
            {"label": "\\N", "confidence": 1.7976931348623157e308, "due": None, "meta": "1"},
        ),
    ]
    with sink("upsert").open() as writer:
        assert isinstance(writer, PgBatchWriter)
        assert writer.write(rows) == {}
        assert staging_tables(writer) == []  # no COPY: the rows went as one bound JSON array
    found = target.rows(
        "SELECT ticket_id, label, CAST(confidence AS text), due, CAST(meta AS text) FROM scores ORDER BY 1"
    )
    assert found == [
        (1, tricky, "-0", dt.date(2026, 12, 1), '{"n": [1, 2]}'),
        (2, "", "0.30000000000000004", None, None),
        (3, None, "1e-310", dt.date(2026, 2, 28), "[]"),
        (4, "true", "7", None, "true"),
        (2147483647, "\\N", "1.7976931348623157e+308", None, "1"),
    ]


@pytest.mark.parametrize(
    "label, confidence, due, limit, stored",
    [
        ("a", 0.5, dt.date(2026, 12, 1), None, "0.5"),  # a callable's date: psycopg adapts it
        ("a", Decimal("0.25"), "2026-12-01", None, "0.25"),  # a Decimal
        ("a", float("nan"), "2026-12-01", None, "NaN"),  # JSON has no NaN
        ("a", -float("inf"), "2026-12-01", None, "-Infinity"),  # nor infinities
        (Mood.CALM, 0.5, "2026-12-01", None, "0.5"),  # a str subclass (an Enum): psycopg's adaptation
        ("a", 0.5, "2026-12-01", 10, "0.5"),  # a batch whose JSON passes the limit
    ],
    ids=["date", "Decimal", "NaN", "infinity", "str subclass", "over the JSON limit"],
)
def test_a_batch_json_cannot_carry_as_it_is_travels_by_copy_into_a_temporary_table_of_the_target_columns_types(
    target: Target,
    monkeypatch: pytest.MonkeyPatch,
    label: Any,
    confidence: Any,
    due: Any,
    limit: Any,
    stored: str,
) -> None:
    if limit is not None:
        monkeypatch.setattr(pg_batch, "JSON_LIMIT", limit)
    first = SinkRow({"ticket_id": 1}, {"label": label, "confidence": confidence, "due": due, "meta": None})
    with sink("upsert").open() as writer:
        assert isinstance(writer, PgBatchWriter)
        assert writer.write([first, row(2, "b")]) == {}
        assert staging_tables(writer) == [
            ("ticket_id", "integer"),
            ("label", "text"),
            ("confidence", "double precision"),
            ("due", "date"),
            ("meta", "jsonb"),
        ]
    found = target.rows("SELECT ticket_id, label, CAST(confidence AS text), due FROM scores ORDER BY 1")
    assert found == [
        (1, str(getattr(label, "value", label)), stored, dt.date(2026, 12, 1)),
        (2, "b", "0.5", dt.date(2026, 12, 1)),
    ]


def test_batch_json_carries_only_the_exact_json_types_finite_and_within_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Count(enum.IntEnum):
        ONE = 1

    params = [(1, "a\tb", 0.5, True, None), (2, "é", -0.0, False, 3)]
    assert batch_json(params) == json.dumps(params, ensure_ascii=False, separators=(",", ":"))
    for other in (
        Count.ONE,
        Mood.CALM,
        Decimal("1"),
        dt.date(2026, 1, 1),
        b"x",
        (1,),
        float("nan"),
        float("-inf"),
    ):
        assert batch_json([(1, "a"), (2, other)]) is None, other
    monkeypatch.setattr(pg_batch, "JSON_LIMIT", len(batch_json(params) or "") - 1)
    assert batch_json(params) is None


#: A table of the types a JSON answer's values land in (no NUL in text: the database refuses it).
TYPED = (
    "CREATE TABLE typed (k BIGINT PRIMARY KEY, t TEXT, f DOUBLE PRECISION, n NUMERIC, b BOOLEAN,"
    " j JSONB, i INTEGER)"
)
_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_values = st.tuples(
    st.none() | _text,
    st.none() | st.floats(allow_nan=False, allow_infinity=False),
    st.none() | st.integers(-(10**30), 10**30),
    st.none() | st.booleans(),
    st.none() | _json.map(lambda value: json.dumps(value, ensure_ascii=False)),
    st.none() | st.integers(-(2**31), 2**31 - 1),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(_values, min_size=1, max_size=8))
def test_a_json_batch_writes_exactly_what_copy_and_the_one_row_statement_write(
    target: Target, batch: list[tuple[Any, ...]]
) -> None:
    target.execute("DROP TABLE IF EXISTS typed")
    target.execute(TYPED)
    typed = SqlUpsertSink(
        conn_id=CONN_ID,
        table="typed",
        key_columns=["k"],
        columns={name: f"$.{name}" for name in ("t", "f", "n", "b", "j", "i")},
        key_type=int,
    )
    names = ("t", "f", "n", "b", "j", "i")
    rows = [SinkRow({"k": key}, dict(zip(names, values, strict=True))) for key, values in enumerate(batch)]
    assert batch_json([typed.params(one) for one in rows]) is not None
    read = "SELECT k, t, CAST(f AS text), CAST(n AS text), b, CAST(j AS text), i FROM typed ORDER BY k"
    written = {}
    for way in ("json", "copy", "one row"):
        target.execute("TRUNCATE typed")
        with (
            typed.open() as writer,
            patch.object(pg_batch, "batch_json", batch_json if way == "json" else lambda _: None),
        ):
            assert isinstance(writer, PgBatchWriter)
            refused = writer.rows_writer.one_by_one(rows) if way == "one row" else writer.write(rows)
        assert refused == {}, (way, refused)
        written[way] = target.rows(read)
    assert written["json"] == written["copy"] == written["one row"]


@pytest.mark.parametrize("driver", ["psycopg 3", "psycopg2"])
@pytest.mark.parametrize("mode", ["upsert", "update"])
@pytest.mark.parametrize("way", ["json", "copy"])
def test_a_value_too_long_for_its_columns_length_is_refused_with_its_row_never_cut_to_fit(
    target: Target, monkeypatch: pytest.MonkeyPatch, driver: str, mode: str, way: str
) -> None:
    # an explicit CAST to varchar(3), char(2), bit(3) or a domain over varchar(3) cuts a value to fit
    target.execute("CREATE DOMAIN short_code AS VARCHAR(3) CHECK (VALUE <> 'no')")
    target.execute(
        "CREATE TABLE short (ticket_id INTEGER PRIMARY KEY, code VARCHAR(3), flag CHAR(2), bits BIT(3),"
        " kind short_code)"
    )
    target.execute(
        "INSERT INTO short (ticket_id) SELECT k FROM generate_series(1, 5) k UNION SELECT 10 + k FROM generate_series(1, 5) k"
    )
    if way == "copy":
        monkeypatch.setattr(pg_batch, "batch_json", lambda params: None)
    short = SqlUpsertSink(
        conn_id=CONN_ID,
        table="short",
        key_columns=["ticket_id"],
        columns={"code": "$.code", "flag": "$.flag", "bits": "$.bits", "kind": "$.kind"},
        mode=mode,  # type: ignore[arg-type]
    )
    fits = {"code": "abc", "flag": "ok", "bits": "101", "kind": "abc"}
    bad = [
        {**fits, "code": "abcdef"},
        {**fits, "flag": "toolong"},
        {**fits, "bits": "10101"},
        {**fits, "kind": "abcdef"},
        {**fits, "kind": "no"},  # the domain's CHECK still holds
    ]
    refused: list[dict[int, str]] = []

    def write(writer: PgBatchWriter) -> None:
        for key, values in enumerate(bad, start=1):  # each alone beside a row that fits: one statement
            refused.append(
                writer.write([SinkRow({"ticket_id": key}, fits), SinkRow({"ticket_id": 10 + key}, values)])
            )

    if driver == "psycopg2":
        with psycopg2_writer(target, short) as writer:
            write(writer)
    else:
        with short.open() as writer:
            assert isinstance(writer, PgBatchWriter)
            write(writer)
    assert [sorted(one) for one in refused] == [[1]] * len(bad), refused
    assert target.rows("SELECT ticket_id, code, flag, CAST(bits AS text), kind FROM short ORDER BY 1") == [
        *[(key, "abc", "ok", "101", "abc") for key in range(1, len(bad) + 1)],
        *[(10 + key, None, None, None, None) for key in range(1, len(bad) + 1)],
    ]
