"""The OpenLineage datasets of a task: its sources' and sinks' :class:`~airflow_batch_provider.core.lineage.DatasetRef` named.

Airflow's OpenLineage provider (the ``openlineage`` extra) calls an operator's
``get_openlineage_facets_on_start`` when the task starts and ``get_openlineage_facets_on_complete``
when it ends; the prepare and deliver operators answer with :func:`operator_lineage`. Nothing here
imports the provider until it asks, so the package runs the same without it.

A table or query is named the way the provider names the tables of its own SQL operators: the
connection's ``common.sql`` hook gives the namespace and the database (``postgres://host:5432``,
``{database}``), the provider's SQL parser reads the table names out of the statement and qualifies
them with the hook's default schema. A file is named by :func:`~airflow_batch_provider.core.lineage.path_dataset`.
A dataset that cannot be named (its connection is gone, a template the context cannot render) is
left out with a warning naming it; the others are reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from airflow_batch_provider.core.lineage import DatasetRef, datasource_of, path_dataset
from airflow_batch_provider.core.names import is_templated
from airflow_batch_provider.hooks.sql import sql_connection_hook

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    #: What ``get_openlineage_facets_on_start`` and ``get_openlineage_facets_on_complete`` return.
    Lineage: TypeAlias = OperatorLineage[Dataset, Any]

log = logging.getLogger(__name__)

#: Renders a declared text (a templated query or path) with the task's context.
Render = Callable[[str], str]


def operator_lineage(
    *, inputs: Sequence[DatasetRef | None] = (), outputs: Sequence[DatasetRef | None] = (), render: Render
) -> Lineage:
    """The provider's ``OperatorLineage`` of a task: its inputs and outputs named (``None``: nothing declared).

    :param inputs: what the task reads
    :param outputs: what the task writes
    :param render: renders a declared text with the task's context
    """
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=[d for ref in inputs if ref is not None for d in datasets(ref, render, "input")],
        outputs=[d for ref in outputs if ref is not None for d in datasets(ref, render, "output")],
    )


def datasets(ref: DatasetRef, render: Render, role: Literal["input", "output"]) -> list[Dataset]:
    """The datasets of one ref: a file, a table, or the tables a query reads (none when it cannot be named).

    :param ref: the declared dataset
    :param render: renders its text with the task's context
    :param role: ``input`` or ``output``, for the warning
    """
    try:
        text = render(ref.text)
        if is_templated(text):
            raise ValueError("the task's context did not render its template")
        if ref.kind == "path":
            from airflow.providers.common.compat.openlineage.facet import Dataset

            named = path_dataset(text)
            return [Dataset(namespace=named.namespace, name=named.name)]
        if ref.conn_id is None:
            raise ValueError("a table or query needs its connection")
        return sql_datasets(ref.conn_id, f"SELECT * FROM {text}" if ref.kind == "table" else text)
    except Exception as exc:  # lineage never fails a task: the dataset is left out, with why
        where = f" through connection {ref.conn_id!r}" if ref.conn_id else ""
        log.warning(
            "OpenLineage: the %s %s (%s%s) is not reported: %s. Check the connection and the template.",
            role,
            ref.kind,
            ref.text if ref.kind != "query" else "the source's query",
            where,
            exc,
        )
        return []


def sql_datasets(conn_id: str, sql: str) -> list[Dataset]:
    """The tables ``sql`` reads, named as the provider names a SQL operator's tables on that connection.

    :param conn_id: the SQL connection
    :param sql: the statement (``SELECT * FROM {table}`` for a table)
    """
    from airflow.providers.openlineage.sqlparser import DatabaseInfo, SQLParser

    hook, conn_type = sql_connection_hook(conn_id, "OpenLineage")
    conn = hook.connection
    info = hook.get_openlineage_database_info(conn)
    default_schema: str | None
    if info is None:  # the hook names none (SQLite): the connection's type, host and port do
        source = datasource_of(conn_type, conn.host, conn.port)
        info = DatabaseInfo(scheme=source.scheme, authority=source.authority)
        default_schema = source.default_schema or hook.get_openlineage_default_schema()
    else:
        default_schema = hook.get_openlineage_default_schema()
    parser = SQLParser(dialect=hook.get_openlineage_database_dialect(conn), default_schema=default_schema)
    meta = parser.parse(parser.split_sql_string(sql))
    if meta is None:
        raise ValueError("the provider's SQL parser could not read the statement")
    tables, _ = parser.get_metadata_from_parser(
        inputs=meta.in_tables, outputs=[], database_info=info, namespace=parser.create_namespace(info)
    )
    return list(tables)


def task_context(task_instance: Any = None) -> Any:
    """The task's context, to render templates with: the task instance's, else the running task's (``None``: none).

    :param task_instance: the task instance the provider passes on completion
    """
    if task_instance is not None and callable(getattr(task_instance, "get_template_context", None)):
        return task_instance.get_template_context()
    from airflow.sdk import get_current_context

    try:
        return get_current_context()
    except Exception:  # outside a running task: templates stay as they are, and are left out
        return None


def renderer(operator: Any, task_instance: Any = None) -> Render:
    """Render a declared text with the operator's Jinja and the task's context (as it is, without one).

    :param operator: the task's operator (its ``render_template``)
    :param task_instance: the task instance the provider passes on completion
    """
    context = task_context(task_instance)
    if context is None:
        return lambda text: text
    return lambda text: str(operator.render_template(text, context))
