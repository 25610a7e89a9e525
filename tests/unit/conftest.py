"""The unit tests' one ledger: opened on the ``ledger_url`` fixture's fresh database (SQLite, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from airflow_batch_provider.ledger import Ledger


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """A :class:`Ledger` on a fresh, empty database, its engine disposed after the test."""
    from airflow_batch_provider.ledger import Ledger

    opened = Ledger.from_url(ledger_url)
    try:
        yield opened
    finally:
        opened.engine.dispose()
