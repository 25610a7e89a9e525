"""Connection -> adapter. Behaviour lives in the adapters; this hook only builds them."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import BaseHook

from airflow_batch_provider.adapters.base import AdapterSettings, BatchAdapter
from airflow_batch_provider.adapters.registry import adapter_class


def settings_from_connection(conn: Any) -> AdapterSettings:
    """Build adapter settings from an Airflow connection; the secret never leaves this object.

    The API base URL is the connection's host (with scheme, e.g. ``http://127.0.0.1:8089/v1``);
    the key is the password; everything else is in extras.

    :param conn: an Airflow connection
    """
    extra = dict(conn.extra_dejson or {})
    if conn.login:
        # e.g. an AWS access key id; adapters that need a login read it from extras
        extra.setdefault("login", conn.login)
    base_url = conn.host or extra.pop("base_url", None)
    if base_url and conn.port and "://" in base_url and base_url.count(":") == 1:
        base_url = f"{base_url}:{conn.port}"
    return AdapterSettings(
        api_key=conn.password or extra.pop("api_key", None), base_url=base_url, extra=extra
    )


class BatchHook(BaseHook):
    """Turn an LLM batch connection into the adapter registered for its connection type.

    :param batch_conn_id: the connection id
    """

    conn_name_attr = "batch_conn_id"
    default_conn_name = "batch_default"
    conn_type = "openai_batch"
    hook_name = "LLM Batch"
    ui_placeholders: ClassVar[dict[str, str]] = {}

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_conn_id = batch_conn_id

    def get_conn(self) -> BatchAdapter:
        """Return the adapter for this connection."""
        return self.get_adapter()

    def get_adapter(self) -> BatchAdapter:
        """Return the adapter for this connection (SDK imported now, lazily)."""
        conn = self.get_connection(self.batch_conn_id)
        return adapter_class(conn.conn_type or "")(settings_from_connection(conn))

    @classmethod
    async def aget_adapter(cls, batch_conn_id: str) -> BatchAdapter:
        """Return the adapter, reading the connection without blocking the event loop.

        :param batch_conn_id: the connection id
        """
        conn = await cls.aget_connection(batch_conn_id)
        return adapter_class(conn.conn_type or "")(settings_from_connection(conn))

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabel the connection form: host is the API base URL, password the API key."""
        return {
            "hidden_fields": ["schema", "login", "port"],
            "relabeling": {"host": "API base URL (optional)", "password": "API key"},
            "placeholders": {
                "host": "https://api.openai.com/v1",
                "extra": '{"organization": "...", "project": "...", "api_type": "openai"}',
                **cls.ui_placeholders,
            },
        }


class OpenAIBatchHook(BatchHook):
    """OpenAI, Azure OpenAI and OpenAI-compatible batch endpoints (``openai_batch``)."""

    default_conn_name = "openai_batch_default"
    conn_type = "openai_batch"
    hook_name = "OpenAI Batch"
