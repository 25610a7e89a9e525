"""The ledger schema as version 1 wrote it (frozen copy), to test the in-place upgrade of an older ledger."""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

SCHEMA_VERSION: Final = 1

metadata = MetaData()

meta = Table(
    "abp_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)


def _usage_columns() -> list[Column[int]]:
    return [
        Column("input_tokens", BigInteger, nullable=False, default=0),
        Column("output_tokens", BigInteger, nullable=False, default=0),
        Column("cached_input_tokens", BigInteger, nullable=False, default=0),
        Column("cache_write_tokens", BigInteger, nullable=False, default=0),
        Column("cost_nusd", BigInteger, nullable=False, default=0),
    ]


items = Table(
    "abp_items",
    metadata,
    Column("workload", String(200), primary_key=True),
    Column("item_key", String(64), primary_key=True),
    Column("prompt_version", String(100), primary_key=True),
    Column("app_id", Text, nullable=False),
    Column("model", String(200), nullable=False),
    Column("input_hash", String(64), nullable=False),
    Column("request_json", Text, nullable=False),
    Column("state", String(32), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("run_id", String(250), nullable=False),
    Column("job_id", String(250)),
    Column("custom_id", String(64)),
    Column("route", String(32)),
    Column("output_json", Text),
    Column("error_code", String(100)),
    Column("error_message", Text),
    Column("succeeded_hash", String(64)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_abp_items_run_state", "workload", "run_id", "state"),
    # keyset pages of one run in key order (iter_items)
    Index("ix_abp_items_run_key", "workload", "run_id", "item_key", "prompt_version"),
    Index("ix_abp_items_job", "job_id"),
)

jobs = Table(
    "abp_jobs",
    metadata,
    Column("job_id", String(250), primary_key=True),
    Column("workload", String(200), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("round", Integer, nullable=False),
    Column("chunk_index", Integer, nullable=False),
    Column("provider", String(64), nullable=False),
    Column("model", String(200), nullable=False),
    Column("kind", String(16), nullable=False, default="chat"),
    Column("idempotency_key", String(128), nullable=False, unique=True),
    Column("state", String(32), nullable=False),
    Column("staged_path", Text, nullable=False),
    Column("input_sha256", String(64), nullable=False),
    Column("lines", Integer, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("input_ref", Text),
    Column("batch_id", String(200)),
    Column("batch_state", String(32)),
    Column("output_path", Text),
    Column("error_path", Text),
    Column("result_lines", Integer, nullable=False, default=0),
    Column("malformed_lines", Integer, nullable=False, default=0),
    Column("duplicate_lines", Integer, nullable=False, default=0),
    Column("unknown_lines", Integer, nullable=False, default=0),
    Column("missing", Integer, nullable=False, default=0),
    Column("error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("submitted_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("reconciled_at", DateTime(timezone=True)),
    Index("ix_abp_jobs_run", "workload", "run_id", "round"),
)

attempts = Table(
    "abp_attempts",
    metadata,
    Column("job_id", String(250), primary_key=True),
    Column("custom_id", String(64), primary_key=True),
    Column("workload", String(200), nullable=False),
    Column("item_key", String(64), nullable=False),
    Column("prompt_version", String(100), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("mode", String(16), nullable=False),
    Column("outcome", String(32)),
    Column("discarded", Boolean, nullable=False, default=False),
    Column("error_code", String(100)),
    Column("error_message", Text),
    *_usage_columns(),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_abp_attempts_item", "workload", "item_key", "prompt_version"),
    Index("ix_abp_attempts_run", "workload", "run_id"),
)

runs = Table(
    "abp_runs",
    metadata,
    Column("workload", String(200), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("provider", String(64)),
    Column("model", String(200)),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("report_json", Text),
)

published = Table(
    "abp_results",
    metadata,
    Column("workload", String(200), primary_key=True),
    Column("item_key", String(64), primary_key=True),
    Column("prompt_version", String(100), primary_key=True),
    Column("app_id", Text, nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("state", String(32), nullable=False),
    Column("output_json", Text),
    Column("published_at", DateTime(timezone=True), nullable=False),
)
