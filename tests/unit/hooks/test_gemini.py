"""The ``gemini_batch`` hook: the Developer API reads its own connection; Vertex AI borrows a gcp connection's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_batch_provider.adapters.gemini import GeminiBatchAdapter
from airflow_batch_provider.hooks.batch import hook_class
from airflow_batch_provider.hooks.gemini import GeminiBatchHook, gemini_settings
from tests.support.gcs import service_account_key


def _gemini(**extra: object) -> SimpleNamespace:
    return SimpleNamespace(
        conn_type="gemini_batch",
        host="http://127.0.0.1:1",
        port=None,
        login=None,
        password="gm-key",
        extra_dejson=extra,
    )


def _gcp(monkeypatch: pytest.MonkeyPatch, project: str) -> None:
    extra = {"keyfile_dict": json.dumps(service_account_key("http://127.0.0.1:1/token", project))}
    extra["gcs.endpoint"] = "http://127.0.0.1:2"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ABP_GCP", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )


def test_the_hook_of_the_gemini_connection_type_is_this_one_and_builds_the_gemini_adapter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert hook_class("gemini_batch") is GeminiBatchHook
    monkeypatch.setenv(
        "AIRFLOW_CONN_GEMINI_BATCH_DEFAULT",
        json.dumps({"conn_type": "gemini_batch", "host": "http://127.0.0.1:1", "password": "gm-key"}),
    )
    adapter = GeminiBatchHook().get_adapter()
    assert isinstance(adapter, GeminiBatchAdapter)
    assert (adapter.settings.base_url, adapter.settings.api_key) == ("http://127.0.0.1:1", "gm-key")


def test_a_developer_api_connection_reads_no_gcp_connection_even_when_one_is_named() -> None:
    settings = gemini_settings(_gemini(gcp_conn_id="no_such_connection", api_version="v1beta"))
    assert settings.credentials is None
    assert settings.extra == {"gcp_conn_id": "no_such_connection", "api_version": "v1beta"}


def test_vertex_takes_credentials_project_and_gcs_endpoint_from_the_gcp_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _gcp(monkeypatch, "from-the-key")
    settings = gemini_settings(_gemini(vertexai=True, gcp_conn_id="abp_gcp", location="us-central1"))
    assert settings.credentials is not None
    assert settings.extra["project"] == "from-the-key"
    assert settings.extra["gcs_endpoint_url"] == "http://127.0.0.1:2"


def test_what_the_gemini_connection_sets_itself_wins_over_the_gcp_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _gcp(monkeypatch, "from-the-key")
    settings = gemini_settings(
        _gemini(vertexai=True, gcp_conn_id="abp_gcp", project="mine", gcs_endpoint_url="http://127.0.0.1:3")
    )
    assert (settings.extra["project"], settings.extra["gcs_endpoint_url"]) == ("mine", "http://127.0.0.1:3")
