"""The Anthropic Message Batches and Messages routes, driven with the real ``anthropic`` SDK.

The SDK parses every answer into its own types (``MessageBatch``, ``MessageBatchIndividualResponse``,
``Message``) and its errors into its exception classes; a shape that drifts from Anthropic's
fails here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from batch_emulator.anthropic_api import MessagesPrompt, rfc3339
from batch_emulator.config import EmulatorConfig
from batch_emulator.model import count_tokens, message_tokens
from batch_emulator.store import Clock
from batch_emulator.testing import run_emulator

anthropic = pytest.importorskip("anthropic")

LONG_SYSTEM = "Extract the invoice number, date, vendor and total as JSON. " * 90  # ~1,350 tokens


class FakeTime:
    def __init__(self) -> None:
        self.value = float(int(time.time()))

    def __call__(self) -> float:
        return self.value


@dataclass
class Emu:
    url: str
    time: FakeTime
    client: Any

    def advance(self, seconds: float = 20.0) -> None:
        self.time.value += seconds

    def faults(self, **faults: Any) -> None:
        httpx.put(self.url + "/_emulator/config", json={"faults": faults}).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/_emulator/stats").json())


@pytest.fixture
def emu() -> Iterator[Emu]:
    fake = FakeTime()
    with run_emulator(EmulatorConfig(), clock=Clock(fake)) as url:
        yield Emu(url, fake, anthropic.Anthropic(api_key="sk-test", base_url=url, max_retries=0))


def req(custom_id: str, text: str = "Invoice No: INV-1 dated 2025-01-02 total $10.00", **params: Any) -> Any:
    return {
        "custom_id": custom_id,
        "params": {
            "model": "claude-haiku-4-5",
            "max_tokens": 300,
            "system": [{"type": "text", "text": "You extract invoice fields."}],
            "messages": [{"role": "user", "content": text}],
            **params,
        },
    }


def test_a_batch_is_in_progress_with_every_request_processing_until_it_ends(emu: Emu) -> None:
    batch = emu.client.messages.batches.create(requests=[req(f"r{i}") for i in range(5)])
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 5 and batch.request_counts.succeeded == 0
    assert batch.results_url is None and batch.ended_at is None
    assert (batch.expires_at - batch.created_at).total_seconds() == 86_400
    emu.advance(13.0)  # finalizing in the neutral lifecycle: still in_progress for Anthropic
    assert emu.client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    emu.advance(2.0)
    ended = emu.client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 5,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert ended.ended_at is not None and ended.ended_at > ended.created_at
    assert ended.results_url == f"{emu.url}/v1/messages/batches/{batch.id}/results"


def test_results_parse_into_the_sdks_types_with_messages_and_usage(emu: Emu) -> None:
    batch = emu.client.messages.batches.create(requests=[req("a"), req("b")])
    emu.advance()
    results = {r.custom_id: r.result for r in emu.client.messages.batches.results(batch.id)}
    assert set(results) == {"a", "b"}
    message = results["a"].message
    assert results["a"].type == "succeeded"
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text"
    assert '"invoice_number": "INV-1"' in message.content[0].text
    usage = message.usage
    system_tokens = count_tokens("You extract invoice fields.")
    user_tokens = message_tokens("Invoice No: INV-1 dated 2025-01-02 total $10.00")
    assert usage.input_tokens == system_tokens + user_tokens
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 0
    assert usage.service_tier == "batch"


def test_a_cache_control_prefix_is_written_once_then_read_and_short_prefixes_are_not_cached(emu: Emu) -> None:
    cached_system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    requests = [req(f"c{i}", system=cached_system) for i in range(4)]
    requests.append(req("plain", system=LONG_SYSTEM))  # a plain string system prompt is never cached
    requests.append(
        req("short", system=[{"type": "text", "text": "short", "cache_control": {"type": "ephemeral"}}])
    )
    batch = emu.client.messages.batches.create(requests=requests)
    emu.advance()
    usage = {r.custom_id: r.result.message.usage for r in emu.client.messages.batches.results(batch.id)}
    prefix = count_tokens(LONG_SYSTEM)
    cached = [usage[f"c{i}"] for i in range(4)]
    assert sorted(u.cache_creation_input_tokens for u in cached) == [0, 0, 0, prefix]
    assert sorted(u.cache_read_input_tokens for u in cached) == [0, prefix, prefix, prefix]
    assert all(
        u.input_tokens == message_tokens(requests[0]["params"]["messages"][0]["content"]) for u in cached
    )
    for name in ("plain", "short"):
        assert usage[name].cache_creation_input_tokens == usage[name].cache_read_input_tokens == 0


def test_item_faults_come_back_as_errored_results_in_anthropics_error_format(emu: Emu) -> None:
    emu.faults(rate_500=0.25, rate_429=0.25, rate_400=0.25, rate_context_length=0.25)
    batch = emu.client.messages.batches.create(requests=[req(f"f{i}") for i in range(40)])
    emu.advance()
    ended = emu.client.messages.batches.retrieve(batch.id)
    assert ended.request_counts.errored == 40
    results = list(emu.client.messages.batches.results(batch.id))
    assert {r.result.type for r in results} == {"errored"}
    kinds = {r.result.error.error.type for r in results}
    assert kinds == {"overloaded_error", "rate_limit_error", "invalid_request_error"}
    assert all(r.result.error.type == "error" and r.result.error.request_id for r in results)
    assert any("prompt is too long" in r.result.error.error.message for r in results)


def test_an_invalid_request_errors_alone_and_the_rest_of_the_batch_runs(emu: Emu) -> None:
    bad = req("bad")
    del bad["params"]["max_tokens"]
    batch = emu.client.messages.batches.create(requests=[bad, req("good")])
    emu.advance()
    results = {r.custom_id: r.result for r in emu.client.messages.batches.results(batch.id)}
    assert results["bad"].type == "errored"
    assert results["bad"].error.error.type == "invalid_request_error"
    assert "max_tokens" in results["bad"].error.error.message
    assert results["good"].type == "succeeded"


def test_an_expiring_batch_ends_with_expired_results_for_the_unfinished_requests(emu: Emu) -> None:
    emu.faults(expire_batches=[0], expire_after_fraction=0.3)
    batch = emu.client.messages.batches.create(requests=[req(f"e{i}") for i in range(10)])
    emu.advance()
    ended = emu.client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert (ended.request_counts.succeeded, ended.request_counts.expired) == (3, 7)
    types = sorted(r.result.type for r in emu.client.messages.batches.results(batch.id))
    assert types == ["expired"] * 7 + ["succeeded"] * 3


def test_cancel_moves_to_canceling_then_ended_with_canceled_results(emu: Emu) -> None:
    batch = emu.client.messages.batches.create(requests=[req(f"x{i}") for i in range(10)])
    emu.advance(4.5)  # a quarter of the work done
    canceling = emu.client.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None
    assert canceling.results_url is None
    emu.advance(2.0)
    ended = emu.client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert (ended.request_counts.succeeded, ended.request_counts.canceled) == (2, 8)
    types = sorted(r.result.type for r in emu.client.messages.batches.results(batch.id))
    assert types == ["canceled"] * 8 + ["succeeded"] * 2


def test_missing_duplicate_and_malformed_lines_are_written_as_configured(emu: Emu) -> None:
    emu.faults(rate_missing=0.2, rate_duplicate=0.2, rate_malformed=0.2)
    batch = emu.client.messages.batches.create(requests=[req(f"m{i}") for i in range(50)])
    emu.advance()
    assert emu.client.messages.batches.retrieve(batch.id).request_counts.succeeded == 50
    raw = httpx.get(f"{emu.url}/v1/messages/batches/{batch.id}/results").content.splitlines()
    parsed, broken = [], 0
    import json

    for line in raw:
        try:
            parsed.append(json.loads(line)["custom_id"])
        except ValueError:
            broken += 1
    assert broken > 0
    assert len(parsed) != len(set(parsed))  # duplicates
    assert len(set(parsed)) + broken < 50  # some are missing (a broken line's item counts too)


def test_results_of_a_running_batch_are_refused(emu: Emu) -> None:
    batch = emu.client.messages.batches.create(requests=[req("a")])
    response = httpx.get(f"{emu.url}/v1/messages/batches/{batch.id}/results")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_list_pages_newest_first_with_after_id_and_before_id(emu: Emu) -> None:
    ids = []
    for i in range(5):
        ids.append(emu.client.messages.batches.create(requests=[req(f"l{i}")]).id)
        emu.advance(1.0)
    newest_first = ids[::-1]
    assert [b.id for b in emu.client.messages.batches.list(limit=2)] == newest_first  # auto-pagination
    page = emu.client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more
    assert (page.first_id, page.last_id) == (newest_first[0], newest_first[1])
    after = emu.client.messages.batches.list(limit=2, after_id=newest_first[1])
    assert [b.id for b in after.data] == newest_first[2:4] and after.has_more
    before = emu.client.messages.batches.list(limit=2, before_id=newest_first[3])
    assert [b.id for b in before.data] == newest_first[1:3] and before.has_more
    first = emu.client.messages.batches.list(limit=5, before_id=newest_first[1])
    assert [b.id for b in first.data] == newest_first[:1] and not first.has_more


def test_create_refuses_bad_and_duplicate_custom_ids_and_unknown_batches_are_404(emu: Emu) -> None:
    with pytest.raises(anthropic.BadRequestError, match="pattern"):
        emu.client.messages.batches.create(requests=[req("has space")])
    with pytest.raises(anthropic.BadRequestError, match="duplicate"):
        emu.client.messages.batches.create(requests=[req("a"), req("a")])
    with pytest.raises(anthropic.BadRequestError, match="at least one"):
        emu.client.messages.batches.create(requests=[])
    with pytest.raises(anthropic.NotFoundError):
        emu.client.messages.batches.retrieve("msgbatch_nope")


def test_fail_validation_refuses_the_next_create_once(emu: Emu) -> None:
    emu.faults(fail_validation=1)
    with pytest.raises(anthropic.BadRequestError, match="fail_validation"):
        emu.client.messages.batches.create(requests=[req("a")])
    assert emu.client.messages.batches.create(requests=[req("a")]).processing_status == "in_progress"


def test_retrieve_can_answer_a_transient_api_error(emu: Emu) -> None:
    batch = emu.client.messages.batches.create(requests=[req("a")])
    emu.faults(retrieve_5xx_rate=1.0)
    with pytest.raises(anthropic.InternalServerError) as info:
        emu.client.messages.batches.retrieve(batch.id)
    assert info.value.body["error"]["type"] == "api_error"


def test_messages_answers_a_message_and_remembers_cache_prefixes(emu: Emu) -> None:
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "Invoice No: INV-9 total €12.00"}]
    first = emu.client.messages.create(
        model="claude-haiku-4-5", max_tokens=200, system=system, messages=messages
    )
    second = emu.client.messages.create(
        model="claude-haiku-4-5", max_tokens=200, system=system, messages=messages
    )
    assert first.usage.cache_creation_input_tokens == count_tokens(LONG_SYSTEM)
    assert second.usage.cache_read_input_tokens == count_tokens(LONG_SYSTEM)
    assert second.usage.service_tier == "standard"
    assert '"currency": "EUR"' in second.content[0].text


def test_messages_truncates_at_max_tokens_with_stop_reason_max_tokens(emu: Emu) -> None:
    reply = emu.client.messages.create(
        model="m", max_tokens=3, messages=[{"role": "user", "content": "A long first sentence here. More."}]
    )
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens <= 3


def test_messages_rate_limit_answers_429_with_retry_after_and_ratelimit_headers(emu: Emu) -> None:
    emu.faults(rpm_limit=1)
    ok = emu.client.messages.with_raw_response.create(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    assert ok.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert ok.headers["anthropic-ratelimit-requests-remaining"] == "0"
    with pytest.raises(anthropic.RateLimitError) as info:
        emu.client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "rate_limit_error"
    assert int(info.value.response.headers["retry-after"]) >= 1


def test_messages_injected_faults_use_429_and_529(emu: Emu) -> None:
    emu.faults(sync_429_rate=1.0, sync_retry_after_s=2)
    with pytest.raises(anthropic.RateLimitError) as rate:
        emu.client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert rate.value.response.headers["retry-after"] == "2"
    emu.faults(sync_429_rate=0.0, sync_500_rate=1.0)
    with pytest.raises(anthropic.APIStatusError) as over:
        emu.client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert over.value.status_code == 529
    assert over.value.body["error"]["type"] == "overloaded_error"


def test_messages_refuses_a_prompt_over_the_context_window(emu: Emu) -> None:
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        emu.client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "word " * 120_000}]
        )


def test_an_api_key_when_configured_is_checked_as_x_api_key_or_bearer_token() -> None:
    with run_emulator(EmulatorConfig(api_key="right")) as url:
        assert httpx.get(url + "/v1/messages/batches", headers={"x-api-key": "right"}).status_code == 200
        assert httpx.get(url + "/v1/messages/batches", headers={"x-api-key": "no"}).status_code == 401
        wrong = anthropic.Anthropic(api_key="wrong", base_url=url, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.batches.list()
        right = anthropic.Anthropic(api_key="right", base_url=url, max_retries=0)
        assert list(right.messages.batches.list()) == []


def test_the_prompt_digest_counts_system_blocks_and_finds_the_cache_breakpoint() -> None:
    prompt = MessagesPrompt(
        {
            "system": [
                {"type": "text", "text": "aaaa" * 10, "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "bbbb"},
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "cccc"}]}],
        }
    )
    assert prompt.prefix_tokens == 10
    assert prompt.prompt_tokens == 10 + 1 + message_tokens("cccc")
    assert prompt.user == "cccc"
    assert rfc3339(0) == "1970-01-01T00:00:00Z" and rfc3339(None) is None
