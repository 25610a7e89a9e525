"""A sink's column mapping written once as one function of the answer, not walked for every row.

A :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink` maps each answer to its row: the key
columns from the application id (and the prompt version), each other column from a JSON path into
the answer or a callable of it. Walking that mapping as data for every answer (a loop over the
columns, a test of each column's kind) cost as much as the rest of the row's mapping; here it is
written out as Python source once per sink, one line per column, and compiled, as
:mod:`dataclasses` writes a class's ``__init__``. Two functions:

- ``row_for(result)``: the :class:`~airflow_batch_provider.services.delivery.SinkRow`, with its
  digest: the JSON object :func:`~airflow_batch_provider.ledger.digests.values_sha256` writes
  (members in key order) written out member by member
  (:func:`~airflow_batch_provider.ledger.digests.value_json`), not built as a dict, sorted and
  encoded for every row (measured: 1.0 against 1.6 us a row, three members);
- ``params(row)``: a row's parameters in the sink's statement order (the keys first for an
  upsert, last for an update).

The source holds no value from the mapping: column names are plain SQL identifiers (checked by the
sink before this runs) written as string literals; the JSON paths' steps, the callables and the
key's converter are passed in by name. What each line does is what the mapping says:

- a one-step path (``"$.label"``) on an answer that is a JSON object: ``output.get(step)``;
- any other path, or an answer that is not an object: :func:`~airflow_batch_provider.core.json_path.read_path`
  (a step that is not there gives ``None``);
- a callable: called with the result;
- a value that is an object or a list is bound as its JSON text (sorted keys).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from airflow_batch_provider.core.json_path import read_path
from airflow_batch_provider.ledger.candidates import Candidate
from airflow_batch_provider.ledger.digests import text_sha256, value_json
from airflow_batch_provider.services.delivery import SinkRow

#: A plain SQL identifier (one '.' for a schema): every name a sink writes into SQL, and into the
#: compiled source here.
IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
#: One mapped column: its name, its JSON path's steps (``()`` for a callable) and its callable.
Column = tuple[str, tuple[str | int, ...], Callable[[Candidate], Any] | None]


def bindable(value: Any) -> Any:
    """A value a DB-API driver binds: objects and lists travel as JSON text.

    :param value: a mapped value
    """
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return value


@dataclass(frozen=True)
class RowMap:
    """The two compiled functions of one sink's mapping.

    :param row_for: the answer -> its row
    :param params: a row -> its parameters in the statement's order
    """

    row_for: Callable[[Candidate], SinkRow]
    params: Callable[[SinkRow], tuple[Any, ...]]


def compile_row_map(
    key_columns: Sequence[str],
    key_type: Callable[[str], Any],
    columns: Sequence[Column],
    keys_last: bool,
) -> RowMap:
    """Write and compile the mapping's two functions.

    :param key_columns: one (the application id) or two (then the prompt version) plain identifiers
    :param key_type: converts the application id for the first key column
    :param columns: the mapped columns, in the statement's order (names are plain identifiers)
    :param keys_last: whether the keys come after the columns in the parameters (an update)
    """
    names: dict[str, Any] = {
        "SinkRow": SinkRow,
        "new": tuple.__new__,  # a NamedTuple made in C: its class's own __new__ is Python
        "read_path": read_path,
        "bindable": bindable,
        "key_type": key_type,
        "NESTED": (dict, list),
        "value_json": value_json,
        "text_sha256": text_sha256,
    }
    keys = [f"{key_columns[0]!r}: k0"]
    if len(key_columns) == 2:
        keys.append(f"{key_columns[1]!r}: result.prompt_version")
    lines = [
        "def row_for(result):",
        "    k0 = key_type(result.app_id)",
        "    output = result.output",
        "    plain = type(output) is dict",
    ]
    for index, (_, steps, call) in enumerate(columns):
        value = f"v{index}"
        if call is not None:
            names[f"call{index}"] = call
            lines.append(f"    {value} = call{index}(result)")
        else:
            names[f"steps{index}"] = steps
            read = f"read_path(output, steps{index})"
            if len(steps) == 1:
                lines.append(f"    {value} = output.get(steps{index}[0]) if plain else {read}")
            else:
                lines.append(f"    {value} = {read}")
        lines.append(f"    if isinstance({value}, NESTED):")
        lines.append(f"        {value} = bindable({value})")
    # the digest's JSON object written out: its members in key order, each value by value_json
    members = {key_columns[0]: "k0", **{name: f"v{index}" for index, (name, _, _) in enumerate(columns)}}
    if len(key_columns) == 2:
        members[key_columns[1]] = "result.prompt_version"
    for name in members:
        if not IDENTIFIER.match(name):
            raise ValueError(f"column {name!r} is not a plain SQL identifier")
    text = ", ".join(f'"{name}": {{value_json({members[name]})}}' for name in sorted(members))
    lines.append(f"    digest = text_sha256(f'{{{{{text}}}}}')")
    written = ", ".join(f"{name!r}: v{index}" for index, (name, _, _) in enumerate(columns))
    lines.append(f"    return new(SinkRow, ({{{', '.join(keys)}}}, {{{written}}}, digest))")
    key_params = [f"keys[{key!r}]" for key in key_columns]
    value_params = [f"values.get({name!r})" for name, _, _ in columns]
    ordered = [*value_params, *key_params] if keys_last else [*key_params, *value_params]
    lines += [
        "def params(row):",
        "    keys, values, _ = row",
        f"    return ({', '.join(ordered)},)",
    ]
    exec(compile("\n".join(lines), "<SqlUpsertSink mapping>", "exec"), names)
    return RowMap(names["row_for"], names["params"])
