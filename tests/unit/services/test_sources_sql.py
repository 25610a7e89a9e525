"""A SQL source read in keyset pages through a real Airflow connection and its real hook (SQLite, and
MariaDB through the MySQL provider in `make test-mysql`; PostgreSQL's server-side read is
test_sources_sql_stream.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.operators.sources import read_sql_source
from airflow_batch_provider.services.records import Reject, load_records
from airflow_batch_provider.services.sources_sql import SqlPaging, SqlSource, page_queries

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}")
RUN = "manual__2026-12-01T00:00:00+00:00"


@dataclass
class SourceDb:
    """The source database behind the Airflow connection ``src``: a DB-API connection and its marker."""

    conn: Any
    marker: str

    def insert(self, columns: str, rows: Sequence[tuple[Any, ...]]) -> None:
        marks = ", ".join([self.marker] * len(rows[0]))
        cursor = self.conn.cursor()
        cursor.executemany(f"INSERT INTO tickets ({columns}) VALUES ({marks})", rows)
        self.conn.commit()


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("mysql", marks=pytest.mark.mysql)])
def source(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[SourceDb]:
    """A ``tickets`` table behind the Airflow connection ``src``: a SQLite file, or a MariaDB database."""
    create = "CREATE TABLE tickets (ticket_id INTEGER, text TEXT, price NUMERIC, raw BLOB)"
    if request.param == "sqlite":
        path = tmp_path / "source.db"
        monkeypatch.setenv("AIRFLOW_CONN_SRC", f"sqlite://{quote(str(path), safe='')}")
        db = sqlite3.connect(path)
        db.execute(create)
        yield SourceDb(db, "?")
        db.close()
        return
    server = request.getfixturevalue("mysql_server")
    name = server.create_database()
    monkeypatch.setenv("AIRFLOW_CONN_SRC", server.conn_json(name))
    server.execute(create, name)
    import MySQLdb

    db = MySQLdb.connect(host=server.host, port=server.port, user=server.user, database=name)
    yield SourceDb(db, "%s")
    db.close()
    server.drop_database(name)


def fill(db: SourceDb, n: int, start: int = 0) -> None:
    db.insert("ticket_id, text", [(i, f"ticket {i}") for i in range(start, start + n)])


def test_a_table_is_read_in_id_order_one_page_at_a_time_through_the_connections_hook(
    source: SourceDb,
) -> None:
    fill(source, 25)
    paging = SqlPaging()
    source = SqlSource(conn_id="src", table="tickets", id_column="ticket_id", columns=["text"], page_size=10)
    records = list(read_sql_source(source, "id", paging))
    assert [r.value["id"] for r in records if r.value] == list(range(25))
    assert records[3].value == {"ticket_id": 3, "text": "ticket 3", "id": 3}
    assert all(r.problem is None for r in records)
    assert (paging.pages, paging.largest_page) == (3, 10)
    assert [r.position for r in records] == list(range(25))


def test_paging_holds_at_most_one_page_of_rows_whatever_the_table_size(
    source: SourceDb,
) -> None:
    fill(source, 1_050)
    paging = SqlPaging()
    source = SqlSource(conn_id="src", table="tickets", id_column="ticket_id", page_size=100)
    reader = read_sql_source(source, "id", paging)
    for read in range(1, 1_051):
        next(reader)
        # rows fetched never run ahead of the rows handed on by more than one page
        assert paging.pages * 100 - read < 100
        assert paging.largest_page <= 100
    assert next(reader, None) is None
    assert paging.pages == 11


def test_a_retried_read_gets_the_same_rows_in_the_same_order(source: SourceDb) -> None:
    # inserted out of order: the keyset order, not the table's, decides
    source.insert("ticket_id, text", [(i, f"t{i}") for i in (7, 3, 9, 1, 5, 2)])
    source = SqlSource(
        conn_id="src", sql="SELECT ticket_id, text FROM tickets", id_column="ticket_id", page_size=4
    )
    first = [r.raw for r in read_sql_source(source, "id")]
    assert first == [r.raw for r in read_sql_source(source, "id")]
    assert [json.loads(r or "")["ticket_id"] for r in first] == [1, 2, 3, 5, 7, 9]


def test_a_null_id_a_repeated_id_across_a_page_edge_and_bytes_not_utf8_are_rejects_with_their_place(
    source: SourceDb, tmp_path: Path
) -> None:
    fill(source, 10)
    source.insert(
        "ticket_id, text, raw",
        [
            (None, "no id", None),
            (4, "a second 4", None),
            (4, "a third 4", None),
            (11, "bad bytes", b"caf\xe9"),
        ],
    )
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    rejects: list[Reject] = []
    source = SqlSource(conn_id="src", table="tickets", id_column="ticket_id", page_size=5)
    result = load_records(
        ledger=ledger,
        workload="w",
        run_id=RUN,
        template=PROMPT,
        records=read_sql_source(source, PROMPT.id_field),
        write_reject=rejects.append,
    )
    # 14 rows: 10 items and 4 rejects, none lost to the keyset (the page 0..4 ends inside the run of 4s)
    assert (result.read, result.items, result.rejected) == (14, 10, 4)
    by_code = {r.code: r for r in rejects}
    assert sorted(result.rejected_by_code.items()) == [
        ("duplicate_id", 2),
        ("invalid_utf8", 1),
        ("missing_id", 1),
    ]
    assert "row 1 with a NULL id" in by_code["missing_id"].message
    assert "WHERE ticket_id IS NOT NULL" in by_code["missing_id"].message
    assert (
        "column 'raw'" in by_code["invalid_utf8"].message
        and "ticket_id 11" in by_code["invalid_utf8"].message
    )
    assert by_code["invalid_utf8"].app_id == "11"
    assert ledger.count_states("w", RUN) == {"pending": 10, "review": 1}


def test_a_run_of_one_id_longer_than_a_page_is_read_once_row_by_row(source: SourceDb) -> None:
    rows = [(1, "one"), *((3, f"three {k}") for k in range(12)), (2, "two"), (4, "four")]
    source.insert("ticket_id, text", rows)
    source = SqlSource(conn_id="src", table="tickets", id_column="ticket_id", columns=["text"], page_size=5)
    read = [((r.value or {})["ticket_id"], (r.value or {})["text"]) for r in read_sql_source(source, "id")]
    assert sorted(read) == sorted(rows) and len(read) == len(rows)
    assert [i for i, _ in read] == sorted(i for i, _ in rows)


def test_a_query_with_a_percent_sign_is_read_across_pages_whatever_the_drivers_marker(
    source: SourceDb,
) -> None:
    fill(source, 25)
    query = "SELECT ticket_id, text FROM tickets WHERE text LIKE 'ticket 1%'"
    paged = SqlSource(conn_id="src", sql=query, id_column="ticket_id", page_size=4)
    assert [(r.value or {})["ticket_id"] for r in read_sql_source(paged, "id")] == [1, *range(10, 20)]


def test_the_query_is_wrapped_as_a_subquery_and_paged_on_the_id_column() -> None:
    source = SqlSource(
        conn_id="c", sql="SELECT * FROM t WHERE x = 1;", id_column="k", columns=["a", "k"], page_size=7
    )
    first, after, same, null, equal = page_queries(source, "k", "%s")
    assert (
        first
        == "SELECT k, a FROM (SELECT * FROM t WHERE x = 1) abp_source WHERE k IS NOT NULL ORDER BY k LIMIT 7"
    )
    assert (
        after == "SELECT k, a FROM (SELECT * FROM t WHERE x = 1) abp_source WHERE k > %s ORDER BY k LIMIT 7"
    )
    assert same.endswith("WHERE k = %s") and null.endswith("WHERE k IS NULL")
    assert equal == "SELECT k FROM (SELECT * FROM t WHERE x = 1) abp_source WHERE k = %s"


def test_a_percent_sign_in_the_query_is_doubled_only_where_a_format_driver_reads_parameters() -> None:
    source = SqlSource(conn_id="c", sql="SELECT * FROM t WHERE body LIKE 'a%'", page_size=2)
    first, after, same, null, equal = page_queries(source, "id", "%s")
    assert "LIKE 'a%'" in first and "LIKE 'a%'" in null
    assert "LIKE 'a%%'" in after and "LIKE 'a%%'" in same and "LIKE 'a%%'" in equal
    assert "LIKE 'a%'" in page_queries(source, "id", "?")[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of sql= or table="),
        ({"sql": "SELECT 1", "table": "t"}, "exactly one of sql= or table="),
        ({"sql": " ; "}, "sql= is empty"),
        ({"table": "t", "page_size": 0}, "page_size=0 is below 1"),
        ({"table": "t; DROP TABLE x"}, "table 't; DROP TABLE x' is not a plain SQL name"),
        ({"table": "t", "id_column": "id desc"}, "id_column 'id desc' is not a plain SQL name"),
    ],
)
def test_a_source_that_cannot_be_paged_is_refused_when_the_dag_is_parsed(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SqlSource(conn_id="c", **kwargs)  # type: ignore[arg-type]


def test_a_sql_source_declares_its_table_or_its_query_through_its_connection_for_lineage() -> None:
    from airflow_batch_provider.core.lineage import DatasetRef

    table = SqlSource(conn_id="support_db", table="crm.{{ params.table }}")
    assert table.dataset == DatasetRef("table", "crm.{{ params.table }}", "support_db")
    query = SqlSource(conn_id="support_db", sql="SELECT id, body FROM tickets")
    assert query.dataset == DatasetRef("query", "SELECT id, body FROM tickets", "support_db")


def test_ids_a_case_insensitive_collation_holds_equal_are_each_read_once_across_a_page_edge(
    source: SourceDb,
) -> None:
    """MariaDB's default collation holds 'a' = 'A' (MySQL's too; SQLite's NOCASE columns): the database
    pages and reads "one id's rows" by its equality, the reader must not count them by Python's."""
    nocase = " COLLATE NOCASE" if source.marker == "?" else ""  # SQLite's; MariaDB's is its default
    cursor = source.conn.cursor()
    cursor.execute(f"CREATE TABLE codes (code VARCHAR(10){nocase}, text TEXT)")
    ids = ["a", "A", "b", "B", "c", "C", "d"]
    cursor.executemany(
        f"INSERT INTO codes (code, text) VALUES ({source.marker}, {source.marker})",
        [(i, f"code {i}") for i in ids],
    )
    source.conn.commit()
    paged = SqlSource(conn_id="src", table="codes", id_column="code", page_size=2)
    read = [json.loads(r.raw or "")["code"] for r in read_sql_source(paged, "id")]
    assert sorted(read) == sorted(ids)
