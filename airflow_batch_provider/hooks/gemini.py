"""The ``gemini_batch`` connection type: Gemini Batch Mode and Vertex AI batch prediction."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.entries import registration
from airflow_batch_provider.adapters.gemini import GeminiBatchAdapter
from airflow_batch_provider.hooks.batch import BatchHook, settings_from_connection


def gemini_settings(conn: Any) -> AdapterSettings:
    """Build adapter settings; for Vertex AI, Google credentials from the ``gcp_conn_id`` field.

    The ``gcs.endpoint`` of that connection (a GCS endpoint override, the Google provider's
    extra) becomes the adapter's ``gcs_endpoint_url`` unless the Gemini connection sets one.

    :param conn: an Airflow connection
    """
    settings = settings_from_connection(conn)
    extra = dict(settings.extra)
    gcp_conn_id = extra.get("gcp_conn_id")
    if not (extra.get("vertexai") and gcp_conn_id):
        return settings
    from airflow_batch_provider.hooks.google import google_credentials

    credentials, project, endpoint = google_credentials(str(gcp_conn_id))
    if project and not extra.get("project"):
        extra["project"] = project
    if endpoint and not extra.get("gcs_endpoint_url"):
        extra["gcs_endpoint_url"] = endpoint
    return replace(settings, extra=extra, credentials=credentials)


class GeminiBatchHook(BatchHook):
    """Gemini Batch Mode through ``google-genai`` (``gemini_batch``), and Vertex AI batch prediction.

    The adapter is :class:`~airflow_batch_provider.adapters.gemini.GeminiBatchAdapter`.

    Host: API base URL (optional; the bundled emulator's URL in tests and demos). Password: the
    Developer API key. Named fields: ``api_version``, ``inline_max_bytes``, ``timeout``,
    ``max_retries``; for Vertex AI ``vertexai``, ``project``, ``location``, ``gcs_prefix`` and
    ``gcp_conn_id`` (a ``google_cloud_platform`` connection whose credentials reach Vertex AI
    and GCS; empty: Application Default Credentials).

    :param batch_conn_id: the connection id
    """

    conn_type = GeminiBatchAdapter.conn_type
    default_conn_name = f"{conn_type}_default"
    hook_name = registration(conn_type).hook_name

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)

    @classmethod
    def adapter_settings(cls, conn: Any) -> AdapterSettings:
        return gemini_settings(conn)
