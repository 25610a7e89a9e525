"""How close to the database's own bulk write is a delivery into PostgreSQL, and is its memory flat?

Subject: :func:`~airflow_batch_provider.services.delivery.deliver` of a run's published answers
(``{"sentiment": ..., "confidence": ...}``) through a ``SqlUpsertSink`` (``INSERT ... ON CONFLICT
(ticket_id) DO UPDATE``, batches of 1,000 rows, one transaction each) behind a real Airflow
``postgres`` connection and its hook, each batch then recorded per item in the ledger: once with
the ledger in a SQLite file (the embedded default), once in a PostgreSQL database (on the same
server as the target). Every timed delivery starts with an empty target table and no delivery
recorded; each ledger is warmed first by the delivery of another, small run.

Baselines, measured in the same run on the same rows and database, in turns with the delivery
(SQLite ledger): one run of each a turn, seconds apart, so that a shared host whose speed drifts
moves them together (the PostgreSQL ledger's delivery is timed after them); the ``executemany``
warmed first, as the delivery is:

- ``COPY ... FROM STDIN`` of the same rows in one transaction (the database's floor);
- one ``executemany`` of the same ``INSERT ... ON CONFLICT`` in one transaction, on the driver
  the Airflow hook uses (psycopg 3, which pipelines it): the least a hand-written upsert does.

Where the time goes: one more delivery with each ledger and one more ``executemany``, each with
this process's CPU and the PostgreSQL server's CPU per row (the server's processes read from
``/proc``; left out where they cannot be read). A delivery does two writes a row (the sink's and
the ledger's record) and reads the answers and the sink's records; the baseline does one write.
And, with the SQLite ledger, the same delivery with a part left out (the ledger's record, the
sink's writes, or both: reading and mapping only), against the whole delivery: what each part
adds to the wall clock when the others run beside it. And one more delivery (SQLite ledger) with
each stage's wall time summed on its thread: reading and mapping on the delivery's thread (the
rest of its time it waits for the others), the sink's write of each batch on the sink's thread,
and the ledger's record of each batch on the record's thread.

Memory is the peak traced (:mod:`tracemalloc`) of a delivery of N and of 10N results (SQLite
ledger): a delivery that holds one batch at a time has a 10N/N ratio near 1.

Usage: ``python benchmarks/bench_delivery.py [--size tiny|small|default|large]`` (``large``: the
1,000,000-result delivery, memory at 100,000 and 1,000,000)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    CpuSplit,
    Timing,
    airflow_postgres_conn,
    check_size,
    cli,
    cpu_split,
    floor_insert,
    mib,
    per_s,
    postgres_server_cpu,
    postgres_url,
    result,
    row,
    timed,
    timed_in_turns,
    traced_peak,
)
from sqlalchemy import create_engine, delete, text
from sqlalchemy.engine import make_url

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import db_stamp, insert_rows
from airflow_batch_provider.services import delivery
from airflow_batch_provider.services.delivery import deliver
from airflow_batch_provider.sinks.sql import SqlUpsertSink

#: size -> (results N for the memory runs, results for throughput (and 10N), timing repeats: each
#: figure the best of that many, the baselines as well as the deliveries (a warm `executemany`
#: runs up to a third faster than its first run in the process))
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (50, 500, 1),
    "small": (2_000, 20_000, 1),
    "default": (10_000, 100_000, 3),
    "large": (100_000, 1_000_000, 1),
}
CONN_ID = "bench_target"
WORKLOAD = "bench_delivery"
RUN = "manual__2026-12-01T00:00:00+00:00"
#: The small run each ledger's warm-up delivers (its own tickets, untimed).
WARM_RUN, WARM = "manual__2026-11-30T00:00:00+00:00", 1_000
#: The run of N results the memory figure compares with the run's 10N.
SMALL_RUN = "manual__2026-11-29T00:00:00+00:00"
LEDGER_DB = "abp_bench_delivery_ledger"
LABELS = ("negative", "neutral", "positive")
TABLE = "CREATE TABLE tickets (ticket_id BIGINT PRIMARY KEY, sentiment TEXT, confidence DOUBLE PRECISION)"


def answer(i: int) -> str:
    """The published answer of ticket ``i`` (JSON)."""
    return f'{{"sentiment": "{LABELS[i % 3]}", "confidence": {round(0.5 + (i % 50) / 100, 2)}}}'


def seed(ledger: Ledger, n: int, small: int) -> None:
    """Untimed setup: ``n`` published answers of the run, ``small`` of another, and the warm-up run's."""
    columns = [c.name for c in s.published.c]  # tuples in the table's column order
    with ledger.engine.begin() as conn:
        conn.execute(delete(s.published))
        now = db_stamp(conn, datetime.now(UTC))
        for run_id, first, count in ((WARM_RUN, 10**9, WARM), (SMALL_RUN, 2 * 10**9, small), (RUN, 0, n)):
            for start in range(first, first + count, 50_000):
                rows = [
                    (WORKLOAD, item_key(str(i)), "v1", str(i), run_id, "succeeded", answer(i), now)
                    for i in range(start, min(first + count, start + 50_000))
                ]
                insert_rows(conn, s.published, columns, rows)


def reset(ledger: Ledger, target: Any) -> None:
    """Untimed: an empty target table and no delivery recorded."""
    with ledger.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {s.deliveries.name}"))  # no dead rows left for the next delivery
        else:
            conn.execute(delete(s.deliveries))
    with target.begin() as conn:
        conn.execute(text("TRUNCATE tickets"))


#: The ``executemany`` baseline's name in every row that compares with it.
EXECUTEMANY = "one psycopg (3) executemany of the same INSERT ... ON CONFLICT, one transaction"


def sink(kind: type[SqlUpsertSink] = SqlUpsertSink) -> SqlUpsertSink:
    return kind(
        conn_id=CONN_ID,
        table="tickets",
        key_columns=["ticket_id"],
        columns={"sentiment": "$.sentiment", "confidence": "$.confidence"},
        key_type=int,
    )


def subject(ledger: Ledger, n: int, run_id: str = RUN, into: SqlUpsertSink | None = None) -> int:
    counts = deliver(ledger, WORKLOAD, run_id, into or sink())
    if counts.written != n:
        raise AssertionError(f"delivered {counts.written} rows of {n}")
    return counts.written


def prepared(ledger: Ledger, target: Any, n: int, small: int) -> None:
    """Untimed: seed the ledger, then warm it (and the hook) with the warm-up run."""
    seed(ledger, n, small)
    reset(ledger, target)
    subject(ledger, WARM, WARM_RUN)  # the hook, the connections, the caches


def timed_delivery(ledger: Ledger, target: Any, n: int, small: int, repeat: int) -> Timing:
    """Seed the ledger, warm it (and the hook) with the warm-up run, then time the delivery of ``n``."""
    prepared(ledger, target, n, small)
    return timed(lambda: subject(ledger, n), repeat, setup=lambda: reset(ledger, target))


#: The parts of a delivery left out, one at a time, in :func:`parts_rows`: (record, write into the sink).
PARTS: dict[str, tuple[bool, bool]] = {
    "the ledger's record left out": (False, True),
    "the sink's writes left out": (True, False),
    "both left out (reading and mapping only)": (False, False),
}


class _NoWrites:
    """A writer that writes nothing (the sink's part left out)."""

    def write(self, rows: Any) -> dict[int, str]:
        return {}


class _Unwritten(SqlUpsertSink):
    """The benchmark's sink, mapping each answer as it does, with nothing written."""

    @contextmanager
    def open(self) -> Iterator[_NoWrites]:
        yield _NoWrites()


def parts_rows(ledger: Ledger, target: Any, n: int, repeat: int, whole: Timing) -> list[dict[str, Any]]:
    """The delivery of ``n`` with a part left out, against the whole delivery (rows/s)."""
    out: list[dict[str, Any]] = []
    for name, (record, write) in PARTS.items():

        def work(record: bool = record, write: bool = write) -> int:
            # the record's function, module-wide, for this one delivery
            left_out = (
                nullcontext() if record else patch.object(delivery, "record_deliveries", lambda *a, **k: None)
            )
            with left_out:
                return subject(ledger, n, RUN, sink() if write else sink(_Unwritten))

        timing = timed(work, repeat, setup=lambda: reset(ledger, target))
        out.append(
            row(
                f"deliver {n:,} results, ledger on SQLite, {name}",
                "rows/s",
                per_s(n, timing.best_s),
                per_s(n, whole.best_s),
                subject="deliver() with that part replaced by nothing",
                baseline_name="the whole delivery, ledger on SQLite",
                note="above 1: what the part costs the delivery",
            )
        )
    return out


DELIVERY_THREAD, SINK_THREAD, RECORD_THREAD = (
    "the delivery's thread",
    "the sink's thread",
    "the record's thread",
)
READING = "reading the answers a page at a time"
MAPPING = "mapping each answer to its row and digest"
RECORD = "the ledger's record of a batch"
WRITE = "the sink's write of a batch"
WAITING = "waiting for the other threads, the rest"


@dataclass(frozen=True)
class Stage:
    """A stage of one delivery whose wall time :func:`stage_walls` sums.

    :param owner: the module or class whose attribute is the stage
    :param attr: the attribute wrapped
    :param pages: a generator: the time of each page it yields is summed, not its caller's
    """

    owner: Any
    attr: str
    pages: bool = False


STAGES: dict[str, Stage] = {
    READING: Stage(delivery, "candidate_pages", pages=True),
    MAPPING: Stage(delivery, "_rows"),
    WRITE: Stage(delivery._Batch, "write"),
    RECORD: Stage(delivery._Batch, "record"),
}
#: The rows :func:`stage_rows` shows, each with the thread it runs on: the delivery's thread waits
#: (for the sink's and the record's) the rest of the whole.
SHOWN: dict[str, str] = {
    READING: DELIVERY_THREAD,
    MAPPING: DELIVERY_THREAD,
    WAITING: DELIVERY_THREAD,
    WRITE: SINK_THREAD,
    RECORD: RECORD_THREAD,
}


def stage_walls(ledger: Ledger, target: Any, n: int) -> tuple[float, dict[str, float]]:
    """One more delivery of ``n`` (SQLite ledger) with each stage's wall time summed; (whole, per stage) in s."""
    spent = dict.fromkeys(STAGES, 0.0)

    def clocked(name: str, work: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return work(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return run

    def paged(name: str, work: Any) -> Any:
        def pages(*args: Any, **kwargs: Any) -> Iterator[Any]:
            found = work(*args, **kwargs)
            while True:
                start = time.perf_counter()
                page = next(found, None)
                spent[name] += time.perf_counter() - start
                if page is None:
                    return
                yield page

        return pages

    reset(ledger, target)
    with ExitStack() as patched:
        for name, stage in STAGES.items():
            wrap = paged if stage.pages else clocked
            patched.enter_context(
                patch.object(stage.owner, stage.attr, wrap(name, getattr(stage.owner, stage.attr)))
            )
        start = time.perf_counter()
        subject(ledger, n)
        whole = time.perf_counter() - start
    return whole, spent


def stage_rows(ledger: Ledger, target: Any, n: int) -> list[dict[str, Any]]:
    """Where one delivery's wall time goes, per stage and thread, against the whole (us a row)."""
    whole, spent = stage_walls(ledger, target, n)
    derived = {WAITING: whole - spent[READING] - spent[MAPPING]}
    return [
        row(
            f"deliver {n:,} results, ledger on SQLite: {name} ({thread})",
            "us/row",
            {**spent, **derived}[name] * 1e6 / n,
            whole * 1e6 / n,
            subject="that stage's wall time, summed over the delivery",
            baseline_name="the whole delivery's wall time",
            note="the share of the wall clock; the three threads' shares overlap",
        )
        for name, thread in SHOWN.items()
    ]


def split_delivery(ledger: Ledger, target: Any, n: int, server: Any) -> CpuSplit:
    """One more delivery of ``n`` (after the timed ones), with this process's and the server's CPU."""
    reset(ledger, target)
    return cpu_split(lambda: subject(ledger, n), n, server)


def split_rows(n: int, splits: dict[str, CpuSplit], many: CpuSplit) -> list[dict[str, Any]]:
    """The CPU figures per row: each ledger's delivery against the ``executemany``'s."""
    out: list[dict[str, Any]] = []
    for kind, split in splits.items():
        out.append(
            row(
                f"this process's CPU per row, {n:,} results, ledger on {kind}",
                "us/row",
                split.client_us,
                many.client_us,
                subject="deliver() (every thread)",
                baseline_name=EXECUTEMANY,
                note=f"wall {split.wall_us:.1f} us/row against {many.wall_us:.1f}",
            )
        )
        if split.server_us is not None and many.server_us is not None:
            out.append(
                row(
                    f"PostgreSQL server's CPU per row, {n:,} results, ledger on {kind}",
                    "us/row",
                    split.server_us,
                    many.server_us,
                    subject="deliver(): the sink's writes, and the ledger's reads and writes where it is on PostgreSQL",
                    baseline_name=EXECUTEMANY,
                    note=(
                        "the server's processes as /proc counts them (the postmaster and its children), "
                        "in 10 ms ticks: read it at 10,000 rows or more"
                    ),
                )
            )
    return out


def postgres_ledger(url: str) -> Ledger:
    """A ledger in a fresh database of the target's server."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {LEDGER_DB}"))
        conn.execute(text(f"CREATE DATABASE {LEDGER_DB}"))
    admin.dispose()
    return Ledger.from_url(make_url(url).set(database=LEDGER_DB).render_as_string(hide_password=False))


def drop_postgres_ledger(ledger: Ledger, url: str) -> None:
    ledger.engine.dispose()
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {LEDGER_DB}"))
    admin.dispose()


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
    with target.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS tickets"))
        conn.execute(text(TABLE))
    rows = [(i, LABELS[i % 3], round(0.5 + (i % 50) / 100, 2)) for i in range(n_speed)]
    server = postgres_server_cpu(target)
    splits: dict[str, CpuSplit] = {}
    with tempfile.TemporaryDirectory(prefix="abp-bench-delivery-") as tmp:
        ledger = Ledger.from_url(f"sqlite:///{Path(tmp) / 'ledger.sqlite'}")
        prepared(ledger, target, n_speed, n_mem)
        same_driver = create_engine(pg.set(drivername="postgresql+psycopg"))
        executemany(same_driver, rows[:WARM])  # untimed: the driver's first executemany in the process
        # in turns: the delivery and its baselines seconds apart, not minutes (the host's speed drifts)
        turns = timed_in_turns(
            {
                "SQLite": lambda: subject(ledger, n_speed),
                "COPY": lambda: floor_insert(
                    target, "tickets", ["ticket_id", "sentiment", "confidence"], rows
                ),
                "executemany": lambda: executemany(same_driver, rows),
            },
            repeat,
            setup=lambda: reset(ledger, target),
        )
        timings = {"SQLite": turns["SQLite"]}
        copy, many = turns["COPY"], turns["executemany"]
        splits["SQLite"] = split_delivery(ledger, target, n_speed, server)
        rows_out.extend(parts_rows(ledger, target, n_speed, repeat, timings["SQLite"]))
        rows_out.extend(stage_rows(ledger, target, n_speed))
        pg_ledger = postgres_ledger(url)
        try:
            timings["PostgreSQL"] = timed_delivery(pg_ledger, target, n_speed, n_mem, repeat)
            splits["PostgreSQL"] = split_delivery(pg_ledger, target, n_speed, server)
        finally:
            drop_postgres_ledger(pg_ledger, url)
        reset(ledger, target)
        many_split = cpu_split(lambda: executemany(same_driver, rows), n_speed, server)
        same_driver.dispose()
        for kind, timing in timings.items():
            for name, base in (
                ("COPY FROM STDIN of the same rows, one transaction", copy),
                (EXECUTEMANY, many),
            ):
                rows_out.append(
                    row(
                        f"deliver {n_speed:,} results into PostgreSQL, ledger on {kind}",
                        "rows/s",
                        per_s(n_speed, timing.best_s),
                        per_s(n_speed, base.best_s),
                        subject="deliver(), SqlUpsertSink upsert, batches of 1,000, recorded in the ledger",
                        baseline_name=name,
                    )
                )
        rows_out.extend(split_rows(n_speed, splits, many_split))
        peaks = []
        for n, run_id in ((n_mem, SMALL_RUN), (n_speed, RUN)):  # the SQLite ledger seeded above
            reset(ledger, target)
            nbytes, _ = traced_peak(lambda n=n, run_id=run_id: subject(ledger, n, run_id))  # type: ignore[misc]
            peaks.append(nbytes)
        rows_out.append(
            row(
                f"peak memory growth, {n_mem:,} -> {n_speed:,} results",
                "peak(10N)/peak(N)",
                peaks[1] / max(1, peaks[0]),
                subject=f"deliver(), ledger on SQLite; peak at N: {mib(peaks[0]):.1f} MiB, at 10N: {mib(peaks[1]):.1f} MiB",
                note="1.0 = flat; a delivery that held every row would be near 10",
            )
        )
        ledger.engine.dispose()
    target.dispose()
    return result(
        "delivery",
        size,
        {"results_memory": [n_mem, n_speed], "results_speed": n_speed, "repeat": repeat, "postgres": how},
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
