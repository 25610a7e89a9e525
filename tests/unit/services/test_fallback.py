"""The real-time path against the emulator's real-time API, with a real ledger.

No mocks: the OpenAI SDK's async client talks HTTP to the emulator on 127.0.0.1, and the ledger
is SQLite in the test's folder.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.money import to_nusd
from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.ratelimit import RetryPolicy
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.ledger.store import PreparedItem, sync_job_id
from airflow_batch_provider.operators.batch import build_report
from airflow_batch_provider.services.fallback import (
    ANSWER_LOST,
    FALLBACK_FROM,
    POSSIBLY_PAID_TWICE,
    FallbackSettings,
    close_interrupted_sends,
    possibly_paid_twice,
    run_fallback,
)
from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.testing import run_emulator

WORKLOAD = "wl"
RUN = "run1"
PROMPT = PromptTemplate(
    version="v1",
    model="gpt-4o-mini",
    system="Label the comment.",
    user="{{ text }}",
    params={"max_tokens": 16},
)
PRICE = PriceTable.load().price("openai", "gpt-4o-mini")


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")


@pytest.fixture
def emulator() -> Iterator[str]:
    config = EmulatorConfig(time_scale=0.05, context_window_tokens=200, timings=Timings(rate_window_s=60.0))
    with run_emulator(config) as url:
        yield url


def _adapter(url: str) -> OpenAIBatchAdapter:
    return OpenAIBatchAdapter(AdapterSettings(api_key="sk-test", base_url=f"{url}/v1"))


def _put_faults(url: str, faults: dict[str, Any]) -> None:
    req = urllib.request.Request(
        f"{url}/_emulator/config",
        data=json.dumps({"faults": faults}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/_emulator/stats", timeout=10) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _counter(url: str, name: str) -> int:
    """The emulator's count of an event over every provider (``sync_requests``, ``sync_500`` ...)."""
    return int(_stats(url)["counters"].get(name, 0))


def _sync_requests(url: str) -> int:
    return _counter(url, "sync_requests")


def _seed(ledger: Ledger, texts: dict[str, str]) -> None:
    ledger.start_run(WORKLOAD, RUN, "openai", PROMPT.model)
    items = [
        PreparedItem(app_id, PROMPT.render({"id": app_id, "text": text})) for app_id, text in texts.items()
    ]
    ledger.upsert_items(WORKLOAD, RUN, items)


def _open_rows(ledger: Ledger) -> list[OpenItem]:
    return list(ledger.iter_item_rows(WORKLOAD, RUN, states=FALLBACK_FROM, shape=OpenItem))


async def _fallback(ledger: Ledger, url: str, rows: list[OpenItem], **settings: Any) -> dict[str, Any]:
    config = FallbackSettings(
        rpm=settings.get("rpm", 600),
        tpm=settings.get("tpm", 100_000),
        concurrency=settings.get("concurrency", 4),
        window_s=settings.get("window_s", 60.0),
        retry=settings.get("retry", RetryPolicy(max_attempts=5, initial_delay=0.05, max_delay=0.2)),
    )
    return await run_fallback(
        ledger=ledger,
        workload=WORKLOAD,
        run_id=RUN,
        provider="openai",
        client=_adapter(url).realtime_client(),
        rows=rows,
        template=PROMPT,
        settings=config,
        prices=PriceTable.load(),
    )


def _attempts(ledger: Ledger) -> list[dict[str, Any]]:
    with ledger.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(s.attempts).order_by(s.attempts.c.custom_id)).mappings()]


def _usage(a: dict[str, Any]) -> Usage:
    return Usage(a["input_tokens"], a["output_tokens"], a["cached_input_tokens"], a["cache_write_tokens"])


async def test_open_items_succeed_through_the_real_time_api_at_full_price(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {f"c{i}": f"comment number {i} is fine" for i in range(6)})
    summary = await _fallback(ledger, emulator, _open_rows(ledger))
    assert summary["sent"] == 6 and summary["succeeded"] == 6
    assert ledger.count_routes(WORKLOAD, RUN) == {("succeeded", "fallback"): 6}
    attempts = _attempts(ledger)
    assert {a["mode"] for a in attempts} == {"sync"} and len(attempts) == 6
    assert all(a["job_id"] == sync_job_id(WORKLOAD, RUN) for a in attempts)
    for a in attempts:
        assert a["outcome"] == "succeeded" and a["input_tokens"] > 0 and a["output_tokens"] > 0
        assert a["cost_nusd"] == to_nusd(cost(_usage(a), PRICE, "sync"))
        assert (
            a["cost_nusd"] == 2 * to_nusd(cost(_usage(a), PRICE, "batch"))
            or abs(a["cost_nusd"] - 2 * to_nusd(cost(_usage(a), PRICE, "batch"))) <= 1
        )
    report = build_report(ledger, WORKLOAD, RUN, "openai", None)
    assert report["items_by_route"]["fallback"] == 6
    assert Decimal(report["paid_by_kind"]["fallback"]) == Decimal(report["paid"]) > 0
    assert Decimal(report["savings"]) == 0  # synchronous work saves nothing


async def test_an_item_that_already_has_a_result_is_not_sent_again(ledger: Ledger, emulator: str) -> None:
    _seed(ledger, {f"c{i}": f"comment {i}" for i in range(4)})
    rows = _open_rows(ledger)
    first = await _fallback(ledger, emulator, rows[:2])
    sent_before = _sync_requests(emulator)
    # A rerun of the task with the same (stale) list of rows: the two done items are not sent.
    again = await _fallback(ledger, emulator, rows)
    assert first["succeeded"] == 2
    assert again["already_done"] == 2 and again["sent"] == 2
    assert _sync_requests(emulator) - sent_before == 2
    assert len(_attempts(ledger)) == 4
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": 4}


async def test_a_permanent_failure_goes_to_review_without_retries(ledger: Ledger, emulator: str) -> None:
    _seed(ledger, {"ok": "short", "long": "word " * 400})  # over the emulator's 200-token window
    summary = await _fallback(ledger, emulator, _open_rows(ledger))
    assert summary.get("retries", 0) == 0
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": 1, "review": 1}
    (review,) = list(ledger.iter_items(WORKLOAD, RUN, states=["review"], columns=["app_id", "error_code"]))
    assert review["app_id"] == "long" and review["error_code"] == "context_length_exceeded"
    failed = [a for a in _attempts(ledger) if a["outcome"] == "failed_permanent"]
    assert len(failed) == 1 and failed[0]["cost_nusd"] == 0


async def test_429s_with_retry_after_are_retried_and_every_item_succeeds(
    ledger: Ledger, emulator: str
) -> None:
    # The provider allows 3 requests per window (3 s: the emulator's minute at time scale 0.05);
    # the fallback is told 600 per window, so the provider's 429s (with Retry-After) and its
    # rate-limit headers must hold it back.
    _put_faults(emulator, {"rpm_limit": 3})
    _seed(ledger, {f"c{i}": f"comment {i}" for i in range(7)})
    summary = await _fallback(ledger, emulator, _open_rows(ledger), concurrency=4, window_s=3.0)
    assert summary["succeeded"] == 7
    assert summary["provider_pauses"] >= 1
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": 7}
    assert len(_attempts(ledger)) == 7  # a 429 is a retry within one attempt, not a new row


async def test_a_late_batch_result_after_the_fallback_is_kept_as_duplicate_cost(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {"c0": "late one", "c1": "other"})
    job_id = "wl:run1:r1:c00000"
    job: dict[str, Any] = {
        "job_id": job_id,
        "workload": WORKLOAD,
        "run_id": RUN,
        "round": 1,
        "chunk_index": 0,
        "provider": "openai",
        "model": PROMPT.model,
        "idempotency_key": "abp-key",
        "staged_path": "/tmp/none.jsonl",
        "input_sha256": "0" * 64,
        "lines": 2,
        "size_bytes": 10,
        "kind": "chat",
    }
    rows = {r["app_id"]: r for r in ledger.iter_items(WORKLOAD, RUN, columns=["app_id"])}
    ledger.record_job(
        job, [(rows[a]["item_key"], "v1", f"{rows[a]['item_key']}__a1c0", 1) for a in ("c0", "c1")]
    )
    ledger.mark_submitted(job_id, "batch_x", "file_x")
    await _fallback(ledger, emulator, _open_rows(ledger))
    assert ledger.count_routes(WORKLOAD, RUN) == {("succeeded", "fallback"): 2}
    late = Usage(input_tokens=20, output_tokens=5)
    stats = ledger.apply_results(
        job_id,
        [ItemResult("c0__a1c0", "succeeded", output="late answer", usage=late)],
        lambda u: cost(u, PRICE, "batch"),
    )
    assert stats.late == 1 and stats.applied == 0
    assert ledger.count_routes(WORKLOAD, RUN) == {("succeeded", "fallback"): 2}  # still one row each
    batch = [a for a in _attempts(ledger) if a["mode"] == "batch" and a["outcome"] == "succeeded"]
    assert (
        len(batch) == 1
        and batch[0]["discarded"]
        and batch[0]["cost_nusd"] == to_nusd(cost(late, PRICE, "batch"))
    )
    report = build_report(ledger, WORKLOAD, RUN, "openai", None)
    assert Decimal(report["paid_by_kind"]["discarded"]) == cost(late, PRICE, "batch")
    total = sum(a["cost_nusd"] for a in _attempts(ledger))
    assert to_nusd(Decimal(report["paid"])) == total


async def test_a_result_recorded_after_a_late_batch_success_is_discarded_not_applied(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {"c0": "x"})
    (row,) = _open_rows(ledger)
    cid = ledger.begin_sync_attempt(WORKLOAD, RUN, row.item_key, "v1", FALLBACK_FROM)
    assert cid == f"{row.item_key}__s1"
    # Meanwhile the item got a usable result elsewhere (simulated by a direct transition).
    ledger.transition(WORKLOAD, RUN, "succeeded", ["fallback"], output_json='"from batch"', route="batch")
    state = ledger.record_sync_result(
        WORKLOAD, RUN, ItemResult(cid, "succeeded", output="sync", usage=Usage(10, 2)), 123
    )
    assert state == "succeeded"
    (att,) = _attempts(ledger)
    assert att["discarded"] and att["cost_nusd"] == 123
    (item,) = list(ledger.iter_items(WORKLOAD, RUN, columns=["output_json", "route"]))
    assert item["output_json"] == '"from batch"' and item["route"] == "batch"


def _interrupt(ledger: Ledger, app_ids: list[str]) -> dict[str, str]:
    """Leave items as a crash between the call and the record does: in fallback, attempt open."""
    rows = {r.app_id: r for r in _open_rows(ledger)}
    return {
        a: str(ledger.begin_sync_attempt(WORKLOAD, RUN, rows[a].item_key, "v1", FALLBACK_FROM))
        for a in app_ids
    }


async def test_items_stranded_in_fallback_are_resumed_even_when_the_caller_does_not_list_them(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {f"c{i}": f"comment {i}" for i in range(4)})
    opened = _interrupt(ledger, ["c0", "c1"])
    # the caller lists only what it still sees as staged (the below-minimum path's filter)
    rest = [r for r in _open_rows(ledger) if r.app_id in ("c2", "c3")]
    summary = await _fallback(ledger, emulator, rest)
    assert summary["sent"] == 4 and summary[POSSIBLY_PAID_TWICE] == 2
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": 4}
    attempts = {a["custom_id"]: a for a in _attempts(ledger)}
    for app_id, cid in opened.items():
        closed = attempts[cid]
        assert (closed["outcome"], closed["error_code"], closed["cost_nusd"]) == (
            "failed_retryable",
            POSSIBLY_PAID_TWICE,
            0,
        )
        assert attempts[cid.replace("__s1", "__s2")]["outcome"] == "succeeded", app_id
    assert possibly_paid_twice(ledger, WORKLOAD, RUN) == 2
    # a further rerun finds nothing open and sends nothing
    sent = _sync_requests(emulator)
    again = await _fallback(ledger, emulator, _open_rows(ledger))
    assert again["items"] == 0 and _sync_requests(emulator) == sent


async def test_a_crash_while_closing_an_interrupted_send_is_finished_by_the_next_call(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {"c0": "x", "c1": "y"})
    (cid,) = _interrupt(ledger, ["c0"]).values()
    (row,) = [r for r in _open_rows(ledger) if r.app_id == "c0"]
    # the item was moved, the attempt not yet closed: then the process died
    ledger.transition(
        WORKLOAD,
        RUN,
        "failed_retryable",
        ["fallback"],
        keys=[(row.item_key, "v1")],
        error_code=POSSIBLY_PAID_TWICE,
    )
    summary = await _fallback(ledger, emulator, [])
    assert summary[POSSIBLY_PAID_TWICE] == 1 and summary["succeeded"] == 1
    assert {a["custom_id"]: a["error_code"] for a in _attempts(ledger)}[cid] == POSSIBLY_PAID_TWICE
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": 1, "pending": 1}


def test_publish_can_close_interrupted_sends_without_sending_and_nothing_stays_in_fallback(
    ledger: Ledger,
) -> None:
    _seed(ledger, {"c0": "x", "c1": "y"})
    (cid,) = _interrupt(ledger, ["c0"]).values()
    closed = close_interrupted_sends(ledger, WORKLOAD, RUN, ANSWER_LOST)
    assert [r.app_id for r in closed] == ["c0"]
    assert ledger.count_states(WORKLOAD, RUN) == {"failed_retryable": 1, "pending": 1}
    (att,) = _attempts(ledger)
    assert (att["custom_id"], att["outcome"], att["error_code"]) == (cid, "failed_retryable", ANSWER_LOST)
    assert possibly_paid_twice(ledger, WORKLOAD, RUN) == 0
    report = build_report(ledger, WORKLOAD, RUN, "openai", None)
    assert "fallback" not in report["states"]


# ---------------------------------------------------------------------------------------------- one limit, many tasks


def most_in_any_window(stamps: list[float], window: float) -> int:
    """Most answers the provider gave within any window that starts at one of them."""
    stamps = sorted(stamps)
    return max((sum(1 for t in stamps if start <= t < start + window) for start in stamps), default=0)


def fallbacks_in_processes(
    ledger_url: str, emulator: str, settings: FallbackSettings, tasks: int
) -> list[float]:
    """Run ``tasks`` fallback processes at once on one key; return when the emulator answered each request."""
    import multiprocessing

    from tests.unit.services import fallback_worker

    Ledger.from_url(ledger_url).engine.dispose()  # the schema, before the processes race
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(tasks), ctx.Queue()
    procs = [
        ctx.Process(
            target=fallback_worker.send, args=(ledger_url, emulator, f"wl{n}", 8, settings, barrier, results)
        )
        for n in range(tasks)
    ]
    for p in procs:
        p.start()
    summaries = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(summary.get("succeeded") == 8 for summary in summaries), summaries
    with urllib.request.urlopen(f"{emulator}/_emulator/record", timeout=10) as resp:
        record = json.loads(resp.read())
    return [float(answer["at"]) for answer in record["realtime"]["openai"]]


# A window of 4 requests in 3 s: 3 tasks x 8 items need at least 5 windows together.
SHARED = FallbackSettings(rpm=4, tpm=None, concurrency=4, window_s=3.0, quota_key="emu")


def test_fallback_tasks_in_several_processes_on_one_key_never_exceed_its_limit_together(
    tmp_path: Path, emulator: str
) -> None:
    """The store on PostgreSQL is raced in ``tests/unit/ledger/test_quota.py``."""
    stamps = fallbacks_in_processes(f"sqlite:///{tmp_path / 'shared.sqlite'}", emulator, SHARED, tasks=3)
    assert len(stamps) == 24
    assert most_in_any_window(stamps, SHARED.window_s) <= 4


def test_fallback_tasks_each_with_its_own_window_exceed_the_keys_limit_together(
    tmp_path: Path, emulator: str
) -> None:
    """The failure the shared window prevents: per-task limiters each use the whole limit."""
    from dataclasses import replace

    stamps = fallbacks_in_processes(
        f"sqlite:///{tmp_path / 'own.sqlite'}", emulator, replace(SHARED, quota_key=None), tasks=3
    )
    assert most_in_any_window(stamps, SHARED.window_s) > 4
