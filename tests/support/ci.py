"""What a test needs from the machine: skipped outside CI when it is missing, a failure under CI.

A test that needs a program the repository cannot install (Debian's ``redis-server``, MariaDB's
``mariadbd``) skips with the install hint on a developer's machine; under CI (``CI=true``) a missing
one fails, so that CI never passes by skipping it (``.ci/run`` installs them where they are missing).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """``CI`` set to a true value, as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_program(hint: str, ci: bool) -> NoReturn:
    """Skip with ``hint`` outside CI; under CI, fail with it (a CI run never passes by skipping).

    :param hint: what is missing and how to install it
    :param ci: running under CI (``CI=true``)
    """
    if ci:
        pytest.fail(f"{hint}; CI installs it in .ci/run")
    pytest.skip(hint)
