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


def read_path(value: Any, steps: tuple[str | int, ...]) -> Any:
    """Follow ``steps`` into ``value``; a step that is not there gives ``None``.

    :param value: the parsed answer
    :param steps: from :func:`parse_path`
    """
    for step in steps:
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                return None
            value = value[step]
        else:
            if not isinstance(value, dict):
                return None
            value = value.get(step)
    return value
