"""A task's OpenLineage datasets: tables named as the provider names them, files by the spec, failures left out.

The provider's own objects (``OperatorLineage``, its SQL parser, the hooks' database info) against a
real PostgreSQL and a real SQLite file behind Airflow connections. That the provider's listener
emits these for a running DAG is ``tests/dags/test_lineage.py``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.lineage import DatasetRef
from airflow_batch_provider.operators.lineage import operator_lineage, renderer, sql_datasets, task_context

SECRET = "s3cr3t-pw"


def named(datasets: list[Any]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


@pytest.fixture
def support_db(postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A database with ``public.tickets`` and ``crm.customers``, behind the connection ``support_db``."""
    database = postgres_server.create_database()
    postgres_server.execute(
        "CREATE TABLE tickets (ticket_id int, customer_id int, body text)", dbname=database
    )
    postgres_server.execute("CREATE SCHEMA crm", dbname=database)
    postgres_server.execute("CREATE TABLE crm.customers (customer_id int, name text)", dbname=database)
    conn = {
        "conn_type": "postgres",
        "host": "127.0.0.1",
        "port": postgres_server.port,
        "login": "postgres",
        "password": SECRET,  # the test server trusts local connections
        "schema": database,
    }
    monkeypatch.setenv("AIRFLOW_CONN_SUPPORT_DB", json.dumps(conn))
    try:
        yield postgres_server, database
    finally:
        postgres_server.drop_database(database)


def test_a_postgres_table_and_a_querys_tables_are_named_host_port_and_database_schema_table(
    support_db: Any,
) -> None:
    server, database = support_db
    namespace = f"postgres://127.0.0.1:{server.port}"
    assert named(sql_datasets("support_db", "SELECT * FROM tickets")) == [
        (namespace, f"{database}.public.tickets")
    ]
    joined = sql_datasets(
        "support_db",
        "SELECT t.ticket_id, c.name, t.body FROM tickets t JOIN crm.customers c USING (customer_id) WHERE t.body <> ''",
    )
    assert sorted(named(joined)) == [
        (namespace, f"{database}.crm.customers"),
        (namespace, f"{database}.public.tickets"),
    ]
    assert all(SECRET not in d.namespace + d.name and "postgres@" not in d.namespace for d in joined)


def test_a_sqlite_table_is_named_by_the_database_files_path_and_the_main_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_LABELS_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "l.db")})
    )
    lineage = operator_lineage(outputs=[DatasetRef("table", "review_labels", "labels_db")], render=str)
    assert lineage.inputs == []
    assert named(lineage.outputs) == [(f"sqlite://{tmp_path / 'l.db'}", "main.review_labels")]


def test_a_file_is_an_input_a_callable_declares_nothing_and_the_text_is_rendered_first() -> None:
    lineage = operator_lineage(
        inputs=[DatasetRef("path", "s3://exports/{{ ds }}/t.jsonl"), None],
        render=lambda text: text.replace("{{ ds }}", "2026-12-01"),
    )
    assert named(lineage.inputs) == [("s3://exports", "2026-12-01/t.jsonl")]
    assert lineage.outputs == [] and lineage.run_facets == {} and lineage.job_facets == {}


def test_a_dataset_that_cannot_be_named_is_left_out_with_a_warning_and_the_others_are_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the handler on the module's logger itself: looking the connection up configures Airflow's
    # logging, which replaces the root logger's handlers (caplog's among them) when it is the
    # first thing in the process to do so
    logger = logging.getLogger("airflow_batch_provider.operators.lineage")
    logger.addHandler(caplog.handler)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        lineage = operator_lineage(
            inputs=[
                DatasetRef("table", "tickets", "no_such_conn"),
                DatasetRef("path", "/data/{{ params.day }}.jsonl"),  # no context rendered it
                DatasetRef("path", "/data/tickets.jsonl"),
            ],
            render=str,
        )
    logger.removeHandler(caplog.handler)
    assert named(lineage.inputs) == [("file", "/data/tickets.jsonl")]
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "the input table (tickets through connection 'no_such_conn') is not reported" in m for m in messages
    )
    assert any("/data/{{ params.day }}.jsonl" in m and "did not render its template" in m for m in messages)


def test_outside_a_running_task_there_is_no_context_and_texts_are_left_as_they_are() -> None:
    from airflow.sdk import BaseOperator

    assert task_context() is None
    assert renderer(BaseOperator(task_id="t"))("{{ ds }}") == "{{ ds }}"


def test_with_a_task_instances_context_a_template_is_rendered_by_the_operators_jinja() -> None:
    from airflow.sdk import BaseOperator

    class Instance:
        def get_template_context(self) -> dict[str, Any]:
            return {"params": {"table": "tickets_2026"}}

    assert renderer(BaseOperator(task_id="t"), Instance())("{{ params.table }}") == "tickets_2026"


#: run first in the subprocess: every module of the provider and of the OpenLineage client fails to import,
#: but the provider's entry (``get_provider_info``) that Airflow's provider discovery reads
HIDE_PROVIDER = """
import importlib.abc, sys
class Hidden(importlib.abc.MetaPathFinder):
    @staticmethod
    def inside(name):
        below = name.startswith("airflow.providers.openlineage.") or name.split(".")[0] == "openlineage"
        return below and not name.endswith(".get_provider_info")
    def find_spec(self, name, path=None, target=None):
        if self.inside(name):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden)")
        return None
sys.meta_path.insert(0, Hidden())
"""


def test_the_package_imports_and_builds_its_tasks_without_the_openlineage_provider() -> None:
    code = HIDE_PROVIDER + (
        "import pendulum\n"
        "from airflow.sdk import DAG\n"
        "from airflow_batch_provider.pipeline import batch_inference_group\n"
        "from airflow_batch_provider.services.sources_sql import SqlSource\n"
        "from airflow_batch_provider.sinks import SqlUpsertSink\n"
        "with DAG('d', schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:\n"
        "    batch_inference_group(workload='w', records=SqlSource(conn_id='c', table='t'),\n"
        "        prompt='include/prompts/feedback_classification.yaml', batch_conn_id='openai_batch_default',\n"
        "        lane='provider', sinks=[SqlUpsertSink(conn_id='c', table='t', key_columns=['id'],\n"
        "        columns={'label': '$.label'})])\n"
        "print(sorted(t.task_id for t in dag.tasks if t.task_id.split('.')[-1] in ('prepare', 'deliver_t')))\n"
        "print(sorted(m for m in sys.modules if Hidden.inside(m)))\n"
    )
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=repo, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["['w.deliver_t', 'w.prepare']", "[]"]
