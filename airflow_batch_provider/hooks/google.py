"""Google Cloud credentials and GCS from a ``google_cloud_platform`` connection.

With the Google provider installed its ``GoogleBaseHook`` resolves the credentials and its
filesystem serves ``gs://`` for ``ObjectStoragePath``. Without it (its install pulls in far more
than Vertex batch needs), this module reads the same connection extras with ``google-auth`` and
registers ``gs://`` for ``ObjectStoragePath`` through ``gcsfs``: ``keyfile_dict`` (service
account or external account JSON), ``key_path``, ``credential_config_file``, ``is_anonymous``,
``project``, ``scope`` (comma-separated) and ``gcs.endpoint`` (a GCS endpoint override, e.g. an
emulator); none of them: Application Default Credentials. Install ``airflow-batch-provider[vertex]``.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from airflow_batch_provider.exceptions import ConfigurationError

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
#: the Google provider's extra key of a GCS endpoint override (same name, same meaning)
GCS_ENDPOINT = "gcs.endpoint"


def _google_provider() -> bool:
    return importlib.util.find_spec("airflow.providers.google") is not None


#: ``ObjectStoragePath`` schemes served here; the Google provider's filesystem wins when installed
schemes: list[str] = [] if _google_provider() else ["gs", "gcs"]


def _field(extra: dict[str, Any], name: str) -> Any:
    value = extra.get(name)
    if value in (None, ""):
        value = extra.get(f"extra__google_cloud_platform__{name}")
    return None if value == "" else value


def credentials_from_extras(extra: dict[str, Any]) -> tuple[Any, str | None]:
    """Return ``(credentials, project)`` from a ``google_cloud_platform`` connection's extras.

    :param extra: the connection extras
    :raises ConfigurationError: a key that is not JSON, or more than one credential source
    """
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    scope = _field(extra, "scope")
    scopes = [s.strip() for s in str(scope).split(",") if s.strip()] if scope else [CLOUD_PLATFORM]
    project = _field(extra, "project")
    keyfile = _field(extra, "keyfile_dict")
    key_path = _field(extra, "key_path")
    config_file = _field(extra, "credential_config_file")
    given = [
        n
        for n, v in (
            ("keyfile_dict", keyfile),
            ("key_path", key_path),
            ("credential_config_file", config_file),
        )
        if v
    ]
    if len(given) > 1:
        raise ConfigurationError(
            f"the Google Cloud connection sets {given}; set one credential source (or none for ADC)."
        )
    if _field(extra, "is_anonymous") in (True, "true", "True"):
        return AnonymousCredentials(), project
    if keyfile or (config_file and str(config_file).lstrip().startswith("{")):
        raw = keyfile or config_file
        try:
            info = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except ValueError as exc:
            raise ConfigurationError(
                "the Google Cloud connection's keyfile_dict is not JSON; paste the whole key file."
            ) from exc
        credentials, found = google.auth.load_credentials_from_dict(info, scopes=scopes)
    elif key_path or config_file:
        credentials, found = google.auth.load_credentials_from_file(
            str(key_path or config_file), scopes=scopes
        )
    else:
        credentials, found = google.auth.default(scopes=scopes)
    return credentials, project or found


def google_credentials(gcp_conn_id: str) -> tuple[Any, str | None, str | None]:
    """Return ``(credentials, project, gcs endpoint)`` of a ``google_cloud_platform`` connection.

    Blocking: reads the connection (and, with a key file, the file).

    :param gcp_conn_id: the connection id
    """
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(gcp_conn_id)
    extra = dict(conn.extra_dejson or {})
    endpoint = extra.get(GCS_ENDPOINT) or None
    if _google_provider():  # pragma: no cover - the Google provider is not installed in the test venv
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

        credentials, project = GoogleBaseHook(gcp_conn_id=gcp_conn_id).get_credentials_and_project_id()
        return credentials, project, endpoint
    credentials, project = credentials_from_extras(extra)
    return credentials, project, endpoint


def get_fs(conn_id: str | None, storage_options: dict[str, Any] | None = None) -> Any:
    """``ObjectStoragePath``'s filesystem of ``gs://`` (see the module docstring).

    :param conn_id: a ``google_cloud_platform`` connection, or ``None`` for ADC
    :param storage_options: passed to ``gcsfs`` over what the connection gives
    """
    from gcsfs.core import GCSFileSystem

    from airflow_batch_provider.adapters.gemini import gcs_filesystem

    if conn_id is None:
        return GCSFileSystem(**(storage_options or {}))
    credentials, project, endpoint = google_credentials(conn_id)
    fs = gcs_filesystem(credentials, project, endpoint)
    if storage_options:
        return GCSFileSystem(**{**fs.storage_options, **storage_options})
    return fs
