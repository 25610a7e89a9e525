"""The ``bedrock_batch`` connection type: Amazon Bedrock batch inference (model invocation jobs)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from airflow_batch_provider.adapters.base import AdapterSettings, BatchAdapter
from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.hooks.batch import BatchHook, settings_from_connection


def bedrock_settings(conn: Any) -> AdapterSettings:
    """Build adapter settings from a ``bedrock_batch`` connection, keeping the login (access key id).

    :param conn: an Airflow connection
    """
    settings = settings_from_connection(conn)
    if conn.login and "aws_access_key_id" not in settings.extra:
        settings = replace(settings, extra={**settings.extra, "aws_access_key_id": conn.login})
    return settings


class BedrockBatchHook(BatchHook):
    """Amazon Bedrock batch inference (``bedrock_batch``), served by ``BedrockBatchAdapter``.

    Login and password: AWS access key id and secret access key (leave both empty for boto3's
    default credential chain: instance role, environment, profile). Host: Bedrock endpoint URL
    override (optional; the bundled emulator's URL in tests and demos). Extras: ``region_name``,
    ``role_arn`` (required), ``s3_uri`` (required), ``output_s3_uri``, ``s3_endpoint_url``,
    ``bedrock_runtime_endpoint_url``, ``timeout_hours``, ``min_records``; see the adapter.

    :param batch_conn_id: the connection id
    """

    default_conn_name = "bedrock_batch_default"
    conn_type = "bedrock_batch"
    hook_name = "Amazon Bedrock Batch"
    ui_placeholders: ClassVar[dict[str, str]] = {
        "host": "https://bedrock.us-east-1.amazonaws.com (optional)",
        "extra": '{"region_name": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/BedrockBatch", '
        '"s3_uri": "s3://my-bucket/llm-batch/input", "output_s3_uri": "s3://my-bucket/llm-batch/output"}',
    }

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)

    def get_adapter(self) -> BatchAdapter:
        """Return the adapter for this connection, with the login passed on as the access key id."""
        conn = self.get_connection(self.batch_conn_id)
        return adapter_class(conn.conn_type or self.conn_type)(bedrock_settings(conn))

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabel the connection form: login and password are the AWS key pair."""
        return {
            "hidden_fields": ["schema", "port"],
            "relabeling": {
                "host": "Bedrock endpoint URL (optional)",
                "login": "AWS access key ID (optional)",
                "password": "AWS secret access key (optional)",
            },
            "placeholders": dict(cls.ui_placeholders),
        }
