from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support import postgres as pg
from tests.support.ports import free_port, is_listening


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


@pytest.mark.postgres
def test_the_postgres_server_accepts_a_connection_and_stops_cleanly(tmp_path: Path) -> None:
    server = pg.start_postgres(tmp_path, dbname="probe")
    try:
        pid = server.postmaster_pid()
        assert pid is not None
        engine = sa.create_engine(server.url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar() == "probe"
            assert conn.execute(sa.text("SHOW listen_addresses")).scalar() == "127.0.0.1"
            assert conn.execute(sa.text("SHOW fsync")).scalar() == "off"
        engine.dispose()
        assert server.url == f"postgresql+psycopg2://postgres@127.0.0.1:{server.port}/probe"
    finally:
        server.stop()
    assert not server.running
    assert not is_listening(server.port)
    assert not pg.process_alive(pid)
    assert not server.workdir.exists()
    server.stop()  # idempotent


@pytest.mark.postgres
def test_the_server_is_stopped_when_the_with_block_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), pg.running_postgres(tmp_path) as server:
        assert is_listening(server.port)
        raise RuntimeError("boom")
    assert not server.running
    assert not is_listening(server.port)


@pytest.mark.postgres
def test_a_port_taken_between_choosing_and_binding_is_retried_with_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken, free_port()])
        monkeypatch.setattr(pg, "free_port", lambda: next(ports))
        with pg.running_postgres(tmp_path) as server:
            assert server.port != taken
            assert server.execute("SELECT 1") == [(1,)]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has to hand the server to another user")
def test_as_root_the_server_runs_as_an_unprivileged_user(postgres_server: pg.PostgresServer) -> None:
    pid = postgres_server.postmaster_pid()
    assert pid is not None
    assert _uid_of(pid) != 0
    assert postgres_server.data_dir.stat().st_uid != 0


def test_the_session_postgres_url_works_with_sqlalchemy(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TEMP TABLE t (x int)"))
        conn.execute(sa.text("INSERT INTO t VALUES (41), (1)"))
        assert conn.execute(sa.text("SELECT sum(x) FROM t")).scalar() == 42
    engine.dispose()


def test_ledger_url_is_an_empty_database_of_the_requested_kind(
    ledger_url: str, request: pytest.FixtureRequest
) -> None:
    kind = request.node.callspec.params["ledger_url"]
    engine = sa.create_engine(ledger_url)
    assert engine.dialect.name == kind
    assert sa.inspect(engine).get_table_names() == []
    with engine.begin() as conn:  # leave a table behind: the next test must not see it
        conn.execute(sa.text("CREATE TABLE leftover (x int)"))
    engine.dispose()


def test_ledger_url_postgresql_variant_carries_the_postgres_marker(request: pytest.FixtureRequest) -> None:
    items = [i for i in request.session.items if i.name.startswith("test_ledger_url_is_an_empty_database")]
    marked = {i.name: i.get_closest_marker("postgres") is not None for i in items}
    assert marked == {
        "test_ledger_url_is_an_empty_database_of_the_requested_kind[sqlite]": False,
        "test_ledger_url_is_an_empty_database_of_the_requested_kind[postgresql]": True,
    }


def test_a_database_is_dropped_even_while_a_connection_is_still_open(
    postgres_server: pg.PostgresServer,
) -> None:
    name = postgres_server.create_database()
    engine = sa.create_engine(postgres_server.url_for(name))
    conn = engine.connect()
    conn.execute(sa.text("SELECT 1"))
    postgres_server.drop_database(name)
    rows = postgres_server.execute(f"SELECT 1 FROM pg_database WHERE datname = '{name}'")
    assert rows == []
    engine.dispose()


def test_database_names_that_are_not_plain_identifiers_are_refused(
    postgres_server: pg.PostgresServer,
) -> None:
    with pytest.raises(ValueError):
        postgres_server.create_database('x"; DROP DATABASE postgres; --')


def test_without_server_binaries_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ABP_PG_BIN_DIR", raising=False)
    monkeypatch.setattr(pg, "candidate_bin_dirs", lambda: [tmp_path])
    with pytest.raises(pg.PostgresUnavailable) as info:
        pg.find_postgres_bin_dir()
    message = str(info.value)
    assert "apt-get install postgresql" in message
    assert "pip install pgserver" in message


def test_a_bin_dir_override_without_the_binaries_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ABP_PG_BIN_DIR", str(tmp_path))
    with pytest.raises(pg.PostgresUnavailable, match="ABP_PG_BIN_DIR"):
        pg.find_postgres_bin_dir()


def test_binaries_on_path_come_before_the_pip_installed_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in pg.REQUIRED_BINARIES:
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.delenv("ABP_PG_BIN_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    candidates = pg.candidate_bin_dirs()
    assert candidates[0] == tmp_path.resolve()
    assert pg.find_postgres_bin_dir() == tmp_path.resolve()


@pytest.mark.postgres
@pytest.mark.skipif(importlib.util.find_spec("pgserver") is None, reason="pgserver wheel not installed")
def test_the_pip_installed_pgserver_binaries_start_a_working_server(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    with pg.running_postgres(tmp_path, bin_dir=bin_dir) as server:
        version = server.execute("SHOW server_version")[0][0]
        assert version.split(".")[0].isdigit()
        assert server.execute("SELECT 1") == [(1,)]


@pytest.mark.postgres
@pytest.mark.skipif(importlib.util.find_spec("pgserver") is None, reason="pgserver wheel not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another OS user")
def test_binaries_inside_a_private_folder_still_start_a_server_as_the_unprivileged_user(
    tmp_path: Path,
) -> None:
    import shutil

    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations
    install = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    site = install.parent.parent
    private = tmp_path / "clone"  # a `mktemp -d` clone: mode 0700, owned by root
    private.mkdir(mode=0o700)
    copy = private / ".venv" / "site-packages"  # the wheel's layout: pgserver/pginstall, pgserver.libs
    shutil.copytree(install, copy / "pgserver" / "pginstall", symlinks=True)
    for libs in site.glob("pgserver*.libs"):
        shutil.copytree(libs, copy / libs.name, symlinks=True)
    with pg.running_postgres(tmp_path, bin_dir=copy / "pgserver" / "pginstall" / "bin") as server:
        assert server.execute("SELECT 1") == [(1,)]
        pid = server.postmaster_pid()
        assert pid is not None and _uid_of(pid) != 0
