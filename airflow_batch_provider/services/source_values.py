"""Turning one row of a table or a Parquet file into a :class:`SourceRecord`, JSON-safe.

No Airflow here. A database driver or ``pyarrow`` hands over Python values of many types; the
prompt template and the ledger take JSON. Each type is converted explicitly, never with ``str()``
by default: a value this module does not know is a reject naming the column, its type and the
fix (cast it in the query), so that a row never renders as ``<object at 0x...>``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from airflow_batch_provider.services.records import RAW_LIMIT, SourceRecord

#: What an identifier in a generated query may look like: a name, or schema-qualified names.
IDENTIFIER_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$"


class UnsupportedValue(ValueError):
    """A value that has no JSON form the template could render.

    :param code: the reject's code
    :param reason: what the value is and the fix
    """

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def json_safe(value: Any, column: str) -> Any:
    """Return ``value`` as JSON can hold it: a string, a number, a bool, ``None``, a list or a dict.

    ``Decimal`` keeps its digits (an integral one is an ``int``, another its exact text, never a
    float); ``datetime``, ``date`` and ``time`` are ISO 8601 text; ``timedelta`` is seconds;
    ``bytes`` are UTF-8 text; a UUID is its text; lists and dicts are converted item by item.

    :param value: the driver's value
    :param column: the column it came from, for the message
    :raises UnsupportedValue: bytes that are not UTF-8, a float that is not finite, any other type
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise UnsupportedValue(
            "unsupported_value",
            f"column {column!r} holds {value!r}, which JSON cannot hold; filter it out or map it to NULL in the query.",
        )
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise UnsupportedValue(
                "unsupported_value",
                f"column {column!r} holds the decimal {value}, which JSON cannot hold; filter it out in the query.",
            )
        exponent = value.as_tuple().exponent
        integral = isinstance(exponent, int) and exponent >= 0
        return int(value) if integral else str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            preview = base64.b64encode(raw[:24]).decode("ascii")
            raise UnsupportedValue(
                "invalid_utf8",
                f"column {column!r} holds {len(raw)} bytes that are not UTF-8 text (base64 {preview}...); "
                "convert them to text in the query (e.g. encode them as base64) or leave the column out.",
            ) from None
    if isinstance(value, (list, tuple)):
        return [json_safe(v, column) for v in value]
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, column) for k, v in value.items()}
    raise UnsupportedValue(
        "unsupported_value",
        f"column {column!r} holds a {type(value).__module__}.{type(value).__qualname__}, which the template "
        f"cannot render; cast it to text or a number in the query (e.g. CAST({column} AS TEXT)) or leave the "
        "column out.",
    )


def row_record(
    row: Mapping[str, Any], *, id_column: str, id_field: str, position: int, where: str
) -> SourceRecord:
    """One row as a record: its columns as the template's fields, the id column as the app id.

    The id column's value is also given to the template under ``id_field`` (the prompt's
    ``id_field``) when the two names differ. A NULL id or a value :func:`json_safe` cannot
    convert makes the record a reject whose reason names ``where`` (page and row, row group and
    row) and the column; the fields that could be converted are kept, for its id.

    :param row: the row, by column name
    :param id_column: the column that holds the application id
    :param id_field: the prompt's id field
    :param position: the row's 0-based index among the rows read
    :param where: the row's place in the source, in words (``page 3, row 17``)
    """
    value: dict[str, Any] = {}
    problem: tuple[str, str] | None = None
    for column, raw in row.items():
        try:
            value[column] = json_safe(raw, column)
        except UnsupportedValue as exc:
            problem = problem or (exc.code, f"{where}: {exc}")
    if id_column in value:
        value[id_field] = value[id_column]
    if problem is None and value.get(id_column) is None:
        problem = (
            "missing_id",
            f"{where} has a NULL {id_column!r}; every row needs an application id: fill it, or filter the "
            f"row out of the query (WHERE {id_column} IS NOT NULL).",
        )
    raw_text = json.dumps(value, ensure_ascii=False, default=str)[:RAW_LIMIT]
    return SourceRecord(position, None, value=value, problem=problem, raw=raw_text)
