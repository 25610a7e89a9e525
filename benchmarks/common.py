"""Shared helpers for the benchmarks: timing, traced memory, result rows, the machine.

Every benchmark module is ``benchmarks/bench_<name>.py`` and exposes ``run(size: str) -> dict``,
with ``size`` one of :data:`SIZES` (``tiny`` is for the smoke test only; ``large`` is the million
items end to end, and a module whose own ``SIZES`` lacks a size is skipped at it by ``run_all``).
The dict it returns has:

- ``name``: the benchmark's name;
- ``size``: the size it ran at;
- ``params``: what it ran with (item counts, chunk sizes, databases);
- ``rows``: a list of :func:`row` dicts, one figure each, each compared with a baseline measured
  in the same run (``ratio`` = subject / baseline, for the metric named in the row);
- ``skipped``: a list of ``{"case": ..., "reason": ...}`` for what could not run here;
- ``notes``: sentences a reader needs to read the figures.

Figures are never asserted anywhere: speed and memory are ratios against a baseline measured in
the same process, so that a slow or busy machine moves both sides together.
"""

from __future__ import annotations

import gc
import os
import platform
import sqlite3
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

SIZES: Final[tuple[str, ...]] = ("tiny", "small", "default", "large")
REPO_ROOT: Final = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def ensure_repo_on_path() -> None:
    """Put this tree first on ``sys.path``: the package and ``tests.support`` imported from it.

    A benchmark run as a script measures the package of the tree it is in, not another copy the
    interpreter would find first (an editable install of another clone, a wheel in the virtual
    environment): run from a worktree with another clone's environment, it measured that clone's
    code. Called when this module is imported, before a benchmark imports the package.
    """
    root = str(REPO_ROOT)
    while root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)


ensure_repo_on_path()


def check_size(size: str) -> None:
    """Refuse an unknown size with the list of known ones.

    :param size: the requested size
    :raises ValueError: the size is unknown
    """
    if size not in SIZES:
        raise ValueError(f"unknown benchmark size {size!r}; use one of {', '.join(SIZES)}.")


@dataclass(frozen=True)
class Timing:
    """Best and all wall-clock times of one piece of work.

    :param best_s: the shortest run, in seconds (the least disturbed by other load)
    :param all_s: every run, in seconds
    :param last: what the last run returned
    """

    best_s: float
    all_s: tuple[float, ...]
    last: Any = None

    @property
    def spread(self) -> float:
        """Slowest over fastest run (1.0 = no noise seen; only meaningful with 2+ runs)."""
        return max(self.all_s) / self.best_s if self.best_s > 0 else 1.0


def timed(work: Callable[[], object], repeat: int = 1, setup: Callable[[], object] | None = None) -> Timing:
    """Time ``work`` ``repeat`` times, calling ``setup`` (untimed) before each run.

    :param work: the measured work
    :param repeat: how many runs
    :param setup: untimed preparation before each run (a fresh database, say)
    """
    return timed_in_turns({"work": work}, repeat, setup)["work"]


def timed_in_turns(
    works: Mapping[str, Callable[[], object]], repeat: int = 1, setup: Callable[[], object] | None = None
) -> dict[str, Timing]:
    """Time each piece of work ``repeat`` times, in turns: one run of each, then the next turn.

    A subject and its baselines timed in turns run minutes apart at most by one run of each, so a
    shared host whose speed drifts moves them together; timed one after the other (every run of
    the subject, then every run of a baseline), they compare different minutes of the host.

    :param works: name -> the measured work, run in this order within a turn
    :param repeat: how many turns
    :param setup: untimed preparation before each run (a fresh database, say)
    """
    runs: dict[str, list[float]] = {name: [] for name in works}
    last: dict[str, object] = {}
    for _ in range(max(1, repeat)):
        for name, work in works.items():
            if setup is not None:
                setup()
            gc.collect()
            start = time.perf_counter()
            last[name] = work()
            runs[name].append(time.perf_counter() - start)
    return {name: Timing(min(spent), tuple(spent), last[name]) for name, spent in runs.items()}


def traced_peak(work: Callable[[], T]) -> tuple[int, T]:
    """Run ``work`` under :mod:`tracemalloc` and return (peak bytes above the start, its result).

    Only Python allocations are traced: SQLite's and libpq's own buffers are not counted.

    :param work: the measured work
    """
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - before), result


def ratio(value: float | None, baseline: float | None) -> float | None:
    """Return value / baseline, or ``None`` when either is missing or the baseline is zero.

    :param value: the subject's figure
    :param baseline: the baseline's figure
    """
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def row(
    case: str,
    metric: str,
    value: float | None,
    baseline: float | None = None,
    *,
    subject: str = "",
    baseline_name: str = "",
    note: str = "",
) -> dict[str, Any]:
    """One figure of a benchmark, with its baseline and their ratio.

    :param case: what was measured (e.g. ``upsert new, sqlite``)
    :param metric: unit of ``value`` and ``baseline`` (``lines/s``, ``rows/s``, ``MiB``)
    :param value: the subject's figure
    :param baseline: the baseline's figure, measured in the same run
    :param subject: the code measured
    :param baseline_name: the baseline's code
    :param note: anything a reader needs for this one figure
    """
    return {
        "case": case,
        "metric": metric,
        "value": value,
        "baseline": baseline,
        "ratio": ratio(value, baseline),
        "subject": subject,
        "baseline_name": baseline_name,
        "note": note,
    }


def per_s(count: int, seconds: float) -> float:
    """Return a rate, guarding against a zero duration.

    :param count: items processed
    :param seconds: elapsed seconds
    """
    return count / seconds if seconds > 0 else float("inf")


def mib(nbytes: int) -> float:
    """Bytes to MiB.

    :param nbytes: a byte count
    """
    return nbytes / (1024 * 1024)


def machine() -> dict[str, Any]:
    """Describe where the figures were measured: CPUs, memory, load, Python, SQLite."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        info["load_avg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        info["load_avg_1_5_15"] = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total_gib"] = round(int(line.split()[1]) / (1024 * 1024), 1)
                break
    except OSError:
        pass
    return info


def result(
    name: str,
    size: str,
    params: dict[str, Any],
    rows: list[dict[str, Any]],
    skipped: list[dict[str, str]] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Assemble what ``run(size)`` returns.

    :param name: the benchmark's name
    :param size: the size it ran at
    :param params: what it ran with
    :param rows: the figures (see :func:`row`)
    :param skipped: cases that could not run, with the reason
    :param notes: sentences a reader needs
    """
    return {
        "name": name,
        "size": size,
        "params": params,
        "rows": rows,
        "skipped": skipped or [],
        "notes": notes or [],
    }


_PG: dict[str, Any] = {}


def postgres_url() -> tuple[str | None, str]:
    """Return (a PostgreSQL URL, how it was found) or (``None``, why not), once per process.

    ``ABP_BENCH_PG_URL`` names a server to use; ``ABP_BENCH_PG=0`` skips PostgreSQL; otherwise a
    throw-away server is started with ``tests/support/postgres.py`` (stopped at exit). That server
    runs with ``fsync=off`` and ``synchronous_commit=off``: its write figures are optimistic next
    to a durable production server.
    """
    if "url" in _PG:
        return _PG["url"], _PG["how"]
    url: str | None
    if os.environ.get("ABP_BENCH_PG_URL"):
        url, how = os.environ["ABP_BENCH_PG_URL"], "ABP_BENCH_PG_URL"
    elif os.environ.get("ABP_BENCH_PG") == "0":
        url, how = None, "ABP_BENCH_PG=0"
    else:
        try:
            from tests.support.postgres import PostgresUnavailable, start_postgres
        except ImportError as exc:
            url, how = None, f"tests.support.postgres cannot be imported ({exc})"
        else:
            try:
                server = start_postgres()
            except (PostgresUnavailable, OSError) as exc:
                url, how = None, str(exc).splitlines()[0]
            else:
                _PG["server"] = server
                url, how = server.url, f"throw-away server from {server.bin_dir} (fsync=off)"
    _PG["url"], _PG["how"] = url, how
    return url, how


@dataclass(frozen=True)
class CpuSplit:
    """Where one run of some work spent its time, per item: the wall clock, this process's CPU and
    the database server's CPU (``None`` where the server's processes cannot be read here).

    :param wall_us: wall-clock microseconds per item
    :param client_us: this process's CPU microseconds per item (every thread)
    :param server_us: the server's CPU microseconds per item (the postmaster and its children)
    """

    wall_us: float
    client_us: float
    server_us: float | None


def postgres_server_cpu(engine: Any) -> Callable[[], float] | None:
    """A reader of a local PostgreSQL server's CPU seconds so far (its postmaster and every child).

    The server is found from a backend's process id (``pg_backend_pid()``): its parent is the
    postmaster. ``None`` where ``/proc`` does not show it (another machine, another OS).

    :param engine: a SQLAlchemy engine on the server
    """
    from sqlalchemy import text

    with engine.connect() as conn:  # the backend read while its connection is open (it may end on close)
        backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        try:
            postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:  # not a process this machine's /proc shows
            return None
    tick = os.sysconf("SC_CLK_TCK")

    def scan() -> tuple[int, frozenset[tuple[int, str]]]:
        """The server's CPU ticks, and its children with their states."""
        total = 0
        children: set[tuple[int, str]] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended meanwhile
                continue
            if int(entry.name) == postmaster or int(fields[1]) == postmaster:
                # utime, stime, and those of its waited-for children (a backend that ended)
                total += sum(int(f) for f in fields[11:15])
                if int(entry.name) != postmaster:
                    children.add((int(entry.name), fields[0]))
        return total, frozenset(children)

    def seconds() -> float:
        # A backend whose connection just closed may exit and be reaped in the middle of a scan
        # (its time then counted in neither place): scan until no child is exiting and two scans
        # in a row see the same children.
        total, children = scan()
        for _ in range(40):
            time.sleep(0.05)
            again, now = scan()
            if now == children and all(state != "Z" for _, state in now):
                return again / tick
            total, children = again, now
        return total / tick

    return seconds


def cpu_split(work: Callable[[], object], items: int, server: Callable[[], float] | None) -> CpuSplit:
    """Run ``work`` once; return its wall time, this process's CPU and the server's, per item.

    :param work: the measured work
    :param items: how many items it processes
    :param server: the server's CPU reader (:func:`postgres_server_cpu`), or ``None``
    """
    gc.collect()
    s0 = server() if server else 0.0
    w0, c0 = time.perf_counter(), time.process_time()
    work()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    used = (server() - s0) if server else None
    per = 1e6 / max(1, items)
    return CpuSplit(wall * per, cpu * per, None if used is None else used * per)


def cli(doc: str | None, run: Any, sizes: Any, argv: list[str] | None = None) -> None:
    """The command line of one benchmark module: ``--size``, JSON on stdout.

    :param doc: the module docstring (its first line is the description)
    :param run: the module's ``run(size)``
    :param sizes: the sizes it accepts
    :param argv: arguments (default: ``sys.argv``)
    """
    import argparse
    import json

    parser = argparse.ArgumentParser(description=(doc or "").split("\n", 1)[0])
    parser.add_argument("--size", choices=list(sizes), default="default")
    parser.add_argument("--items", type=int, default=None, help="one item count instead of the size's")
    args = parser.parse_args(argv)
    figures = run(args.size) if args.items is None else run(args.size, items=args.items)
    print(json.dumps(figures, indent=2))


def floor_insert(engine: Any, table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> int:
    """The database's floor for writing ``rows``: one transaction, no per-row work but the driver's.

    PostgreSQL: psycopg2's ``copy_expert`` (``COPY ... FROM STDIN``, CSV format); SQLite: one
    prepared ``executemany`` INSERT on the driver's cursor. Values are ``None`` (written as NULL),
    ``bool``, ``int``, ``str`` or ``datetime``; an empty string would read back as NULL on
    PostgreSQL, so the benchmarks write none.

    :param engine: a SQLAlchemy engine
    :param table: the table's name
    :param columns: the columns, in the tuples' order
    :param rows: the rows
    :return: how many rows
    """
    import csv
    import io

    names = ", ".join(columns)
    with engine.begin() as conn:
        cur = conn.connection.driver_connection.cursor()
        try:
            if engine.dialect.name == "postgresql":
                buf = io.StringIO()
                csv.writer(buf, lineterminator="\n").writerows(rows)
                buf.seek(0)
                cur.copy_expert(f"COPY {table} ({names}) FROM STDIN WITH (FORMAT csv)", buf)
            else:
                marks = ", ".join("?" for _ in columns)
                cur.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)
        finally:
            cur.close()
    return len(rows)


def floor_name(engine: Any) -> str:
    """How :func:`floor_insert` writes on this engine's database, for the rows' ``baseline_name``."""
    if engine.dialect.name == "postgresql":
        return "psycopg2 COPY FROM STDIN, one transaction"
    return "one prepared executemany INSERT, one transaction"


def airflow_postgres_conn(url: str) -> str:
    """The Airflow connection (JSON, for ``AIRFLOW_CONN_<ID>``) of a PostgreSQL URL.

    :param url: a SQLAlchemy URL of the server's database
    """
    import json

    from sqlalchemy.engine import make_url

    pg = make_url(url)
    return json.dumps(
        {
            "conn_type": "postgres",
            "host": pg.host,
            "port": pg.port,
            "login": pg.username,
            "password": pg.password or "",
            "schema": pg.database,
        }
    )
