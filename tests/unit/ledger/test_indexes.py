"""The upgrade step that adds the indexes an older ledger lacks: each once, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.indexes import _index, add_missing_indexes


def _names(ledger: Ledger) -> set[str]:
    inspector = inspect(ledger.engine)
    return {ix["name"] for table in s.metadata.tables for ix in inspector.get_indexes(table)}


def test_a_ledger_without_the_added_indexes_gets_each_once_and_a_second_pass_creates_none(
    ledger: Ledger,
) -> None:
    assert set(s.ADDED_INDEXES) <= _names(ledger)  # a new ledger has them from create_all
    with ledger.engine.begin() as conn:  # as a ledger written before they were declared
        for name in s.ADDED_INDEXES:
            conn.execute(text(f"DROP INDEX {name}"))
    assert not set(s.ADDED_INDEXES) & _names(ledger)
    assert add_missing_indexes(ledger.engine) == list(s.ADDED_INDEXES)
    assert set(s.ADDED_INDEXES) <= _names(ledger)
    assert add_missing_indexes(ledger.engine) == []


def test_an_added_index_declared_on_no_table_is_named_as_a_schema_error() -> None:
    with pytest.raises(KeyError, match="ix_nowhere"):
        _index("ix_nowhere")
