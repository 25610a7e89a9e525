"""OpenAI request checks and answers (``batch_emulator.openai_bodies``), in real time and as batch lines, through the real ``openai`` SDK.

Every response the SDK receives is validated against the official OpenAPI description by the
``emulator_factory`` fixture; a test fails at exit when one does not conform.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from batch_emulator.model import cached_tokens, message_tokens

from .conftest import Emulator, EmulatorFactory, SpecChecker
from .helpers import LONG_SYSTEM, chat_line, finish

openai = pytest.importorskip("openai")

# -- context window ------------------------------------------------------------------------


def test_items_whose_prompt_exceeds_the_context_window_fail_on_their_own(
    emulator_factory: EmulatorFactory,
) -> None:
    with emulator_factory(context_window_tokens=200) as emu:
        lines = [chat_line("short", user="fine"), chat_line("long", user="x" * 4000)]
        batch = finish(emu, emu.create_batch(lines).id)
        errors = emu.lines(batch.error_file_id)
        assert [line["custom_id"] for line in errors] == ["long"]
        assert errors[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as exc:
            emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 4000}])
        assert exc.value.code == "context_length_exceeded"


# -- prompt caching ----------------------------------------------------------------------------


def test_a_shared_system_prompt_counts_as_cached_after_its_first_use(emu: Emulator) -> None:
    lines = [chat_line(f"c{i}", user=f"review {i}", system=LONG_SYSTEM) for i in range(6)]
    lines.append(chat_line("short", user="review", system="Classify sentiment."))
    batch = finish(emu, emu.create_batch(lines).id)
    out = emu.lines(batch.output_file_id)
    prefix = message_tokens(LONG_SYSTEM)
    assert prefix >= 1024
    cached = {
        line["custom_id"]: line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        for line in out
    }
    first_long = next(line["custom_id"] for line in out if line["custom_id"] != "short")
    assert cached.pop("short") == 0, "a prefix under 1024 tokens is never cached"
    assert cached.pop(first_long) == 0, "the first use of a prefix is not cached"
    assert set(cached.values()) == {prefix // 128 * 128}
    assert batch.usage.input_tokens_details.cached_tokens == 5 * (prefix // 128 * 128)
    assert cached_tokens(prefix, True) == prefix // 128 * 128


# -- synchronous endpoints ---------------------------------------------------------------------


def test_a_chat_completion_classifies_sentiment_and_reports_usage(emu: Emulator) -> None:
    messages = [
        {"role": "system", "content": "Return the sentiment and topic as JSON."},
        {"role": "user", "content": "The app keeps crashing after the update, terrible experience."},
    ]
    reply = emu.client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    answer = json.loads(reply.choices[0].message.content)
    assert answer["sentiment"] == "negative"
    assert answer["topic"] == "app_experience"
    assert 0.5 <= answer["confidence"] <= 0.99
    assert reply.choices[0].finish_reason == "stop"
    usage = reply.usage
    assert usage.prompt_tokens == sum(message_tokens(m["content"]) for m in messages)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_a_chat_completion_cut_at_max_tokens_ends_with_finish_reason_length(emu: Emulator) -> None:
    reply = emu.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "word " * 40}], max_completion_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens <= 3


def test_repeated_sync_requests_with_a_long_system_prompt_report_cached_tokens(emu: Emulator) -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "great service"}]
    first = emu.client.chat.completions.create(model="m", messages=messages)
    second = emu.client.chat.completions.create(model="m", messages=messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == message_tokens(LONG_SYSTEM) // 128 * 128


def test_embeddings_are_normalised_vectors_of_the_requested_dimension(emu: Emulator) -> None:
    default = emu.client.embeddings.create(
        model="text-embedding-3-small", input=["good parcel", "bad parcel"]
    )
    assert [len(d.embedding) for d in default.data] == [256, 256]  # the SDK asks for base64 and decodes it
    floats = emu.client.embeddings.create(
        model="e", input="good parcel", dimensions=32, encoding_format="float"
    )
    vector = floats.data[0].embedding
    assert len(vector) == 32
    assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-6)
    assert default.usage.prompt_tokens == default.usage.total_tokens == 6
    with pytest.raises(openai.BadRequestError):
        emu.client.embeddings.create(model="e", input=[])


# -- Responses API and moderations -----------------------------------------------------------

LABEL_SCHEMA = {
    "type": "object",
    "properties": {"sentiment": {"type": "string"}},
    "required": ["sentiment"],
    "additionalProperties": False,
}


def response_line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": "o4-mini",
            "instructions": "Label the sentiment.",
            "input": [{"role": "user", "content": f"review {i}: I love it"}],
            "text": {
                "format": {"type": "json_schema", "name": "label", "schema": LABEL_SCHEMA, "strict": True}
            },
            **body,
        },
    }


def test_a_responses_batch_answers_response_objects_with_reasoning_usage(
    emu: Emulator, spec: SpecChecker
) -> None:
    lines = [
        response_line(0),
        response_line(1, reasoning={"effort": "high"}),
        response_line(2, reasoning={"effort": "minimal"}),
    ]
    for line in lines:
        spec.validate("CreateResponse", line["body"])
    batch = finish(emu, emu.create_batch(lines, endpoint="/v1/responses").id)
    assert batch.status == "completed"
    bodies = {line["custom_id"]: line["response"]["body"] for line in emu.lines(batch.output_file_id)}
    for body in bodies.values():
        spec.validate("Response", body)
        (message,) = [item for item in body["output"] if item["type"] == "message"]
        assert json.loads(message["content"][0]["text"])["sentiment"] == "positive"
    reasoning = {cid: b["usage"]["output_tokens_details"]["reasoning_tokens"] for cid, b in bodies.items()}
    assert reasoning == {"r0": 64, "r1": 256, "r2": 0}
    assert all(
        b["usage"]["output_tokens"] > b["usage"]["output_tokens_details"]["reasoning_tokens"]
        for b in bodies.values()
    )
    assert batch.usage is not None and batch.usage.output_tokens_details.reasoning_tokens == 320


def test_the_same_responses_batch_answers_the_same_twice(emulator_factory: EmulatorFactory) -> None:
    answers = []
    for _ in range(2):
        with emulator_factory() as emu:
            batch = finish(
                emu, emu.create_batch([response_line(0), response_line(1)], endpoint="/v1/responses").id
            )
            answers.append(
                sorted(
                    json.dumps(line["response"]["body"]["output"]) for line in emu.lines(batch.output_file_id)
                )
            )
    assert answers[0] == answers[1]


def test_a_responses_line_with_chat_parameters_fails_on_its_own(emu: Emulator) -> None:
    bad = response_line(1, messages=[{"role": "user", "content": "x"}])
    batch = finish(emu, emu.create_batch([response_line(0), bad], endpoint="/v1/responses").id)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
    (error,) = emu.lines(batch.error_file_id)
    assert error["custom_id"] == "r1" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["code"] == "unknown_parameter"


def test_a_realtime_response_is_a_valid_response_object(emu: Emulator) -> None:
    body = response_line(0)["body"]
    answer = emu.client.responses.create(**body)
    assert answer.status == "completed"
    assert json.loads(answer.output_text)["sentiment"] == "positive"
    assert answer.usage is not None and answer.usage.output_tokens_details.reasoning_tokens == 64
    assert emu.checked.count("Response") == 1


def test_a_realtime_response_without_input_is_refused_with_an_error_response(emu: Emulator) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        emu.client.responses.create(model="o4-mini", input=[])
    assert caught.value.status_code == 400


def test_moderations_flag_by_word_deterministically_in_batch_and_in_real_time(
    emu: Emulator, spec: SpecChecker
) -> None:
    texts = {"m0": "I will attack you", "m1": "what lovely weather", "m2": "you idiot"}
    lines = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/moderations",
            "body": {"model": "omni-moderation-latest", "input": text},
        }
        for cid, text in texts.items()
    ]
    batch = finish(emu, emu.create_batch(lines, endpoint="/v1/moderations").id)
    out = {line["custom_id"]: line["response"]["body"] for line in emu.lines(batch.output_file_id)}
    for body in out.values():
        spec.validate("CreateModerationResponse", body)
    flagged = {cid: body["results"][0]["flagged"] for cid, body in out.items()}
    assert flagged == {"m0": True, "m1": False, "m2": True}
    assert out["m0"]["results"][0]["categories"]["violence"] is True
    assert out["m2"]["results"][0]["categories"]["harassment"] is True
    live = emu.client.moderations.create(model="omni-moderation-latest", input="I will attack you")
    assert (
        live.results[0].model_dump(by_alias=True)["category_scores"]
        == out["m0"]["results"][0]["category_scores"]
    )
