"""The ``bedrock_batch`` connection type (``hooks.bedrock``): where AWS credentials belong, and its test button.

Jobs run on an ``aws`` connection's credentials (keys, assume-role, the triggers' async client) and
the test button against a reachable bucket are in ``tests/unit/adapters/test_bedrock.py``, with the
emulator and an S3 server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from tests.support.aws_conns import aws_and_bedrock, bedrock_conn


@pytest.mark.parametrize(
    "keys",
    [{"login": "AKID", "password": "secret"}, {"extra": {"aws_access_key_id": "AKID", "region_name": "x"}}],
)
def test_aws_keys_in_the_bedrock_connection_are_refused_with_where_they_belong(
    monkeypatch: pytest.MonkeyPatch, keys: dict[str, Any]
) -> None:
    from airflow_batch_provider.hooks.batch import BatchHook

    monkeypatch.setenv("AIRFLOW_CONN_ABP_KEYS", json.dumps({"conn_type": "bedrock_batch", **keys}))
    with pytest.raises(ConfigurationError, match="aws_conn_id"):
        BatchHook("abp_keys").get_adapter()


def test_the_test_button_says_no_to_a_closed_bedrock_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models.connection import Connection

    from tests.support.ports import free_port

    aws_and_bedrock(
        monkeypatch,
        {"login": "AKID", "password": "secret"},
        bedrock_conn(f"http://127.0.0.1:{free_port()}", "abp-x"),
    )
    ok, message = Connection.get_connection_from_secrets("abp_bedrock").test_connection()
    assert not ok and "Could not connect" in message, message


def test_the_aws_connections_region_and_endpoints_fill_only_what_the_bedrock_connection_leaves_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.models.connection import Connection

    from airflow_batch_provider.hooks.bedrock import bedrock_settings

    aws_and_bedrock(
        monkeypatch,
        {
            "login": "AKID",
            "password": "secret",
            "extra": {
                "region_name": "eu-central-1",
                "service_config": {
                    "s3": {"endpoint_url": "http://s3.internal:9000"},
                    "bedrock-runtime": {"endpoint_url": "http://runtime.internal"},
                    "bedrock": {"endpoint_url": "http://bedrock.internal"},
                },
            },
        },
        {"extra": {"aws_conn_id": "abp_aws", "role_arn": "arn:aws:iam::1:role/r", "s3_uri": "s3://b/in"}},
    )
    filled = bedrock_settings(Connection.get_connection_from_secrets("abp_bedrock"))
    assert filled.base_url == "http://bedrock.internal"
    assert (filled.extra["region_name"], filled.extra["s3_endpoint_url"]) == (
        "eu-central-1",
        "http://s3.internal:9000",
    )
    assert filled.extra["bedrock_runtime_endpoint_url"] == "http://runtime.internal"
    assert filled.credentials is not None and filled.api_key is None  # the keys stay with the aws hook

    own = bedrock_conn("http://emulator:9", "bucket")
    own["extra"] |= {"region_name": "us-west-2", "s3_endpoint_url": "http://own-s3"}
    monkeypatch.setenv("AIRFLOW_CONN_ABP_BEDROCK", json.dumps({"conn_type": "bedrock_batch", **own}))
    kept = bedrock_settings(Connection.get_connection_from_secrets("abp_bedrock"))
    assert (kept.base_url, kept.extra["region_name"], kept.extra["s3_endpoint_url"]) == (
        "http://emulator:9",
        "us-west-2",
        "http://own-s3",
    )
