"""The ``anthropic_batch`` connection type: Anthropic Message Batches."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.adapters.anthropic import AnthropicBatchAdapter
from airflow_batch_provider.adapters.entries import registration
from airflow_batch_provider.hooks.batch import BatchHook


class AnthropicBatchHook(BatchHook):
    """Anthropic Message Batches (``anthropic_batch``).

    The adapter is :class:`~airflow_batch_provider.adapters.anthropic.AnthropicBatchAdapter`.

    Host: API base URL (optional, ``https://api.anthropic.com``; the bundled emulator's URL in
    tests and demos). Password: the API key. Named fields: ``default_max_tokens``,
    ``prompt_caching``, ``json_output``, ``timeout``, ``max_retries``; see the adapter.

    :param batch_conn_id: the connection id
    """

    conn_type = AnthropicBatchAdapter.conn_type
    default_conn_name = f"{conn_type}_default"
    hook_name = registration(conn_type).hook_name

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)
