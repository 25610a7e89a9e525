"""The ``bedrock_batch`` connection type: Amazon Bedrock batch inference (model invocation jobs)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.bedrock import BedrockBatchAdapter
from airflow_batch_provider.adapters.entries import registration
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.batch import BatchHook, settings_from_connection

#: AWS key material that belongs in the aws connection, never in the bedrock_batch one
_KEY_EXTRAS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def aws_hook(aws_conn_id: str, region_name: str | None) -> Any:
    """Return the Amazon provider's ``AwsBaseHook`` for a connection, its connection read now.

    Profiles, assume-role (``role_arn`` in the aws connection), web identity and endpoint
    overrides are the Amazon provider's: whatever an ``aws`` connection supports.

    :param aws_conn_id: an ``aws`` connection id (missing: boto3's default credential chain)
    :param region_name: the Bedrock region (wins over the aws connection's)
    """
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError as exc:
        raise ConfigurationError(
            "bedrock_batch connections take their credentials from the Amazon provider; install "
            "airflow-batch-provider[bedrock] (apache-airflow-providers-amazon)."
        ) from exc
    hook = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="bedrock", region_name=region_name)
    _ = hook.conn_config  # read the connection here (a thread in the triggerer), not in the loop
    return hook


def bedrock_settings(conn: Any) -> AdapterSettings:
    """Build adapter settings from a ``bedrock_batch`` connection, credentials from its ``aws_conn_id``.

    The endpoint overrides of the aws connection (``endpoint_url``, ``service_config``) apply
    where the Bedrock connection sets none.

    :param conn: an Airflow connection
    :raises ConfigurationError: AWS keys in the Bedrock connection itself
    """
    settings = settings_from_connection(conn)
    extra = dict(settings.extra)
    keys = [k for k in _KEY_EXTRAS if k in extra] + (["login"] if conn.login else [])
    if conn.password:
        keys.append("password")
    if keys:
        raise ConfigurationError(
            f"the bedrock_batch connection {conn.conn_id!r} holds AWS keys ({', '.join(keys)}); they are not "
            "used. Put them in an aws connection and name it in the field aws_conn_id (default "
            "aws_default), where profiles, assume-role and web identity also work."
        )
    extra.pop("login", None)
    hook = aws_hook(str(extra.get("aws_conn_id") or "aws_default"), extra.get("region_name"))
    region = hook.conn_config.region_name
    if region and not extra.get("region_name"):
        extra["region_name"] = region
    for service, name in (("s3", "s3_endpoint_url"), ("bedrock-runtime", "bedrock_runtime_endpoint_url")):
        endpoint = hook.conn_config.get_service_endpoint_url(service)
        if endpoint and not extra.get(name):
            extra[name] = endpoint
    base_url = settings.base_url or hook.conn_config.get_service_endpoint_url("bedrock")
    return replace(settings, base_url=base_url, extra=extra, credentials=hook)


class BedrockBatchHook(BatchHook):
    """Amazon Bedrock batch inference (``bedrock_batch``), served by ``BedrockBatchAdapter``.

    Credentials: the ``aws`` connection named by the field ``aws_conn_id`` (default
    ``aws_default``; missing: boto3's default chain), through the Amazon provider's
    ``AwsBaseHook``. Host: Bedrock endpoint URL override (optional; the bundled emulator's URL
    in tests and demos). Named fields: ``region_name``, ``role_arn`` (the batch job's service
    role, required), ``s3_uri`` (required), ``output_s3_uri``, ``model_id``, ``timeout_hours``,
    ``min_records``, ``s3_endpoint_url``, ``bedrock_runtime_endpoint_url``; see the adapter.

    :param batch_conn_id: the connection id
    """

    conn_type = BedrockBatchAdapter.conn_type
    default_conn_name = f"{conn_type}_default"
    hook_name = registration(conn_type).hook_name

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)

    @classmethod
    def adapter_settings(cls, conn: Any) -> AdapterSettings:
        return bedrock_settings(conn)
