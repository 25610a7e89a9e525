"""The ledger's room tests: a fresh ledger, once on SQLite and once on PostgreSQL (``ledger_url``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_batch_provider.ledger import Ledger


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """A ledger opened on ``ledger_url``, its engine disposed after the test."""
    opened = Ledger.from_url(ledger_url)
    try:
        yield opened
    finally:
        opened.engine.dispose()
