"""The status trigger on a real event loop, polling the emulator with the async SDK client."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.triggers.batch import BatchStatusTrigger, first_poll_delay
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

REQUEST = CanonicalRequest("a1", "v1", "gpt-4o-mini", messages=({"role": "user", "content": "great"},))


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with run_emulator(EmulatorConfig(time_scale=0.02)) as url:
        conn = {"conn_type": "openai_batch", "host": f"{url}/v1", "password": "sk-secret-value"}
        monkeypatch.setenv("AIRFLOW_CONN_EMU_BATCH", json.dumps(conn))
        yield url


def submit(url: str, key: str) -> BatchRef:
    adapter = OpenAIBatchAdapter(AdapterSettings("sk", f"{url}/v1"))
    data = adapter.format_line(REQUEST, "a1__a1c0") + b"\n"
    return adapter.submit(adapter.stage(io.BytesIO(data), f"{key}.jsonl", len(data)), key, {})


def trigger_for(ref: BatchRef, policy: PollPolicy, submitted_at: float | None = None) -> BatchStatusTrigger:
    return BatchStatusTrigger(
        batch_conn_id="emu_batch",
        job_id="job-1",
        batch_id=ref.batch_id,
        provider="openai",
        idempotency_key=ref.idempotency_key,
        submitted_at=submitted_at if submitted_at is not None else time.time(),
        policy=policy.to_dict(),
    )


async def first_event(trigger: BatchStatusTrigger) -> dict[str, object]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


def test_the_trigger_serialises_primitives_and_no_secret() -> None:
    trigger = trigger_for(BatchRef("openai", "batch_1", "abp-k"), PollPolicy(initial_interval=1))
    path, kwargs = trigger.serialize()
    assert path == "airflow_batch_provider.triggers.batch.BatchStatusTrigger"
    text = json.dumps(kwargs)  # raises if anything is not a primitive
    assert "sk-" not in text
    assert BatchStatusTrigger(**kwargs).serialize() == (path, kwargs)


async def test_the_trigger_fires_done_when_the_batch_completes(emulator: str) -> None:
    ref = submit(emulator, "k1")
    event = await first_event(
        trigger_for(ref, PollPolicy(initial_interval=0.1, factor=1.0, max_interval=0.1))
    )
    assert event["status"] == "done"
    assert event["batch"]["state"] == "completed"  # type: ignore[index]
    assert event["batch_id"] == ref.batch_id
    assert int(event["polls"]) >= 1  # type: ignore[call-overload]


async def test_the_trigger_stops_at_the_deadline_instead_of_failing(emulator: str) -> None:
    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 100.0}).raise_for_status()
    ref = submit(emulator, "k2")
    policy = PollPolicy(initial_interval=0.1, factor=1.0, max_interval=0.1, deadline=time.time() + 0.5)
    event = await first_event(trigger_for(ref, policy))
    assert event["status"] == "deadline"
    assert event["batch"]["state"] in {"validating", "in_progress"}  # type: ignore[index]


async def test_the_trigger_gives_up_after_too_many_status_errors_in_a_row(emulator: str) -> None:
    ref = submit(emulator, "k3")
    httpx.put(f"{emulator}/_emulator/config", json={"faults": {"retrieve_5xx_rate": 1.0}}).raise_for_status()
    policy = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05, max_consecutive_errors=2)
    event = await first_event(trigger_for(ref, policy))
    assert event["status"] == "give_up"
    assert "3 status errors in a row (limit 2)" in str(event["reason"])


async def test_each_failed_poll_is_counted_by_the_triggerer_with_the_workload(
    emulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.triggers import batch as trigger_module

    counted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        trigger_module, "count_poll_error", lambda e, w, p: counted.append((e.split(":")[0], w, p))
    )
    ref = submit(emulator, "k6")
    httpx.put(f"{emulator}/_emulator/config", json={"faults": {"retrieve_5xx_rate": 1.0}}).raise_for_status()
    policy = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05, max_consecutive_errors=2)
    trigger = trigger_for(ref, policy)
    trigger.workload = "feedback"
    event = await first_event(trigger)
    assert event["status"] == "give_up"
    assert len(counted) == 3 and {(w, p) for _, w, p in counted} == {("feedback", "openai")}


def test_a_poll_error_metric_that_cannot_be_sent_is_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_batch_provider import metrics
    from airflow_batch_provider.triggers.batch import count_poll_error

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("statsd socket closed")

    monkeypatch.setattr(metrics, "record_poll_error", broken)
    count_poll_error("ReadTimeout: slow", "w", "openai")  # no exception


async def test_the_trigger_tolerates_transient_errors_below_the_limit(emulator: str) -> None:
    ref = submit(emulator, "k4")
    httpx.put(f"{emulator}/_emulator/config", json={"faults": {"retrieve_5xx_rate": 0.5}}).raise_for_status()
    policy = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05, max_consecutive_errors=50)
    event = await first_event(trigger_for(ref, policy))
    assert event["status"] == "done"


async def test_the_trigger_times_out_counting_from_submission(emulator: str) -> None:
    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 100.0}).raise_for_status()
    ref = submit(emulator, "k5")
    policy = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05, timeout=60)
    event = await first_event(trigger_for(ref, policy, submitted_at=time.time() - 61))
    assert event["status"] == "timeout"


def test_the_first_polls_of_a_round_of_batches_spread_over_one_interval_and_a_batch_keeps_its_place() -> None:
    """Triggers that defer together must not poll (and parse) in step on the triggerer's one loop."""
    delays = [first_poll_delay(f"batch_{i:032x}", 30.0) for i in range(1000)]
    assert all(0.0 <= d < 30.0 for d in delays)
    per_tenth = [sum(1 for d in delays if k * 3.0 <= d < (k + 1) * 3.0) for k in range(10)]
    assert min(per_tenth) >= 50 and max(per_tenth) <= 150, per_tenth  # none of ten slots gets 15%
    assert first_poll_delay("batch_x", 30.0) == first_poll_delay("batch_x", 30.0)
