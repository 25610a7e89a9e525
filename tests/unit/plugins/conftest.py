"""Fixtures of the page's tests: a finished run in a ledger (SQLite and PostgreSQL), and three workloads shared by users of different rights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.plugins.api import open_for_actions, open_readonly
from tests.unit.plugins.seeding import LEGACY, TICKETS, TICKETS_DAG, Seeded, Shared, seed_finished_run


@pytest.fixture
def seeded(ledger_url: str) -> Iterator[Seeded]:
    writer = Ledger.from_url(ledger_url)
    try:
        report = seed_finished_run(writer)
    finally:
        writer.engine.dispose()
    yield Seeded(ledger_url, report)
    open_readonly(ledger_url).engine.dispose()
    open_readonly.cache_clear()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    yield url
    open_readonly.cache_clear()


@pytest.fixture
def shared(sqlite_url: str) -> Iterator[Shared]:
    writer = Ledger.from_url(sqlite_url)
    try:
        seed_finished_run(writer)
        seed_finished_run(writer, workload=TICKETS, dag_id=TICKETS_DAG, permanent_message="=HYPERLINK(1)")
        seed_finished_run(writer, workload=LEGACY, dag_id=None)
    finally:
        writer.engine.dispose()
    yield Shared(sqlite_url)
    open_for_actions.cache_clear()
