"""Gemini's request format (``adapters.gemini_format``): a canonical request as a REST ``GenerateContentRequest`` (its generation config, tools and tool choice)."""

from __future__ import annotations

import json

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.gemini import GeminiBatchAdapter, rest_request
from airflow_batch_provider.core.requests import CanonicalRequest
from tests.unit.adapters.tools import WEATHER

MODEL = "gemini-2.5-flash"
SYSTEM = "Classify the sentiment and topic of the customer comment. Answer as JSON."


def test_a_chat_line_is_a_keyed_generate_content_request_with_the_system_prompt_first() -> None:
    request = CanonicalRequest(
        app_id="a1",
        prompt_version="v1",
        model=MODEL,
        system=SYSTEM,
        messages=(
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": "classify this"},
        ),
        params={
            "max_tokens": 50,
            "temperature": 0.0,
            "stop": "END",
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
            "thinking_config": {"thinking_budget": 0},
        },
    )
    line = json.loads(GeminiBatchAdapter(AdapterSettings(api_key="k")).format_line(request, "cid-1"))
    assert line["key"] == "cid-1"
    body = line["request"]
    assert list(body)[:3] == ["model", "contents", "systemInstruction"]
    assert body["model"] == f"models/{MODEL}"
    assert body["systemInstruction"] == {"parts": [{"text": SYSTEM}]}
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][1]["parts"] == [{"text": "hi"}]
    assert body["generationConfig"] == {
        "maxOutputTokens": 50,
        "temperature": 0.0,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
        "thinkingConfig": {"thinking_budget": 0},
    }


def test_tools_become_function_declarations_and_tool_choice_a_function_calling_config() -> None:
    request = CanonicalRequest(
        "t1",
        "v1",
        "gemini-2.5-flash",
        messages=({"role": "user", "content": "weather in Oslo?"},),
        params={"tools": [WEATHER], "tool_choice": {"name": "get_weather"}, "temperature": 0},
    )
    body = rest_request(request)
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Weather of a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ]
        }
    ]
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert body["generationConfig"] == {"temperature": 0}
