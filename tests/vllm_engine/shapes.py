"""The shape of a JSON value: its keys and types, not its values (the engine-vs-stand-in check)."""

from __future__ import annotations

from typing import Any


def shape(value: Any) -> Any:
    """Keys and value types of ``value``, recursively; a list by the shape of its first element.

    Integers and floats are both ``number`` (a random model's vector may hold either), ``None`` is
    ``null``: two output lines have the same shape when a reader of one can read the other.

    :param value: a parsed JSON value
    """
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__
