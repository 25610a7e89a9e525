from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.core.validation import check_output

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["sentiment", "confidence"],
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
}


def ok(output: Any) -> ItemResult:
    return ItemResult("k__a1c0", "succeeded", output=output, usage=Usage(5, 3), raw={"finish": "stop"})


def test_text_output_passes_unchanged() -> None:
    res = ok("any text, even {not json")
    assert check_output(res, "text") is res


@pytest.mark.parametrize(
    "outcome", ["failed_retryable", "failed_permanent", "expired", "cancelled", "missing"]
)
def test_a_result_that_did_not_succeed_passes_through_untouched(outcome: str) -> None:
    res = ItemResult("k__a1c0", outcome, output="garbage")  # type: ignore[arg-type]
    assert check_output(res, "json", SCHEMA) is res


def test_a_json_string_is_parsed_into_an_object() -> None:
    res = check_output(ok('{"sentiment": "positive", "confidence": 0.9}'), "json", SCHEMA)
    assert res.outcome == "succeeded"
    assert res.output == {"sentiment": "positive", "confidence": 0.9}
    assert res.usage == Usage(5, 3)


def test_an_already_parsed_object_is_validated_as_it_is() -> None:
    res = check_output(ok({"sentiment": "neutral", "confidence": 0}), "json", SCHEMA)
    assert res.outcome == "succeeded"


def test_json_without_a_schema_only_has_to_parse() -> None:
    assert check_output(ok("[1, 2]"), "json").output == [1, 2]


def test_output_that_is_not_json_is_invalid_with_the_parser_message() -> None:
    res = check_output(ok("Sure! Here is the JSON: {"), "json", SCHEMA)
    assert res.outcome == "invalid_output"
    assert res.error_code == "invalid_output"
    assert res.error_message is not None
    assert res.error_message.startswith("output is not JSON (Expecting value at char 0)")
    # the discarded output is kept for review, and the usage is kept: it was paid for
    assert res.raw == {"finish": "stop", "discarded_output": "Sure! Here is the JSON: {"}
    assert res.usage == Usage(5, 3)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ({"sentiment": "angry", "confidence": 0.5}, "at sentiment: 'angry' is not one of"),
        ({"sentiment": "positive", "confidence": 2}, "at confidence: 2 is greater than the maximum of 1"),
        ({"sentiment": "positive"}, "at (root): 'confidence' is a required property"),
        (
            {"sentiment": "positive", "confidence": 1, "x": 1},
            "at (root): Additional properties are not allowed",
        ),
        ('"just a string"', "at (root): 'just a string' is not of type 'object'"),
    ],
)
def test_json_that_breaks_the_schema_is_invalid_naming_where_and_why(output: Any, message: str) -> None:
    res = check_output(ok(output), "json", SCHEMA)
    assert res.outcome == "invalid_output"
    assert res.error_message is not None
    assert res.error_message.startswith("output does not match the schema ")
    assert message in res.error_message


def test_a_discarded_output_is_cut_to_500_characters() -> None:
    res = check_output(ok("x" * 2000), "json")
    assert res.outcome == "invalid_output"
    assert res.raw["discarded_output"] == "x" * 500


@pytest.mark.parametrize("vector", [[0.1, -2, 3.5], [0], [1e-9]])
def test_a_list_of_numbers_is_a_valid_vector(vector: list[float]) -> None:
    res = ok(vector)
    assert check_output(res, "vector") is res


@pytest.mark.parametrize("vector", [[], None, "0.1,0.2", [0.1, "0.2"], [[0.1]], {"embedding": [0.1]}])
def test_anything_else_is_an_invalid_vector(vector: Any) -> None:
    res = check_output(ok(vector), "vector")
    assert res.outcome == "invalid_output"
    assert res.error_message == "expected a non-empty list of numbers (an embedding)"
