"""How close does the ledger's item upsert come to a bare bulk INSERT, on SQLite and PostgreSQL?

Subject: :meth:`Ledger.upsert_items` of N prepared items, three passes per database:

1. ``new``: a fresh ledger, every item inserted as ``pending``;
2. ``already_in_run``: the same items, same run id (a cleared prepare task running again);
3. ``unchanged``: a new run id, every item's input matching its last success (the skip path).

Then :meth:`Ledger.iter_items` (keyset pagination, a page of 1,000 per short read) over the run.

Baselines (the floor), on the same database in the same run: the same rows (same values,
``request_json`` and ``input_hash`` computed the same way) written into the same table
(``abp_items``, with its keys and indexes) in one transaction at the database's floor: psycopg2's
``COPY ... FROM STDIN`` on PostgreSQL, one prepared ``executemany`` INSERT on SQLite's driver
cursor (the table is emptied, untimed, before the ledger's passes); and one plain
``SELECT ... ORDER BY`` of the same rows and columns for the read.

SQLite is a file in WAL mode (``synchronous=NORMAL``, as :meth:`Ledger.from_url` sets it).
PostgreSQL is a throw-away local server from ``tests/support/postgres.py`` (``fsync=off``) or
``ABP_BENCH_PG_URL``; when none can be found its rows are reported as skipped with the reason.

Usage: ``python benchmarks/bench_ledger.py [--size tiny|small|default] [--items N]``
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    check_size,
    cli,
    floor_insert,
    floor_name,
    per_s,
    postgres_url,
    result,
    row,
    timed,
    traced_peak,
)
from sqlalchemy import select, text

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import BATCH, NEW_ITEM_COLUMNS, PreparedItem

#: size -> (item counts, fresh runs per count); two counts show how the rates scale with N
SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "tiny": ((300,), 1),
    "small": ((10_000,), 1),
    "default": ((10_000, 50_000), 1),
}
WORKLOAD = "bench"
SYSTEM = "Label the customer comment as positive, negative or neutral; answer with one word."


def make_items(n: int) -> list[PreparedItem]:
    """N distinct prepared items (a comment each), built before any timing.

    :param n: how many
    """
    out = []
    for i in range(n):
        key = f"c{i:09d}"
        text_ = f"comment {i}: the parcel came {i % 9} days late but the product is fine, thanks"
        out.append(
            PreparedItem(
                key,
                CanonicalRequest(
                    app_id=key,
                    prompt_version="bench-v1",
                    model="gpt-4o-mini",
                    system=SYSTEM,
                    messages=({"role": "user", "content": text_},),
                    params={"max_tokens": 5},
                ),
            )
        )
    return out


# the floor writes exactly the columns the ledger writes for a new item
ITEM_COLUMNS = list(NEW_ITEM_COLUMNS)


def floor_items(ledger: Ledger, items: list[PreparedItem], run_id: str) -> int:
    """The floor: the same rows, into the same table (``abp_items``, its keys and indexes), in one
    transaction with the database's fastest bulk path (see :func:`common.floor_insert`).

    ``input_hash`` and ``request_json`` are computed per row here too, as the ledger does.

    :param ledger: gives the engine
    :param items: the items
    :param run_id: the run id written on each row
    """
    now = utcnow()
    stamp = now if ledger.engine.dialect.name == "postgresql" else now.strftime("%Y-%m-%d %H:%M:%S.%f")
    rows = [
        (
            WORKLOAD,
            it.key,
            it.request.prompt_version,
            it.request.app_id,
            it.request.model,
            it.request.input_hash,
            json.dumps(it.request.to_dict(), ensure_ascii=False),
            "pending",
            0,
            run_id,
            stamp,
            stamp,
        )
        for it in items
    ]
    return floor_insert(ledger.engine, s.items.name, ITEM_COLUMNS, rows)


def empty_items(ledger: Ledger) -> None:
    """Untimed: the items table empty again after the floor wrote into it."""
    with ledger.engine.begin() as conn:
        if ledger.engine.dialect.name == "postgresql":
            conn.execute(text("TRUNCATE abp_items"))
        else:
            conn.execute(s.items.delete())


def count_items(ledger: Ledger, run_id: str) -> int:
    """The subject for reads: every row of the run through :meth:`Ledger.iter_items`.

    :param ledger: the ledger
    :param run_id: the run id
    """
    return sum(1 for _ in ledger.iter_items(WORKLOAD, run_id))


def baseline_select(ledger: Ledger, run_id: str, keep: bool = False) -> int:
    """The floor for reads: one plain SELECT of the run's rows in key order.

    :param ledger: gives the engine
    :param run_id: the run id
    :param keep: fetch every row into a list first (the naive read, for the memory figure)
    """
    c = s.items.c
    q = select(*c).where(c.workload == WORKLOAD, c.run_id == run_id).order_by(c.item_key, c.prompt_version)
    with ledger.engine.connect() as conn:
        if keep:
            return len(conn.execute(q).mappings().all())
        return sum(1 for _ in conn.execute(q).mappings())


def fresh_ledger(url: str) -> Ledger:
    """Open the ledger at ``url`` with every table empty (dropped and created again).

    :param url: a SQLAlchemy URL
    """
    ledger = Ledger.from_url(url)
    s.metadata.drop_all(ledger.engine)
    ledger.ensure_schema()
    return ledger


def mark_all_succeeded(ledger: Ledger) -> None:
    """Untimed setup of pass 3: every item succeeded with its current input."""
    with ledger.engine.begin() as conn:
        conn.execute(
            s.items.update().values(
                state="succeeded", succeeded_hash=s.items.c.input_hash, output_json='"neutral"', route="batch"
            )
        )


def _check(stats: Any, field: str, n: int) -> None:
    got = getattr(stats, field)
    if got != n:
        raise RuntimeError(f"benchmark setup is wrong: expected {n} items {field}, the ledger said {stats}")


def bench_database(
    label: str, url_for: Callable[[], str], items: list[PreparedItem], repeat: int
) -> list[dict[str, Any]]:
    """All passes on one database; best of ``repeat`` fresh runs for each figure.

    :param label: ``sqlite`` or ``postgresql``
    :param url_for: returns a URL to an empty (or emptied) database
    :param items: the items
    :param repeat: fresh runs
    """
    n = len(items)
    best: dict[str, float] = {}
    peaks: dict[str, int] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, seconds), seconds)

    for attempt in range(repeat):
        ledger = fresh_ledger(url_for())
        try:
            t = timed(partial(floor_items, ledger, items, "run-1"))
            keep("floor", t.best_s)
            empty_items(ledger)
            t = timed(partial(ledger.upsert_items, WORKLOAD, "run-1", items))
            _check(t.last, "new", n)
            keep("new", t.best_s)
            t = timed(partial(ledger.upsert_items, WORKLOAD, "run-1", items))
            _check(t.last, "already_in_run", n)
            keep("already_in_run", t.best_s)
            mark_all_succeeded(ledger)
            t = timed(partial(ledger.upsert_items, WORKLOAD, "run-2", items))
            _check(t.last, "unchanged", n)
            keep("unchanged", t.best_s)
            t = timed(partial(count_items, ledger, "run-2"))
            if t.last != n:
                raise RuntimeError(f"iter_items yielded {t.last} rows, expected {n}")
            keep("iter_items", t.best_s)
            t = timed(partial(baseline_select, ledger, "run-2"))
            keep("baseline_select", t.best_s)
            if attempt == 0:
                # Memory of a read pass (untimed): pagination keeps one page, the plain SELECT all rows.
                peaks["iter_items"], _ = traced_peak(partial(count_items, ledger, "run-2"))
                peaks["select"], _ = traced_peak(partial(baseline_select, ledger, "run-2", keep=True))
        finally:
            ledger.engine.dispose()

    floor = per_s(n, best["floor"])
    floor_label = f"{floor_name(ledger.engine)} into abp_items"
    note = f"best of {repeat}"
    subject_names = {
        "new": "upsert_items, all new",
        "already_in_run": "upsert_items again, same run (all already_in_run)",
        "unchanged": "upsert_items, new run, all unchanged (skip path)",
    }
    rows = [
        row(
            f"{label}, {n:,}: {subject_names[name]}",
            "rows/s",
            per_s(n, best[name]),
            floor,
            subject=f"Ledger.upsert_items ({n:,} items)",
            baseline_name=floor_label,
            note=note,
        )
        for name in ("new", "already_in_run", "unchanged")
    ]
    rows.append(
        row(
            f"{label}, {n:,}: iter_items (keyset pages of {BATCH:,})",
            "rows/s",
            per_s(n, best["iter_items"]),
            per_s(n, best["baseline_select"]),
            subject=f"Ledger.iter_items ({n:,} rows, all columns)",
            baseline_name="one plain SELECT ... ORDER BY key",
            note=note,
        )
    )
    rows.append(
        row(
            f"{label}, {n:,}: read the run's rows, peak memory",
            "MiB",
            peaks["iter_items"] / (1024 * 1024),
            peaks["select"] / (1024 * 1024),
            subject="Ledger.iter_items",
            baseline_name="the same SELECT fetched into a list",
            note="Python allocations only",
        )
    )
    return rows


def _sqlite_urls(folder: str) -> Callable[[], str]:
    """Return a function giving a new SQLite file URL in ``folder`` on each call."""
    counter = itertools.count()
    return lambda: f"sqlite:///{folder}/ledger-{next(counter)}.sqlite"


def run(size: str = "default", items: int | None = None) -> dict[str, Any]:
    """Run the ledger benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small`` or ``default``
    :param items: run this one item count instead of the size's (e.g. 100,000)
    """
    check_size(size)
    counts, repeat = SIZES[size]
    if items is not None:
        counts = (items,)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    pg, how = postgres_url()
    if pg is None:
        skipped.append({"case": "postgresql", "reason": f"skipped: {how}"})
    for n in counts:
        prepared = make_items(n)
        with tempfile.TemporaryDirectory(prefix="abp-bench-ledger-") as tmp:
            rows += bench_database("sqlite", _sqlite_urls(tmp), prepared, repeat)
        if pg is not None:
            rows += bench_database("postgresql", lambda: pg, prepared, repeat)
    return result(
        "ledger",
        size,
        {
            "items": list(counts),
            "repeat": repeat,
            "slice": BATCH,
            "sqlite": "file, WAL, synchronous=NORMAL",
            "postgresql": how,
        },
        rows,
        skipped,
        notes=[
            "ratio = ledger rows/s / the floor's rows/s on the same database (1.0 = as fast as the floor).",
            "The floor writes the same rows into the same table (abp_items) in one transaction: COPY on "
            "PostgreSQL, one prepared executemany on SQLite; it computes input_hash and request_json per "
            "row as the ledger does.",
            "Every figure is the best of the fresh runs; each run starts from empty tables.",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
