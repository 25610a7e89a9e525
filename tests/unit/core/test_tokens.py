from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.tokens import (
    DEFAULT_MAX_OUTPUT,
    MESSAGE_OVERHEAD,
    NON_TEXT_PART_TOKENS,
    REPLY_PRIMING,
    TokenEstimate,
    estimate_request_tokens,
    estimate_text_tokens,
    max_output_tokens,
)


def chat(user: Any = "x" * 40, system: str | None = None, **params: Any) -> CanonicalRequest:
    return CanonicalRequest(
        app_id="a1",
        prompt_version="v1",
        model="gpt-4o-mini",
        system=system,
        messages=({"role": "user", "content": user},),
        params=params,
    )


def test_text_costs_one_token_per_four_bytes_rounded_up() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abcd") == 1
    assert estimate_text_tokens("abcde") == 2
    assert estimate_text_tokens("x" * 4000) == 1000


def test_non_latin_text_is_counted_by_utf8_bytes_so_the_estimate_errs_high() -> None:
    assert estimate_text_tokens("日本語のテキスト") == 6  # 8 characters, 24 bytes


def test_a_chat_request_counts_text_plus_per_message_overhead() -> None:
    estimate = estimate_request_tokens(chat(user="x" * 40, system="s" * 400, max_tokens=60))
    system = 100 + MESSAGE_OVERHEAD
    assert estimate == TokenEstimate(
        input=system + REPLY_PRIMING + MESSAGE_OVERHEAD + 10, max_output=60, cacheable=system
    )


def test_the_estimate_is_deterministic_and_grows_with_the_prompt() -> None:
    short, long = chat(user="x" * 40), chat(user="x" * 4000)
    assert estimate_request_tokens(short) == estimate_request_tokens(short)
    assert estimate_request_tokens(long).input - estimate_request_tokens(short).input == 990


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"max_tokens": 60}, 60),
        ({"max_completion_tokens": 200}, 200),
        ({"max_output_tokens": 300}, 300),
        ({"max_tokens": 10, "max_completion_tokens": 20}, 10),
        ({}, DEFAULT_MAX_OUTPUT),
        ({"max_tokens": True}, DEFAULT_MAX_OUTPUT),
        ({"max_tokens": "60"}, DEFAULT_MAX_OUTPUT),
    ],
)
def test_max_output_comes_from_the_first_max_tokens_param_or_the_default(
    params: dict[str, Any], expected: int
) -> None:
    assert max_output_tokens(params) == expected
    assert estimate_request_tokens(chat(**params)).max_output == expected


def test_a_response_schema_counts_as_input() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert estimate_request_tokens(chat(response_format=schema)).input > estimate_request_tokens(chat()).input


def test_content_parts_count_their_text_and_a_fixed_amount_per_image() -> None:
    parts = [{"type": "text", "text": "x" * 8}, {"type": "image_url", "image_url": {"url": "data:..."}}]
    as_parts = estimate_request_tokens(chat(user=parts)).input
    as_text = estimate_request_tokens(chat(user="x" * 8)).input
    assert as_parts == as_text + NON_TEXT_PART_TOKENS


def test_an_embedding_counts_its_text_only_and_has_no_output() -> None:
    request = CanonicalRequest(
        app_id="e1",
        prompt_version="v1",
        model="text-embedding-3-small",
        kind="embedding",
        messages=({"role": "user", "content": "x" * 80},),
        params={"max_tokens": 50},
    )
    assert estimate_request_tokens(request) == TokenEstimate(input=20, max_output=0, cacheable=0)


def test_estimates_add_up() -> None:
    assert TokenEstimate(1, 2, 3) + TokenEstimate(10, 20, 30) == TokenEstimate(11, 22, 33)


def test_a_moderation_request_reserves_no_output_tokens() -> None:
    from airflow_batch_provider.core.requests import CanonicalRequest
    from airflow_batch_provider.core.tokens import estimate_request_tokens

    request = CanonicalRequest.from_dict(
        {
            "app_id": "m1",
            "prompt_version": "v1",
            "model": "omni-moderation-latest",
            "kind": "moderation",
            "messages": [{"role": "user", "content": "a text to check"}],
        }
    )
    estimate = estimate_request_tokens(request)
    assert estimate.max_output == 0 and estimate.input > 0
