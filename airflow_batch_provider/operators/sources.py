"""Which reader a prepare's ``records=`` takes, and opening it: files, callables, tables, Parquet, workloads.

The reading itself lives in :mod:`airflow_batch_provider.services.records` (JSONL, CSV, a
callable), :mod:`~airflow_batch_provider.services.sources_sql`,
:mod:`~airflow_batch_provider.services.sources_parquet` and
:mod:`~airflow_batch_provider.services.sources_workload` (another workload's answers); here the source is rendered with the task
context and opened lazily, so that a failing open is reported like any failure of the source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, closing
from typing import Any, Final

from airflow_batch_provider.core.lineage import DatasetRef
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.hooks.sql import sql_connection_hook
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.sources_parquet import ParquetSource
from airflow_batch_provider.services.sources_sql import SqlPaging, SqlSource, read_sql
from airflow_batch_provider.services.sources_sql_stream import stream_sql
from airflow_batch_provider.services.sources_workload import WorkloadSource, read_workload

#: What ``records=`` takes: a JSONL/CSV/Parquet path or URL, a callable returning dicts, a table or
#: query, a Parquet file, another workload's published answers.
RecordSource = str | Callable[..., Iterable[Mapping[str, Any]]] | SqlSource | ParquetSource | WorkloadSource


#: Connection types whose driver keeps a named cursor on the server (psycopg 3, psycopg2).
SERVER_CURSOR_TYPES: Final = frozenset({"postgres", "postgresql"})


def read_sql_source(
    source: SqlSource, id_field: str, paging: SqlPaging | None = None
) -> Iterator[SourceRecord]:
    """Read a SQL source through its connection's hook; the connection is closed when reading ends.

    The hook is the one the connection's type names (:mod:`airflow_batch_provider.hooks.sql`,
    shared with the SQL sink). On PostgreSQL the rows come through one server-side cursor, a page
    per fetch (:mod:`airflow_batch_provider.services.sources_sql_stream`); every other database is
    read in keyset pages with the hook's parameter marker
    (:mod:`airflow_batch_provider.services.sources_sql`).

    :param source: the source (its ``sql`` already rendered)
    :param id_field: the prompt's id field
    :param paging: counts what was read, when given
    """
    hook, conn_type = sql_connection_hook(source.conn_id, "a SqlSource")
    with closing(hook.get_conn()) as conn:
        if conn_type.lower() in SERVER_CURSOR_TYPES:
            yield from stream_sql(conn, source, id_field=id_field, paging=paging)
        else:
            yield from read_sql(conn, source, placeholder=hook.placeholder, id_field=id_field, paging=paging)


def describe_source(records: RecordSource) -> str:
    """The source in words, for messages (never a connection's secret: only its id).

    :param records: the operator's ``records``
    """
    if isinstance(records, (SqlSource, ParquetSource, WorkloadSource)):
        return records.describe()
    return records if isinstance(records, str) else "callable"


def source_dataset(records: RecordSource) -> DatasetRef | None:
    """What ``records`` reads, for lineage (``None``: a callable or another workload's answers, which name no dataset).

    :param records: the operator's ``records``
    """
    if isinstance(records, (SqlSource, ParquetSource)):
        return records.dataset
    return DatasetRef("path", records) if isinstance(records, str) else None


def open_records(
    records: RecordSource,
    *,
    context: Any,
    stack: ExitStack,
    render: Callable[[Any, Any], Any],
    template: PromptTemplate,
    records_conn_id: str | None,
    ledger_conn_id: str | None = None,
) -> Iterator[SourceRecord]:
    """The records of ``records``, read lazily (files stay open in ``stack``).

    :param records: the operator's ``records``
    :param context: the task context
    :param stack: closes what is opened when prepare is done with it
    :param render: renders a templated string with the context (the operator's ``render_template``)
    :param template: the prompt (its ``id_field`` and the fields a Parquet file is projected to)
    :param records_conn_id: the object store's connection for a path
    :param ledger_conn_id: the reading group's ledger (a ``WorkloadSource`` without its own)
    """
    from airflow_batch_provider.services.records import read_csv, read_jsonl, read_values

    if isinstance(records, WorkloadSource):
        return _workload(records, context, render, template, ledger_conn_id)
    if callable(records):
        produce = records
        return read_values(lambda: produce(context))
    if isinstance(records, SqlSource):
        rendered = dataclasses.replace(
            records,
            sql=None if records.sql is None else render(records.sql, context),
            table=None if records.table is None else render(records.table, context),
        )
        return read_sql_source(rendered, template.id_field)
    if isinstance(records, str) and render(records, context).endswith(".parquet"):
        records = ParquetSource(records)
    if isinstance(records, ParquetSource):
        return _parquet(records, context, stack, render, template, records_conn_id)
    from airflow.sdk import ObjectStoragePath

    path = ObjectStoragePath(render(records, context), conn_id=records_conn_id)
    reader = read_csv if str(path).endswith(".csv") else read_jsonl

    def opened() -> Iterator[SourceRecord]:
        # Opened on first read, so that a failing open is reported like any source failure.
        yield from reader(stack.enter_context(path.open("rb")))

    return opened()


def _workload(
    source: WorkloadSource,
    context: Any,
    render: Callable[[Any, Any], Any],
    template: PromptTemplate,
    ledger_conn_id: str | None,
) -> Iterator[SourceRecord]:
    rendered = dataclasses.replace(source, workload=render(source.workload, context))
    ledger = LedgerHook(source.ledger_conn_id or ledger_conn_id).get_conn()
    yield from read_workload(ledger, rendered, id_field=template.id_field)


def _parquet(
    source: ParquetSource,
    context: Any,
    stack: ExitStack,
    render: Callable[[Any, Any], Any],
    template: PromptTemplate,
    records_conn_id: str | None,
) -> Iterator[SourceRecord]:
    from airflow.sdk import ObjectStoragePath

    from airflow_batch_provider.services.sources_parquet import read_parquet

    path = ObjectStoragePath(render(source.path, context), conn_id=source.conn_id or records_conn_id)
    id_column = source.id_column or template.id_field
    columns = [
        c for c in (template.fields if source.columns is None else source.columns) if c != template.id_field
    ]
    yield from read_parquet(
        stack.enter_context(path.open("rb")),
        name=str(path),
        id_column=id_column,
        id_field=template.id_field,
        columns=columns,
        batch_size=source.batch_size,
    )
