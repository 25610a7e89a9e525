"""Gemini's clients: the SDK's options for the Developer API and Vertex AI, GCS, and a Vertex job's arguments.

Split from :mod:`airflow_batch_provider.adapters.gemini`, which re-exports every public name.
"""

from __future__ import annotations

from typing import Any, Final

from airflow_batch_provider.adapters.base import (
    AdapterSettings,
)
from airflow_batch_provider.exceptions import ConfigurationError

DEFAULT_API_VERSION: Final = "v1beta"


def http_options(settings: AdapterSettings, *, attempts: int | None = None) -> dict[str, Any]:
    """Return the SDK's ``HttpOptions`` (as a dict) for a connection.

    The Developer API is pinned to ``v1beta`` (extra ``api_version``), the version that serves
    Batch Mode; ``base_url`` is the connection host (the emulator in tests).

    :param settings: the connection settings
    :param attempts: total attempts per call (``1``: no SDK retries); default ``max_retries + 1``
    """
    extra = settings.extra
    tries = attempts if attempts is not None else int(extra.get("max_retries", 3)) + 1
    options: dict[str, Any] = {
        "timeout": int(float(extra.get("timeout", 120.0)) * 1000),
        "retry_options": {"attempts": max(1, tries)},
    }
    if settings.base_url:
        options["base_url"] = settings.base_url
    if not extra.get("vertexai"):
        options["api_version"] = extra.get("api_version", DEFAULT_API_VERSION)
    elif extra.get("api_version"):
        options["api_version"] = extra["api_version"]
    return options


def client_kwargs(settings: AdapterSettings, *, attempts: int | None = None) -> dict[str, Any]:
    """Return ``genai.Client`` keyword arguments for a connection (Developer API or Vertex AI).

    :param settings: the connection settings
    :param attempts: total attempts per call (see :func:`http_options`)
    :raises ConfigurationError: a Vertex connection without project or location
    """
    extra = settings.extra
    kwargs: dict[str, Any] = {"http_options": http_options(settings, attempts=attempts)}
    if extra.get("vertexai"):
        missing = [k for k in ("project", "location") if not extra.get(k)]
        if missing:
            raise ConfigurationError(
                f"a Vertex AI Gemini connection needs {missing} in its extras, e.g. "
                '{"vertexai": true, "project": "my-project", "location": "us-central1", '
                '"gcs_prefix": "gs://bucket/llm-batch"}.'
            )
        kwargs.update(vertexai=True, project=extra["project"], location=extra["location"])
        if settings.credentials is not None:
            kwargs["credentials"] = settings.credentials  # from the connection's gcp_conn_id
    else:
        if not settings.api_key:
            raise ConfigurationError(
                "the Gemini connection has no API key; put the key in the connection's password field."
            )
        kwargs["api_key"] = settings.api_key
    return kwargs


def gcs_filesystem(credentials: Any, project: str | None, endpoint_url: str | None) -> Any:
    """Return a ``gcsfs`` filesystem (its plain JSON-API class: batch staging needs no zonal buckets).

    :param credentials: ``google.auth`` credentials, or ``None`` for Application Default Credentials
    :param project: the billing project
    :param endpoint_url: a GCS endpoint override (an emulator), or ``None``
    :raises ConfigurationError: gcsfs is not installed
    """
    try:
        from gcsfs.core import GCSFileSystem
    except ImportError as exc:
        raise ConfigurationError(
            "gs:// staging needs gcsfs; install airflow-batch-provider[vertex]."
        ) from exc
    from google.auth.credentials import AnonymousCredentials

    token: Any = "anon" if isinstance(credentials, AnonymousCredentials) else credentials
    return GCSFileSystem(project=project, token=token, endpoint_url=endpoint_url)


def vertex_create_args(model: str, uri: str, key: str, gcs_prefix: str) -> dict[str, Any]:
    """Return ``client.batches.create`` arguments of a Vertex AI batch prediction job.

    :param model: the model (``gemini-2.5-flash`` or ``models/...``)
    :param uri: the ``gs://`` input file
    :param key: the idempotency key (display name and output folder)
    :param gcs_prefix: the connection's ``gs://`` prefix
    """
    if not uri.startswith("gs://") or not gcs_prefix.startswith("gs://"):
        raise ConfigurationError(
            f"Vertex AI batch input and output must be gs:// URIs (got {uri!r} and {gcs_prefix!r}); "
            'set the connection extra "gcs_prefix" to a gs:// folder.'
        )
    return {
        "model": model.removeprefix("models/"),
        "src": uri,
        "config": {"display_name": key, "dest": f"{gcs_prefix.rstrip('/')}/output/{key}/"},
    }
