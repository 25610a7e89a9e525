"""Contract tests of the Anthropic adapter: the real ``anthropic`` SDK against the emulator over HTTP."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from airflow_batch_provider.adapters.anthropic import AnthropicBatchAdapter, _status
from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef, InputRef, Limits
from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.core.chunking import Chunker
from airflow_batch_provider.core.custom_ids import make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import BatchInDoubtError, ConfigurationError
from batch_emulator.config import EmulatorConfig
from batch_emulator.store import Clock
from batch_emulator.testing import run_emulator

from .faults import FAST_CREATE, arm, batches

anthropic = pytest.importorskip("anthropic")

DONE_S = 20.0  # validating 2 s + in progress 10 s + finalizing 2 s at time scale 1
LONG_SYSTEM = "You extract invoice fields from the document and answer in JSON. " * 80  # ~1,300 tokens


class FakeTime:
    """A time source that moves only when told; it starts at the wall clock, like a real provider's."""

    def __init__(self) -> None:
        self.value = time.time()

    def __call__(self) -> float:
        return self.value


@dataclass
class Env:
    url: str
    time: FakeTime
    tmp: Path

    def adapter(self, **extra: Any) -> AnthropicBatchAdapter:
        return AnthropicBatchAdapter(
            AdapterSettings(api_key="sk-test", base_url=self.url, extra={"spool_dir": str(self.tmp), **extra})
        )

    def advance(self, seconds: float = DONE_S) -> None:
        self.time.value += seconds

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        response = httpx.request(method, self.url + path, json=body)
        response.raise_for_status()
        return dict(response.json())

    def faults(self, **faults: Any) -> None:
        self.admin("PUT", "/_emulator/config", {"faults": faults})

    def created(self) -> int:
        return int(self.admin("GET", "/_emulator/stats")["counters"].get("anthropic.batches_created", 0))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    fake = FakeTime()
    with run_emulator(EmulatorConfig(), clock=Clock(fake)) as url:
        yield Env(url, fake, tmp_path)


def request(app_id: str, text: str | None = None, **params: Any) -> CanonicalRequest:
    return CanonicalRequest(
        app_id=app_id,
        prompt_version="v1",
        model="claude-haiku-4-5",
        system="You extract invoice fields.",
        messages=({"role": "user", "content": text or f"Invoice No: INV-{app_id} total $10.00"},),
        params=params,
    )


def write_chunk(adapter: AnthropicBatchAdapter, path: Path, n: int, chunk: int = 0, attempt: int = 1) -> Path:
    with path.open("wb") as fh:
        for i in range(n):
            cid = make_custom_id(f"item-{i:04d}", attempt, chunk)
            fh.write(adapter.format_line(request(f"{i}"), cid) + b"\n")
    return path


def stage_and_submit(adapter: AnthropicBatchAdapter, chunk: Path, key: str) -> BatchRef:
    with chunk.open("rb") as fh:
        ref = adapter.stage(fh, f"{key}.jsonl", chunk.stat().st_size)
    return adapter.submit(ref, key, {"workload": "w"})


def results_of(adapter: AnthropicBatchAdapter, ref: BatchRef) -> list[ItemResult | MalformedLine]:
    return list(adapter.iter_results(ref))


# -- registry, limits, formatting --------------------------------------------------------------


def test_the_registry_finds_the_adapter_by_its_connection_type() -> None:
    assert adapter_class("anthropic_batch") is AnthropicBatchAdapter


def test_the_limits_are_anthropics_message_batches_limits() -> None:
    limits = AnthropicBatchAdapter.limits
    assert limits.max_requests == 100_000
    assert limits.max_bytes == 256 * 1024 * 1024
    assert limits.custom_id_pattern == r"^[a-zA-Z0-9_-]{1,64}$"


def test_a_line_is_a_batch_request_with_a_cached_system_block_and_a_default_max_tokens() -> None:
    adapter = AnthropicBatchAdapter(AdapterSettings(api_key="k"))
    line = json.loads(adapter.format_line(request("a", temperature=0, seed=7), "a__a1c0"))
    assert line["custom_id"] == "a__a1c0"
    params = line["params"]
    assert params["model"] == "claude-haiku-4-5"
    assert params["max_tokens"] == 1024
    assert params["temperature"] == 0
    assert "seed" not in params
    assert params["system"] == [
        {"type": "text", "text": "You extract invoice fields.", "cache_control": {"type": "ephemeral"}}
    ]
    assert params["messages"] == [{"role": "user", "content": "Invoice No: INV-a total $10.00"}]


def test_max_tokens_and_stop_are_translated_and_caching_can_be_turned_off() -> None:
    adapter = AnthropicBatchAdapter(AdapterSettings(extra={"prompt_caching": False}))
    params = json.loads(adapter.format_line(request("a", max_completion_tokens=50, stop="END"), "a"))[
        "params"
    ]
    assert params["max_tokens"] == 50
    assert params["stop_sequences"] == ["END"]
    assert "cache_control" not in params["system"][0]


def test_a_json_schema_response_format_becomes_a_system_instruction_inside_the_cached_block() -> None:
    schema = {"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    adapter = AnthropicBatchAdapter(AdapterSettings())
    params = json.loads(adapter.format_line(request("a", response_format=fmt), "a"))["params"]
    assert "response_format" not in params
    (block,) = params["system"]
    assert block["text"].startswith("You extract invoice fields.\n\nAnswer with exactly one JSON object")
    assert json.dumps(schema, sort_keys=True, separators=(",", ":")) in block["text"]
    assert block["cache_control"] == {"type": "ephemeral"}


def test_the_output_config_json_mode_sends_the_schema_as_a_native_structured_output() -> None:
    schema = {"type": "object", "properties": {"total": {"type": "number"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    adapter = AnthropicBatchAdapter(AdapterSettings(extra={"json_output": "output_config"}))
    params = json.loads(adapter.format_line(request("a", response_format=fmt), "a"))["params"]
    assert params["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert params["system"][0]["text"] == "You extract invoice fields."


def test_an_embedding_request_is_refused_with_the_fix() -> None:
    adapter = AnthropicBatchAdapter(AdapterSettings())
    req = CanonicalRequest(app_id="e1", prompt_version="v1", model="m", kind="embedding", messages=())
    with pytest.raises(
        ConfigurationError,
        match=r"provider 'anthropic' accepts only \['chat'\]\. Providers that accept 'embedding': bedrock, gemini, openai",
    ):
        adapter.format_line(req, "e1")


def test_a_custom_id_outside_the_charset_is_refused() -> None:
    adapter = AnthropicBatchAdapter(AdapterSettings())
    with pytest.raises(ValueError, match="does not match"):
        adapter.format_line(request("a"), "has space")


def test_the_chunker_splits_at_the_adapters_request_limit(tmp_path: Path) -> None:
    class Tiny(AnthropicBatchAdapter):
        limits: ClassVar[Limits] = Limits(max_requests=3, max_bytes=10_000)

    adapter = Tiny(AdapterSettings())

    def sink(name: str) -> Any:
        return (tmp_path / name).open("wb")

    def line_for(app_id: str) -> Callable[[str], bytes]:
        return lambda cid: adapter.format_line(request(app_id), cid)

    with Chunker(adapter.limits, sink) as chunker:
        for i in range(7):
            chunker.add(f"k{i}", str(i), 1, line_for(str(i)))
    assert [c.lines for c in chunker.chunks] == [3, 3, 1]


def test_stage_refuses_a_chunk_over_the_request_limit_and_a_line_with_a_bad_custom_id(tmp_path: Path) -> None:
    class Tiny(AnthropicBatchAdapter):
        limits: ClassVar[Limits] = Limits(max_requests=2, max_bytes=10_000)

    adapter = Tiny(AdapterSettings(extra={"spool_dir": str(tmp_path)}))
    chunk = write_chunk(adapter, tmp_path / "c.jsonl", 3)
    with chunk.open("rb") as fh, pytest.raises(ConfigurationError, match="holds 3 requests"):
        adapter.stage(fh, "k.jsonl", chunk.stat().st_size)
    bad = io.BytesIO(b'{"custom_id": "a b", "params": {}}\n')
    with pytest.raises(ConfigurationError, match="line 1"):
        adapter.stage(bad, "k.jsonl", 40)
    assert list((tmp_path / "abp-anthropic").iterdir()) == []  # nothing left spooled


def test_the_emulator_refuses_duplicate_custom_ids_at_create_like_anthropic(env: Env) -> None:
    adapter = env.adapter()
    line = adapter.format_line(request("1"), "same")
    chunk = env.tmp / "dup.jsonl"
    chunk.write_bytes(line + b"\n" + line + b"\n")
    with chunk.open("rb") as fh, pytest.raises(ConfigurationError, match="appears twice"):
        adapter.stage(fh, "k.jsonl", chunk.stat().st_size)
    client = anthropic.Anthropic(api_key="k", base_url=env.url, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="duplicate custom_id"):
        client.messages.batches.create(requests=[json.loads(line), json.loads(line)])


# -- submit and idempotency ---------------------------------------------------------------------


def test_a_second_submit_with_the_same_key_returns_the_same_batch(env: Env) -> None:
    adapter = env.adapter()
    chunk = write_chunk(adapter, env.tmp / "c.jsonl", 5)
    first = stage_and_submit(adapter, chunk, "abp-key-1")
    second = stage_and_submit(adapter, chunk, "abp-key-1")
    assert second == first
    assert first.batch_id.startswith("msgbatch_")
    assert adapter.find("abp-key-1") == first
    assert env.created() == 1
    assert list((env.tmp / "abp-anthropic").iterdir()) == []  # spooled requests are cleaned up


def test_a_lost_create_reply_is_recovered_from_the_ended_batchs_results(env: Env) -> None:
    chunk = write_chunk(env.adapter(), env.tmp / "c.jsonl", 5)
    lost = stage_and_submit(env.adapter(), chunk, "abp-key-2")  # its reply never reached the ledger
    env.advance()
    retry = env.adapter()  # a new task attempt: a fresh adapter that knows nothing
    assert retry.find("abp-key-2") is None  # nothing staged yet: no intent to compare against
    again = stage_and_submit(retry, chunk, "abp-key-2")
    assert again.batch_id == lost.batch_id
    assert env.created() == 1


def test_a_sibling_chunk_of_the_same_size_is_never_taken_for_this_one(env: Env) -> None:
    adapter = env.adapter()
    sibling = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c0.jsonl", 4, chunk=0), "abp-c0")
    env.advance()
    ours = stage_and_submit(env.adapter(), write_chunk(adapter, env.tmp / "c1.jsonl", 4, chunk=1), "abp-c1")
    assert ours.batch_id != sibling.batch_id
    assert env.created() == 2


@pytest.mark.parametrize("fault", ["500_after", "drop_after", "slow_after"])
def test_a_lost_create_reply_puts_the_job_in_doubt_and_never_creates_a_second_batch(
    env: Env, fault: str
) -> None:
    adapter = env.adapter(**FAST_CREATE)
    chunk = write_chunk(adapter, env.tmp / "c.jsonl", 3)
    arm(env.url, f"create:{fault}")
    with pytest.raises(BatchInDoubtError, match="job abp-key-3 is in doubt") as caught:
        stage_and_submit(adapter, chunk, "abp-key-3")
    doubt = caught.value
    assert (doubt.key, doubt.request_count) == ("abp-key-3", 3)
    (batch,) = batches(env.url, "anthropic")
    retry = env.adapter(**FAST_CREATE)  # a new task attempt knows only what the ledger kept
    ids = [make_custom_id(f"item-{i:04d}", 1, 0) for i in range(3)]
    with pytest.raises(BatchInDoubtError, match="still run"):
        retry.resolve_in_doubt("abp-key-3", doubt.created_after, 3, custom_ids=ids)
    assert len(batches(env.url, "anthropic")) == 1, "being in doubt never creates"
    env.advance()
    found = retry.resolve_in_doubt("abp-key-3", doubt.created_after, 3, custom_ids=ids)
    assert found is not None and found.batch_id == batch["id"]
    (ended,) = batches(env.url, "anthropic")
    assert ended["keys"] == {} and sorted(ended["billed"]) == sorted(ids)


def test_a_job_in_doubt_with_no_matching_batch_is_proven_absent(env: Env) -> None:
    adapter = env.adapter(**FAST_CREATE)
    arm(env.url, "create:500")  # refused before acting, but a 500 cannot say so: in doubt
    with pytest.raises(BatchInDoubtError) as caught:
        stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 3), "abp-absent")
    assert batches(env.url, "anthropic") == []
    assert adapter.resolve_in_doubt("abp-absent", caught.value.created_after, 3) is None


def test_an_ended_batch_of_another_chunk_proves_nothing_was_created_for_this_one(env: Env) -> None:
    adapter = env.adapter(**FAST_CREATE)
    intent = datetime.now(timezone.utc) - timedelta(seconds=1)
    stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c0.jsonl", 3, chunk=0), "abp-sibling")
    env.advance()
    ours = [make_custom_id(f"item-{i:04d}", 1, 1) for i in range(3)]
    assert env.adapter().resolve_in_doubt("abp-ours", intent, 3, custom_ids=ours) is None
    with pytest.raises(BatchInDoubtError, match="pass custom_ids"):
        env.adapter().resolve_in_doubt("abp-ours", intent, 3)


def test_a_create_refused_with_429_is_sent_again_and_makes_one_batch(env: Env) -> None:
    adapter = env.adapter(**FAST_CREATE)
    arm(env.url, "create:429", create_retry_after_s=0)
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 2), "abp-429")
    assert [b["id"] for b in batches(env.url, "anthropic")] == [ref.batch_id]


def test_batches_created_before_the_chunk_was_staged_are_not_candidates(env: Env) -> None:
    adapter = env.adapter(find_clock_skew_s=0)
    chunk = write_chunk(adapter, env.tmp / "c.jsonl", 2)
    old = stage_and_submit(adapter, chunk, "abp-old")
    env.advance()
    later = time.time() + 10_000
    os.utime(chunk, (later, later))  # the chunk was (re)written after that batch was created
    fresh = stage_and_submit(env.adapter(find_clock_skew_s=0), chunk, "abp-old")
    assert fresh.batch_id != old.batch_id


def test_submit_refuses_an_input_that_was_not_staged_inline(env: Env) -> None:
    with pytest.raises(ConfigurationError, match="inline"):
        env.adapter().submit(InputRef("file", "file-1"), "k", {})
    with pytest.raises(ConfigurationError, match="is gone"):
        env.adapter().submit(InputRef("inline", str(env.tmp / "nope.jsonl")), "k", {})


# -- status ------------------------------------------------------------------------------------


def fake_batch(status: str, cancel: bool = False, **counts: int) -> SimpleNamespace:
    base = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    return SimpleNamespace(
        processing_status=status,
        cancel_initiated_at="2026-01-01T00:00:00Z" if cancel else None,
        request_counts=SimpleNamespace(**{**base, **counts}),
    )


@pytest.mark.parametrize(
    ("batch", "state", "completed", "failed"),
    [
        (fake_batch("in_progress", processing=10), "in_progress", 0, 0),
        (fake_batch("canceling", cancel=True, processing=10), "cancelling", 0, 0),
        (fake_batch("ended", succeeded=8, errored=2), "completed", 8, 2),
        (fake_batch("ended", errored=10), "completed", 0, 10),
        (fake_batch("ended", expired=10), "expired", 0, 10),
        (fake_batch("ended", succeeded=6, expired=4), "expired", 6, 4),
        (fake_batch("ended", canceled=10), "cancelled", 0, 10),
        (fake_batch("ended", cancel=True, succeeded=3, canceled=7), "cancelled", 3, 7),
        (fake_batch("ended", cancel=True, succeeded=10), "cancelled", 10, 0),
    ],
    ids=[
        "in_progress",
        "canceling",
        "ended-mixed",
        "ended-all-errored",
        "ended-all-expired",
        "ended-partly-expired",
        "ended-all-canceled",
        "ended-cancel-partial",
        "ended-cancel-too-late",
    ],
)
def test_every_processing_status_and_result_mix_maps_to_a_neutral_state(
    batch: SimpleNamespace, state: str, completed: int, failed: int
) -> None:
    status = _status(batch)
    assert (status.state, status.completed, status.failed, status.total) == (state, completed, failed, 10)
    assert status.raw_state == batch.processing_status
    assert status.terminal == (batch.processing_status == "ended")


def test_status_follows_a_batch_from_in_progress_to_completed(env: Env) -> None:
    adapter = env.adapter()
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 4), "abp-s")
    status = adapter.status(ref)
    assert (status.state, status.total, status.completed) == ("in_progress", 4, 0)
    env.advance()
    status = adapter.status(ref)
    assert (status.state, status.total, status.completed, status.failed) == ("completed", 4, 4, 0)


def test_an_expired_batch_keeps_what_it_finished(env: Env) -> None:
    env.faults(expire_batches=[0], expire_after_fraction=0.5)
    adapter = env.adapter()
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 10), "abp-e")
    env.advance()
    status = adapter.status(ref)
    assert status.state == "expired"
    assert (status.completed, status.failed) == (5, 5)
    outcomes = sorted(r.outcome for r in results_of(adapter, ref) if isinstance(r, ItemResult))
    assert outcomes == ["expired"] * 5 + ["succeeded"] * 5


async def test_the_async_status_client_reads_the_same_status(env: Env) -> None:
    adapter = env.adapter()
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 2), "abp-a")
    client = adapter.async_client()
    try:
        assert (await client.status(ref)).state == "in_progress"
        env.advance()
        assert (await client.status(ref)).state == "completed"
    finally:
        await client.close()


# -- results -----------------------------------------------------------------------------------


def test_every_result_type_and_error_maps_to_a_neutral_outcome(env: Env) -> None:
    env.faults(rate_500=0.15, rate_429=0.15, rate_400=0.1, rate_context_length=0.1, rate_missing=0.1)
    adapter = env.adapter()
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 60), "abp-r")
    env.advance()
    results = [r for r in results_of(adapter, ref) if isinstance(r, ItemResult)]
    by_code = {r.error_code: r.outcome for r in results if r.error_code}
    assert by_code == {
        "overloaded_error": "failed_retryable",
        "rate_limit_error": "failed_retryable",
        "invalid_request_error": "failed_permanent",
    }
    assert any("prompt is too long" in (r.error_message or "") for r in results)
    assert 0 < len(results) < 60  # missing items have no line
    ok = [r for r in results if r.outcome == "succeeded"]
    assert ok and all(json.loads(r.output)["invoice_number"] for r in ok)
    assert all(r.usage.output_tokens > 0 and r.usage.input_tokens > 0 for r in ok)


def test_cache_writes_and_reads_are_reported_as_cache_write_and_cached_input_tokens(env: Env) -> None:
    adapter = env.adapter()
    chunk = env.tmp / "c.jsonl"
    with chunk.open("wb") as fh:
        for i in range(4):
            req = CanonicalRequest(
                app_id=str(i),
                prompt_version="v1",
                model="claude-haiku-4-5",
                system=LONG_SYSTEM,
                messages=({"role": "user", "content": f"Invoice INV-{i}00"},),
            )
            fh.write(adapter.format_line(req, f"i{i}") + b"\n")
    ref = stage_and_submit(adapter, chunk, "abp-cache")
    env.advance()
    usages = [r.usage for r in results_of(adapter, ref) if isinstance(r, ItemResult)]
    assert usages[0].cache_write_tokens > 1024 and usages[0].cached_input_tokens == 0
    assert all(u.cached_input_tokens == usages[0].cache_write_tokens for u in usages[1:])
    assert all(u.cache_write_tokens == 0 and u.input_tokens < 50 for u in usages[1:])


def test_download_writes_the_raw_results_stream_and_no_separate_error_file(env: Env) -> None:
    adapter = env.adapter()
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 3), "abp-d")
    sink = io.BytesIO()
    assert adapter.download(ref, "output", sink) == 0  # not ended yet: no results_url
    env.advance()
    assert adapter.download(ref, "output", sink) == len(sink.getvalue()) > 0
    assert len(sink.getvalue().splitlines()) == 3
    assert adapter.download(ref, "errors", io.BytesIO()) == 0


def test_damaged_duplicated_and_unknown_lines_are_reported_not_fatal() -> None:
    adapter = AnthropicBatchAdapter(AdapterSettings())
    ok = {"custom_id": "a", "result": {"type": "succeeded", "message": {"content": [], "usage": {}}}}
    lines = [
        json.dumps(ok),
        json.dumps(ok),
        '{"custom_id": "b", "result": {"type": "succ',
        json.dumps({"custom_id": "c", "result": {"type": "mystery"}}),
        json.dumps({"result": {"type": "expired"}}),
        json.dumps({"custom_id": "d", "result": {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "x"}}}}),
        json.dumps({"custom_id": "e", "result": {"type": "errored", "error": {"type": "error", "error": {"type": "timeout_error", "message": "t"}}}}),
        json.dumps({"custom_id": "f", "result": {"type": "errored", "error": {"type": "error", "error": {"type": "authentication_error", "message": "k"}}}}),
        json.dumps({"custom_id": "g", "result": {"type": "canceled"}}),
        json.dumps({"custom_id": "h", "result": {"type": "succeeded", "message": {"content": [{"type": "tool_use", "input": {"total": 3}}], "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 9}}}}),
    ]  # fmt: skip
    parsed = list(adapter.parse_results(io.BytesIO("\n".join(lines).encode())))
    bad = [p for p in parsed if isinstance(p, MalformedLine)]
    assert [b.line_number for b in bad] == [3, 4, 5]
    assert bad[1].custom_id == "c"
    good = {p.custom_id: p for p in parsed if isinstance(p, ItemResult)}
    assert [p.custom_id for p in parsed if isinstance(p, ItemResult)].count("a") == 2
    assert good["d"].outcome == good["e"].outcome == "failed_retryable"
    assert good["f"].outcome == "failed_permanent"
    assert good["g"].outcome == "cancelled"
    assert good["h"].output == {"total": 3}
    usage = good["h"].usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.cache_write_tokens) == (
        5,
        2,
        7,
        9,
    )


# -- cancel ------------------------------------------------------------------------------------


def test_a_cancelled_batch_goes_through_canceling_and_its_unprocessed_items_come_back_cancelled(
    env: Env,
) -> None:
    adapter = env.adapter()
    ref = stage_and_submit(adapter, write_chunk(adapter, env.tmp / "c.jsonl", 10), "abp-x")
    env.advance(7.0)  # half of the work done
    adapter.cancel(ref)
    assert adapter.status(ref).state == "cancelling"
    env.advance(5.0)
    status = adapter.status(ref)
    assert status.state == "cancelled" and status.completed == 5
    outcomes = sorted(r.outcome for r in results_of(adapter, ref) if isinstance(r, ItemResult))
    assert outcomes == ["cancelled"] * 5 + ["succeeded"] * 5


# -- real-time client ----------------------------------------------------------------------------


async def test_the_realtime_client_answers_and_reports_cache_usage(env: Env) -> None:
    client = env.adapter().realtime_client()
    req = CanonicalRequest(
        app_id="r",
        prompt_version="v1",
        model="claude-haiku-4-5",
        system=LONG_SYSTEM,
        messages=({"role": "user", "content": "Invoice No: INV-77 total $5.00"},),
    )
    try:
        first = await client.complete(req, "r1")
        second = await client.complete(req, "r2")
    finally:
        await client.close()
    assert first.result.outcome == "succeeded" and first.retry_after is None
    assert json.loads(first.result.output)["invoice_number"] == "INV-77"
    assert first.result.usage.cache_write_tokens > 1024
    assert second.result.usage.cached_input_tokens == first.result.usage.cache_write_tokens


async def test_a_429_becomes_a_retryable_result_with_the_providers_retry_after(env: Env) -> None:
    env.faults(sync_429_rate=1.0, sync_retry_after_s=3)
    client = env.adapter().realtime_client()
    try:
        reply = await client.complete(request("q"), "q1")
    finally:
        await client.close()
    assert reply.result.outcome == "failed_retryable"
    assert reply.result.error_code == "rate_limit_error"
    assert reply.retry_after == 3.0
    assert reply.rate_limit["anthropic-ratelimit-requests-remaining"] == "0"


async def test_an_overloaded_529_is_retryable_and_a_bad_request_is_permanent(env: Env) -> None:
    env.faults(sync_500_rate=1.0)
    client = env.adapter().realtime_client()
    try:
        overloaded = await client.complete(request("o"), "o1")
        env.faults(sync_500_rate=0.0)
        too_long = await client.complete(request("t", text="word " * 200_000), "t1")
    finally:
        await client.close()
    assert (overloaded.result.outcome, overloaded.result.error_code) == (
        "failed_retryable",
        "overloaded_error",
    )
    assert overloaded.result.raw["status_code"] == 529
    assert (too_long.result.outcome, too_long.result.error_code) == (
        "failed_permanent",
        "invalid_request_error",
    )
    assert "prompt is too long" in (too_long.result.error_message or "")


async def test_an_unreachable_endpoint_is_a_retryable_result_not_an_exception(tmp_path: Path) -> None:
    adapter = AnthropicBatchAdapter(
        AdapterSettings(api_key="k", base_url="http://127.0.0.1:9", extra={"timeout": 2})
    )
    client = adapter.realtime_client()
    try:
        reply = await client.complete(request("u"), "u1")
    finally:
        await client.close()
    assert reply.result.outcome == "failed_retryable"
    assert reply.result.error_code in ("connection_error", "timeout")


async def test_a_realtime_answer_is_in_the_emulators_record_under_its_custom_id(env: Env) -> None:
    client = env.adapter().realtime_client()
    try:
        reply = await client.complete(request("1"), "rt-1")
    finally:
        await client.close()
    (answer,) = env.admin("GET", "/_emulator/record")["realtime"]["anthropic"]
    assert answer["custom_id"] == "rt-1"
    assert answer["usage"]["output_tokens"] == reply.result.usage.output_tokens
