"""Does a SQL source stream its rows with flat memory, and how close to a plain cursor is it?

Subject: :func:`~airflow_batch_provider.operators.sources.read_sql_source` over a SQLite table behind
a real Airflow connection (``AIRFLOW_CONN_BENCH_SOURCE``) and the SQLite provider's hook: keyset
pages on the id column (10,000 rows at the default size), each row converted into a JSON-safe ``SourceRecord``.
The records are counted and dropped, as the ledger upsert drops them once written.

Baselines, measured in the same run on the same table:

- speed: one ``SELECT ... ORDER BY id`` iterated on a plain ``sqlite3`` cursor, each row turned
  into a dict (the least work that hands the same rows on);
- memory: the same query read with ``fetchall()`` into a list (the whole result in memory, what
  a records callable returning ``hook.get_records(...)`` does).

Memory is the peak traced (:mod:`tracemalloc`) at N and 10N rows: a streaming read has a 10N/N
peak ratio near 1; the list grows about 10x.

Usage: ``python benchmarks/bench_sources.py [--size tiny|small|default]``
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import check_size, cli, mib, per_s, result, row, timed, traced_peak

from airflow_batch_provider.operators.sources import read_sql_source
from airflow_batch_provider.services.sources_sql import SqlSource

#: size -> (rows N for the memory runs (and 10N), rows for throughput, timing repeats, page size)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2_000, 2_000, 1, 200),
    "small": (20_000, 50_000, 2, 2_000),
    "default": (100_000, 1_000_000, 1, 10_000),
}
CONN_ID = "bench_source"


def make_table(path: Path, n: int) -> None:
    """A table of ``n`` support tickets: an integer primary key, a channel and a 60-120 character text."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE tickets (ticket_id INTEGER PRIMARY KEY, channel TEXT, body TEXT, price NUMERIC)")
    chunk = 50_000
    for start in range(0, n, chunk):
        db.executemany(
            "INSERT INTO tickets VALUES (?, ?, ?, ?)",
            (
                (
                    i,
                    "email" if i % 3 else "chat",
                    f"ticket {i}: the lamp flickers " + "x" * (i % 60),
                    i * 0.25,
                )
                for i in range(start, min(n, start + chunk))
            ),
        )
    db.commit()
    db.close()


def stream(path: Path, page: int) -> int:
    """The subject: read every row as a record through the connection's hook; return the count."""
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = f"sqlite://{quote(str(path), safe='')}"
    source = SqlSource(conn_id=CONN_ID, table="tickets", id_column="ticket_id", page_size=page)
    return sum(1 for _ in read_sql_source(source, "id"))


def plain_cursor(path: Path) -> int:
    """The speed floor: one ordered query on a plain cursor, each row a dict, none kept."""
    db = sqlite3.connect(path)
    try:
        cursor = db.execute("SELECT * FROM tickets ORDER BY ticket_id")
        names = [d[0] for d in cursor.description]
        return sum(1 for r in cursor if dict(zip(names, r, strict=True)))
    finally:
        db.close()


def fetch_all(path: Path) -> int:
    """The memory baseline: the whole result in a list of dicts."""
    db = sqlite3.connect(path)
    try:
        cursor = db.execute("SELECT * FROM tickets ORDER BY ticket_id")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
        return len(rows)
    finally:
        db.close()


def peak(work: Callable[[Path], int], path: Path, n: int) -> int:
    nbytes, count = traced_peak(lambda: work(path))
    if count != n:
        raise AssertionError(f"read {count} rows of {n}")
    return nbytes


def run(size: str = "default") -> dict[str, Any]:
    """Run the sources benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small`` or ``default``
    """
    check_size(size)
    n_mem, n_speed, repeat, page = SIZES[size]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="abp-bench-sources-") as tmp:
        tables = {n: Path(tmp) / f"tickets-{n}.db" for n in sorted({n_mem, 10 * n_mem, n_speed})}
        for n, path in tables.items():
            make_table(path, n)
        speed = tables[n_speed]
        stream(tables[n_mem], page)  # imports the hooks and reads the connection once, untimed
        subject = timed(lambda: stream(speed, page), repeat)
        floor = timed(lambda: plain_cursor(speed), repeat)
        rows.append(
            row(
                f"read {n_speed:,} rows, sqlite",
                "rows/s",
                per_s(n_speed, subject.best_s),
                per_s(n_speed, floor.best_s),
                subject=f"read_sql_source, keyset pages of {page:,}, JSON-safe records",
                baseline_name="one SELECT ... ORDER BY on a plain sqlite3 cursor, rows as dicts",
            )
        )
        small, big = tables[n_mem], tables[10 * n_mem]
        paged = partial(stream, page=page)
        stream_n, stream_10n = peak(paged, small, n_mem), peak(paged, big, 10 * n_mem)
        list_n, list_10n = peak(fetch_all, small, n_mem), peak(fetch_all, big, 10 * n_mem)
        rows.append(
            row(
                f"peak memory, {10 * n_mem:,} rows",
                "MiB",
                mib(stream_10n),
                mib(list_10n),
                subject="read_sql_source",
                baseline_name="fetchall() into a list of dicts",
            )
        )
        rows.append(
            row(
                f"peak memory growth, {n_mem:,} -> {10 * n_mem:,} rows",
                "peak(10N)/peak(N)",
                stream_10n / max(1, stream_n),
                list_10n / max(1, list_n),
                subject="read_sql_source",
                baseline_name="fetchall() into a list of dicts",
                note="1.0 = flat; the list grows with the rows",
            )
        )
    return result(
        "sources",
        size,
        {"rows_memory": [n_mem, 10 * n_mem], "rows_speed": n_speed, "page_size": page, "repeat": repeat},
        rows,
        notes=[
            "ratio = subject / baseline on the same SQLite table in the same run.",
            "tracemalloc sees Python allocations only: SQLite's page cache is not counted.",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
