"""Output checks: a result whose output is not what the prompt asked for is ``invalid_output``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from airflow_batch_provider.core.results import ItemResult

OutputFormat = Literal["text", "json", "vector"]


def check_output(
    result: ItemResult, output_format: OutputFormat, schema: Mapping[str, Any] | None = None
) -> ItemResult:
    """Parse and validate a successful result's output; anything else passes through.

    :param result: the parsed result line
    :param output_format: ``text`` (kept as is), ``json`` (parsed, optionally validated against
        ``schema``) or ``vector`` (a list of numbers)
    :param schema: JSON Schema the parsed object must satisfy
    """
    if result.outcome != "succeeded" or output_format == "text":
        return result
    if output_format == "vector":
        if (
            isinstance(result.output, list)
            and result.output
            and all(isinstance(x, (int, float)) for x in result.output)
        ):
            return result
        return _invalid(result, "expected a non-empty list of numbers (an embedding)")
    value = result.output
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            return _invalid(result, f"output is not JSON ({exc.msg} at char {exc.pos})")
    if schema is not None:
        import jsonschema

        errors = sorted(
            jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path)
        )
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
            return _invalid(result, f"output does not match the schema at {where}: {errors[0].message}")
    return replace(result, output=value)


def _invalid(result: ItemResult, message: str) -> ItemResult:
    return replace(
        result,
        outcome="invalid_output",
        error_code="invalid_output",
        error_message=message,
        raw={**result.raw, "discarded_output": str(result.output)[:500]},
    )
