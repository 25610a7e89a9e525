"""Where a workload's final answers go: the user's tables and consumers, each item once.

:class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink` writes into a table through an Airflow
SQL connection, :class:`~airflow_batch_provider.sinks.pgvector.PgVectorSink` embeddings into a
pgvector column, :class:`~airflow_batch_provider.sinks.consumer.Consumer` calls a function once
per answer with an idempotency key (a ticket, an email); :mod:`airflow_batch_provider.ledger.deliveries`
records every delivery and hand-off.
"""

from __future__ import annotations

from airflow_batch_provider.ledger.handoffs import HandOff
from airflow_batch_provider.sinks.consumer import Consumer
from airflow_batch_provider.sinks.pgvector import PgVectorSink
from airflow_batch_provider.sinks.sql import SqlUpsertSink

__all__ = ["Consumer", "HandOff", "PgVectorSink", "SqlUpsertSink"]
