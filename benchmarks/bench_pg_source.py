"""Does a SQL source on PostgreSQL stream with flat memory through its server-side cursor?

Subject: :func:`~airflow_batch_provider.operators.sources.read_sql_source` of
``SqlSource(table="tickets", id_column="ticket_id", page_size=10_000)`` behind a real Airflow
``postgres`` connection and its hook (psycopg 3): one ``SELECT ... ORDER BY ticket_id NULLS LAST``
through a named cursor, 10,000 rows per ``FETCH``, each row a JSON-safe ``SourceRecord``, counted
and dropped as the ledger upsert drops them.

Baseline, on the same table in the same run: the same query on a plain (client-side) psycopg 3
cursor, iterated row by row; libpq holds its whole result in memory before the first row.

Each read runs in a fresh Python process, which reports its peak resident set (``ru_maxrss``: the
drivers' C buffers count, as they do not under :mod:`tracemalloc`) and its rows per second; a read
that streams has about the same peak at N and at 10N rows.

Usage: ``python benchmarks/bench_pg_source.py [--size tiny|small|default]``
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import airflow_postgres_conn, check_size, cli, postgres_url, result, row
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
#: size -> (rows N for the memory runs (and 10N), page size)
SIZES: dict[str, tuple[int, int]] = {
    "tiny": (2_000, 200),
    "small": (20_000, 2_000),
    "default": (100_000, 10_000),
}
CONN_ID = "bench_pg_source"

#: One read in a fresh process: argv = kind, table, page size, the connection as JSON, the URL.
CHILD = """
import json, os, resource, sys, time
kind, table, page, conn, url = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ["AIRFLOW_CONN_BENCH_PG_SOURCE"] = conn
from airflow_batch_provider.operators.sources import read_sql_source
from airflow_batch_provider.services.sources_sql import SqlSource
import psycopg
start = time.perf_counter()
if kind == "subject":
    source = SqlSource(conn_id="bench_pg_source", table=table, id_column="ticket_id", page_size=page)
    count = sum(1 for _ in read_sql_source(source, "id"))
else:
    with psycopg.connect(url) as db, db.cursor() as cur:
        cur.execute(f"SELECT * FROM {table} ORDER BY ticket_id NULLS LAST")
        names = [d[0] for d in cur.description]
        count = sum(1 for r in cur if dict(zip(names, r)))
seconds = time.perf_counter() - start
print(json.dumps({"count": count, "seconds": seconds, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def make_table(engine: Any, table: str, n: int) -> None:
    """A table of ``n`` support tickets (integer key, channel, a 60-120 character text), built by the server."""
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        conn.execute(
            text(
                f"CREATE TABLE {table} AS SELECT i AS ticket_id, CASE WHEN i % 3 = 0 THEN 'chat' ELSE 'email' END"
                " AS channel, 'ticket ' || i || ': the lamp flickers ' || repeat('x', i % 60) AS body,"
                f" i * 0.25 AS price FROM generate_series(1, {n}) i"
            )
        )
        conn.execute(text(f"ALTER TABLE {table} ADD PRIMARY KEY (ticket_id)"))


def read(kind: str, table: str, page: int, conn: str, url: str, n: int) -> dict[str, Any]:
    """One read in a fresh process: its count, seconds and peak resident set (KiB)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, table, str(page), conn, url],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise AssertionError(f"the {kind} read of {table} failed: {done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if out["count"] != n:
        raise AssertionError(f"the {kind} read of {table} gave {out['count']} rows of {n}")
    return out


def run(size: str = "default") -> dict[str, Any]:
    """Run the PostgreSQL source benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small`` or ``default``
    """
    check_size(size)
    n, page = SIZES[size]
    url, how = postgres_url()
    if url is None:
        return result("pg_source", size, {"postgres": how}, [], notes=[f"skipped: no PostgreSQL ({how})"])
    pg = make_url(url)
    conn = airflow_postgres_conn(url)
    plain = pg.set(drivername="postgresql").render_as_string(hide_password=False)
    engine = create_engine(url)
    figures: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        for rows in (n, 10 * n):
            table = f"bench_tickets_{rows}"
            make_table(engine, table, rows)
            for kind in ("subject", "baseline"):
                figures[kind, rows] = read(kind, table, page, conn, plain, rows)
            with engine.begin() as c:
                c.execute(text(f"DROP TABLE {table}"))
    finally:
        engine.dispose()

    def rss(kind: str, rows: int) -> float:
        return float(figures[kind, rows]["maxrss_kib"]) / 1024

    big = 10 * n
    subject_name = f"read_sql_source, a named cursor, {page:,} rows per FETCH, JSON-safe records"
    baseline_name = "the same query on a plain psycopg 3 cursor, iterated (libpq holds the result)"
    rows_out = [
        row(
            f"read {big:,} rows, postgres",
            "rows/s",
            big / figures["subject", big]["seconds"],
            big / figures["baseline", big]["seconds"],
            subject=subject_name,
            baseline_name=baseline_name,
        ),
        row(
            f"peak resident set, {big:,} rows",
            "MiB",
            rss("subject", big),
            rss("baseline", big),
            subject=subject_name,
            baseline_name=baseline_name,
            note=f"at {n:,} rows: {rss('subject', n):.0f} and {rss('baseline', n):.0f} MiB",
        ),
        row(
            f"peak resident set growth, {n:,} -> {big:,} rows",
            "peak(10N)/peak(N)",
            rss("subject", big) / rss("subject", n),
            rss("baseline", big) / rss("baseline", n),
            subject=subject_name,
            baseline_name=baseline_name,
            note="1.0 = flat; each process's peak includes its imports (Airflow: about 150 MiB)",
        ),
    ]
    return result(
        "pg_source",
        size,
        {"rows_memory": [n, big], "page_size": page, "postgres": how},
        rows_out,
        notes=["each read in a fresh process; ru_maxrss counts the drivers' C buffers too."],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
