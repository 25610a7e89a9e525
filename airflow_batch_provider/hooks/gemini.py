"""The ``gemini_batch`` connection type: Gemini Batch Mode and Vertex AI batch prediction."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_batch_provider.hooks.batch import BatchHook


class GeminiBatchHook(BatchHook):
    """Gemini Batch Mode through ``google-genai`` (``gemini_batch``).

    The adapter is :class:`~airflow_batch_provider.adapters.gemini.GeminiBatchAdapter`.

    Host: API base URL (optional, ``https://generativelanguage.googleapis.com``; the bundled
    emulator's URL in tests and demos). Password: the API key (not needed for Vertex AI, which
    uses Application Default Credentials). Extras: ``api_version`` (default ``v1beta``),
    ``inline_max_bytes``, ``find_scan_limit``, ``max_retries``, ``timeout``; for Vertex AI
    ``vertexai``, ``project``, ``location`` and ``gcs_prefix``.

    :param batch_conn_id: the connection id
    """

    default_conn_name = "gemini_batch_default"
    conn_type = "gemini_batch"
    hook_name = "Gemini Batch"
    ui_placeholders: ClassVar[dict[str, str]] = {
        "host": "https://generativelanguage.googleapis.com",
        "extra": '{"inline_max_bytes": 0} or {"vertexai": true, "project": "my-project", '
        '"location": "us-central1", "gcs_prefix": "gs://bucket/llm-batch"}',
    }

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)
