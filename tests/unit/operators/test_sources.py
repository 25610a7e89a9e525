"""Prepare reads a table (templated query, real SQLite connection), a Parquet file on disk and on S3."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import RecordSourceError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.operators.batch import BatchPrepareOperator
from airflow_batch_provider.operators.sources import describe_source
from airflow_batch_provider.services.sources_parquet import ParquetSource
from airflow_batch_provider.services.sources_sql import SqlSource
from airflow_batch_provider.services.sources_workload import WorkloadSource
from tests.unit.ledger.answered import answered_run

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ channel }}: {{ text }}", id_field="id")
RUN = "manual__2026-12-01T00:00:00+00:00"


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", url)
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", f"file://{tmp_path / 'staging'}")
    monkeypatch.setenv("AIRFLOW_CONN_OPS_TEST", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    return Ledger.from_url(url)


def prepare(records: object, workload: str = "src") -> BatchPrepareOperator:
    return BatchPrepareOperator(
        task_id="prepare",
        workload=workload,
        batch_conn_id="ops_test",
        records=records,  # type: ignore[arg-type]
        prompt=PROMPT,
    )


def test_prepare_reads_the_rows_its_templated_query_selects_through_a_sqlite_connection(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "warehouse.db"
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", f"sqlite://{quote(str(path), safe='')}")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE comments (comment_id INTEGER PRIMARY KEY, channel TEXT, text TEXT, day TEXT)")
    db.executemany(
        "INSERT INTO comments VALUES (?, ?, ?, ?)",
        [(i, "email", f"comment {i}", "2026-12-01" if i % 2 else "2026-11-30") for i in range(1, 21)],
    )
    db.commit()
    db.close()
    source = SqlSource(
        conn_id="warehouse",
        sql="SELECT comment_id, channel, text FROM comments WHERE day = '{{ params.day }}'",
        id_column="comment_id",
        page_size=3,
    )
    manifests = prepare(source).execute({"run_id": RUN, "params": {"day": "2026-12-01"}})  # type: ignore[arg-type]
    assert ledger.count_states("src", RUN) == {"staged": 10}
    assert len(manifests) == 1
    assert source.sql and "{{ params.day }}" in source.sql  # the DAG's source is left as written


def test_prepare_reads_a_parquet_file_by_its_suffix_with_only_the_columns_the_prompt_reads(
    ledger: Ledger, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "comments.parquet"
    table = pa.table(
        {
            "id": [f"c{i}" for i in range(12)],
            "channel": ["chat"] * 12,
            "text": [f"text {i}" for i in range(12)],
            "unread": [b"\xff"] * 12,  # not UTF-8: would be a reject if it were read
        }
    )
    pq.write_table(table, path, row_group_size=5)
    prepare(str(path)).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert ledger.count_states("src", RUN) == {"staged": 12}


def test_a_parquet_file_without_a_column_the_prompt_reads_fails_naming_the_file_the_column_and_its_columns(
    ledger: Ledger, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "comments.parquet"
    pq.write_table(pa.table({"id": ["a"], "body": ["x"]}), path)
    with pytest.raises(
        RecordSourceError, match=r"comments.parquet has no column 'channel'.*\['id', 'body'\]"
    ):
        prepare(ParquetSource(str(path))).execute({"run_id": RUN})  # type: ignore[arg-type]


def test_a_parquet_file_on_s3_is_read_through_the_object_stores_connection(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str
) -> None:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="abp-sources")
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.table({"ticket": ["t1", "t2", "t3"], "channel": ["a"] * 3, "text": ["x", "y", "z"]}), sink
    )
    s3.put_object(Bucket="abp-sources", Key="in/tickets.parquet", Body=sink.getvalue().to_pybytes())
    conn = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps(conn))
    source = ParquetSource("s3://abp-sources/in/tickets.parquet", id_column="ticket", conn_id="lake")
    prepare(source).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert ledger.count_states("src", RUN) == {"staged": 3}


def test_a_source_is_described_by_its_table_or_path_and_its_connection_id_only() -> None:
    assert describe_source(SqlSource(conn_id="wh", table="t")) == "SqlSource(table t through connection 'wh')"
    assert describe_source(ParquetSource("/x.parquet")) == "ParquetSource(/x.parquet)"
    assert describe_source(lambda context: []) == "callable"
    assert describe_source(WorkloadSource("extract")) == "WorkloadSource(answers of workload 'extract')"


def test_a_path_source_declares_its_path_and_a_callable_declares_nothing_for_lineage() -> None:
    from airflow_batch_provider.core.lineage import DatasetRef
    from airflow_batch_provider.operators.sources import source_dataset

    assert source_dataset("{{ params.folder }}/tickets.jsonl") == DatasetRef(
        "path", "{{ params.folder }}/tickets.jsonl"
    )
    assert source_dataset(ParquetSource("/data/t.parquet")) == DatasetRef("path", "/data/t.parquet")
    assert source_dataset(SqlSource(conn_id="db", table="t")) == DatasetRef("table", "t", "db")
    assert source_dataset(lambda context: [{"id": "1"}]) is None


def test_prepare_reads_another_workloads_answers_from_the_ledger_its_source_names(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    answers = {"a": {"channel": "chat", "text": "one"}, "b": {"channel": "mail", "text": "two"}}
    answered_run(ledger, "extract", "r1", answers)  # in the prepare's own ledger
    fields = {"channel": "$.answer.channel", "text": "$.answer.text"}
    source = WorkloadSource(workload="{{ params.step1 }}", fields=fields)
    prepare(source).execute({"run_id": RUN, "params": {"step1": "extract"}})  # type: ignore[arg-type]
    assert ledger.count_states("src", RUN) == {"staged": 2}
    assert {r["app_id"] for r in ledger.iter_items("src", RUN)} == {"a", "b"}
    # another ledger, through its own connection
    other = Ledger.from_url(f"sqlite:///{tmp_path / 'other.sqlite'}")
    answered_run(other, "extract", "r1", {"c": {"channel": "chat", "text": "three"}})
    monkeypatch.setenv(
        "AIRFLOW_CONN_STEP1_LEDGER",
        json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "other.sqlite")}),
    )
    elsewhere = WorkloadSource(workload="extract", fields=fields, ledger_conn_id="step1_ledger")
    prepare(elsewhere, workload="src2").execute({"run_id": RUN})  # type: ignore[arg-type]
    assert {r["app_id"] for r in ledger.iter_items("src2", RUN)} == {"c"}


def test_prepare_from_a_workload_with_no_published_answers_fails_naming_it_and_the_remedy(
    ledger: Ledger,
) -> None:
    with pytest.raises(
        RecordSourceError,
        match=r"WorkloadSource\(answers of workload 'invoice_entities'\) stopped early: after 0 records, reading "
        r"the source raised RecordSourceError: workload 'invoice_entities' has no published answers in this "
        r"ledger.*Run the workload's DAG first",
    ):
        prepare(WorkloadSource(workload="invoice_entities")).execute({"run_id": RUN})  # type: ignore[arg-type]
