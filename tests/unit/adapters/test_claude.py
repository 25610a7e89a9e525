"""One Claude body for Anthropic and Bedrock: the same canonical request, the same Messages body."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from airflow_batch_provider.adapters.anthropic import AnthropicBatchAdapter
from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.bedrock import BedrockBatchAdapter
from airflow_batch_provider.adapters.claude import claude_result, claude_tool_choice, prompt_caching
from airflow_batch_provider.core.requests import CanonicalRequest
from tests.unit.adapters.tools import WEATHER

SCHEMA = {"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}
#: Requests that exercise every part of the body both providers share.
CASES: dict[str, dict[str, Any]] = {
    "plain": {"temperature": 0},
    "json_object": {"response_format": {"type": "json_object"}, "max_tokens": 60},
    "json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    },
    "stop_and_openai_knobs": {"stop": "END", "seed": 7, "max_completion_tokens": 50, "top_p": 0.5},
    "tools": {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
}


def request(model: str, **params: Any) -> CanonicalRequest:
    return CanonicalRequest(
        app_id="a",
        prompt_version="v1",
        model=model,
        system="You extract invoice fields.",
        messages=({"role": "user", "content": "Invoice INV-1 total $10.00"},),
        params=params,
    )


def anthropic_body(extra: dict[str, Any], **params: Any) -> dict[str, Any]:
    adapter = AnthropicBatchAdapter(AdapterSettings(api_key="k", extra=extra))
    return dict(json.loads(adapter.format_line(request("claude-haiku-4-5", **params), "a__a1c0"))["params"])


def bedrock_body(extra: dict[str, Any], **params: Any) -> dict[str, Any]:
    adapter = BedrockBatchAdapter(AdapterSettings(extra=extra))
    line = adapter.format_line(request("anthropic.claude-3-5-haiku-20241022-v1:0", **params), "a__a1c0")
    return dict(json.loads(line)["modelInput"])


@pytest.mark.parametrize("extra", [{}, {"prompt_caching": False}, {"json_output": "output_config"}])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_canonical_request_yields_the_same_claude_body_from_anthropic_and_bedrock(
    case: str, extra: dict[str, Any]
) -> None:
    ours = anthropic_body(extra, **CASES[case])
    theirs = bedrock_body(extra, **CASES[case])
    assert ours.pop("model") == "claude-haiku-4-5"
    assert theirs.pop("anthropic_version") == "bedrock-2023-05-31"
    assert ours == theirs


def test_a_prompt_moved_to_bedrock_keeps_its_json_output_mode() -> None:
    body = bedrock_body(
        {}, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    )
    (block,) = body["system"]
    assert "Answer with exactly one JSON object" in block["text"]
    assert json.dumps(SCHEMA, sort_keys=True, separators=(",", ":")) in block["text"]


def test_tools_in_any_providers_form_become_claudes_tools() -> None:
    body = anthropic_body({}, **CASES["tools"])
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "get_weather"}
    assert claude_tool_choice("required") == {"type": "any"}
    assert claude_tool_choice({"type": "any"}) == {"type": "any"}


def test_bedrock_drops_the_fields_only_anthropics_api_takes() -> None:
    body = bedrock_body({}, metadata={"user_id": "u"}, service_tier="auto")
    assert "metadata" not in body and "service_tier" not in body and "model" not in body


def test_the_old_bedrock_cache_setting_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(
        DeprecationWarning, match="'cache_system_prompt' is deprecated; name it 'prompt_caching'"
    ):
        assert prompt_caching({"cache_system_prompt": False}) is False
    with pytest.warns(DeprecationWarning):
        body = bedrock_body({"cache_system_prompt": False})
    assert "cache_control" not in body["system"][0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prompt_caching({"prompt_caching": "false", "cache_system_prompt": True}) is False
        assert prompt_caching({}) is True


def test_a_lone_tool_call_is_the_output_of_a_claude_message() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {"city": "Oslo"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 4},
    }
    result = claude_result("a", message)
    assert result.output == {"city": "Oslo"}
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.cached_input_tokens) == (
        10,
        3,
        4,
    )
