"""Ledger tables (SQLAlchemy Core) and the schema version.

Money is stored as integer nano-dollars (``*_nusd``): exact on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    text,
)

#: 1: first release. 2: job claims and in-doubt columns, ``abp_items.review_*``, ``abp_runs.dag_id``,
#: the ``abp_leases`` and ``abp_audit`` tables. 3: ``abp_runs.batch_conn_id`` (the connection a run
#: started on). 4: the ``abp_extra_lines`` table (billed result lines beyond an item's one
#: answer: a second answer, an unreadable line; created when missing, like every table), and
#: ``abp_runs.prompt_version`` and ``abp_runs.prompt_sha256`` (the prompt a run started with).
#: 5: the ``abp_deliveries`` table (what each sink and consumer was handed, per item and prompt
#: version; a new table, created when missing like every table), and the
#: ``abp_prompt_changes`` table (items a run sent again because its prompt's content
#: changed under the same version; created when missing, like every table).
#: 6: indexes for the reads of a ledger with a long history (``ix_abp_runs_started``,
#: ``ix_abp_jobs_state``, ``ix_abp_items_review``, ``ix_abp_results_run``: :data:`ADDED_INDEXES`,
#: created when missing on open, each on its own).
#: 7: ``abp_deliveries``' index by delivery key holds only the hand-offs a consumer is offered
#: (``ix_abp_deliveries_offered``, partial; the full ``ix_abp_deliveries_key`` it replaces, which
#: every sink row paid for, is dropped on open: :data:`DROPPED_INDEXES`).
#: Older ledgers are upgraded in place on open.
SCHEMA_VERSION: Final = 7


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that goes in as UTC and comes back timezone-aware UTC, on SQLite too.

    SQLite keeps no zone: a naive value read back would be taken for local time by ``astimezone``
    or ``timestamp()``. Values are converted to UTC on the way in (a naive value is taken to be
    UTC already, as every earlier version of this package wrote it) and marked UTC on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC; SQLite stores the naive UTC wall clock.

        :param value: the value written
        :param dialect: the database dialect
        """
        if value is None:
            return None
        utc = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """Return an aware UTC datetime.

        :param value: the value read
        :param dialect: the database dialect
        """
        if value is None:
            return None
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
        if moment.tzinfo is None:
            return moment.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc)

    # The two processors below do what the two methods above say in one call per value: the
    # ledger writes a timestamp per row, and reconcile writes tens of thousands of rows.
    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any]:
        """Return the per-value bind function (UTC first, then the dialect's own conversion).

        :param dialect: the database dialect
        """
        inner = self.impl_instance.dialect_impl(dialect).bind_processor(dialect)
        utc = timezone.utc
        naive = dialect.name == "sqlite"  # SQLite's DATETIME formats the fields and drops the zone

        # A bulk write binds the same ``now`` on every row: remember the last one (one tuple, so a
        # thread never sees the input of one value with the output of another).
        last: list[tuple[Any, Any]] = [(None, None)]

        def process(value: Any) -> Any:
            seen, done = last[0]
            if value is seen:
                return done
            given = value
            if value is not None:
                zone = value.tzinfo
                if zone is None:
                    if not naive:
                        value = value.replace(tzinfo=utc)
                elif zone is not utc:
                    value = value.astimezone(utc)
            out = inner(value) if inner is not None else value
            last[0] = (given, out)
            return out

        return process

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], Any]:
        """Return the per-value result function (the dialect's conversion, then UTC).

        :param dialect: the database dialect
        :param coltype: the DBAPI column type
        """
        inner = self.impl_instance.dialect_impl(dialect).result_processor(dialect, coltype)
        utc = timezone.utc

        last: list[tuple[Any, Any]] = [(None, None)]  # rows written together read back one stamp

        def process(value: Any) -> Any:
            if value is None:
                return None
            seen, done = last[0]
            if value == seen:
                return done
            raw = value
            if inner is not None:
                value = inner(value)
            if not isinstance(value, datetime):
                value = datetime.fromisoformat(str(value))
            zone = value.tzinfo
            if zone is None:
                value = value.replace(tzinfo=utc)
            elif zone is not utc:
                value = value.astimezone(utc)
            last[0] = (raw, value)
            return value

        return process


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
    # a person's decision on a review item: NULL (open), ``resolved`` or ``skipped``
    Column("review_action", String(16)),
    Column("review_note", Text),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index("ix_abp_items_run_state", "workload", "run_id", "state"),
    # keyset pages of one run in key order (iter_items)
    Index("ix_abp_items_run_key", "workload", "run_id", "item_key", "prompt_version"),
    Index("ix_abp_items_job", "job_id"),
    # the open review queue in key order and its counts (review_items, review_counts; schema version 6):
    # partial, so that no other read of the items weighs it (the queries name the state inline);
    # the state a column too, so that SQLite without statistics prefers it to the workload's indexes
    Index(
        "ix_abp_items_review",
        "workload",
        "state",
        "item_key",
        "prompt_version",
        "error_code",
        "review_action",
        sqlite_where=text("state = 'review'"),
        postgresql_where=text("state = 'review'"),
    ),
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
    Column("created_at", UTCDateTime(), nullable=False),
    Column("submitted_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    Column("reconciled_at", UTCDateTime()),
    # compare-and-set claim on the create call (Ledger.claim_job)
    Column("claim_owner", String(250)),
    Column("claim_count", Integer, nullable=False, default=0, server_default="0"),
    Column("claim_expires_at", UTCDateTime()),
    # why a create call's outcome is unknown (state ``in_doubt``)
    Column("in_doubt_reason", Text),
    Column("in_doubt_at", UTCDateTime()),
    # what the upload task staged at the provider: ``file`` (input_ref is the file id), ``uri``
    # (input_ref is the object URI) or ``inline`` (nothing at the provider; submit posts the chunk)
    Column("input_kind", String(16)),
    Index("ix_abp_jobs_run", "workload", "run_id", "round"),
    # the jobs in doubt of every workload (jobs_in_doubt; schema version 6)
    Index("ix_abp_jobs_state", "state", "workload"),
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
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
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
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Column("report_json", Text),
    Column("dag_id", String(250)),
    # the batch connection id as prepare rendered it: every later task of the run must render the same
    Column("batch_conn_id", String(250)),
    # the prompt as prepare rendered it (version and content digest): every later task must render the same
    Column("prompt_version", String(100)),
    Column("prompt_sha256", String(64)),
    # a workload's runs newest first (the workload page, the retention policy; schema version 6)
    Index("ix_abp_runs_started", "workload", "started_at"),
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
    Column("published_at", UTCDateTime(), nullable=False),
    # one run's published answers in key order (the sinks' and consumers' candidates; schema version 6)
    Index("ix_abp_results_run", "workload", "run_id", "item_key", "prompt_version"),
)

leases = Table(
    "abp_leases",
    metadata,
    Column("workload", String(200), primary_key=True),
    Column("run_id", String(250), nullable=False),
    Column("dag_id", String(250)),
    Column("owner", String(250), nullable=False),
    Column("acquired_at", UTCDateTime(), nullable=False),
    Column("taken_over_from", String(250)),
)

audit = Table(
    "abp_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("action", String(32), nullable=False),
    Column("workload", String(200), nullable=False),
    Column("item_count", Integer, nullable=False),
    Column("target", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Index("ix_abp_audit_workload", "workload", "at"),
)

#: Result lines the provider billed beyond the one answer an item keeps (schema version 4):
#: ``duplicate`` (a second copy of a line with another answer), ``superseded`` (an error line
#: with usage for an item whose success is kept), ``unreadable`` (a damaged line whose usage could
#: not be read; its tokens are an estimate from the item's request, ``estimated`` true). One row
#: per line of a job's files, numbered in reading order; a reconcile rewrites the job's rows.
extra_lines = Table(
    "abp_extra_lines",
    metadata,
    Column("job_id", String(250), primary_key=True),
    Column("ordinal", Integer, primary_key=True),
    Column("workload", String(200), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("custom_id", String(64)),
    Column("kind", String(16), nullable=False),
    Column("estimated", Boolean, nullable=False, default=False),
    *_usage_columns(),
    Index("ix_abp_extra_lines_run", "workload", "run_id"),
)

#: Items a run prepares again because the prompt's content changed under the same version (an
#: in-place edit, schema version 5): one row per item and run, with the digest of the prompt the
#: item was last prepared with and of the one this run renders. The recorded reason such an item
#: is sent and paid again (the report's ``prompt_changed``).
prompt_changes = Table(
    "abp_prompt_changes",
    metadata,
    Column("workload", String(200), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("item_key", String(64), primary_key=True),
    Column("prompt_version", String(100), primary_key=True),
    Column("previous_run_id", String(250), nullable=False),
    Column("previous_sha256", String(64), nullable=False),
    Column("prompt_sha256", String(64), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Index("ix_abp_prompt_changes_item", "workload", "item_key", "prompt_version"),
)

#: Columns added after version 1, by table: an older ledger gets them with ``ALTER TABLE ... ADD``.
ADDED_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "abp_items": ("review_action", "review_note"),
    "abp_jobs": (
        "claim_owner",
        "claim_count",
        "claim_expires_at",
        "in_doubt_reason",
        "in_doubt_at",
        "input_kind",
    ),
    "abp_runs": ("dag_id", "batch_conn_id", "prompt_version", "prompt_sha256"),
}

#: Indexes added after their table (schema version 6): an older ledger gets each one that is
#: missing with ``CREATE INDEX IF NOT EXISTS`` (:func:`airflow_batch_provider.ledger.indexes.add_missing_indexes`).
ADDED_INDEXES: Final[tuple[str, ...]] = (
    "ix_abp_runs_started",
    "ix_abp_jobs_state",
    "ix_abp_items_review",
    "ix_abp_results_run",
    "ix_abp_deliveries_offered",
)
#: Indexes a later version replaced, with their tables (schema version 7): dropped on open where a ledger has them
#: (:func:`airflow_batch_provider.ledger.indexes.drop_replaced_indexes`).
DROPPED_INDEXES: Final[dict[str, str]] = {"ix_abp_deliveries_key": "abp_deliveries"}

#: Infrastructure cost of a self-hosted job (the vLLM lane): GPU time of its pod, at the
#: connection's hourly rate. One row per job; a re-run of the pod task overwrites it.
infra_costs = Table(
    "abp_infra_costs",
    metadata,
    Column("job_id", String(250), primary_key=True),
    Column("workload", String(200), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("pod_name", String(253)),
    Column("gpu_type", String(64)),
    Column("gpu_count", Integer, nullable=False),
    Column("started_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    Column("gpu_seconds", BigInteger, nullable=False),
    Column("usd_per_gpu_hour_micros", BigInteger, nullable=False),
    Column("cost_nusd", BigInteger, nullable=False),
    Column("outcome", String(32), nullable=False),
    Column("reason", Text),
    Index("ix_abp_infra_costs_run", "workload", "run_id"),
)

# Quotas shared by every task of a connection (:mod:`airflow_batch_provider.ledger.quota`). Times
# are epoch seconds (``Double``): the window arithmetic is done on them, in every process alike.

#: One row per quota key (a connection): the row every reservation locks first, and the pause a
#: provider ordered (Retry-After) for everyone using the key.
quota_keys = Table(
    "abp_quota_keys",
    metadata,
    Column("quota_key", String(250), primary_key=True),
    Column("paused_until", Double, nullable=False, default=0.0),
    Column("seq", BigInteger, nullable=False, default=0),
)

#: The sliding log of the real-time requests reserved under a quota key: one row per request,
#: its tokens (the estimate until the answer, then the charge) counted from ``at``; until its
#: answer is ``settled`` it counts as if sent now.
rate_log = Table(
    "abp_rate_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("quota_key", String(250), nullable=False),
    Column("at", Double, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("settled", Boolean, nullable=False, default=False),
    Index("ix_abp_rate_log_key_at", "quota_key", "at"),
)

#: Batch jobs admitted under a quota key's enqueued-token limit, per model: their estimated input
#: tokens count until the batch ends (``released_at`` set).
enqueued = Table(
    "abp_enqueued",
    metadata,
    Column("quota_key", String(250), primary_key=True),
    Column("job_id", String(250), primary_key=True),
    Column("model", String(200), nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("admitted_at", Double, nullable=False),
    Column("released_at", Double),
    Index("ix_abp_enqueued_open", "quota_key", "model", "released_at"),
)

#: What each sink wrote and each consumer was offered or acknowledged (schema version 5), one row
#: per workload, sink (or consumer), application id and prompt version
#: (:mod:`airflow_batch_provider.ledger.deliveries`). ``state`` is ``delivered`` (the sink committed
#: the row whose values hash to ``result_sha256``), ``refused`` (the sink refused it: ``error``),
#: ``offered`` (a consumer was handed it under ``delivery_key``; a sink's row keeps ``""`` there) or
#: ``acknowledged`` (the consumer acted on it). A changed answer updates the row, adding none.
deliveries = Table(
    "abp_deliveries",
    metadata,
    Column("workload", String(200), primary_key=True),
    Column("sink", String(200), primary_key=True),
    Column("app_id", String(500), primary_key=True),
    Column("prompt_version", String(100), primary_key=True),
    Column("item_key", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("result_sha256", String(64), nullable=False),
    Column("delivery_key", String(64), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("error", Text),
    Column("writes", Integer, nullable=False, default=1),
    Column("delivered_at", UTCDateTime(), nullable=False),
    Index("ix_abp_deliveries_run", "workload", "sink", "run_id"),
    # a consumer's offered hand-offs by key (schema version 7); a sink's rows are never looked up by key
    Index(
        "ix_abp_deliveries_offered",
        "workload",
        "sink",
        "delivery_key",
        sqlite_where=text("state = 'offered'"),
        postgresql_where=text("state = 'offered'"),
    ),
)
