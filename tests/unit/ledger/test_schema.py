from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import BigInteger, create_engine, inspect, select, update

from airflow_batch_provider.exceptions import LedgerError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from tests.unit.ledger import schema_v1

TABLES = {
    "abp_meta",
    "abp_items",
    "abp_jobs",
    "abp_attempts",
    "abp_runs",
    "abp_results",
    "abp_leases",
    "abp_audit",
    "abp_extra_lines",
    "abp_prompt_changes",
}


def test_a_new_ledger_creates_every_table_and_records_the_schema_version(ledger: Ledger) -> None:
    assert set(inspect(ledger.engine).get_table_names()) >= TABLES
    assert ledger.schema_version == s.SCHEMA_VERSION
    with ledger.engine.connect() as conn:
        rows = conn.execute(select(s.meta)).all()
    assert [tuple(r) for r in rows] == [("schema_version", str(s.SCHEMA_VERSION))]


def test_opening_a_ledger_again_keeps_one_version_row_and_the_data(ledger: Ledger, ledger_url: str) -> None:
    ledger.start_run("wl", "r1", "openai", "gpt-4o-mini")
    again = Ledger.from_url(ledger_url)
    try:
        again.ensure_schema()
        assert again.schema_version == s.SCHEMA_VERSION
        assert [r["run_id"] for r in again.runs("wl")] == ["r1"]
        with again.engine.connect() as conn:
            assert len(conn.execute(select(s.meta)).all()) == 1
    finally:
        again.engine.dispose()


def test_a_ledger_written_by_a_newer_package_is_refused_with_the_fix(ledger: Ledger, ledger_url: str) -> None:
    newer = s.SCHEMA_VERSION + 1
    with ledger.engine.begin() as conn:
        conn.execute(update(s.meta).where(s.meta.c.key == "schema_version").values(value=str(newer)))
    with pytest.raises(LedgerError) as caught:
        Ledger.from_url(ledger_url).engine.dispose()
    message = str(caught.value)
    assert f"schema version {newer} is newer than this package's {s.SCHEMA_VERSION}" in message
    assert "upgrade airflow-batch-provider" in message


def test_an_older_recorded_version_is_accepted_and_brought_up_to_this_packages(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "gpt-4o-mini")
    with ledger.engine.begin() as conn:
        conn.execute(update(s.meta).where(s.meta.c.key == "schema_version").values(value="1"))
    ledger.ensure_schema()
    with ledger.engine.connect() as conn:
        rows = conn.execute(select(s.meta.c.key, s.meta.c.value)).all()
    assert [tuple(r) for r in rows] == [("schema_version", str(s.SCHEMA_VERSION))]
    assert ledger.schema_version == s.SCHEMA_VERSION
    assert [r["run_id"] for r in ledger.runs("wl")] == ["r1"]


def test_items_are_keyed_by_workload_item_key_and_prompt_version() -> None:
    assert [c.name for c in s.items.primary_key] == ["workload", "item_key", "prompt_version"]
    assert [c.name for c in s.attempts.primary_key] == ["job_id", "custom_id"]
    assert [c.name for c in s.jobs.primary_key] == ["job_id"]
    assert [c.name for c in s.published.primary_key] == ["workload", "item_key", "prompt_version"]


def test_a_jobs_idempotency_key_is_unique() -> None:
    assert s.jobs.c.idempotency_key.unique


def test_money_is_stored_as_integer_nano_dollars() -> None:
    money = [c for t in s.metadata.tables.values() for c in t.columns if c.name.endswith("_nusd")]
    assert money
    assert all(isinstance(c.type, BigInteger) for c in money)


def test_custom_ids_and_item_keys_fit_their_columns() -> None:
    assert s.items.c.item_key.type.length == 64  # type: ignore[attr-defined]
    assert s.items.c.custom_id.type.length == 64  # type: ignore[attr-defined]
    assert s.attempts.c.custom_id.type.length == 64  # type: ignore[attr-defined]


def test_the_lookup_indexes_exist_in_the_database(ledger: Ledger) -> None:
    found = {
        ix["name"]
        for table in ("abp_items", "abp_jobs", "abp_attempts")
        for ix in inspect(ledger.engine).get_indexes(table)
    }
    assert {
        "ix_abp_items_run_state",
        "ix_abp_items_job",
        "ix_abp_jobs_run",
        "ix_abp_attempts_item",
        "ix_abp_attempts_run",
    } <= found


def test_a_ledger_written_by_schema_version_1_is_upgraded_in_place_and_keeps_its_rows(
    ledger_url: str,
) -> None:
    engine = create_engine(ledger_url)
    then = datetime(2025, 12, 31, 23, 0, tzinfo=timezone.utc)
    schema_v1.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(schema_v1.meta.insert().values(key="schema_version", value="1"))
        conn.execute(
            schema_v1.runs.insert().values(
                workload="wl", run_id="r1", provider="openai", model="m", started_at=then
            )
        )
        conn.execute(
            schema_v1.jobs.insert().values(
                job_id="wl:r1:r1:c00000",
                workload="wl",
                run_id="r1",
                round=1,
                chunk_index=0,
                provider="openai",
                model="m",
                kind="chat",
                idempotency_key="k1",
                state="staged",
                staged_path="/s/c0.jsonl",
                input_sha256="0" * 64,
                lines=1,
                size_bytes=10,
                result_lines=0,
                malformed_lines=0,
                duplicate_lines=0,
                unknown_lines=0,
                missing=0,
                created_at=then,
            )
        )
    engine.dispose()

    upgraded = Ledger.from_url(ledger_url)
    try:
        assert upgraded.schema_version == s.SCHEMA_VERSION == 7
        assert set(inspect(upgraded.engine).get_table_names()) >= TABLES
        for index in s.ADDED_INDEXES:
            assert index in {
                ix["name"] for t in s.metadata.tables for ix in inspect(upgraded.engine).get_indexes(t)
            }
        for table, names in s.ADDED_COLUMNS.items():
            assert set(names) <= {c["name"] for c in inspect(upgraded.engine).get_columns(table)}
        [run] = upgraded.runs("wl")
        assert (run["run_id"], run["started_at"], run["dag_id"]) == ("r1", then, None)
        job = upgraded.get_job("wl:r1:r1:c00000")
        assert (job.state, job.claim_count, job.claim_owner, job.created_at) == ("staged", 0, None, then)
        assert upgraded.claim_job(job.job_id, "t1", 60).claim_count == 1
        Ledger.from_url(ledger_url).engine.dispose()  # opening again finds nothing to add
    finally:
        upgraded.engine.dispose()


def test_every_timestamp_column_reads_back_timezone_aware_utc() -> None:
    stamps = [c for t in s.metadata.tables.values() for c in t.columns if "DateTime" in repr(c.type)]
    assert stamps
    assert all(isinstance(c.type, s.UTCDateTime) for c in stamps)


@pytest.mark.parametrize(
    "written",
    [
        datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc),
        datetime(2026, 7, 1, 8, 0, tzinfo=timezone(timedelta(hours=-4))),
        datetime(2026, 7, 1, 12, 0),  # naive: taken as UTC, as earlier versions wrote it
    ],
)
def test_a_timestamp_in_any_zone_is_stored_as_its_utc_instant(ledger: Ledger, written: datetime) -> None:
    ledger.start_run("wl", "r1", "openai", "m")
    with ledger.engine.begin() as conn:
        conn.execute(update(s.runs).values(started_at=written))
    [run] = ledger.runs("wl")
    assert run["started_at"] == datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)
    assert run["started_at"].tzinfo is timezone.utc


def test_a_version_5_ledger_gets_the_history_indexes_once_each(ledger_url: str) -> None:
    from sqlalchemy import text

    from airflow_batch_provider.ledger.indexes import add_missing_indexes

    Ledger.from_url(ledger_url).engine.dispose()
    engine = create_engine(ledger_url)
    with engine.begin() as conn:
        for name in s.ADDED_INDEXES:
            conn.execute(text(f"DROP INDEX {name}"))
        conn.execute(update(s.meta).values(value="5"))
    engine.dispose()

    upgraded = Ledger.from_url(ledger_url)
    try:
        assert upgraded.schema_version == s.SCHEMA_VERSION
        names = {ix["name"] for t in s.metadata.tables for ix in inspect(upgraded.engine).get_indexes(t)}
        assert set(s.ADDED_INDEXES) <= names
        assert add_missing_indexes(upgraded.engine) == []
    finally:
        upgraded.engine.dispose()
