"""The OpenAI adapter through the real `openai` SDK against the emulator over HTTP."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef, BatchStatus, InputRef
from airflow_batch_provider.adapters.openai import METADATA_KEY, OpenAIBatchAdapter
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import BatchInDoubtError, ConfigurationError
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

from .faults import FAST_CREATE, arm, batches

CHAT = CanonicalRequest(
    app_id="a1",
    prompt_version="v1",
    model="gpt-4o-mini",
    system="You label sentiment.",
    messages=({"role": "user", "content": "I love it"},),
    params={"max_tokens": 20},
)
EMBED = CanonicalRequest(
    app_id="e1",
    prompt_version="v1",
    model="text-embedding-3-small",
    kind="embedding",
    messages=({"role": "user", "content": "hello world"},),
)


@pytest.fixture
def emulator() -> Iterator[str]:
    with run_emulator(EmulatorConfig(time_scale=0.02)) as url:
        yield url


def adapter_for(url: str, **extra: object) -> OpenAIBatchAdapter:
    return OpenAIBatchAdapter(AdapterSettings(api_key="sk-test", base_url=f"{url}/v1", extra=extra))


def stats(url: str) -> dict[str, object]:
    return dict(httpx.get(f"{url}/_emulator/stats").json())


def advance(url: str, seconds: float) -> float:
    answer = httpx.post(f"{url}/_emulator/clock", json={"advance_s": seconds})
    answer.raise_for_status()
    return float(answer.json()["now"])


def stage_lines(adapter: OpenAIBatchAdapter, requests: list[CanonicalRequest], name: str) -> InputRef:
    data = b"".join(adapter.format_line(r, f"{r.app_id}__a1c0") + b"\n" for r in requests)
    return adapter.stage(io.BytesIO(data), name, len(data))


def test_the_limits_are_openais_documented_ones() -> None:
    limits = OpenAIBatchAdapter.limits
    assert (limits.max_requests, limits.max_bytes) == (50_000, 200 * 1024 * 1024)
    assert limits.usable_bytes < limits.max_bytes


def test_a_chat_line_puts_the_shared_system_prompt_first() -> None:
    line = json.loads(adapter_for("http://x").format_line(CHAT, "a1__a1c0"))
    assert line["custom_id"] == "a1__a1c0"
    assert (line["method"], line["url"]) == ("POST", "/v1/chat/completions")
    assert line["body"]["messages"][0] == {"role": "system", "content": "You label sentiment."}
    assert line["body"]["max_tokens"] == 20


def test_an_embedding_line_targets_the_embeddings_endpoint() -> None:
    line = json.loads(adapter_for("http://x").format_line(EMBED, "e1__a1c0"))
    assert line["url"] == "/v1/embeddings"
    assert line["body"] == {"model": "text-embedding-3-small", "input": "hello world"}


def test_azure_lines_use_the_deployment_relative_url() -> None:
    azure = OpenAIBatchAdapter(AdapterSettings("k", "https://x.openai.azure.com", {"api_type": "azure"}))
    assert json.loads(azure.format_line(CHAT, "a1__a1c0"))["url"] == "/chat/completions"


def test_a_second_upload_of_the_same_chunk_reuses_the_file(emulator: str) -> None:
    adapter = adapter_for(emulator)
    first = stage_lines(adapter, [CHAT], "abp-key1.jsonl")
    second = stage_lines(adapter, [CHAT], "abp-key1.jsonl")
    assert first == second
    assert stats(emulator)["files_uploaded"] == 1


def test_submitting_twice_with_one_key_creates_one_batch(emulator: str) -> None:
    adapter = adapter_for(emulator)
    ref = stage_lines(adapter, [CHAT], "abp-key2.jsonl")
    first = adapter.submit(ref, "abp-key2", {"workload": "w"})
    second = adapter.submit(ref, "abp-key2", {"workload": "w"})
    assert first == second
    assert adapter.find("abp-key2") == first
    assert adapter.find("abp-unknown") is None
    assert stats(emulator)["batches_created"] == 1


def test_status_walks_through_the_lifecycle_to_completed_with_counts(emulator: str) -> None:
    adapter = adapter_for(emulator)
    ref = adapter.submit(
        stage_lines(adapter, [CHAT, replace(CHAT, app_id="a2")], "k3.jsonl"),
        "k3",
        {},
    )
    seen = {adapter.status(ref).state}
    for _ in range(40):
        advance(emulator, 0.05)
        status = adapter.status(ref)
        seen.add(status.state)
        if status.terminal:
            break
    assert status.state == "completed" and status.terminal
    assert (status.total, status.completed, status.failed) == (2, 2, 0)
    assert {"validating", "completed"} <= seen


def test_results_stream_from_the_output_file_with_usage(emulator: str) -> None:
    adapter = adapter_for(emulator)
    ref = adapter.submit(stage_lines(adapter, [CHAT], "k4.jsonl"), "k4", {})
    advance(emulator, 60)
    assert adapter.status(ref).state == "completed"
    results = list(adapter.iter_results(ref))
    assert len(results) == 1
    (res,) = results
    assert isinstance(res, ItemResult) and res.outcome == "succeeded"
    assert res.custom_id == "a1__a1c0"
    assert res.usage.input_tokens > 0 and res.usage.output_tokens > 0


def test_a_failed_validation_reports_the_providers_reason(emulator: str) -> None:
    httpx.put(f"{emulator}/_emulator/config", json={"faults": {"fail_validation": 1}}).raise_for_status()
    adapter = adapter_for(emulator)
    ref = adapter.submit(stage_lines(adapter, [CHAT], "k5.jsonl"), "k5", {})
    advance(emulator, 60)
    status = adapter.status(ref)
    assert status.state == "failed" and status.reason


def test_cancel_ends_the_batch_cancelled(emulator: str) -> None:
    adapter = adapter_for(emulator)
    ref = adapter.submit(stage_lines(adapter, [CHAT], "k6.jsonl"), "k6", {})
    adapter.cancel(ref)
    assert adapter.status(ref).state in {"cancelling", "cancelled"}
    advance(emulator, 60)
    assert adapter.status(ref).state == "cancelled"


async def test_the_async_client_reads_the_same_status_in_flight_and_at_the_end() -> None:
    """Its own slow emulator (``validating`` lasts 200 s of real time): the two reads of an
    in-flight batch cannot straddle a phase change, however loaded the machine is."""
    with run_emulator(EmulatorConfig(time_scale=100)) as slow:
        adapter = adapter_for(slow)
        ref = adapter.submit(stage_lines(adapter, [CHAT], "k7.jsonl"), "k7", {})
        client = adapter.async_client()
        try:
            in_flight = await client.status(ref)
            assert in_flight == adapter.status(ref) and in_flight.state == "validating"
            advance(slow, 2_000)  # past validating, in_progress and finalizing (1,400 s here)
            done = await client.status(ref)
        finally:
            await client.close()
        assert done == adapter.status(ref) and done.state == "completed" and done.completed == 1


def test_every_result_line_shape_maps_to_a_neutral_outcome() -> None:
    lines = [
        {
            "custom_id": "ok__a1c0",
            "response": {
                "status_code": 200,
                "body": {
                    "object": "chat.completion",
                    "choices": [{"message": {"content": '{"x": 1}'}, "finish_reason": "stop"}],
                    "usage": {
                        "prompt_tokens": 1100,
                        "completion_tokens": 5,
                        "prompt_tokens_details": {"cached_tokens": 1024},
                    },
                },
            },
            "error": None,
        },
        {
            "custom_id": "emb__a1c0",
            "response": {
                "status_code": 200,
                "body": {
                    "object": "list",
                    "data": [{"embedding": [0.1, 0.2]}],
                    "usage": {"prompt_tokens": 3},
                },
            },
            "error": None,
        },
        {
            "custom_id": "r429__a1c0",
            "response": {
                "status_code": 429,
                "body": {"error": {"code": "rate_limit_exceeded", "message": "slow down"}},
            },
            "error": None,
        },
        {
            "custom_id": "r500__a1c0",
            "response": {"status_code": 500, "body": {"error": {"type": "server_error", "message": "oops"}}},
            "error": None,
        },
        {
            "custom_id": "ctx__a1c0",
            "response": {
                "status_code": 400,
                "body": {"error": {"code": "context_length_exceeded", "message": "too long"}},
            },
            "error": None,
        },
        {
            "custom_id": "exp__a1c0",
            "response": None,
            "error": {"code": "batch_expired", "message": "expired"},
        },
        {
            "custom_id": "can__a1c0",
            "response": None,
            "error": {"code": "batch_cancelled", "message": "cancelled"},
        },
    ]
    data = (
        b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        + b'{"custom_id": "broken__a1c0", "resp\n'
    )
    parsed = list(adapter_for("http://x").parse_results(io.BytesIO(data)))
    outcomes = {p.custom_id: p.outcome for p in parsed if isinstance(p, ItemResult)}
    assert outcomes == {
        "ok__a1c0": "succeeded",
        "emb__a1c0": "succeeded",
        "r429__a1c0": "failed_retryable",
        "r500__a1c0": "failed_retryable",
        "ctx__a1c0": "failed_permanent",
        "exp__a1c0": "expired",
        "can__a1c0": "cancelled",
    }
    ok = next(p for p in parsed if isinstance(p, ItemResult) and p.custom_id == "ok__a1c0")
    assert (ok.usage.input_tokens, ok.usage.cached_input_tokens, ok.usage.output_tokens) == (76, 1024, 5)
    emb = next(p for p in parsed if isinstance(p, ItemResult) and p.custom_id == "emb__a1c0")
    assert emb.output == [0.1, 0.2]
    (bad,) = [p for p in parsed if isinstance(p, MalformedLine)]
    assert bad.line_number == 8


def test_a_batch_ref_survives_a_round_trip_through_xcom() -> None:
    ref = BatchRef("openai", "batch_1", "abp-k")
    assert BatchRef.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref


AFTER_FAULTS = ["500_after", "drop_after", "slow_after"]


@pytest.mark.parametrize("fault", AFTER_FAULTS)
def test_a_lost_create_reply_is_found_by_its_key_and_not_created_again(emulator: str, fault: str) -> None:
    adapter = adapter_for(emulator, **FAST_CREATE)
    staged = stage_lines(adapter, [CHAT], "lost-create.jsonl")
    arm(emulator, f"create:{fault}")
    ref = adapter.submit(staged, "lost-create", {})
    (batch,) = batches(emulator, "openai")
    assert ref.batch_id == batch["id"]
    assert batch["keys"]["metadata"][METADATA_KEY] == "lost-create"


@pytest.mark.parametrize("fault", AFTER_FAULTS)
def test_a_lost_upload_reply_is_found_by_name_and_not_uploaded_again(emulator: str, fault: str) -> None:
    adapter = adapter_for(emulator, **FAST_CREATE)
    arm(emulator, f"upload:{fault}")
    ref = stage_lines(adapter, [CHAT], "lost-upload.jsonl")
    files = httpx.get(f"{emulator}/v1/files").json()["data"]
    assert [f["id"] for f in files] == [ref.value]


def test_a_create_refused_with_429_before_acting_is_sent_again(emulator: str) -> None:
    adapter = adapter_for(emulator, **FAST_CREATE)
    staged = stage_lines(adapter, [CHAT], "refused.jsonl")
    arm(emulator, "create:429", "create:429", create_retry_after_s=0)
    ref = adapter.submit(staged, "refused", {})
    assert [b["id"] for b in batches(emulator, "openai")] == [ref.batch_id]
    assert stats(emulator)["counters"]["openai.create_faults.429"] == 2  # type: ignore[index]


def test_a_create_that_fails_ambiguously_on_every_try_ends_in_doubt_not_in_a_batch(emulator: str) -> None:
    adapter = adapter_for(emulator, create_attempts=2, **FAST_CREATE)
    staged = stage_lines(adapter, [CHAT], "doubt.jsonl")
    arm(emulator, "create:500", "create:500")
    with pytest.raises(BatchInDoubtError, match="job doubt is in doubt") as caught:
        adapter.submit(staged, "doubt", {})
    assert caught.value.key == "doubt"
    assert batches(emulator, "openai") == []
    assert adapter.resolve_in_doubt("doubt", caught.value.created_after, 1) is None


def test_a_create_refused_as_invalid_is_raised_at_once_and_never_looked_up(emulator: str) -> None:
    import openai

    adapter = adapter_for(emulator, **FAST_CREATE)
    with pytest.raises(openai.NotFoundError):
        adapter.submit(InputRef("file", "file-missing"), "bad", {})
    assert stats(emulator)["counters"].get("openai.create_calls") == 1  # type: ignore[attr-defined]


def test_find_pages_past_the_newest_thousand_batches(emulator: str) -> None:
    adapter = adapter_for(emulator)
    staged = stage_lines(adapter, [CHAT], "old.jsonl")
    ref = adapter.submit(staged, "old", {})
    body = {"input_file_id": staged.value, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    with httpx.Client(base_url=emulator) as http:
        for _ in range(1_000):
            http.post("/v1/batches", json=body).raise_for_status()
    assert adapter.find("old") == ref


def test_find_stops_at_batches_created_before_the_intent(emulator: str) -> None:
    adapter = adapter_for(emulator, find_clock_skew_s=60)
    ref = adapter.submit(stage_lines(adapter, [CHAT], "earlier.jsonl"), "earlier", {})
    now = advance(emulator, 86_400)
    intent = datetime.fromtimestamp(now, timezone.utc)
    assert adapter.find("earlier", created_after=intent) is None
    assert adapter.find("earlier", created_after=intent - timedelta(days=2)) == ref
    assert adapter.resolve_in_doubt("earlier", intent - timedelta(days=2), 1) == ref


def test_a_batch_over_the_enqueued_token_limit_ends_failed_with_its_code(emulator: str) -> None:
    arm(emulator, fail_token_limit=1)
    adapter = adapter_for(emulator)
    ref = adapter.submit(stage_lines(adapter, [CHAT], "tokens.jsonl"), "tokens", {})
    advance(emulator, 60)
    status = adapter.status(ref)
    assert (status.state, status.error_code) == ("failed", "token_limit_exceeded")
    assert status.error_message and "Enqueued token limit reached for gpt-4o-mini" in status.error_message
    assert BatchStatus.from_dict(status.to_dict()) == status


def test_a_completed_batch_has_no_error_code(emulator: str) -> None:
    adapter = adapter_for(emulator)
    ref = adapter.submit(stage_lines(adapter, [CHAT], "fine.jsonl"), "fine", {})
    advance(emulator, 60)
    assert adapter.status(ref).error_code is None


async def test_a_realtime_answer_is_in_the_emulators_record_under_its_custom_id(emulator: str) -> None:
    client = adapter_for(emulator).realtime_client()
    try:
        reply = await client.complete(CHAT, "a1__a1c0")
    finally:
        await client.close()
    (answer,) = httpx.get(f"{emulator}/_emulator/record").json()["realtime"]["openai"]
    assert answer["custom_id"] == "a1__a1c0"
    assert answer["usage"]["output_tokens"] == reply.result.usage.output_tokens


class OneWay(io.RawIOBase):
    """A stream that reads once, front to back, like an object-store download."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_an_upload_refused_once_is_sent_again_whole_from_a_one_way_stream(emulator: str) -> None:
    adapter = adapter_for(emulator, **FAST_CREATE)
    data = adapter.format_line(CHAT, "a1__a1c0") + b"\n"
    arm(emulator, "upload:429", create_retry_after_s=0)
    ref = adapter.stage(io.BufferedReader(OneWay(data)), "one-way.jsonl", len(data))
    (upload,) = httpx.get(f"{emulator}/v1/files").json()["data"]
    assert (upload["id"], upload["bytes"]) == (ref.value, len(data))


# -- request kinds: Responses API, moderations, tools --------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"sentiment": {"type": "string"}},
    "required": ["sentiment"],
    "additionalProperties": False,
}
RESPONSE = CanonicalRequest(
    app_id="r1",
    prompt_version="v1",
    model="o4-mini",
    kind="response",
    system="You label sentiment.",
    messages=({"role": "user", "content": "I love it"},),
    params={
        "max_tokens": 300,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "label", "schema": SCHEMA, "strict": True},
        },
    },
)
MODERATION = CanonicalRequest(
    app_id="m1",
    prompt_version="v1",
    model="omni-moderation-latest",
    kind="moderation",
    messages=({"role": "user", "content": "I will attack you"},),
)
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def spec_errors(schema: str, instance: Any) -> list[str]:
    from tests.unit.batch_emulator.conftest import SpecChecker, bundled_components

    return SpecChecker(bundled_components()).errors(schema, instance)


def test_the_adapter_accepts_every_openai_kind() -> None:
    assert OpenAIBatchAdapter.kinds == {"chat", "embedding", "response", "moderation"}


def test_a_response_line_targets_the_responses_endpoint_with_text_format_and_reasoning() -> None:
    line = json.loads(adapter_for("http://x").format_line(RESPONSE, "r1__a1c0"))
    assert line["url"] == "/v1/responses"
    body = line["body"]
    assert body == {
        "model": "o4-mini",
        "instructions": "You label sentiment.",
        "input": [{"role": "user", "content": "I love it"}],
        "max_output_tokens": 300,
        "text": {"format": {"type": "json_schema", "name": "label", "schema": SCHEMA, "strict": True}},
        "reasoning": {"effort": "low"},
    }
    assert spec_errors("CreateResponse", body) == []


def test_a_response_request_naming_a_chat_only_parameter_is_refused_not_silently_dropped() -> None:
    with pytest.raises(ConfigurationError, match=r"refuses: \['seed', 'stop'\]"):
        adapter_for("http://x").format_line(replace(RESPONSE, params={"stop": "x", "seed": 1}), "r1__a1c0")


def test_a_moderation_line_targets_the_moderations_endpoint() -> None:
    line = json.loads(adapter_for("http://x").format_line(MODERATION, "m1__a1c0"))
    assert line["url"] == "/v1/moderations"
    assert line["body"] == {"model": "omni-moderation-latest", "input": "I will attack you"}
    assert spec_errors("CreateModerationRequest", line["body"]) == []


def test_tools_take_the_chat_form_and_the_responses_form() -> None:
    adapter = adapter_for("http://x")
    chat = replace(CHAT, params={"tools": [WEATHER], "tool_choice": {"name": "get_weather"}})
    body = json.loads(adapter.format_line(chat, "a1__a1c0"))["body"]
    assert body["tools"] == [{"type": "function", "function": WEATHER}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    anthropic_form = {
        "name": "get_weather",
        "description": "Weather of a city",
        "input_schema": WEATHER["parameters"],
    }
    response = replace(RESPONSE, params={"tools": [anthropic_form], "tool_choice": "required"})
    body = json.loads(adapter.format_line(response, "r1__a1c0"))["body"]
    assert body["tools"] == [{"type": "function", **WEATHER, "strict": None}]
    assert body["tool_choice"] == "required"
    assert spec_errors("CreateResponse", body) == []


def test_a_response_batch_yields_the_structured_output_and_its_reasoning_tokens(emulator: str) -> None:
    adapter = adapter_for(emulator)
    requests = [RESPONSE, replace(RESPONSE, app_id="r2", messages=({"role": "user", "content": "awful"},))]
    ref = adapter.submit(stage_lines(adapter, requests, "kr.jsonl"), "kr", {}, kind="response")
    advance(emulator, 60)
    assert adapter.status(ref).state == "completed"
    results = sorted(adapter.iter_results(ref), key=lambda r: r.custom_id)
    assert [r.outcome for r in results if isinstance(r, ItemResult)] == ["succeeded", "succeeded"]
    first = results[0]
    assert isinstance(first, ItemResult)
    assert json.loads(first.output)["sentiment"] == "positive"
    assert first.usage.reasoning_tokens == 16
    assert first.usage.output_tokens > first.usage.reasoning_tokens


def test_a_moderation_batch_yields_the_classification(emulator: str) -> None:
    adapter = adapter_for(emulator)
    calm = replace(MODERATION, app_id="m2", messages=({"role": "user", "content": "lovely weather"},))
    ref = adapter.submit(stage_lines(adapter, [MODERATION, calm], "km.jsonl"), "km", {}, kind="moderation")
    advance(emulator, 60)
    results = {r.custom_id: r for r in adapter.iter_results(ref) if isinstance(r, ItemResult)}
    assert results["m1__a1c0"].output["flagged"] is True
    assert results["m1__a1c0"].output["categories"]["violence"] is True
    assert results["m2__a1c0"].output["flagged"] is False


async def test_response_and_moderation_requests_run_on_the_realtime_api(emulator: str) -> None:
    client = adapter_for(emulator).realtime_client()
    try:
        response = await client.complete(RESPONSE, "r1__a1c0")
        moderation = await client.complete(MODERATION, "m1__a1c0")
    finally:
        await client.close()
    assert response.result.outcome == "succeeded"
    assert json.loads(response.result.output) == {"sentiment": "positive"} or "sentiment" in json.loads(
        response.result.output
    )
    assert response.result.usage.reasoning_tokens == 16
    assert moderation.result.outcome == "succeeded" and moderation.result.output["flagged"] is True
    record = httpx.get(f"{emulator}/_emulator/record").json()["realtime"]["openai"]
    assert {a["custom_id"] for a in record} == {"r1__a1c0", "m1__a1c0"}


def test_a_failed_response_and_a_tool_call_map_to_neutral_results() -> None:
    failed = {
        "custom_id": "r1",
        "response": {
            "status_code": 200,
            "request_id": "req",
            "body": {
                "object": "response",
                "status": "failed",
                "error": {"code": "server_error", "message": "x"},
            },
        },
    }
    (res,) = adapter_for("http://x").parse_results(io.BytesIO(json.dumps(failed).encode()))
    assert isinstance(res, ItemResult) and (res.outcome, res.error_code) == (
        "failed_retryable",
        "server_error",
    )
    call = {
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Oslo"}', "call_id": "c"}
        ],
        "usage": {"input_tokens": 5, "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 3}},
    }
    line = {"custom_id": "r2", "response": {"status_code": 200, "request_id": "q", "body": call}}
    (res,) = adapter_for("http://x").parse_results(io.BytesIO(json.dumps(line).encode()))
    assert isinstance(res, ItemResult) and res.output == {"city": "Oslo"}
    assert (res.usage.output_tokens, res.usage.reasoning_tokens) == (7, 3)
