"""The ``stack`` marker: tests that start the whole stack (``make stack``); ``-m "not stack"`` skips them."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker (the suite runs with ``--strict-markers``)."""
    config.addinivalue_line("markers", "stack: starts Airflow's components, PostgreSQL and the emulator")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this folder ``stack``."""
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.stack)
