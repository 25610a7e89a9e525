"""How fast does a downloaded job reconcile into the ledger, next to the least work that could?

Two measurements:

1. :meth:`Ledger.apply_results` for one job of N lines (results built beforehand as
   :class:`ItemResult` with usage: 94% succeeded, 4% retryable, 2% permanent failures), on SQLite
   (file, WAL) and on PostgreSQL when one can be found. Two baselines: the database's write floor
   (the same lines' attempt columns, priced the same way, written in one transaction into an
   attempts-shaped table: psycopg2 ``COPY`` on PostgreSQL, one prepared ``executemany`` on
   SQLite), an executemany UPDATE of the job's attempt rows by primary key with the same
   outcome, usage and cost, a commit per 1,000 rows, and the **in-place write floor**: the same lines
   decided beforehand (outcome -> state), staged the same way in a temporary table and applied with
   one ``UPDATE ... FROM`` of the attempts and one of the items, in one transaction. Also the rerun (a cleared reconcile task: same results
   again, nothing changes), against the same floor.
2. :meth:`OpenAIBatchAdapter.parse_results` over a generated OpenAI batch output file of N lines
   (the documented line shapes, 2% error lines) against ``json.loads`` per line and nothing else.

Peak traced memory is reported for both (Python allocations only).

Usage: ``python benchmarks/bench_reconcile.py [--size tiny|small|default] [--items N]``
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ledger import WORKLOAD, fresh_ledger, make_items
from common import (
    check_size,
    cli,
    floor_insert,
    floor_name,
    mib,
    per_s,
    postgres_url,
    result,
    row,
    timed,
    traced_peak,
)
from sqlalchemy import Column, MetaData, Table, and_, bindparam

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import make_custom_id
from airflow_batch_provider.core.money import to_nusd
from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import APPLY_SLICE, BATCH

#: size -> (job lines, timing repeats)
SIZES: dict[str, tuple[int, int]] = {
    "tiny": (300, 1),
    "small": (5_000, 1),
    "default": (10_000, 1),
}
RUN_ID = "run-1"
JOB_ID = "bench:run-1:r0:c00000"
MODEL = "gpt-4o-mini"


def pricer() -> Callable[[Usage], Decimal]:
    """Price one batch line of the benchmark's model, as the reconcile operator does."""
    price = PriceTable.load(None).price("openai", MODEL)
    return lambda usage: cost(usage, price, "batch")


def make_results(n: int) -> list[ItemResult]:
    """N results for the job's custom ids, with usage, in a shuffled order (as providers send them).

    :param n: lines
    """
    rnd = random.Random(11)
    out = []
    for i in range(n):
        cid = make_custom_id(f"c{i:09d}", 1, 0)
        usage = Usage(
            input_tokens=rnd.randint(40, 400), output_tokens=rnd.randint(1, 8), cached_input_tokens=1024
        )
        roll = rnd.random()
        if roll < 0.94:
            out.append(
                ItemResult(
                    cid, "succeeded", output=rnd.choice(["positive", "negative", "neutral"]), usage=usage
                )
            )
        elif roll < 0.98:
            out.append(
                ItemResult(
                    cid, "failed_retryable", usage=usage, error_code="server_error", error_message="retry"
                )
            )
        else:
            out.append(ItemResult(cid, "failed_permanent", error_code="invalid_request", error_message="bad"))
    rnd.shuffle(out)
    return out


_bare_meta = MetaData()
BARE_ATTEMPTS = Table("bench_bare_attempts", _bare_meta, *[Column(c.name, c.type) for c in s.attempts.c])
JOB: dict[str, Any] = {
    "job_id": JOB_ID,
    "workload": WORKLOAD,
    "run_id": RUN_ID,
    "round": 0,
    "chunk_index": 0,
    "provider": "openai",
    "model": MODEL,
    "idempotency_key": "abp-bench",
    "staged_path": "/dev/null",
    "input_sha256": "0" * 64,
    "lines": 0,
    "size_bytes": 0,
}

Placement = tuple[str, str, str, int]


def placements(n: int) -> list[Placement]:
    """(item key, prompt version, custom id, attempt) of each line of the job.

    :param n: lines
    """
    return [(f"c{i:09d}", "bench-v1", make_custom_id(f"c{i:09d}", 1, 0), 1) for i in range(n)]


def baseline_stage(ledger: Ledger, placed: list[Placement]) -> int:
    """The floor for staging: executemany INSERT of the attempt rows into a bare table, then
    executemany UPDATE of the items by primary key, a commit per 1,000.

    :param ledger: gives the engine
    :param placed: the job's lines
    """
    i = s.items.c
    update = (
        s.items.update()
        .where(
            and_(
                i.workload == WORKLOAD,
                i.item_key == bindparam("b_key"),
                i.prompt_version == bindparam("b_ver"),
            )
        )
        .values(
            state="staged",
            job_id=JOB_ID,
            custom_id=bindparam("b_cid"),
            attempts=bindparam("b_att"),
            updated_at=bindparam("b_now"),
        )
    )
    for start in range(0, len(placed), BATCH):
        now = utcnow()
        part = placed[start : start + BATCH]
        with ledger.engine.begin() as conn:
            conn.execute(
                BARE_ATTEMPTS.insert(),
                [
                    {
                        "job_id": JOB_ID,
                        "custom_id": cid,
                        "workload": WORKLOAD,
                        "item_key": key,
                        "prompt_version": ver,
                        "run_id": RUN_ID,
                        "attempt": att,
                        "mode": "batch",
                        "discarded": False,
                        "input_tokens": 0,
                        "output_tokens": 0,
                        "cached_input_tokens": 0,
                        "cache_write_tokens": 0,
                        "cost_nusd": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for key, ver, cid, att in part
                ],
            )
            conn.execute(
                update,
                [
                    {"b_key": key, "b_ver": ver, "b_cid": cid, "b_att": att, "b_now": now}
                    for key, ver, cid, att in part
                ],
            )
    return len(placed)


def unstage(ledger: Ledger) -> None:
    """Untimed: items back to pending, as upsert_items left them."""
    with ledger.engine.begin() as conn:
        conn.execute(s.items.update().values(state="pending", job_id=None, custom_id=None, attempts=0))


def setup_job(ledger: Ledger, n: int) -> tuple[float, float]:
    """N items upserted, staged in one job and submitted; staging is timed against its floor.

    :param ledger: an empty ledger
    :param n: lines
    :return: seconds of (record_job, the staging floor)
    """
    ledger.upsert_items(WORKLOAD, RUN_ID, make_items(n))
    placed = placements(n)
    _bare_meta.drop_all(ledger.engine)
    _bare_meta.create_all(ledger.engine)
    t_floor = timed(partial(baseline_stage, ledger, placed))
    unstage(ledger)
    t_stage = timed(partial(ledger.record_job, {**JOB, "lines": n}, placed))
    ledger.mark_submitted(JOB_ID, "batch_bench", "file-bench")
    return t_stage.best_s, t_floor.best_s


def reset_job(ledger: Ledger) -> None:
    """Untimed: bring the job back to 'submitted, no result seen'."""
    with ledger.engine.begin() as conn:
        conn.execute(
            s.attempts.update()
            .where(s.attempts.c.job_id == JOB_ID)
            .values(
                outcome=None,
                discarded=False,
                error_code=None,
                error_message=None,
                input_tokens=0,
                output_tokens=0,
                cached_input_tokens=0,
                cache_write_tokens=0,
                cost_nusd=0,
            )
        )
        conn.execute(
            s.items.update()
            .where(s.items.c.job_id == JOB_ID)
            .values(
                state="submitted",
                output_json=None,
                succeeded_hash=None,
                route=None,
                error_code=None,
                error_message=None,
            )
        )


def baseline_update(ledger: Ledger, results: list[ItemResult], cost_of: Callable[[Usage], Decimal]) -> int:
    """The floor: executemany UPDATE of the attempt rows by primary key, a commit per 1,000.

    :param ledger: gives the engine
    :param results: the results
    :param cost_of: prices one line
    """
    a = s.attempts.c
    stmt = (
        s.attempts.update()
        .where(and_(a.job_id == bindparam("b_job"), a.custom_id == bindparam("b_cid")))
        .values(
            outcome=bindparam("b_outcome"),
            error_code=bindparam("b_code"),
            error_message=bindparam("b_msg"),
            input_tokens=bindparam("b_in"),
            output_tokens=bindparam("b_out"),
            cached_input_tokens=bindparam("b_cached"),
            cache_write_tokens=bindparam("b_write"),
            cost_nusd=bindparam("b_cost"),
            updated_at=bindparam("b_now"),
        )
    )
    for start in range(0, len(results), BATCH):
        now = utcnow()
        params = [
            {
                "b_job": JOB_ID,
                "b_cid": r.custom_id,
                "b_outcome": r.outcome,
                "b_code": r.error_code,
                "b_msg": r.error_message,
                "b_in": r.usage.input_tokens,
                "b_out": r.usage.output_tokens,
                "b_cached": r.usage.cached_input_tokens,
                "b_write": r.usage.cache_write_tokens,
                "b_cost": to_nusd(cost_of(r.usage)),
                "b_now": now,
            }
            for r in results[start : start + BATCH]
        ]
        with ledger.engine.begin() as conn:
            conn.execute(stmt, params)
    return len(results)


RESULT_COLUMNS = [
    "job_id",
    "custom_id",
    "outcome",
    "discarded",
    "error_code",
    "error_message",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "cost_nusd",
    "updated_at",
]


def floor_results(ledger: Ledger, results: list[ItemResult], cost_of: Callable[[Usage], Decimal]) -> int:
    """The database's floor for the same lines: each result's attempt columns (priced the same
    way) written into an attempts-shaped table in one transaction, COPY on PostgreSQL, one prepared
    executemany on SQLite (see :func:`common.floor_insert`).

    :param ledger: gives the engine
    :param results: the results
    :param cost_of: prices one line
    """
    now = utcnow()
    stamp = now if ledger.engine.dialect.name == "postgresql" else now.strftime("%Y-%m-%d %H:%M:%S.%f")
    rows = [
        (
            JOB_ID,
            r.custom_id,
            r.outcome,
            r.outcome == "invalid_output",
            r.error_code,
            r.error_message,
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cached_input_tokens,
            r.usage.cache_write_tokens,
            to_nusd(cost_of(r.usage)),
            stamp,
        )
        for r in results
    ]
    return floor_insert(ledger.engine, BARE_ATTEMPTS.name, RESULT_COLUMNS, rows)


FLOOR_STAGE_COLUMNS = [
    "job_id",
    "custom_id",
    "item_key",
    "outcome",
    "error_code",
    "error_message",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "cost_nusd",
    "state",
    "output_json",
]


def floor_in_place(ledger: Ledger, results: list[ItemResult], cost_of: Callable[[Usage], Decimal]) -> int:
    """The database's floor for what reconcile must write: the same lines, decided beforehand in
    the plainest way (outcome -> state), staged in one temporary table (COPY on PostgreSQL, one
    prepared executemany on SQLite) and applied with one ``UPDATE ... FROM`` of the attempts and
    one of the items, in one transaction. No reading, no rules, no guard, no counting.

    :param ledger: gives the engine
    :param results: the results
    :param cost_of: prices one line
    """
    import io

    from airflow_batch_provider.core.custom_ids import parse_custom_id
    from airflow_batch_provider.ledger.result_rules import OUTCOME_STATE as _OUTCOME_STATE

    now = utcnow()
    pg = ledger.engine.dialect.name == "postgresql"
    stamp = now if pg else now.strftime("%Y-%m-%d %H:%M:%S.%f")
    rows = [
        (
            JOB_ID,
            r.custom_id,
            parse_custom_id(r.custom_id).key,
            r.outcome,
            r.error_code,
            r.error_message,
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cached_input_tokens,
            r.usage.cache_write_tokens,
            to_nusd(cost_of(r.usage)),
            _OUTCOME_STATE[r.outcome],
            json.dumps(r.output) if r.outcome == "succeeded" else None,
        )
        for r in results
    ]
    names = ", ".join(FLOOR_STAGE_COLUMNS)
    with ledger.engine.begin() as conn:
        cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute(
                "CREATE TEMPORARY TABLE IF NOT EXISTS bench_floor_stage (job_id TEXT, custom_id TEXT, "
                "item_key TEXT, outcome TEXT, error_code TEXT, error_message TEXT, input_tokens BIGINT, "
                "output_tokens BIGINT, cached_input_tokens BIGINT, cache_write_tokens BIGINT, "
                "cost_nusd BIGINT, state TEXT, output_json TEXT)"
            )
            cur.execute("DELETE FROM bench_floor_stage")
            if pg:
                buf = io.StringIO()
                buf.writelines("\t".join("\\N" if v is None else str(v) for v in row) + "\n" for row in rows)
                buf.seek(0)
                cur.copy_expert(f"COPY bench_floor_stage ({names}) FROM STDIN", buf)
                cur.execute("ANALYZE bench_floor_stage")
                mark = "%s"
            else:
                marks = ", ".join("?" for _ in FLOOR_STAGE_COLUMNS)
                cur.executemany(f"INSERT INTO bench_floor_stage ({names}) VALUES ({marks})", rows)
                mark = "?"
            t = "bench_floor_stage"
            cur.execute(
                f"UPDATE abp_attempts SET outcome = {t}.outcome, error_code = {t}.error_code, "
                f"error_message = {t}.error_message, input_tokens = {t}.input_tokens, "
                f"output_tokens = {t}.output_tokens, cached_input_tokens = {t}.cached_input_tokens, "
                f"cache_write_tokens = {t}.cache_write_tokens, cost_nusd = {t}.cost_nusd, "
                f"updated_at = {mark} FROM {t} "
                f"WHERE abp_attempts.job_id = {t}.job_id AND abp_attempts.custom_id = {t}.custom_id",
                (stamp,),
            )
            cur.execute(
                f"UPDATE abp_items SET state = {t}.state, output_json = {t}.output_json, "
                f"error_code = {t}.error_code, error_message = {t}.error_message, updated_at = {mark} "
                f"FROM {t} WHERE abp_items.workload = {mark} AND abp_items.item_key = {t}.item_key "
                f"AND abp_items.prompt_version = 'bench-v1'",
                (stamp, WORKLOAD),
            )
        finally:
            cur.close()
    return len(rows)


def empty_bare(ledger: Ledger) -> None:
    """Untimed: the bare attempts table empty again."""
    with ledger.engine.begin() as conn:
        conn.execute(BARE_ATTEMPTS.delete())


def _apply(ledger: Ledger, results: list[ItemResult], cost_of: Callable[[Usage], Decimal], n: int) -> Any:
    stats = ledger.apply_results(JOB_ID, iter(results), cost_of)
    if stats.applied != n or stats.unknown or stats.duplicates:
        raise RuntimeError(f"benchmark setup is wrong: {n} results, the ledger said {stats}")
    return stats


def bench_database(label: str, url: str, n: int, repeat: int) -> list[dict[str, Any]]:
    """apply_results, its rerun and the floor on one database.

    :param label: ``sqlite`` or ``postgresql``
    :param url: an empty (or emptied) database
    :param n: job lines
    :param repeat: runs of each timed piece
    """
    ledger = fresh_ledger(url)
    cost_of = pricer()
    results = make_results(n)
    try:
        stage_s, stage_floor_s = setup_job(ledger, n)
        t_base = timed(
            lambda: baseline_update(ledger, results, cost_of), repeat, setup=lambda: reset_job(ledger)
        )
        t_floor = timed(
            lambda: floor_results(ledger, results, cost_of), repeat, setup=lambda: empty_bare(ledger)
        )
        empty_bare(ledger)
        t_in_place = timed(
            lambda: floor_in_place(ledger, results, cost_of), repeat, setup=lambda: reset_job(ledger)
        )
        t_apply = timed(lambda: _apply(ledger, results, cost_of, n), repeat, setup=lambda: reset_job(ledger))
        t_rerun = timed(lambda: _apply(ledger, results, cost_of, n), repeat)
        reset_job(ledger)
        peak, _ = traced_peak(lambda: _apply(ledger, results, cost_of, n))
        reset_job(ledger)
        base_peak, _ = traced_peak(lambda: baseline_update(ledger, results, cost_of))
    finally:
        ledger.engine.dispose()
    floor = per_s(n, t_base.best_s)
    copy_floor = per_s(n, t_floor.best_s)
    copy_name = f"{floor_name(ledger.engine)} of the lines into an attempts-shaped table"
    note = f"best of {repeat}"
    return [
        row(
            f"{label}: record_job, stage one job of {n:,} lines",
            "lines/s",
            per_s(n, stage_s),
            per_s(n, stage_floor_s),
            subject="Ledger.record_job",
            baseline_name="executemany INSERT attempts + UPDATE items by key",
            note="one run (the prepare step's ledger write per chunk)",
        ),
        row(
            f"{label}: apply_results, one job of {n:,} lines",
            "lines/s",
            per_s(n, t_apply.best_s),
            floor,
            subject="Ledger.apply_results",
            baseline_name="executemany UPDATE attempts by primary key",
            note=note,
        ),
        row(
            f"{label}: apply_results against the database's write floor",
            "lines/s",
            per_s(n, t_apply.best_s),
            copy_floor,
            subject="Ledger.apply_results",
            baseline_name=copy_name,
            note=note,
        ),
        row(
            f"{label}: apply_results against the in-place write floor",
            "lines/s",
            per_s(n, t_apply.best_s),
            per_s(n, t_in_place.best_s),
            subject="Ledger.apply_results",
            baseline_name=(
                f"{floor_name(ledger.engine)} of the decided lines into a temporary table, then one "
                "UPDATE ... FROM of the attempts and one of the items"
            ),
            note=note,
        ),
        row(
            f"{label}: apply_results rerun (nothing changes)",
            "lines/s",
            per_s(n, t_rerun.best_s),
            floor,
            subject="Ledger.apply_results",
            baseline_name="executemany UPDATE attempts by primary key",
            note=note,
        ),
        row(
            f"{label}: apply_results, peak memory",
            "MiB",
            mib(peak),
            mib(base_peak),
            subject="Ledger.apply_results",
            baseline_name="executemany UPDATE attempts by primary key",
            note="results list built beforehand (not counted); Python allocations only",
        ),
    ]


def write_output_file(path: Path, n: int) -> int:
    """An OpenAI batch output file of N lines (documented shapes; 2% error lines).

    :param path: where to write it
    :param n: lines
    """
    rnd = random.Random(5)
    size = 0
    with path.open("wb") as fh:
        for i in range(n):
            cid = make_custom_id(f"c{i:09d}", 1, 0)
            if rnd.random() < 0.98:
                prompt = rnd.randint(1100, 1500)
                response: dict[str, Any] = {
                    "status_code": 200,
                    "request_id": f"req_{i:08x}",
                    "body": {
                        "id": f"chatcmpl-{i:08x}",
                        "object": "chat.completion",
                        "created": 1_750_000_000,
                        "model": MODEL,
                        "choices": [
                            {
                                "index": 0,
                                "message": {
                                    "role": "assistant",
                                    "content": rnd.choice(["positive", "negative", "neutral"]),
                                },
                                "logprobs": None,
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": 2,
                            "total_tokens": prompt + 2,
                            "prompt_tokens_details": {"cached_tokens": 1024},
                        },
                    },
                }
            else:
                response = {
                    "status_code": 500,
                    "request_id": f"req_{i:08x}",
                    "body": {
                        "error": {
                            "message": "The server had an error",
                            "type": "server_error",
                            "code": "server_error",
                        }
                    },
                }
            line = {"id": f"batch_req_{i:08x}", "custom_id": cid, "response": response, "error": None}
            data = json.dumps(line, separators=(",", ":")).encode() + b"\n"
            fh.write(data)
            size += len(data)
    return size


def parse_subject(path: Path) -> int:
    """The subject: the adapter's streaming parser, every result consumed.

    :param path: the output file
    """
    adapter = OpenAIBatchAdapter(AdapterSettings())
    with path.open("rb") as fh:
        return sum(1 for _ in adapter.parse_results(fh))


def parse_baseline(path: Path) -> int:
    """The floor: json.loads per line, nothing else.

    :param path: the output file
    """
    with path.open("rb") as fh:
        return sum(1 for line in fh if json.loads(line) is not None)


def run(size: str = "default", items: int | None = None) -> dict[str, Any]:
    """Run the reconcile benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small`` or ``default``
    :param items: job lines instead of the size's (e.g. 100,000)
    """
    check_size(size)
    n, repeat = SIZES[size]
    if items is not None:
        n = items
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="abp-bench-reconcile-") as tmp:
        out = Path(tmp) / "output.jsonl"
        nbytes = write_output_file(out, n)
        t_parse = timed(lambda: parse_subject(out), max(repeat, 3))
        t_loads = timed(lambda: parse_baseline(out), max(repeat, 3))
        if t_parse.last != n or t_loads.last != n:
            raise RuntimeError(f"parsed {t_parse.last} / {t_loads.last} lines, expected {n}")
        p_peak, _ = traced_peak(lambda: parse_subject(out))
        l_peak, _ = traced_peak(lambda: parse_baseline(out))
        rows.append(
            row(
                f"parse an OpenAI output file of {n:,} lines",
                "lines/s",
                per_s(n, t_parse.best_s),
                per_s(n, t_loads.best_s),
                subject="OpenAIBatchAdapter.parse_results",
                baseline_name="json.loads per line",
                note=f"{mib(nbytes):.1f} MiB file; best of {max(repeat, 3)}",
            )
        )
        rows.append(
            row(
                "parse, peak memory",
                "MiB",
                mib(p_peak),
                mib(l_peak),
                subject="OpenAIBatchAdapter.parse_results",
                baseline_name="json.loads per line",
                note="both stream: a few lines in memory at a time",
            )
        )
        rows += bench_database("sqlite", f"sqlite:///{tmp}/ledger.sqlite", n, repeat)
    pg, how = postgres_url()
    if pg is None:
        skipped.append({"case": "postgresql", "reason": f"skipped: {how}"})
    else:
        rows += bench_database("postgresql", pg, n, repeat)
    return result(
        "reconcile",
        size,
        {"lines": n, "repeat": repeat, "slice": APPLY_SLICE, "model": MODEL, "postgresql": how},
        rows,
        skipped,
        notes=[
            "ratio = subject lines/s / baseline lines/s on the same database or file (1.0 = as fast as the floor).",
            "Between timed runs the job is reset (untimed) to 'submitted, no result seen'.",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
