"""Staging on S3 works like local staging: the nightly DAG with `staging_root = s3://...`,
through Airflow's ObjectStoragePath and an `aws` connection, against a real S3 server on
loopback (moto in server mode)."""

from __future__ import annotations

import json

import boto3
import pytest

from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e


def test_the_nightly_dag_stages_chunks_outputs_and_reports_on_s3(
    airflow_home: dict[str, str], s3_endpoint: str, tmp_path: object
) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="abp-staging")
    staging_s3 = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    with openai_dag_env(
        airflow_home,
        tmp_path,  # type: ignore[arg-type]
        connections={"staging_s3": staging_s3},
        password="sk",
        staging_root="s3://abp-staging/llm-batch",
        staging_conn_id="staging_s3",
    ) as (_, env):
        proc = run_airflow(env, "dags", "test", "nightly_feedback_classification")
    assert proc.returncode == 0, tail(proc)
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="abp-staging")
        for o in page.get("Contents", [])
    ]
    names = {k.rsplit("/", 1)[-1] for k in keys}
    assert {"chunk-00000.jsonl", "output-00000.jsonl", "results.jsonl", "report.json"} <= names
    report_key = next(k for k in keys if k.endswith("report.json"))
    report = json.loads(s3.get_object(Bucket="abp-staging", Key=report_key)["Body"].read())
    assert report["items"] == 3000
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    run_id = ledger.runs("feedback_classification", limit=1)[0]["run_id"]
    assert ledger.count_states("feedback_classification", run_id) == {"succeeded": 3000}
    # ObjectStoragePath writes the connection id into the URL: s3://<conn_id>@<bucket>/<key>
    paths = [j.staged_path for j in ledger.get_jobs("feedback_classification", run_id)]
    assert paths and all(p.startswith("s3://staging_s3@abp-staging/llm-batch/") for p in paths), paths
