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


def test_keyset_pages_read_each_row_once_in_key_order_a_short_read_per_page(ledger: Ledger) -> None:
    from sqlalchemy import event, select

    from airflow_batch_provider.ledger import schema as s
    from tests.unit.ledger.store_support import prep

    ledger.start_run("wl", "r1", "openai", "gpt-4o-mini")
    # two versions of some keys: the key is the pair, so the pages split between them too
    ledger.upsert_items("wl", "r1", [prep(f"a{n}", version=v) for n in range(7) for v in ("v1", "v2")])
    reads: list[str] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        reads.append(statement)

    c = s.items.c
    query = select(c.prompt_version, c.item_key, c.app_id).where(c.workload == "wl")
    pages = list(bulk.keyset_pages(ledger.engine, query, (c.item_key, c.prompt_version), page=4))
    assert [len(p) for p in pages] == [4, 4, 4, 2]
    keys = [(r.item_key, r.prompt_version) for p in pages for r in p]
    assert keys == sorted(keys) and len(set(keys)) == 14
    assert len(reads) == 4


def test_the_json_probe_finds_this_sqlites_json_functions_and_says_no_where_they_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sqlite3

    bulk.sqlite_json.cache_clear()
    try:
        assert bulk.sqlite_json() is True  # SQLite 3.38 and later build them in
        bulk.sqlite_json.cache_clear()
        connect = sqlite3.connect

        def without_json(*args: object, **kwargs: object) -> sqlite3.Connection:
            conn = connect(*args, **kwargs)  # type: ignore[arg-type]
            conn.create_function("json_extract", 2, lambda *a: 1 / 0)  # as a build without them fails
            return conn

        monkeypatch.setattr(bulk.sqlite3, "connect", without_json)
        assert bulk.sqlite_json() is False
    finally:
        bulk.sqlite_json.cache_clear()
