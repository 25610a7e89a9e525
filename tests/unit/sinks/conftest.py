"""The sink tests' target database, behind the Airflow connection of :data:`~tests.unit.sinks.target.CONN_ID`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.sinks.target import CONN_ID, Target, target_for

#: The target databases: SQLite, PostgreSQL, and MariaDB through the MySQL provider (`make test-mysql`).
SQLITE = pytest.param("sqlite", id="sqlite")
POSTGRESQL = pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)
MYSQL = pytest.param("mysql", id="mysql", marks=pytest.mark.mysql)
SERVERS = {"postgresql": "postgres_server", "mysql": "mysql_server"}


@pytest.fixture(params=[SQLITE, POSTGRESQL, MYSQL])
def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Target]:
    """A fresh target database of each kind (a test narrows them with ``indirect`` parametrization)."""
    server = request.getfixturevalue(SERVERS[request.param]) if request.param in SERVERS else None
    with target_for(request.param, tmp_path, server) as found:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", found.conn_json)
        yield found
