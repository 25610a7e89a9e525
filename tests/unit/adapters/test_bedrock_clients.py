"""Bedrock's clients (``adapters.bedrock_clients``): real boto3 and aiobotocore clients built from a connection's settings.

No request is sent: each test reads the client botocore built (its credentials, region and
endpoint). The jobs run through these clients against the emulator in ``test_bedrock.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from botocore.config import Config

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.bedrock_clients import _split_s3, aio_client, boto_client
from airflow_batch_provider.exceptions import ConfigurationError

ENDPOINT = "http://127.0.0.1:9"


def keyed(**extra: Any) -> AdapterSettings:
    return AdapterSettings(
        api_key="secret-key",
        extra={"aws_access_key_id": "AKIDEXAMPLE", "region_name": "eu-west-3", **extra},
    )


def test_a_blocking_client_signs_with_the_connections_key_pair_in_its_region_at_its_endpoint() -> None:
    client = boto_client(
        keyed(aws_session_token="tok"), "bedrock", ENDPOINT, Config(retries={"max_attempts": 1})
    )
    credentials = client._request_signer._credentials.get_frozen_credentials()
    assert (credentials.access_key, credentials.secret_key, credentials.token) == (
        "AKIDEXAMPLE",
        "secret-key",
        "tok",
    )
    assert (client.meta.region_name, client.meta.endpoint_url) == ("eu-west-3", ENDPOINT)


@pytest.mark.parametrize(
    "settings",
    [
        AdapterSettings(api_key=None, extra={"aws_access_key_id": "AKIDEXAMPLE"}),
        AdapterSettings(api_key="secret-key", extra={}),
    ],
    ids=["key-id-only", "secret-only"],
)
def test_half_an_aws_key_pair_is_refused_naming_both_halves_and_the_default_chain(
    settings: AdapterSettings,
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"half of an AWS key pair.*login.*password.*default credential"
    ):
        boto_client(settings, "s3", None, None)


def test_the_async_client_takes_the_same_credentials_region_and_endpoint() -> None:
    async def build() -> tuple[Any, Any, Any]:
        async with contextlib.AsyncExitStack() as stack:
            client = await aio_client(stack, keyed(), "bedrock-runtime", ENDPOINT, None)
            credentials = await client._request_signer._credentials.get_frozen_credentials()
            return credentials, client.meta.region_name, client.meta.endpoint_url

    credentials, region, endpoint = asyncio.run(build())
    assert (credentials.access_key, credentials.secret_key) == ("AKIDEXAMPLE", "secret-key")
    assert (region, endpoint) == ("eu-west-3", ENDPOINT)


def test_a_staging_uri_splits_into_bucket_and_prefix_and_anything_but_s3_is_refused_with_the_form() -> None:
    assert _split_s3("s3://bucket/llm-batch/input/") == ("bucket", "llm-batch/input")
    assert _split_s3("s3://bucket") == ("bucket", "")
    with pytest.raises(ConfigurationError, match=r"'gs://b/x' is not an s3:// URI; give s3://bucket/prefix"):
        _split_s3("gs://b/x")
