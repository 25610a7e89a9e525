"""Names that become path components and ledger keys: workloads.

A workload name is a folder under the staging root and part of every ledger key, so it is
checked where it is first given (DAG parse time) and again wherever a path is built from it.
"""

from __future__ import annotations

import re
from typing import Final

from airflow_batch_provider.exceptions import ConfigurationError

WORKLOAD_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def is_templated(value: str) -> bool:
    """Say whether ``value`` is an Airflow template, known only when the task runs.

    :param value: an operator argument
    """
    return "{{" in value or "{%" in value


def check_workload(name: object) -> str:
    """Return ``name`` if it is a valid workload name, else raise with the rule and a fix.

    Valid: 1 to 100 characters from ``A-Z a-z 0-9 _ . -``, starting with a letter or digit, and
    no ``..`` (so it never names a parent folder).

    :param name: the workload name
    :raises ConfigurationError: it is not a string, breaks the pattern or contains ``..``
    """
    if not isinstance(name, str) or not WORKLOAD_PATTERN.fullmatch(name) or ".." in name:
        raise ConfigurationError(
            f"workload {name!r} is not a valid workload name: it names a staging folder and a ledger "
            "key, so it must be 1-100 characters of letters, digits, '_', '.' and '-', start with a "
            "letter or digit and not contain '..'. Rename it, e.g. 'nightly_feedback'."
        )
    return name
