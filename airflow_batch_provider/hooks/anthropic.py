"""The ``anthropic_batch`` connection type: Anthropic Message Batches."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.hooks.batch import BatchHook


class AnthropicBatchHook(BatchHook):
    """Anthropic Message Batches (``anthropic_batch``).

    The adapter is :class:`~airflow_batch_provider.adapters.anthropic.AnthropicBatchAdapter`.

    Host: API base URL (optional, ``https://api.anthropic.com``; the bundled emulator's URL in
    tests and demos). Password: the API key. Named fields: ``default_max_tokens``,
    ``prompt_caching``, ``json_output``, ``timeout``, ``max_retries``; see the adapter.

    :param batch_conn_id: the connection id
    """

    default_conn_name = "anthropic_batch_default"
    conn_type = "anthropic_batch"
    hook_name = "Anthropic Batch"

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)

    def probe(self, adapter: BatchAdapter) -> str:
        """List one message batch (``GET /v1/messages/batches?limit=1``), SDK retries off.

        :param adapter: an ``AnthropicBatchAdapter``
        """
        client = adapter.client.with_options(max_retries=0)  # type: ignore[attr-defined]
        page = client.messages.batches.list(limit=1)
        return f"{client.base_url} listed {len(page.data)} message batch(es) on the first page"
