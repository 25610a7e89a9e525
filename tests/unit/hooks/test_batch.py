from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.batch import BatchHook, OpenAIBatchHook, settings_from_connection


def conn(**kw: object) -> SimpleNamespace:
    base = {
        "conn_type": "openai_batch",
        "host": None,
        "port": None,
        "login": None,
        "password": None,
        "extra_dejson": {},
    }
    return SimpleNamespace(**{**base, **kw})


def test_the_host_is_the_base_url_and_the_password_the_key() -> None:
    settings = settings_from_connection(conn(host="http://127.0.0.1:8089/v1", password="sk-1"))
    assert (settings.base_url, settings.api_key) == ("http://127.0.0.1:8089/v1", "sk-1")


def test_a_port_is_added_to_a_host_without_one() -> None:
    assert (
        settings_from_connection(conn(host="http://127.0.0.1", port=8089)).base_url == "http://127.0.0.1:8089"
    )


def test_extras_pass_through_and_the_login_joins_them() -> None:
    settings = settings_from_connection(conn(login="AKIA", extra_dejson={"region_name": "eu-west-1"}))
    assert settings.extra == {"region_name": "eu-west-1", "login": "AKIA"}


def test_the_key_never_appears_in_the_settings_repr() -> None:
    assert "sk-secret" not in repr(settings_from_connection(conn(password="sk-secret")))


def test_the_hook_builds_the_adapter_its_connection_type_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_HOOK_TEST",
        json.dumps({"conn_type": "openai_batch", "host": "http://h/v1", "password": "k"}),
    )
    adapter = BatchHook("hook_test").get_adapter()
    assert isinstance(adapter, OpenAIBatchAdapter)
    assert adapter.settings.base_url == "http://h/v1"


def test_a_connection_of_an_unknown_type_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_BAD", json.dumps({"conn_type": "smtp", "host": "x"}))
    with pytest.raises(ConfigurationError, match="'smtp'"):
        BatchHook("hook_bad").get_adapter()


async def test_the_async_path_reads_the_connection_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_ASYNC", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    assert isinstance(await BatchHook.aget_adapter("hook_async"), OpenAIBatchAdapter)


def test_the_connection_form_relabels_host_and_password() -> None:
    behaviour = OpenAIBatchHook.get_ui_field_behaviour()
    assert behaviour["relabeling"] == {"host": "API base URL (optional)", "password": "API key"}
    assert "login" in behaviour["hidden_fields"]
