from __future__ import annotations

import pytest

from airflow_batch_provider.adapters.registry import retryable_errors
from airflow_batch_provider.core.results import (
    OUTCOMES,
    RETRYABLE_HTTP,
    ItemResult,
    MalformedLine,
    Usage,
    classify_http_error,
)


@pytest.mark.parametrize(
    ("status", "code", "outcome"),
    [
        # retryable HTTP statuses
        (408, None, "failed_retryable"),
        (409, None, "failed_retryable"),
        (429, None, "failed_retryable"),
        (500, None, "failed_retryable"),
        (502, None, "failed_retryable"),
        (503, None, "failed_retryable"),
        (504, None, "failed_retryable"),
        (529, None, "failed_retryable"),
        # permanent HTTP statuses
        (400, None, "failed_permanent"),
        (401, None, "failed_permanent"),
        (403, None, "failed_permanent"),
        (404, None, "failed_permanent"),
        (413, None, "failed_permanent"),
        (422, None, "failed_permanent"),
        (501, None, "failed_permanent"),
        (None, None, "failed_permanent"),
        (None, "invalid_request_error", "failed_permanent"),
        # retryable provider codes, whatever the status says
        (400, "rate_limit_exceeded", "failed_retryable"),
        (None, "server_error", "failed_retryable"),
        (None, "overloaded_error", "failed_retryable"),
        (None, "api_error", "failed_retryable"),
        (None, "rate_limit_error", "failed_retryable"),
        (None, "timeout", "failed_retryable"),
        (None, "internal_error", "failed_retryable"),
        # the batch ended before the item ran
        (None, "batch_expired", "expired"),
        (500, "batch_expired", "expired"),
        (None, "batch_cancelled", "cancelled"),
        (429, "batch_cancelled", "cancelled"),
        # a permanent code does not hide a retryable status
        (503, "invalid_request_error", "failed_retryable"),
        # every provider's own words for "try again later", from the one table
        (None, "timeout_error", "failed_retryable"),
        (400, "ThrottlingException", "failed_retryable"),
        (None, "ModelTimeoutException", "failed_retryable"),
        (None, "UNAVAILABLE", "failed_retryable"),
        (None, "RESOURCE_EXHAUSTED", "failed_retryable"),
        (None, "connection_error", "failed_retryable"),
        (400, "ValidationException", "failed_permanent"),
        (400, "INVALID_ARGUMENT", "failed_permanent"),
    ],
)
def test_http_errors_are_classified_as_retryable_or_permanent(
    status: int | None, code: str | None, outcome: str
) -> None:
    # core knows no provider: the words come from the adapters' declarations, through the registry
    assert classify_http_error(status, code, retryable_errors()) == outcome


def test_every_retryable_status_is_a_timeout_conflict_rate_limit_or_server_error() -> None:
    assert all(s in {408, 409, 429} or 500 <= s < 600 for s in RETRYABLE_HTTP)


def test_classification_only_returns_known_outcomes() -> None:
    for status in (None, 200, 400, 429, 500, 529):
        for code in (None, "batch_expired", "batch_cancelled", "timeout", "x"):
            assert classify_http_error(status, code) in OUTCOMES


def test_the_outcomes_are_those_of_the_design_plus_missing() -> None:
    assert set(OUTCOMES) == {
        "succeeded",
        "failed_retryable",
        "failed_permanent",
        "expired",
        "cancelled",
        "invalid_output",
        "missing",
    }


def test_usage_adds_field_by_field_and_totals_every_token() -> None:
    total = Usage(10, 2, 3, 4) + Usage(1, 1, 1, 1)
    assert total == Usage(input_tokens=11, output_tokens=3, cached_input_tokens=4, cache_write_tokens=5)
    assert total.total_tokens == 23
    assert Usage().total_tokens == 0


def test_an_item_result_defaults_to_no_usage_and_no_error() -> None:
    res = ItemResult("k__a1c0", "succeeded", output={"a": 1})
    assert res.usage == Usage()
    assert (res.error_code, res.error_message, res.raw) == (None, None, {})
    assert ItemResult("a", "missing").raw is not ItemResult("b", "missing").raw


def test_a_malformed_line_keeps_where_and_why() -> None:
    bad = MalformedLine(7, "not JSON", "{oops")
    assert (bad.line_number, bad.reason, bad.excerpt, bad.custom_id) == (7, "not JSON", "{oops", None)
