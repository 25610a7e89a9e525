"""The hook a SQL source reads through is the one the connection's type names, a common.sql DbApiHook."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.sql import sql_hook


def test_a_sqlite_connection_gives_the_sqlite_hook_with_its_parameter_marker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow.providers.sqlite.hooks.sqlite import SqliteHook

    monkeypatch.setenv("AIRFLOW_CONN_SRC", f"sqlite://{quote(str(tmp_path / 'x.db'), safe='')}")
    hook = sql_hook("src")
    assert isinstance(hook, SqliteHook) and hook.placeholder == "?"


def test_a_connection_whose_hook_cannot_run_a_query_is_refused_naming_it_its_type_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_API", json.dumps({"conn_type": "http", "host": "example.test"}))
    with pytest.raises(
        ConfigurationError, match=r"connection 'api' is of type 'http'.*HttpHook is not a common.sql"
    ):
        sql_hook("api")


def test_a_connection_of_a_type_no_installed_provider_knows_is_refused_with_the_provider_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WH", json.dumps({"conn_type": "nosuchdb", "host": "h"}))
    with pytest.raises(
        ConfigurationError, match=r"connection 'wh' is of type 'nosuchdb'.*install the type's provider"
    ):
        sql_hook("wh")
