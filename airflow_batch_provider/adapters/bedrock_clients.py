"""Bedrock's clients: boto3 and aiobotocore clients of a connection (credentials, endpoints), S3 URIs.

Split from :mod:`airflow_batch_provider.adapters.bedrock`, which re-exports every public name.
"""

from __future__ import annotations

import contextlib
from typing import Any

from airflow_batch_provider.adapters.base import (
    AdapterSettings,
)
from airflow_batch_provider.exceptions import ConfigurationError


def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ConfigurationError(f"{uri!r} is not an s3:// URI; give s3://bucket/prefix.")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key.strip("/")


def _session_kwargs(settings: AdapterSettings) -> dict[str, Any]:
    extra = settings.extra
    key_id = extra.get("aws_access_key_id") or extra.get("login")
    secret = settings.api_key or extra.get("aws_secret_access_key")
    kwargs: dict[str, Any] = {}
    if key_id or secret:
        if not (key_id and secret):
            raise ConfigurationError(
                "the Bedrock connection has only half of an AWS key pair; set both the login (access key "
                "id, or extra aws_access_key_id) and the password (secret access key), or neither to use "
                "the default credential chain."
            )
        kwargs["aws_access_key_id"] = key_id
        kwargs["aws_secret_access_key"] = secret
        if extra.get("aws_session_token"):
            kwargs["aws_session_token"] = extra["aws_session_token"]
    if extra.get("region_name"):
        kwargs["region_name"] = extra["region_name"]
    return kwargs


def boto_client(settings: AdapterSettings, service: str, endpoint_url: str | None, config: Any) -> Any:
    """Return a blocking boto3 client; credentials from the hook's ``AwsBaseHook`` when there is one.

    :param settings: the connection settings (``credentials``: an object with ``get_session``)
    :param service: ``bedrock``, ``bedrock-runtime`` or ``s3``
    :param endpoint_url: endpoint override, or ``None``
    :param config: a botocore ``Config``
    """
    source = settings.credentials
    if source is not None:
        session = source.get_session(region_name=settings.extra.get("region_name") or None)
        return session.client(service, endpoint_url=endpoint_url, config=config)
    import boto3

    return boto3.session.Session().client(
        service, endpoint_url=endpoint_url, config=config, **_session_kwargs(settings)
    )


async def aio_client(
    stack: contextlib.AsyncExitStack,
    settings: AdapterSettings,
    service: str,
    endpoint_url: str | None,
    config: Any,
) -> Any:
    """Return an aiobotocore client entered on ``stack``; credentials as in :func:`boto_client`.

    The hook's session is built in a thread: assume-role fetches credentials from STS, blocking.

    :param stack: owns the client's lifetime
    :param settings: the connection settings
    :param service: ``bedrock`` or ``bedrock-runtime``
    :param endpoint_url: endpoint override, or ``None``
    :param config: an aiobotocore ``AioConfig``
    """
    import asyncio

    source = settings.credentials
    region = settings.extra.get("region_name") or None
    if source is not None:
        session = await asyncio.to_thread(source.get_session, region_name=region, deferrable=True)
        kwargs: dict[str, Any] = {"region_name": region} if region else {}
    else:
        from aiobotocore.session import get_session

        session = get_session()
        kwargs = _session_kwargs(settings)
    return await stack.enter_async_context(
        session.create_client(service, endpoint_url=endpoint_url, config=config, **kwargs)
    )


def _bedrock_endpoint(settings: AdapterSettings) -> str | None:
    value = settings.extra.get("bedrock_endpoint_url") or settings.base_url
    return str(value) if value else None


def _runtime_endpoint(settings: AdapterSettings) -> str | None:
    value = settings.extra.get("bedrock_runtime_endpoint_url") or _bedrock_endpoint(settings)
    return str(value) if value else None
