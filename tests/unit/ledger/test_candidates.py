"""A run's published answers read a page at a time, each with the sink's record of it (SQLite and PostgreSQL)."""

from __future__ import annotations

import contextlib
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger, candidates
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import insert_rows, sqlite_json
from airflow_batch_provider.ledger.candidates import candidate_pages
from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import publish_run


def test_a_runs_answers_come_in_key_order_a_page_at_a_time_each_with_what_the_sink_was_last_given(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        publish_run(w, 5)
        first = next(candidate_pages(w.ledger, WORKLOAD, "tickets", RUN, page=2))
        record_deliveries(
            w.ledger,
            WORKLOAD,
            "tickets",
            RUN,
            [
                Delivery(first[0].item_key, first[0].app_id, "v1", "delivered", "h0"),
                Delivery(first[1].item_key, first[1].app_id, "v1", "refused", "h1", "no"),
            ],
        )
        record_deliveries(  # another sink's record is not this sink's
            w.ledger,
            WORKLOAD,
            "emails",
            RUN,
            [Delivery(first[0].item_key, first[0].app_id, "v1", "delivered", "x")],
        )
        pages = list(candidate_pages(w.ledger, WORKLOAD, "tickets", RUN, page=2))
    assert [len(p) for p in pages] == [2, 2, 1]
    answers = [c for p in pages for c in p]
    assert [c.item_key for c in answers] == sorted(c.item_key for c in answers)
    assert sorted(c.app_id for c in answers) == [f"i{k}" for k in range(5)]
    assert [(c.recorded_state, c.recorded_sha256) for c in answers] == [
        ("delivered", "h0"),
        ("refused", "h1"),
        (None, None),
        (None, None),
        (None, None),
    ]
    assert all(c.state == "succeeded" and c.output for c in answers)


#: Stored answers a page as one JSON value must read back as the two reads do: JSON that SQLite
#: parses (text, numbers past a double, duplicate keys, a string, ``null``) and JSON it does not
#: (``NaN``, ``Infinity``, which Python's ``json`` writes), no answer, and an empty one.
AWKWARD = (
    '{"label": "n\\u00e9gatif \\u2028 \\"q\\"", "score": 0.50}',
    '"just text"',
    "null",
    "NaN",
    '{"x": Infinity, "y": -0}',
    "[1, 2e3, 1e400]",
    "12345678901234567890123",
    '{"a": 1, "a": 2}',
    None,
    "",
)


def seed_awkward(ledger: Ledger) -> None:
    """The run's answers (each of AWKWARD twice: two prompt versions), another run's, and a failed one."""
    columns = [c.name for c in s.published.c]
    rows = [
        (WORKLOAD, item_key(f"a{n}"), version, f"a{n}", RUN, state, out, "2026-12-01 00:00:00.000000")
        for n, out in enumerate(AWKWARD)
        for version, state in (("v1", "succeeded"), ("v2", "unchanged"))
    ]
    rows.append((WORKLOAD, item_key("other"), "v1", "other", "another_run", "succeeded", "1", "2026-12-01"))
    rows.append((WORKLOAD, item_key("failed"), "v1", "failed", RUN, "failed", None, "2026-12-01"))
    with ledger.engine.begin() as conn:
        insert_rows(conn, s.published, columns, rows)
    record_deliveries(
        ledger,
        WORKLOAD,
        "tickets",
        RUN,
        [
            Delivery(item_key("a0"), "a0", "v1", "delivered", "h0"),
            Delivery(item_key("a3"), "a3", "v2", "refused", "h3", "no"),
        ],
    )
    record_deliveries(
        ledger, WORKLOAD, "emails", RUN, [Delivery(item_key("a1"), "a1", "v1", "delivered", "x")]
    )


@pytest.mark.parametrize("page", [1, 3, 1000])
def test_a_sqlite_page_read_as_one_json_value_reads_what_the_two_reads_read_whatever_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        seed_awkward(ledger)
        assert sqlite_json()  # this SQLite has its JSON functions: the first read is the one-value read
        one_value = list(candidate_pages(ledger, WORKLOAD, "tickets", RUN, page=page))
        monkeypatch.setattr(candidates, "sqlite_json", lambda: False)
        two_reads = list(candidate_pages(ledger, WORKLOAD, "tickets", RUN, page=page))
    finally:
        ledger.engine.dispose()
    assert [len(p) for p in one_value] == [len(p) for p in two_reads]
    assert sum(map(len, one_value)) == 2 * len(AWKWARD)
    # repr: NaN is not equal to itself; the types must match too (1e400 a float, the long number an int)
    assert [repr(c) for p in one_value for c in p] == [repr(c) for p in two_reads for c in p]
    found = {(c.app_id, c.prompt_version): c for p in one_value for c in p}
    assert math.isnan(found[("a3", "v1")].output)
    assert found[("a1", "v2")].output == "just text"
    assert found[("a6", "v1")].output == 12345678901234567890123
    assert found[("a5", "v1")].output == [1, 2000.0, math.inf]
    assert found[("a7", "v1")].output == {"a": 2}
    assert found[("a8", "v1")].output is None and found[("a9", "v1")].output is None
    assert (found[("a0", "v1")].recorded_state, found[("a0", "v1")].recorded_sha256) == ("delivered", "h0")
    assert (found[("a3", "v2")].recorded_state, found[("a0", "v2")].recorded_state) == ("refused", None)
    assert found[("a1", "v1")].recorded_state is None  # another sink's record is not this sink's


def test_a_sqlite_page_too_long_for_one_json_value_is_read_by_the_two_reads_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    long = '{"text": "' + "x" * 3000 + '"}'
    columns = [c.name for c in s.published.c]
    rows = [
        (
            WORKLOAD,
            item_key(f"a{n}"),
            "v1",
            f"a{n}",
            RUN,
            "succeeded",
            long if n % 3 else '{"short": 1}',
            "2026-12-01",
        )
        for n in range(10)
    ]
    with ledger.engine.begin() as conn:
        insert_rows(conn, s.published, columns, rows)
    expected = [repr(c) for p in candidate_pages(ledger, WORKLOAD, "tickets", RUN, page=4) for c in p]

    # SQLite's longest string lowered to 8,000 bytes on every connection: a page of four answers of
    # 3,000 bytes is too long for one JSON value, each answer alone is not
    @event.listens_for(ledger.engine, "connect")
    def shorter(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 8_000)

    ledger.engine.dispose()
    try:
        raw = ledger.engine.raw_connection()  # the limit holds: one value of the whole page is refused
        try:
            with pytest.raises(sqlite3.DataError, match="too big"):
                raw.driver_connection.execute("SELECT json_group_array(output_json) FROM abp_results")  # type: ignore[union-attr]
        finally:
            raw.close()
        found = list(candidate_pages(ledger, WORKLOAD, "tickets", RUN, page=4))
    finally:
        ledger.engine.dispose()
    assert [len(p) for p in found] == [4, 4, 2]
    assert [repr(c) for p in found for c in p] == expected


def _read_then_fail(ledger: Ledger) -> None:
    for _ in candidate_pages(ledger, WORKLOAD, "tickets", RUN, page=2):
        raise RuntimeError("the delivery failed on its first page")


@pytest.mark.parametrize("end", ["every page read", "closed after one page", "the reader failed"])
def test_the_pages_are_read_on_one_connection_that_goes_back_to_the_pool_however_the_reading_ends(
    tmp_path: Path, ledger_url: str, end: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        publish_run(w, 5)
        pool = w.ledger.engine.pool
        taken: list[int] = []
        event.listen(pool, "checkout", lambda *_: taken.append(1))
        if end == "every page read":
            assert [len(p) for p in candidate_pages(w.ledger, WORKLOAD, "tickets", RUN, page=2)] == [2, 2, 1]
        elif end == "closed after one page":
            pages = candidate_pages(w.ledger, WORKLOAD, "tickets", RUN, page=2)
            assert len(next(pages)) == 2
            pages.close()
        else:
            with contextlib.suppress(RuntimeError):  # the traceback is dropped as the block ends
                _read_then_fail(w.ledger)
        assert pool.checkedout() == 0  # type: ignore[attr-defined]
        if w.ledger.engine.dialect.name == "sqlite":  # one connection for every page (PostgreSQL: one a page)
            assert len(taken) == 1
