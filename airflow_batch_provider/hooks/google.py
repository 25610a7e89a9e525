"""Google Cloud credentials and GCS from a ``google_cloud_platform`` connection.

With the Google provider installed (``pip install airflow-batch-provider[google]``), its
``GoogleBaseHook`` resolves the credentials and its filesystem serves ``gs://`` for
``ObjectStoragePath``. Without it, this module reads the same connection extras with
``google-auth`` and registers ``gs://`` for ``ObjectStoragePath`` through ``gcsfs``:
``keyfile_dict`` (service account or external account JSON), ``key_path``,
``credential_config_file``, ``is_anonymous``, ``project``, ``quota_project_id``, ``scope``
(comma-separated), ``impersonation_chain`` (a service account, or a comma-separated chain whose last
account is impersonated through the ones before it, as the Google provider reads it) and
``gcs.endpoint`` (a GCS endpoint override, e.g. an emulator); none of the credential sources:
Application Default Credentials. Install ``airflow-batch-provider[vertex]``.

``iamcredentials.endpoint`` is this package's own extra: it overrides the IAM Credentials API that
impersonation calls (a private endpoint, an emulator). ``GoogleBaseHook`` has no such option, so a
connection that sets it is read here with ``google-auth`` whether or not the Google provider is
installed (otherwise the override would be dropped and the token bought at the public endpoint).

The Google provider needs ``google-genai`` 2 (its ``google-cloud-aiplatform`` requires
``google-genai<3``) and, from 22.3 on, ``openai`` 2 (through ``litellm``): the ``[google]`` extra
therefore cannot be combined with ``[openai]``; ``constraints-google.txt`` pins an environment that
holds it, and ``make test-google`` tests this package in it.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from airflow_batch_provider.exceptions import ConfigurationError

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
#: the Google provider's extra key of a GCS endpoint override (same name, same meaning)
GCS_ENDPOINT = "gcs.endpoint"
#: this package's extra key of an IAM Credentials API override (impersonation), e.g. an emulator
IAM_ENDPOINT = "iamcredentials.endpoint"


def _google_provider() -> bool:
    return importlib.util.find_spec("airflow.providers.google") is not None


#: ``ObjectStoragePath`` schemes served here; the Google provider's filesystem wins when installed
schemes: list[str] = [] if _google_provider() else ["gs", "gcs"]


def _field(extra: dict[str, Any], name: str) -> Any:
    value = extra.get(name)
    if value in (None, ""):
        value = extra.get(f"extra__google_cloud_platform__{name}")
    return None if value == "" else value


def impersonation_chain(value: Any) -> list[str]:
    """Return the accounts of an ``impersonation_chain`` extra, the impersonated one last.

    :param value: ``None``, an account, a comma-separated chain or a list of accounts
    """
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return [s.strip() for s in items if s.strip()]


def _impersonated(source: Any, chain: list[str], scopes: list[str], endpoint: str | None) -> Any:
    from google.auth import impersonated_credentials

    target = chain[-1]
    override = None
    if endpoint:
        override = f"{endpoint.rstrip('/')}/v1/projects/-/serviceAccounts/{target}:generateAccessToken"
    return impersonated_credentials.Credentials(
        source_credentials=source,
        target_principal=target,
        delegates=chain[:-1] or None,
        target_scopes=scopes,
        iam_endpoint_override=override,
    )


def credentials_from_extras(extra: dict[str, Any]) -> tuple[Any, str | None]:
    """Return ``(credentials, project)`` from a ``google_cloud_platform`` connection's extras.

    With an ``impersonation_chain`` the credentials are those of its last account, obtained with
    the connection's own credentials through the accounts before it; the project, unless the
    ``project`` extra names one, is the impersonated account's (``name@PROJECT.iam...``).

    :param extra: the connection extras
    :raises ConfigurationError: a key that is not JSON, more than one credential source, an
        impersonation chain on anonymous credentials, or a quota project on credentials that
        cannot carry one
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
    chain = impersonation_chain(_field(extra, "impersonation_chain"))
    if _field(extra, "is_anonymous") in (True, "true", "True"):
        if chain:
            raise ConfigurationError(
                f"the Google Cloud connection is anonymous and asks to impersonate {chain[-1]}; anonymous "
                "credentials cannot impersonate: give the connection a key or remove is_anonymous."
            )
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
    if chain:
        credentials = _impersonated(credentials, chain, scopes, _field(extra, IAM_ENDPOINT))
        found = chain[-1].partition("@")[2].split(".", 1)[0] or found
    quota_project = _field(extra, "quota_project_id")
    if quota_project:
        if not hasattr(credentials, "with_quota_project"):
            raise ConfigurationError(
                f"the Google Cloud connection sets quota_project_id={quota_project!r}, which "
                f"{type(credentials).__name__} credentials cannot carry; use a service account key, "
                "ADC or an impersonation chain, or remove quota_project_id."
            )
        credentials = credentials.with_quota_project(quota_project)
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
    if _google_provider() and not _field(extra, IAM_ENDPOINT):
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
