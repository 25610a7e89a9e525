from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy.engine import make_url

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.ledger import LedgerHook, url_from_connection
from tests.support.postgres import PostgresServer


def conn(**kw: object) -> SimpleNamespace:
    base = {
        "conn_id": "c",
        "conn_type": "postgres",
        "host": None,
        "port": None,
        "login": None,
        "password": None,
        "schema": None,
        "extra_dejson": {},
    }
    return SimpleNamespace(**{**base, **kw})


def test_a_postgres_connection_becomes_a_psycopg2_url() -> None:
    url = make_url(
        url_from_connection(conn(host="db", port=5433, login="u", password="p@ss", schema="ledger"))
    )
    assert (url.drivername, url.host, url.port, url.username, url.password, url.database) == (
        "postgresql+psycopg2",
        "db",
        5433,
        "u",
        "p@ss",
        "ledger",
    )


def test_an_explicit_url_in_extras_wins() -> None:
    assert (
        url_from_connection(conn(conn_type="mysql", extra_dejson={"url": "sqlite:///x.db"}))
        == "sqlite:///x.db"
    )


def test_an_unsupported_connection_type_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="use a 'postgres' or 'sqlite' connection"):
        url_from_connection(conn(conn_type="mysql"))


def test_without_a_connection_the_embedded_sqlite_ledger_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", f"sqlite:///{tmp_path / 'l.sqlite'}")
    ledger = LedgerHook().get_conn()
    assert ledger.engine.dialect.name == "sqlite"
    assert ledger.schema_version >= 1


@pytest.mark.postgres
def test_a_real_postgres_connection_opens_the_ledger(
    monkeypatch: pytest.MonkeyPatch, postgres_server: PostgresServer
) -> None:
    url = make_url(postgres_server.url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_LEDGER_PG",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": url.host,
                "port": url.port,
                "login": url.username,
                "schema": url.database,
            }
        ),
    )
    ledger = LedgerHook("ledger_pg").get_conn()
    assert ledger.engine.dialect.name == "postgresql"
    assert ledger.schema_version >= 1


def test_the_test_button_reports_a_ledger_without_creating_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.ledger import Ledger

    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_T", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    ok, message = LedgerHook("ledger_t").test_connection()
    assert ok and "no ledger yet" in message, message
    assert not path.exists() or path.stat().st_size == 0  # the button created nothing
    Ledger.from_url(f"sqlite:///{path}")
    ok, message = LedgerHook("ledger_t").test_connection()
    assert ok and "schema version" in message, message


def test_the_test_button_names_an_unreachable_ledger_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support.ports import free_port

    pg = {
        "conn_type": "postgres",
        "host": "127.0.0.1",
        "port": free_port(),
        "login": "u",
        "password": "pw-9x",
    }
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_DOWN", json.dumps(pg))
    ok, message = LedgerHook("ledger_down").test_connection()
    assert not ok and "'ledger_down' is unreachable" in message and "OperationalError" in message
    assert "pw-9x" not in message
