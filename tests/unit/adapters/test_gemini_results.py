"""Gemini's answers read as neutral values (``adapters.gemini_results``): batch states, error lines and success lines.

The batches behind them, driven through the SDK against the emulator, are in ``test_gemini.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.adapters.gemini_results import STATE_MAP, result_from_line, state_of

pytest.importorskip("google.genai")


@pytest.mark.parametrize("member", [m.value for m in __import__("google.genai.types").genai.types.JobState])
def test_every_job_state_of_the_sdk_maps_to_a_neutral_state_explicitly(member: str) -> None:
    suffix = member.removeprefix("JOB_STATE_")
    assert suffix in STATE_MAP
    assert state_of(member) == STATE_MAP[suffix]
    assert state_of(f"BATCH_STATE_{suffix}") == STATE_MAP[suffix]


@pytest.mark.parametrize(
    ("line", "outcome", "code"),
    [
        (
            {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}},
            "failed_retryable",
            "RESOURCE_EXHAUSTED",
        ),
        ({"error": {"code": 500, "message": "boom"}}, "failed_retryable", "500"),
        (
            {"error": {"code": 503, "message": "later", "status": "UNAVAILABLE"}},
            "failed_retryable",
            "UNAVAILABLE",
        ),
        (
            {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}},
            "failed_permanent",
            "INVALID_ARGUMENT",
        ),
        ({"error": {"code": 8, "message": "grpc quota"}}, "failed_retryable", "8"),
        ({"error": {"code": 3, "message": "grpc bad argument"}}, "failed_permanent", "3"),
        ({"status": {"code": 13, "message": "internal"}}, "failed_retryable", "13"),
        ({"status": "Bad Request: invalid JSON schema"}, "failed_permanent", "error"),
        ({"error": {"code": 499, "message": "x", "status": "CANCELLED"}}, "cancelled", "CANCELLED"),
        (
            {"error": {"code": 504, "message": "x", "status": "DEADLINE_EXCEEDED"}},
            "expired",
            "DEADLINE_EXCEEDED",
        ),
        ({"response": {"promptFeedback": {"blockReason": "SAFETY"}}}, "failed_permanent", "blocked:SAFETY"),
        ({"response": {"candidates": [{"finishReason": "SAFETY"}]}}, "failed_permanent", "finish:SAFETY"),
        ({"response": "not an object"}, "failed_retryable", "no_response"),
    ],
)
def test_every_error_line_shape_maps_to_an_outcome(line: dict[str, Any], outcome: str, code: str) -> None:
    result = result_from_line("k1", line)
    assert (result.outcome, result.error_code) == (outcome, code)


def test_a_success_line_keeps_text_without_thoughts_usage_with_cache_and_the_finish_reason() -> None:
    line = {
        "response": {
            "candidates": [
                {
                    "content": {"parts": [{"text": "thinking...", "thought": True}, {"text": '{"a": 1}'}]},
                    "finishReason": "MAX_TOKENS",
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 1200,
                "cachedContentTokenCount": 1024,
                "candidatesTokenCount": 7,
                "thoughtsTokenCount": 3,
            },
            "responseId": "r1",
        }
    }
    result = result_from_line("k", line)
    assert result.outcome == "succeeded"
    assert result.output == '{"a": 1}'
    assert (result.usage.input_tokens, result.usage.cached_input_tokens, result.usage.output_tokens) == (
        176,
        1024,
        10,
    )
    assert result.raw["finish_reason"] == "MAX_TOKENS"
    vector = result_from_line("k", {"response": {"embedding": {"values": [0.5, 0.5]}, "tokenCount": 4}})
    assert (vector.output, vector.usage.input_tokens) == ([0.5, 0.5], 4)
