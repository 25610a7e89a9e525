"""Airflow connections for Bedrock over an ``aws`` connection, as the tests write them (environment variables)."""

from __future__ import annotations

import json
from typing import Any

import pytest

#: the role Bedrock's batch jobs run as (the emulator checks its form only)
ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"


def aws_and_bedrock(monkeypatch: pytest.MonkeyPatch, aws: dict[str, Any], bedrock: dict[str, Any]) -> None:
    """Connections ``abp_aws`` (type ``aws``, fields ``aws``) and ``abp_bedrock`` (``bedrock_batch``, fields ``bedrock``).

    :param monkeypatch: the test's monkeypatch
    :param aws: the aws connection's fields (login, password, extra)
    :param bedrock: the bedrock_batch connection's fields
    """
    monkeypatch.setenv("AIRFLOW_CONN_ABP_AWS", json.dumps({"conn_type": "aws", **aws}))
    monkeypatch.setenv("AIRFLOW_CONN_ABP_BEDROCK", json.dumps({"conn_type": "bedrock_batch", **bedrock}))


def bedrock_conn(url: str, bucket: str) -> dict[str, Any]:
    """A ``bedrock_batch`` connection's fields: Bedrock at ``url``, staging in ``bucket``, keys from ``abp_aws``.

    :param url: the Bedrock endpoint (the emulator)
    :param bucket: the S3 bucket of the input and output files
    """
    return {
        "host": url,
        "extra": {
            "aws_conn_id": "abp_aws",
            "region_name": "us-east-1",
            "role_arn": ROLE,
            "s3_uri": f"s3://{bucket}/llm-batch/input",
            "output_s3_uri": f"s3://{bucket}/llm-batch/output",
            "max_retries": 0,
        },
    }
