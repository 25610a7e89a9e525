"""The bulk-writes room: staged writes at the database's floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.ledger import Ledger, bulk, items


def test_a_staged_write_on_sqlite_takes_the_write_lock_before_it_reads(tmp_path: Path) -> None:
    # A transaction whose first write went to a temporary staging table read the ledger, then
    # wrote it: a commit by another process in between made SQLite refuse the write at once
    # ("database is locked", no busy wait: a stale snapshot), seen in apply_results while a prune
    # ran in another process (tests/unit/ledger/test_retention.py).
    import sqlite3

    path = tmp_path / "lock.sqlite"
    ledger = Ledger.from_url(f"sqlite:///{path}")
    other = sqlite3.connect(path, timeout=0)
    try:
        with ledger.engine.begin() as conn:
            bulk.stage(conn, items.ITEMS_STAGE, [])
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        ledger.engine.dispose()
