"""Night thirty: a ledger with N nights of history against one with a single night, and its size per night.

For one workload, :class:`History` writes N nights with bulk writes (the rows the stages would
leave: a run with its report, a reconciled job, an attempt per line sent, every item moved to the
run, its result): night 1 sends every item, each later night a few percent changed items, a few
of them failing into review. Then the same night N+1 runs through the ledger's real stages on a
ledger holding N nights and on one holding a single night, in the same process: prepare
(``upsert_items``, the skip-unchanged path), reconcile (``apply_results`` of the changed items'
lines), publish (``publish`` and the report's ``iter_cost_rows``) and the workload page's reads
(``plugins.api`` and ``plugins.review``: the runs list, the run's detail, the review page). ``ratio`` = night N+1's rate
on N nights / its rate on one night (goal: >= 0.8). The ledger's size after each night is
measured with and without a retention policy (``prune`` to the newest runs after each night).

Usage::

    python benchmarks/bench_history.py [--size tiny|small|default|large]
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    check_size,
    cli,
    floor_insert,
    mib,
    per_s,
    postgres_url,
    result,
    row,
)
from sqlalchemy import create_engine, func, select, text

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.retention import RetentionPolicy, prune
from airflow_batch_provider.ledger.store import PreparedItem

#: per size: (nights of history, items a night, repeats of the UI reads, runs of night N+1 on fresh copies)
SIZES: Final[dict[str, tuple[int, int, int, int]]] = {
    "tiny": (2, 200, 1, 1),
    "small": (5, 2_000, 3, 3),
    "default": (30, 5_000, 3, 5),
    "large": (20, 100_000, 5, 3),
}
WL: Final = "history"
CHANGED: Final = 0.03  # share of items whose input changes each night
FAILING: Final = 0.05  # share of the changed items that fail for good (review)
KEEP_RUNS: Final = 3  # the retention policy of the "with retention" size figures
DAGS: Final = frozenset({None})


def request(n: int, version: int) -> CanonicalRequest:
    """Item ``n``'s request at its ``version``-th input."""
    return CanonicalRequest(
        app_id=f"ticket-{n:07d}",
        prompt_version="v1",
        model="gpt-4o-mini",
        system="Label the customer's feedback: bug, praise, question, other.",
        messages=(
            {"role": "user", "content": f"Ticket {n}, revision {version}: the export button does nothing."},
        ),
        params={"max_tokens": 16, "temperature": 0},
    )


def cost(usage: Usage) -> Any:
    from decimal import Decimal

    return (Decimal(usage.input_tokens) + 4 * Decimal(usage.output_tokens)) / Decimal(1_000_000)


class History:
    """Nights of one workload written in bulk, the way its stages would have left them.

    :param ledger: an empty ledger
    :param items: items a night
    :param seed: the random draws of changed and failing items
    """

    def __init__(self, ledger: Ledger, items: int, seed: int = 7) -> None:
        self.ledger = ledger
        self.items = items
        self.random = random.Random(seed)
        self.version = [0] * items
        self.review: set[int] = set()
        self.nights = 0
        self.start = utcnow() - timedelta(days=400)

    def run_id(self, night: int) -> str:
        """The run id of a night."""
        return f"scheduled__night-{night:03d}"

    def changed_tonight(self) -> list[int]:
        """The items whose input changes on the next night (never one in review)."""
        if self.nights == 0:
            return list(range(self.items))
        pool = [n for n in range(self.items) if n not in self.review]
        return sorted(self.random.sample(pool, max(1, int(CHANGED * self.items))))

    def add_night(self) -> None:
        """Write one more night: its run, job, attempts, items and results."""
        night = self.nights + 1
        run_id = self.run_id(night)
        sent = self.changed_tonight()
        # night 1 fails only the items set in review before it (a baseline built to match another history)
        failing = set(self.random.sample(sent, int(FAILING * len(sent)))) if night > 1 else set(self.review)
        at = self.start + timedelta(days=night)
        engine = self.ledger.engine
        job_id = f"{WL}:{run_id}:r1:c00000"
        with engine.begin() as conn:
            conn.execute(
                s.runs.insert().values(
                    workload=WL,
                    run_id=run_id,
                    provider="openai",
                    model="gpt-4o-mini",
                    started_at=at,
                    finished_at=at + timedelta(hours=1),
                    report_json=json.dumps(
                        {"night": night, "items": self.items, "sent": len(sent), "cost": "1.0"}
                    ),
                )
            )
            conn.execute(
                s.jobs.insert().values(
                    job_id=job_id,
                    workload=WL,
                    run_id=run_id,
                    round=1,
                    chunk_index=0,
                    provider="openai",
                    model="gpt-4o-mini",
                    kind="chat",
                    idempotency_key=f"key-{job_id}",
                    state="reconciled",
                    staged_path=f"/staging/{job_id}.jsonl",
                    input_sha256="0" * 64,
                    lines=len(sent),
                    size_bytes=300 * len(sent),
                    batch_id=f"batch_{night}",
                    batch_state="completed",
                    result_lines=len(sent),
                    created_at=at,
                    reconciled_at=at,
                    claim_count=1,
                )
            )
        stamp = at.replace(tzinfo=None) if engine.dialect.name == "sqlite" else at
        attempts: list[tuple[Any, ...]] = []
        changed: list[dict[str, Any]] = []
        for n in sent:
            self.version[n] += 1
            req = request(n, self.version[n])
            key = item_key(req.app_id)
            cid = make_custom_id(key, 1, 0)
            bad = n in failing
            attempts.append(
                (job_id, cid, WL, key, "v1", run_id, 1, "batch", "failed_permanent" if bad else "succeeded",
                 False, "400" if bad else None, "bad input" if bad else None,
                 120, 0 if bad else 6, 0, 0, 144_000 if bad else 168_000, stamp, stamp)
            )  # fmt: skip
            changed.append(
                {
                    "b_key": key,
                    "app_id": req.app_id,
                    "input_hash": req.input_hash,
                    "request_json": json.dumps(req.to_dict()),
                    "state": "review" if bad else "succeeded",
                    "succeeded_hash": None if bad else req.input_hash,
                    "job_id": job_id,
                    "custom_id": cid,
                    "output_json": None if bad else json.dumps({"label": "bug"}),
                    "error_code": "400" if bad else None,
                }
            )
        floor_insert(
            engine,
            "abp_attempts",
            ["job_id", "custom_id", "workload", "item_key", "prompt_version", "run_id", "attempt", "mode",
             "outcome", "discarded", "error_code", "error_message", "input_tokens", "output_tokens",
             "cached_input_tokens", "cache_write_tokens", "cost_nusd", "created_at", "updated_at"],
            attempts,
        )  # fmt: skip
        self._items(night, run_id, stamp, changed)
        self.review |= failing
        self.nights = night

    def _items(self, night: int, run_id: str, stamp: Any, changed: list[dict[str, Any]]) -> None:
        i, r = s.items.c, s.published.c
        engine = self.ledger.engine
        if night == 1:
            floor_insert(
                engine,
                "abp_items",
                ["workload", "item_key", "prompt_version", "app_id", "model", "input_hash", "request_json",
                 "state", "attempts", "run_id", "job_id", "custom_id", "route", "output_json",
                 "succeeded_hash", "created_at", "updated_at"],
                [(WL, c["b_key"], "v1", c["app_id"], "gpt-4o-mini", c["input_hash"], c["request_json"],
                  c["state"], 1, run_id, c["job_id"], c["custom_id"], "batch", c["output_json"],
                  c["succeeded_hash"], stamp, stamp) for c in changed],
            )  # fmt: skip
            floor_insert(
                engine,
                "abp_results",
                [
                    "workload",
                    "item_key",
                    "prompt_version",
                    "app_id",
                    "run_id",
                    "state",
                    "output_json",
                    "published_at",
                ],
                [
                    (WL, c["b_key"], "v1", c["app_id"], run_id, c["state"], c["output_json"], stamp)
                    for c in changed
                ],
            )
            return
        from sqlalchemy import bindparam, case

        with engine.begin() as conn:
            # prepare moved every item to the run: unchanged (its success kept) or held in review
            conn.execute(
                s.items.update()
                .where(i.workload == WL)
                .values(
                    run_id=run_id,
                    state=case((i.state == "review", "review"), else_="unchanged"),
                    route=case((i.state == "review", "held"), else_="unchanged"),
                )
            )
            key = and_key = bindparam("b_key")
            conn.execute(
                s.items.update()
                .where(i.workload == WL, i.item_key == key, i.prompt_version == "v1")
                .values(
                    {
                        name: bindparam(name)
                        for name in (
                            "input_hash",
                            "request_json",
                            "state",
                            "succeeded_hash",
                            "job_id",
                            "custom_id",
                            "output_json",
                            "error_code",
                        )
                    }
                    | {"route": "batch", "attempts": 1, "updated_at": stamp}
                ),
                changed,
            )
            conn.execute(
                s.published.update()
                .where(r.workload == WL)
                .values(run_id=run_id, state=case((r.state == "review", "review"), else_="unchanged"))
            )
            conn.execute(
                s.published.update()
                .where(r.workload == WL, r.item_key == and_key, r.prompt_version == "v1")
                .values(state=bindparam("state"), output_json=bindparam("output_json")),
                changed,
            )


def tonight(history: History) -> list[PreparedItem]:
    """Night N+1's input: every item, the changed ones at their next version (nothing written yet)."""
    changed = set(history.changed_tonight())
    out = []
    for n in range(history.items):
        req = request(n, history.version[n] + (1 if n in changed else 0))
        out.append(PreparedItem(item_key(req.app_id), req))
    return out


def stage_and_answer(ledger: Ledger, run_id: str) -> dict[str, float]:
    """Stage the run's pending items in one job, submit it, apply a success per line (timed) and reconcile it.

    :return: ``lines`` applied and the ``seconds`` ``apply_results`` took
    """
    pending = list(ledger.iter_items(WL, run_id, states=["pending"], columns=["attempts"]))
    job_id = f"{WL}:{run_id}:r1:c00000"
    cids = {
        (r["item_key"], r["prompt_version"]): make_custom_id(r["item_key"], int(r["attempts"]) + 1, 0)
        for r in pending
    }
    ledger.record_job(
        {"job_id": job_id, "workload": WL, "run_id": run_id, "round": 1, "chunk_index": 0, "provider": "openai",
         "model": "gpt-4o-mini", "idempotency_key": f"key-{job_id}", "staged_path": "/staging/x.jsonl",
         "input_sha256": "0" * 64, "lines": len(cids), "size_bytes": 300 * len(cids)},
        [(key, version, cid, 1) for (key, version), cid in cids.items()],
    )  # fmt: skip
    ledger.mark_submitted(job_id, f"batch-{run_id}", f"file-{run_id}")
    lines = [
        ItemResult(cid, "succeeded", output={"label": "bug"}, usage=Usage(120, 6)) for cid in cids.values()
    ]
    t0 = time.perf_counter()
    ledger.apply_results(job_id, lines, cost)
    seconds = time.perf_counter() - t0
    ledger.update_job(job_id, state="reconciled", reconciled_at=utcnow())
    return {"lines": len(lines), "seconds": seconds}


def run_night(ledger: Ledger, run_id: str, items: list[PreparedItem], ui_repeat: int) -> dict[str, float]:
    """Night N+1 through the real stages; return each stage's rate (items, lines or page loads per second)."""
    from airflow_batch_provider.plugins import api, review

    ledger.start_run(WL, run_id, "openai", "gpt-4o-mini")
    t0 = time.perf_counter()
    stats = ledger.upsert_items(WL, run_id, items)
    prepare_s = time.perf_counter() - t0
    reconciled = stage_and_answer(ledger, run_id)
    reconcile_s = reconciled["seconds"]
    t0 = time.perf_counter()
    published = ledger.publish(WL, run_id)
    costed = sum(1 for _ in ledger.iter_cost_rows(WL, run_id))
    publish_s = time.perf_counter() - t0
    ledger.finish_run(WL, run_id, {"night": "tonight"})
    t0 = time.perf_counter()
    for _ in range(ui_repeat):
        api.list_runs(ledger, WL, 20, DAGS)
        found = api.find_run(ledger, WL, run_id)
        assert found is not None
        api.run_detail(ledger, found)
        review.review_page(ledger, WL, None)
    ui_s = time.perf_counter() - t0
    assert stats.new == 0 and published == costed == len(items), (stats, published, costed)
    return {
        "prepare": per_s(len(items), prepare_s),
        "reconcile": per_s(int(reconciled["lines"]), reconcile_s),
        "publish": per_s(published, publish_s),
        "ui": per_s(ui_repeat, ui_s),
    }


def size_bytes(ledger: Ledger) -> int:
    """The bytes the ledger's tables hold: SQLite's used pages (free pages left out), PostgreSQL's relations."""
    with ledger.engine.connect() as conn:
        if ledger.engine.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            return int((pages - free) * size)
        return int(
            conn.execute(
                text(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "WHERE c.relkind = 'r' AND c.relname LIKE 'abp_%'"
                )
            ).scalar_one()
        )


def vacuum(ledger: Ledger) -> None:
    """What autovacuum does after the prune's deletes on PostgreSQL (space reusable, statistics fresh).

    SQLite is left without statistics, as the ledger leaves it (nothing runs ``ANALYZE`` there).
    """
    if ledger.engine.dialect.name == "postgresql":
        with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE) abp_attempts, abp_jobs, abp_items, abp_results, abp_runs"))


def attempts_rows(ledger: Ledger) -> int:
    """Rows of ``abp_attempts`` (the table that grows every night)."""
    with ledger.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(s.attempts)).scalar_one())


class Databases:
    """Fresh ledgers' database URLs for one dialect, and copies of a built one.

    PostgreSQL's are created on the server (a copy is ``CREATE DATABASE ... TEMPLATE``) and dropped
    by :meth:`close`; SQLite's are files in ``folder`` (a copy is the file, checkpointed first).
    """

    def __init__(self, dialect: str, folder: str, pg: str | None) -> None:
        self.dialect, self.folder = dialect, folder
        self.made: list[str] = []
        self.admin = (
            create_engine(pg, isolation_level="AUTOCOMMIT") if dialect == "postgresql" and pg else None
        )
        self.base = pg.rsplit("/", 1)[0] if pg else ""

    def url(self, name: str) -> str:
        """A new, empty database's URL."""
        return self._create(name, None)

    def copy(self, url: str, name: str) -> str:
        """A new database holding what ``url``'s holds (nothing may be connected to it)."""
        return self._create(name, url)

    def _create(self, name: str, template: str | None) -> str:
        if self.admin is None:
            path = Path(self.folder) / f"{name}-{uuid.uuid4().hex[:8]}.sqlite"
            if template is not None:
                shutil.copyfile(template.removeprefix("sqlite:///"), path)
            return f"sqlite:///{path}"
        db = f"abp_hist_{name}_{uuid.uuid4().hex[:8]}"
        source = f' TEMPLATE "{template.rsplit("/", 1)[1]}"' if template is not None else ""
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{db}"{source}'))
        self.made.append(db)
        return f"{self.base}/{db}"

    def close(self) -> None:
        """Drop the PostgreSQL databases made."""
        if self.admin is None:
            return
        with self.admin.connect() as conn:
            for db in self.made:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        self.admin.dispose()


@contextmanager
def databases(dialect: str, folder: str, pg: str | None) -> Iterator[Databases]:
    """:class:`Databases` for ``dialect``, its PostgreSQL databases dropped after."""
    made = Databases(dialect, folder, pg)
    try:
        yield made
    finally:
        made.close()


def settle(ledger: Ledger) -> None:
    """Checkpoint SQLite's WAL into the file and close every connection, so the database can be copied."""
    if ledger.engine.dialect.name == "sqlite":
        with ledger.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    ledger.engine.dispose()


def night_on_copies(
    dbs: Databases, urls: dict[str, str], items: list[PreparedItem], ui_repeat: int, trials: int
) -> dict[str, dict[str, float]]:
    """Night N+1 on ``trials`` fresh copies of each built ledger, the order alternating; each stage's median rate.

    One timing of a stage is tens of milliseconds at these sizes, and a neighbour's burst moves it by
    a factor of two: the copies let the same night run several times on the same history, and the
    alternation gives neither ledger the warmer cache.
    """
    rates: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
    for trial in range(trials):
        order = list(urls) if trial % 2 == 0 else list(reversed(urls))
        for name in order:
            ledger = Ledger.from_url(dbs.copy(urls[name], f"{name}{trial}"))
            try:
                vacuum(ledger)
                rates[name].append(run_night(ledger, "scheduled__tonight", items, ui_repeat))
            finally:
                ledger.engine.dispose()
    return {
        name: {stage: statistics.median(r[stage] for r in got) for stage in got[0]}
        for name, got in rates.items()
    }


def bench_database(
    dialect: str, dbs: Databases, nights: int, items: int, ui_repeat: int, trials: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Night N+1 on N nights against one night, and the sizes per night, on one database."""
    urls = {name: dbs.url(name) for name in ("one", "many", "kept")}
    ledgers = {name: Ledger.from_url(url) for name, url in urls.items()}
    try:
        one, many, kept = (History(ledgers[n], items) for n in ("one", "many", "kept"))
        sizes: list[dict[str, Any]] = []
        for _ in range(nights):
            many.add_night()
            kept.add_night()
            prune(ledgers["kept"], WL, RetentionPolicy(keep_runs=KEEP_RUNS))
            vacuum(ledgers["many"])
            vacuum(ledgers["kept"])
            sizes.append(
                {
                    "database": dialect,
                    "night": many.nights,
                    "mib": round(mib(size_bytes(ledgers["many"])), 2),
                    "mib_retained": round(mib(size_bytes(ledgers["kept"])), 2),
                    "attempts": attempts_rows(ledgers["many"]),
                    "attempts_retained": attempts_rows(ledgers["kept"]),
                }
            )
        # the baseline: one night that leaves every item as the N nights left it (inputs, review)
        one.version, one.review = [v - 1 for v in many.version], set(many.review)
        one.add_night()
        items_tonight = tonight(many)
    finally:
        for ledger in ledgers.values():
            settle(ledger)
    got = night_on_copies(dbs, {"one": urls["one"], "many": urls["many"]}, items_tonight, ui_repeat, trials)
    base, subject = got["one"], got["many"]
    metric = {"prepare": "items/s", "reconcile": "lines/s", "publish": "items/s", "ui": "page sets/s"}
    rows = [
        row(
            f"{dialect}, {items:,} items: {stage} on night {nights + 1} vs night 2",
            metric[stage],
            subject[stage],
            base[stage],
            subject=f"{nights} nights of history",
            baseline_name="1 night of history",
            note=f"median of {trials} runs of the night on fresh copies, the order alternating",
        )
        for stage in ("prepare", "reconcile", "publish", "ui")
    ]
    return rows, sizes


def run(size: str = "default", items: int | None = None) -> dict[str, Any]:
    """Run the history benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small``, ``default`` or ``large``
    :param items: items a night instead of the size's
    """
    check_size(size)
    nights, count, ui_repeat, trials = SIZES[size]
    if items is not None:
        count = items
    rows: list[dict[str, Any]] = []
    sizes: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    pg, how = postgres_url()
    dialects = ["sqlite"] + (["postgresql"] if pg is not None else [])
    if pg is None:
        skipped.append({"case": "postgresql", "reason": f"skipped: {how}"})
    with tempfile.TemporaryDirectory(prefix="abp-bench-history-") as tmp:
        for dialect in dialects:
            with databases(dialect, tmp, pg) as dbs:
                got, per_night = bench_database(dialect, dbs, nights, count, ui_repeat, trials)
            rows += got
            sizes += per_night
    return {
        **result(
            "history",
            size,
            {
                "nights": nights,
                "items": count,
                "changed_share": CHANGED,
                "failing_share_of_changed": FAILING,
                "keep_runs": KEEP_RUNS,
                "trials": trials,
                "postgresql": how,
            },
            rows,
            skipped,
            notes=[
                "ratio = the stage's rate on night N+1 of a ledger holding N nights / its rate on the same "
                "night of a ledger holding one night (goal >= 0.8); both in the same process, each the median of "
                f"{trials} runs of that night on fresh copies of the two ledgers, the order alternating.",
                "prepare: upsert_items of every item (3% changed); reconcile: apply_results of the changed "
                "items' lines; publish: publish and iter_cost_rows; ui: the runs list, the run's detail and "
                "the review page (plugins.api, plugins.review).",
                f"sizes: the ledger's tables after each night, without retention and with keep_runs={KEEP_RUNS} "
                "(prune after each night; PostgreSQL vacuumed after, as autovacuum would).",
            ],
        ),
        "sizes": sizes,
    }


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
