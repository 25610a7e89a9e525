"""How close to the database's own bulk write is a delivery into PostgreSQL, and is its memory flat?

Subject: :func:`~airflow_batch_provider.services.delivery.deliver` of a run's published answers
(``{"sentiment": ..., "confidence": ...}``) through a ``SqlUpsertSink`` (``INSERT ... ON CONFLICT
(ticket_id) DO UPDATE``, batches of 1,000 rows, one transaction each) behind a real Airflow
``postgres`` connection and its hook, each batch then recorded per item in the ledger (SQLite
file, as the embedded default). Every timed delivery starts with an empty target table and no
delivery recorded.

Baselines, measured in the same run on the same rows and database:

- ``COPY ... FROM STDIN`` of the same rows in one transaction (the database's floor);
- one ``executemany`` of the same ``INSERT ... ON CONFLICT`` in one transaction, on the driver
  the Airflow hook uses (psycopg 3, which pipelines it): the least a hand-written upsert does.

Memory is the peak traced (:mod:`tracemalloc`) of a delivery of N and of 10N results: a
delivery that holds one batch at a time has a 10N/N ratio near 1.

Usage: ``python benchmarks/bench_delivery.py [--size tiny|small|default|large]``
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    airflow_postgres_conn,
    check_size,
    cli,
    floor_insert,
    mib,
    per_s,
    postgres_url,
    result,
    row,
    timed,
    traced_peak,
)
from sqlalchemy import create_engine, delete, insert, text
from sqlalchemy.engine import make_url

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.services.delivery import deliver
from airflow_batch_provider.sinks.sql import SqlUpsertSink

#: size -> (results N for the memory runs (and 10N), results for throughput, timing repeats)
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (200, 500, 1),
    "small": (2_000, 20_000, 1),
    "default": (10_000, 100_000, 1),
    "large": (100_000, 1_000_000, 1),
}
CONN_ID = "bench_target"
WORKLOAD = "bench_delivery"
RUN = "manual__2026-12-01T00:00:00+00:00"
LABELS = ("negative", "neutral", "positive")
TABLE = "CREATE TABLE tickets (ticket_id BIGINT PRIMARY KEY, sentiment TEXT, confidence DOUBLE PRECISION)"


def answer(i: int) -> dict[str, Any]:
    """The published answer of ticket ``i``."""
    return {"sentiment": LABELS[i % 3], "confidence": round(0.5 + (i % 50) / 100, 2)}


def seed(ledger: Ledger, n: int) -> None:
    """Untimed setup: ``n`` published answers of one run (the rows publish leaves in ``abp_results``)."""
    now = datetime.now(UTC)
    with ledger.engine.begin() as conn:
        conn.execute(delete(s.published))
        for start in range(0, n, 50_000):
            conn.execute(
                insert(s.published),
                [
                    {
                        "workload": WORKLOAD,
                        "item_key": item_key(str(i)),
                        "prompt_version": "v1",
                        "app_id": str(i),
                        "run_id": RUN,
                        "state": "succeeded",
                        "output_json": json.dumps(answer(i)),
                        "published_at": now,
                    }
                    for i in range(start, min(n, start + 50_000))
                ],
            )


def reset(ledger: Ledger, target: Any) -> None:
    """Untimed: an empty target table and no delivery recorded."""
    with ledger.engine.begin() as conn:
        conn.execute(delete(s.deliveries))
    with target.begin() as conn:
        conn.execute(text("TRUNCATE tickets"))


def sink() -> SqlUpsertSink:
    return SqlUpsertSink(
        conn_id=CONN_ID,
        table="tickets",
        key_columns=["ticket_id"],
        columns={"sentiment": "$.sentiment", "confidence": "$.confidence"},
        key_type=int,
    )


def subject(ledger: Ledger, n: int) -> int:
    counts = deliver(ledger, WORKLOAD, RUN, sink())
    if counts.written != n:
        raise AssertionError(f"delivered {counts.written} rows of {n}")
    return counts.written


def executemany(target: Any, rows: list[tuple[Any, ...]]) -> int:
    """One ``executemany`` of the sink's statement, one transaction, on the driver the hook uses (psycopg 3)."""
    sql = sink().statement("%s")
    with target.begin() as conn:
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.executemany(sql, rows)
        finally:
            cur.close()
    return len(rows)


def run(size: str = "default") -> dict[str, Any]:
    """Run the delivery benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small``, ``default`` or ``large``
    """
    check_size(size)
    n_mem, n_speed, repeat = SIZES[size]
    url, how = postgres_url()
    if url is None:
        return result("delivery", size, {"postgres": how}, [], notes=[f"skipped: no PostgreSQL ({how})"])
    pg = make_url(url)
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = airflow_postgres_conn(url)
    target = create_engine(url)
    rows_out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="abp-bench-delivery-") as tmp:
        ledger = Ledger.from_url(f"sqlite:///{Path(tmp) / 'ledger.sqlite'}")
        with target.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS tickets"))
            conn.execute(text(TABLE))
        seed(ledger, n_speed)
        rows = [(i, *answer(i).values()) for i in range(n_speed)]
        reset(ledger, target)
        subject(ledger, n_speed)  # warm: the hook, the connection, the caches; untimed
        timing = timed(lambda: subject(ledger, n_speed), repeat, setup=lambda: reset(ledger, target))
        copy = timed(
            lambda: floor_insert(target, "tickets", ["ticket_id", "sentiment", "confidence"], rows),
            repeat,
            setup=lambda: reset(ledger, target),
        )
        same_driver = create_engine(pg.set(drivername="postgresql+psycopg"))
        many = timed(lambda: executemany(same_driver, rows), repeat, setup=lambda: reset(ledger, target))
        same_driver.dispose()
        for name, base in (
            ("COPY FROM STDIN of the same rows, one transaction", copy),
            ("one psycopg (3) executemany of the same INSERT ... ON CONFLICT, one transaction", many),
        ):
            rows_out.append(
                row(
                    f"deliver {n_speed:,} results into PostgreSQL",
                    "rows/s",
                    per_s(n_speed, timing.best_s),
                    per_s(n_speed, base.best_s),
                    subject="deliver(), SqlUpsertSink upsert, batches of 1,000, recorded in the ledger",
                    baseline_name=name,
                )
            )
        peaks = []
        for n in (n_mem, 10 * n_mem):
            seed(ledger, n)
            reset(ledger, target)
            nbytes, _ = traced_peak(lambda n=n: subject(ledger, n))  # type: ignore[misc]
            peaks.append(nbytes)
        rows_out.append(
            row(
                f"peak memory growth, {n_mem:,} -> {10 * n_mem:,} results",
                "peak(10N)/peak(N)",
                peaks[1] / max(1, peaks[0]),
                subject=f"deliver(); peak at N: {mib(peaks[0]):.1f} MiB, at 10N: {mib(peaks[1]):.1f} MiB",
                note="1.0 = flat; a delivery that held every row would be near 10",
            )
        )
        ledger.engine.dispose()
    target.dispose()
    return result(
        "delivery",
        size,
        {"results_memory": [n_mem, 10 * n_mem], "results_speed": n_speed, "repeat": repeat, "postgres": how},
        rows_out,
        notes=[
            "ratio = subject / baseline on the same PostgreSQL table in the same run.",
            "tracemalloc sees Python allocations only; the drivers' buffers are not counted.",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
