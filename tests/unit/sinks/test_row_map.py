"""A sink's compiled mapping gives the row, the digest and the parameters that walking the mapping gives."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_batch_provider.core.json_path import parse_path, read_path
from airflow_batch_provider.ledger.candidates import Candidate
from airflow_batch_provider.ledger.digests import values_sha256
from airflow_batch_provider.services.delivery import SinkRow
from airflow_batch_provider.sinks.row_map import compile_row_map


class Label(str):
    pass


class Level(enum.IntEnum):
    HIGH = 3


#: Callables a mapping may give for a column: Python values the JSON of an answer never holds.
CALLS: dict[str, Callable[[Candidate], Any]] = {
    "whole": lambda r: r.output,
    "decimal": lambda _r: Decimal("1.10"),
    "tuple": lambda _r: (1, "two"),
    "label": lambda _r: Label("sub"),
    "level": lambda _r: Level.HIGH,
    "day": lambda _r: date(2026, 12, 4),
    "bool": lambda _r: True,
    "version": lambda r: r.prompt_version,
}
PATHS = ["$", "$.a", "$.b", "$.a.b", "$.a[0]", "$[1]", "$.label", "$.b[0].a"]
KEY_TYPES: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "label": Label}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "label", "é", "0"]), inner, max_size=3)
    ),
    max_leaves=8,
)
sources = st.sampled_from(PATHS) | st.sampled_from(sorted(CALLS)).map(lambda name: CALLS[name])


def walked(
    key_columns: list[str], key_type: Callable[[str], Any], columns: Mapping[str, Any], result: Candidate
) -> SinkRow:
    """The row as walking the mapping gives it: the oracle the compiled functions are held to."""
    keys = {key_columns[0]: key_type(result.app_id)}
    if len(key_columns) == 2:
        keys[key_columns[1]] = result.prompt_version
    values = {}
    for column, source in columns.items():
        value = source(result) if callable(source) else read_path(result.output, parse_path(source))
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False, sort_keys=True)
        values[column] = value
    return SinkRow(keys, values)


def same(one: Any, other: Any) -> bool:
    """Equal, NaN equal to NaN (a row's values compared as their JSON)."""
    return json.dumps(one, default=repr) == json.dumps(other, default=repr)


@settings(max_examples=300, deadline=None)
@given(
    output=st.none() | json_values,
    app_id=st.integers(min_value=0, max_value=10**12).map(str),
    version=st.sampled_from(["v1", "v2 é"]),
    two_keys=st.booleans(),
    key_type=st.sampled_from(sorted(KEY_TYPES)),
    mapped=st.dictionaries(
        st.sampled_from(["label", "score", "body", "a1", "z", "B"]), sources, min_size=1, max_size=4
    ),
    keys_last=st.booleans(),
)
def test_the_compiled_row_digest_and_parameters_are_what_walking_the_mapping_gives(
    output: Any,
    app_id: str,
    version: str,
    two_keys: bool,
    key_type: str,
    mapped: dict[str, Any],
    keys_last: bool,
) -> None:
    key_columns = ["ticket_id", "prompt_version"] if two_keys else ["ticket_id"]
    plan = [
        (name, (), source) if callable(source) else (name, parse_path(source), None)
        for name, source in mapped.items()
    ]
    compiled = compile_row_map(key_columns, KEY_TYPES[key_type], plan, keys_last)
    result = Candidate("k", app_id, version, "succeeded", output, None, None)

    row = compiled.row_for(result)
    expected = walked(key_columns, KEY_TYPES[key_type], mapped, result)

    assert same(row.keys, expected.keys) and list(row.keys) == list(expected.keys)
    assert same(row.values, expected.values) and list(row.values) == list(expected.values)
    assert row.digest == values_sha256({**expected.keys, **expected.values})
    keys = tuple(expected.keys.values())
    values = tuple(expected.values.values())
    assert same(compiled.params(row), values + keys if keys_last else keys + values)


def test_a_name_that_is_not_a_plain_identifier_is_never_written_into_the_source() -> None:
    with pytest.raises(ValueError, match="plain SQL identifier"):
        compile_row_map(["id"], str, [("x'); import os; ('", ("a",), None)], keys_last=False)
