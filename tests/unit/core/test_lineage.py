"""OpenLineage names of files and SQL datasources, by the naming spec: no secret, no query string."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_batch_provider.core.lineage import DatasetName, Datasource, datasource_of, path_dataset


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/data/in/tickets.jsonl", DatasetName("file", "/data/in/tickets.jsonl")),
        ("file:///data/in/tickets.jsonl", DatasetName("file", "/data/in/tickets.jsonl")),
        ("file://nas01/share/tickets.csv", DatasetName("file://nas01", "/share/tickets.csv")),
        ("s3://exports/2026/tickets.parquet", DatasetName("s3://exports", "2026/tickets.parquet")),
        ("s3a://exports/2026/tickets.parquet", DatasetName("s3://exports", "2026/tickets.parquet")),
        ("gs://exports/tickets.jsonl", DatasetName("gs://exports", "tickets.jsonl")),
        ("gcs://exports/tickets.jsonl", DatasetName("gs://exports", "tickets.jsonl")),
        ("hdfs://namenode:8020/data/t.csv", DatasetName("hdfs://namenode:8020", "/data/t.csv")),
        (
            "abfss://raw@acct.dfs.core.windows.net/t.jsonl",
            DatasetName("abfss://raw@acct.dfs.core.windows.net", "/t.jsonl"),
        ),
    ],
)
def test_a_file_is_named_by_its_store_and_path_as_the_naming_spec_says(
    path: str, expected: DatasetName
) -> None:
    assert path_dataset(path) == expected


def test_a_relative_local_path_is_named_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert path_dataset("in/tickets.jsonl") == DatasetName("file", str(tmp_path / "in" / "tickets.jsonl"))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # ObjectStoragePath's form with the connection id before the bucket
        ("s3://aws_default@exports/t.jsonl?versionId=7#x", DatasetName("s3://exports", "t.jsonl")),
        (
            "https://user:hunter2@files.example.com:8443/t.csv?sig=abc",
            DatasetName("https://files.example.com:8443", "/t.csv"),
        ),
        (
            "abfss://raw:hunter2@acct.dfs.core.windows.net/t.jsonl",
            DatasetName("abfss://raw@acct.dfs.core.windows.net", "/t.jsonl"),
        ),
    ],
)
def test_a_urls_user_password_query_and_fragment_never_reach_the_name(
    url: str, expected: DatasetName
) -> None:
    named = path_dataset(url)
    assert named == expected
    assert all(secret not in named.namespace + named.name for secret in ("hunter2", "sig=", "versionId"))


def test_a_sqlite_database_is_named_by_its_files_absolute_path_and_its_tables_by_the_main_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert datasource_of("sqlite", "/var/db/labels.sqlite", None) == Datasource(
        "sqlite", "/var/db/labels.sqlite", "main"
    )
    monkeypatch.chdir(tmp_path)
    assert datasource_of("sqlite", "labels.sqlite", None).authority == os.path.join(tmp_path, "labels.sqlite")


def test_another_sql_datasource_without_openlineage_info_is_named_by_its_type_host_and_port() -> None:
    assert datasource_of("MySQL", "db.internal", 3306) == Datasource("mysql", "db.internal:3306", None)
    assert datasource_of("vertica", "db.internal", None) == Datasource("vertica", "db.internal", None)
    assert datasource_of("duckdb", None, None) == Datasource("duckdb", None, None)
