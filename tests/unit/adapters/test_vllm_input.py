"""The engine's input rules: a line ``vllm run-batch`` would refuse is named before a pod starts.

The same cases run against the engine's own pydantic models in ``tests/vllm_engine``.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.adapters.vllm_input import engine_refusal, served_endpoint, unserved_reason

CHAT: dict[str, Any] = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]}}  # fmt: skip
EMBED: dict[str, Any] = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": "m", "input": "x"}}  # fmt: skip


def with_body(line: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {**line, "body": {**line["body"], **body}}


#: (line, the field path the engine names; None: the engine accepts it)
CASES: list[tuple[dict[str, Any], str | None]] = [
    (CHAT, None),
    (EMBED, None),
    (with_body(CHAT, max_tokens="8", temperature="0.5", stream=False), None),  # lax JSON mode
    (with_body(CHAT, max_tokens=True), None),
    (with_body(CHAT, response_format={"type": "json_object"}), None),
    (with_body(EMBED, input=["a", "b"]), None),
    (with_body(EMBED, input=[1, 2, 3]), None),
    (with_body(CHAT, messages="not a list"), "body.messages"),
    (with_body(CHAT, messages=[{"content": "x"}]), "body.messages.0.role"),
    (with_body(CHAT, max_tokens="x"), "body.max_tokens"),
    (with_body(CHAT, max_tokens=2.5), "body.max_tokens"),
    (with_body(CHAT, temperature="hot"), "body.temperature"),
    (with_body(EMBED, input={"x": 1}), "body.input"),
    ({**EMBED, "custom_id": 1}, "custom_id"),
    ({k: v for k, v in CHAT.items() if k != "method"}, "method"),
    ({**CHAT, "body": "text"}, "body"),
]


@pytest.mark.parametrize(("line", "loc"), CASES)
def test_a_line_is_refused_exactly_where_the_engine_refuses_it_naming_the_field(
    line: dict[str, Any], loc: str | None
) -> None:
    refusal = engine_refusal(line)
    if loc is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal.splitlines()[1] == loc
        assert refusal.startswith("1 validation error for BatchRequestInput")


def test_the_served_endpoints_are_the_engine_s_and_an_unserved_one_gets_its_400_words() -> None:
    for url in ("/v1/chat/completions", "/v1/embeddings", "/v1/score", "/rerank", "/v1/audio/transcriptions"):
        assert served_endpoint(url)
    for url in ("/v1/responses", "/v1/completions", "/v1/moderations"):
        assert not served_endpoint(url)
    reason = unserved_reason({**CHAT, "url": "/v1/responses"})
    assert reason is not None and reason.startswith("URL /v1/responses was used. Supported endpoints:")
    assert unserved_reason(CHAT) is None
