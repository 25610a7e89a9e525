"""What the ledger's room tests share: the workload, prepared items, result lines and a few readers.

The tests of :mod:`airflow_batch_provider.ledger.store` were one module before the ledger was split
into rooms; each room's tests now live in the room's test module and build on these helpers.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import (
    JobClaimedError,
    WorkloadLeasedError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import PreparedItem

WL = "feedback"
SOME_USAGE = Usage(100, 10)
NO_USAGE = Usage()


def cost_of(usage: Usage) -> Decimal:
    """$1 per million input tokens, $2 per million output tokens."""
    return (Decimal(usage.input_tokens) + 2 * Decimal(usage.output_tokens)) / Decimal(1_000_000)


def prep(app_id: str, text: str = "hello", version: str = "v1", model: str = "gpt-4o-mini") -> PreparedItem:
    return PreparedItem(
        item_key(app_id),
        CanonicalRequest(
            app_id=app_id,
            prompt_version=version,
            model=model,
            system="label it",
            messages=({"role": "user", "content": text},),
            params={"max_tokens": 10},
        ),
    )


def ok(custom_id: str, output: Any = None, usage: Usage = SOME_USAGE) -> ItemResult:
    return ItemResult(
        custom_id, "succeeded", output=output if output is not None else {"label": custom_id}, usage=usage
    )


def fail(custom_id: str, outcome: str = "failed_retryable", usage: Usage = NO_USAGE) -> ItemResult:
    return ItemResult(custom_id, outcome, usage=usage, error_code="500", error_message="server error")  # type: ignore[arg-type]


def item(ledger: Ledger, app_id: str, version: str = "v1") -> dict[str, Any]:
    with ledger.engine.connect() as conn:
        row = (
            conn.execute(
                select(s.items).where(
                    s.items.c.workload == WL,
                    s.items.c.item_key == item_key(app_id),
                    s.items.c.prompt_version == version,
                )
            )
            .mappings()
            .one()
        )
    return dict(row)


def attempts_of(ledger: Ledger, app_id: str) -> list[dict[str, Any]]:
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(s.attempts).where(s.attempts.c.item_key == item_key(app_id)).order_by(s.attempts.c.attempt)
        ).mappings()
        return [dict(r) for r in rows]


def snapshot(ledger: Ledger) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, in primary-key order."""
    out: dict[str, list[dict[str, Any]]] = {}
    with ledger.engine.connect() as conn:
        for table in s.metadata.sorted_tables:
            rows = conn.execute(select(table).order_by(*table.primary_key.columns)).mappings()
            out[table.name] = [dict(r) for r in rows]
    return out


def stage(
    ledger: Ledger,
    run_id: str,
    app_ids: Sequence[str],
    round_: int = 1,
    chunk: int = 0,
    version: str = "v1",
) -> tuple[str, dict[str, str]]:
    """Record one job for ``app_ids`` the way the prepare and resubmit tasks do; return its id and custom ids."""
    job_id = f"{WL}:{run_id}:r{round_}:c{chunk:05d}"
    cids: dict[str, str] = {}
    placements = []
    for app_id in app_ids:
        attempt = int(item(ledger, app_id, version)["attempts"]) + 1
        cid = make_custom_id(item_key(app_id), attempt, chunk)
        cids[app_id] = cid
        placements.append((item_key(app_id), version, cid, attempt))
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": WL,
            "run_id": run_id,
            "round": round_,
            "chunk_index": chunk,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "idempotency_key": f"key-{job_id}",
            "staged_path": f"/staging/{job_id}.jsonl",
            "input_sha256": "0" * 64,
            "lines": len(placements),
            "size_bytes": 100 * len(placements),
        },
        placements,
    )
    return job_id, cids


def submit(
    ledger: Ledger, run_id: str, app_ids: Sequence[str], round_: int = 1, chunk: int = 0
) -> tuple[str, dict[str, str]]:
    job_id, cids = stage(ledger, run_id, app_ids, round_, chunk)
    ledger.mark_submitted(job_id, f"batch_{round_}_{chunk}", f"file-{round_}-{chunk}")
    return job_id, cids


def first_run_all_succeeded(ledger: Ledger, app_ids: Iterable[str], run_id: str = "r1") -> dict[str, str]:
    ids = list(app_ids)
    ledger.upsert_items(WL, run_id, [prep(a) for a in ids])
    job_id, cids = submit(ledger, run_id, ids)
    ledger.apply_results(job_id, [ok(cids[a], {"label": a}) for a in ids], cost_of)
    return cids


def staged_job(ledger: Ledger, app_ids: Sequence[str] = ("a",), run_id: str = "r1", chunk: int = 0) -> str:
    ledger.upsert_items(WL, run_id, [prep(a) for a in app_ids])
    return stage(ledger, run_id, list(app_ids), chunk=chunk)[0]


def race_in_threads(url: str, names: Sequence[str], attempt: Any) -> list[tuple[bool, bool]]:
    """Two threads, each with its own ledger, call ``attempt(ledger, name, who)`` together per name."""
    ledgers = [Ledger.from_url(url), Ledger.from_url(url)]
    barrier = threading.Barrier(2)

    def run_all(who: int) -> list[bool]:
        won = []
        for name in names:
            barrier.wait()
            try:
                attempt(ledgers[who], name, who)
                won.append(True)
            except (JobClaimedError, WorkloadLeasedError):
                won.append(False)
        return won

    try:
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(run_all, [0, 1])
    finally:
        for opened in ledgers:
            opened.engine.dispose()
    return list(zip(first, second, strict=True))


def race_in_processes(target: Any, url: str, names: list[str], who: list[str]) -> dict[str, list[str]]:
    """Run ``target`` in one spawned process per ``who``; return, per name, who won it."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(who))
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, names, w, barrier, results)) for w in who]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in range(len(names) * len(who))]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    winners: dict[str, list[str]] = {n: [] for n in names}
    for w, name, won in got:
        if won:
            winners[name].append(w)
    return winners


def in_review_after_run_one(ledger: Ledger, app_ids: Sequence[str] = ("a",)) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in app_ids])
    job, cids = submit(ledger, "r1", list(app_ids))
    ledger.apply_results(job, [fail(cids[a], "failed_permanent") for a in app_ids], cost_of)
    ledger.retry_candidates(WL, "r1", max_attempts=3)


HOSTILE = "tab\there, new\nline, cr\r, backslash \\ and \\N, a quote ' and é"
