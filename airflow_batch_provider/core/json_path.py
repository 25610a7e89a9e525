"""A small JSON path: ``$``, ``$.field``, ``$.a.b``, ``$.list[0]`` read from a parsed answer."""

from __future__ import annotations

import re
from typing import Any, Final

from airflow_batch_provider.exceptions import ConfigurationError

_STEP: Final = re.compile(r"\.([A-Za-z_][A-Za-z0-9_\-]*)|\[(\d+)\]")


def parse_path(path: str) -> tuple[str | int, ...]:
    """Split ``$.a.b[0]`` into its steps (``("a", "b", 0)``).

    :param path: the path, starting with ``$``
    :raises ConfigurationError: the path is not of the form ``$``, ``$.name``, ``$.name[N]`` ...
    """
    if not path.startswith("$"):
        raise ConfigurationError(f"JSON path {path!r} must start with '$' (e.g. '$.label' or '$.scores[0]').")
    steps: list[str | int] = []
    pos = 1
    while pos < len(path):
        match = _STEP.match(path, pos)
        if match is None:
            raise ConfigurationError(
                f"JSON path {path!r}: cannot read it at position {pos} ({path[pos:]!r}); "
                "use '.name' and '[N]' steps, e.g. '$.label' or '$.scores[0]'."
            )
        steps.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        pos = match.end()
    return tuple(steps)


class MissingStep(LookupError):
    """A step of a path that the value does not have.

    :param reached: the path as far as it could be followed (``$``, ``$.answer`` ...)
    :param found: what is there instead, in words (``keys ['a', 'b']``, ``a list of 2``, ``a str``)
    """

    def __init__(self, reached: str, found: str) -> None:
        super().__init__(f"{reached} holds {found}")
        self.reached = reached
        self.found = found


def spell_path(steps: tuple[str | int, ...]) -> str:
    """Write ``steps`` back as a path (``("a", 0)`` -> ``$.a[0]``).

    :param steps: from :func:`parse_path`
    """
    return "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)


def follow_path(value: Any, steps: tuple[str | int, ...]) -> Any:
    """Follow ``steps`` into ``value``; a step that is not there raises (a ``null`` there is a value).

    :param value: the parsed answer
    :param steps: from :func:`parse_path`
    :raises MissingStep: a step names a key the object lacks, an index past the list's end, or
        goes into a value that is neither (the message says how far the path went and what is there)
    """
    for depth, step in enumerate(steps):
        if isinstance(step, int):
            there = isinstance(value, list) and step < len(value)
        else:
            there = isinstance(value, dict) and step in value
        if not there:
            raise MissingStep(spell_path(steps[:depth]), _shape(value))
        value = value[step]
    return value


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return f"the keys {sorted(value)[:20]}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "null" if value is None else f"a {type(value).__name__}"


def read_path(value: Any, steps: tuple[str | int, ...]) -> Any:
    """Follow ``steps`` into ``value``; a step that is not there gives ``None``.

    :param value: the parsed answer
    :param steps: from :func:`parse_path`
    """
    try:
        return follow_path(value, steps)
    except MissingStep:
        return None
