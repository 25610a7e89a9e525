"""The ``anthropic_batch`` connection type: Anthropic Message Batches."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_batch_provider.hooks.batch import BatchHook


class AnthropicBatchHook(BatchHook):
    """Anthropic Message Batches (``anthropic_batch``).

    The adapter is :class:`~airflow_batch_provider.adapters.anthropic.AnthropicBatchAdapter`.

    Host: API base URL (optional, ``https://api.anthropic.com``; the bundled emulator's URL in
    tests and demos). Password: the API key. Extras: see the adapter.

    :param batch_conn_id: the connection id
    """

    default_conn_name = "anthropic_batch_default"
    conn_type = "anthropic_batch"
    hook_name = "Anthropic Batch"
    ui_placeholders: ClassVar[dict[str, str]] = {
        "host": "https://api.anthropic.com",
        "extra": '{"default_max_tokens": 1024, "prompt_caching": true, "json_output": "instruct"}',
    }

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)
