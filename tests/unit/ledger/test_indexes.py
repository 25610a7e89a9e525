"""The upgrade steps that add the indexes an older ledger lacks and drop those replaced: each once, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries
from airflow_batch_provider.ledger.indexes import _index, add_missing_indexes, drop_replaced_indexes


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


def test_a_ledger_with_the_full_delivery_key_index_of_version_6_has_it_replaced_by_the_offered_one_on_open(
    ledger_url: str,
) -> None:
    first = Ledger.from_url(ledger_url)
    try:
        with first.engine.begin() as conn:  # as version 6 left it: every sink row in the key's index
            conn.execute(text("DROP INDEX ix_abp_deliveries_offered"))
            conn.execute(
                text("CREATE INDEX ix_abp_deliveries_key ON abp_deliveries (workload, sink, delivery_key)")
            )
            conn.execute(text("UPDATE abp_meta SET value = '6' WHERE key = 'schema_version'"))
    finally:
        first.engine.dispose()
    upgraded = Ledger.from_url(ledger_url)
    try:
        names = _names(upgraded)
        assert "ix_abp_deliveries_key" not in names and "ix_abp_deliveries_offered" in names
        assert upgraded.schema_version == s.SCHEMA_VERSION == 7
        assert drop_replaced_indexes(upgraded.engine) == []  # a second pass drops nothing
    finally:
        upgraded.engine.dispose()


def test_a_sinks_delivery_rows_stay_out_of_the_delivery_key_index_and_an_offered_hand_off_is_in_it(
    ledger: Ledger,
) -> None:
    rows = [Delivery(f"k{n}", f"i{n}", "v1", "delivered", "h") for n in range(3)]
    record_deliveries(ledger, "wl", "tickets", "r1", rows)
    record_deliveries(ledger, "wl", "emails", "r1", [Delivery("k0", "i0", "v1", "offered", "h")])
    if ledger.engine.dialect.name == "sqlite":
        with ledger.engine.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT count(*) FROM abp_deliveries INDEXED BY ix_abp_deliveries_offered "
                "WHERE state = 'offered' AND workload = 'wl'"
            ).scalar()
    else:
        with ledger.engine.connect() as conn:  # the index's own size in tuples, from the catalogue
            conn.exec_driver_sql("ANALYZE abp_deliveries")
            found = conn.exec_driver_sql(
                "SELECT reltuples FROM pg_class WHERE relname = 'ix_abp_deliveries_offered'"
            ).scalar()
    assert int(found or 0) == 1
