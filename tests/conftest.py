"""Session-wide fixtures: a real PostgreSQL server, an S3-compatible endpoint, an Airflow home.

Kept light on purpose: importing this module imports neither Airflow nor a provider SDK, and sets
no environment variable, so the pure ``core`` and ``ledger`` tests stay fast and isolated. The heavy
pieces are imported inside the fixtures that need them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
AIRFLOW_SITE = REPO_ROOT / "tests" / "support" / "airflow_site"
if str(REPO_ROOT) not in sys.path:  # so that ``tests.support`` imports under any --import-mode
    sys.path.insert(0, str(REPO_ROOT))

if TYPE_CHECKING:
    from tests.support.mysql import MysqlServer
    from tests.support.postgres import PostgresServer
    from tests.support.s3 import S3Server

POSTGRES_FIXTURES = frozenset({"postgres_server", "postgres_url"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the PostgreSQL server ``postgres`` (so ``-m "not postgres"`` works),
    and every test that uses the MariaDB server ``mysql`` (``make test-mysql`` runs ``-m mysql``)."""
    for item in items:
        if POSTGRES_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
        if "mysql_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.mysql)


@pytest.fixture(autouse=True)
def forget_attached_object_stores() -> Iterator[None]:
    """Each test starts with no object store attached.

    Airflow caches an attached store per protocol and connection id for the life of the process,
    so a test that points ``google_cloud_default`` at its own GCS server would otherwise write to
    the server of an earlier test. Nothing is imported here: a test that never attached one pays
    nothing.
    """
    yield
    store = sys.modules.get("airflow.sdk.io.store")
    if store is not None:
        store._STORE_CACHE.clear()


@contextmanager
def _started_postgres(tmp: Path, what: str, extension: str | None = None) -> Iterator[PostgresServer]:
    """Start a server for the session and stop it at the end even on failure (or skip, see below)."""
    from tests.support.postgres import PostgresUnavailable, start_postgres

    try:
        server = start_postgres(tmp, extension=extension)
    except PostgresUnavailable as exc:
        if os.environ.get("ABP_TESTS_SKIP_POSTGRES") == "1":
            pytest.skip(f"{what} unavailable: {exc}")
        raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A PostgreSQL server running for the whole session, stopped at the end even on failure.

    Set ``ABP_TESTS_SKIP_POSTGRES=1`` to skip (rather than fail) its tests where no server binaries
    are installed; by default a missing server is an error, so CI never passes by skipping.
    """
    with _started_postgres(tmp_path_factory.mktemp("postgres"), "PostgreSQL") as server:
        yield server


@pytest.fixture(scope="session")
def pgvector_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PostgresServer]:
    """A PostgreSQL server whose installation ships the ``vector`` extension (pgvector).

    The session's :func:`postgres_server` when its installation has it; else a second server from
    one that does (the ``pgserver`` wheel's, where the distribution's server has no pgvector).
    """
    from tests.support.postgres import PostgresUnavailable, find_postgres_bin_dir, has_extension

    try:
        shared = has_extension(find_postgres_bin_dir(), "vector")
    except PostgresUnavailable:
        shared = False
    if shared:
        yield request.getfixturevalue("postgres_server")
        return
    with _started_postgres(
        tmp_path_factory.mktemp("pgvector"), "PostgreSQL with pgvector", "vector"
    ) as server:
        yield server


@pytest.fixture(scope="session")
def mysql_server() -> Iterator[MysqlServer]:
    """A throw-away MariaDB server running for the whole session (:mod:`tests.support.mysql`).

    Its tests skip where the MySQL provider is not installed (the main venv: ``make test-mysql``
    runs them in its own) and, outside CI, where MariaDB is not; in the MySQL lane and under CI
    (``CI=true``) those are failures.
    """
    from tests.support.ci import under_ci
    from tests.support.mysql import require_mysql, running_mysql

    require_mysql(lane=os.environ.get("ABP_MYSQL_LANE") == "1", ci=under_ci())
    with running_mysql() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """SQLAlchemy URL of the session database: ``postgresql+psycopg2://postgres@127.0.0.1:PORT/abp_test``."""
    return postgres_server.url


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database URL, once on SQLite and once on PostgreSQL.

    SQLite: a new file under ``tmp_path``. PostgreSQL: a new database on the session server, dropped
    (open connections closed) after the test.
    """
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.create_database(f"ledger_{uuid.uuid4().hex[:16]}")
    try:
        yield server.url_for(name)
    finally:
        server.drop_database(name)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3-compatible server on 127.0.0.1, with dummy AWS credentials in the environment.

    The previous values of the AWS variables are restored at the end of the session.
    """
    from tests.support.s3 import dummy_aws_env, start_s3

    with dummy_aws_env(), start_s3() as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: S3Server) -> str:
    """The S3 endpoint URL, e.g. ``http://127.0.0.1:PORT``; pass it as ``endpoint_url``."""
    return s3_server.endpoint_url


def _airflow_command() -> list[str]:
    """The ``airflow`` CLI of the interpreter that runs the tests (its venv's ``bin``)."""
    candidate = Path(sys.executable).parent / "airflow"
    if candidate.exists():
        return [str(candidate)]
    return [sys.executable, "-m", "airflow"]


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A migrated, throw-away Airflow home; yields the environment for ``subprocess`` calls.

    The environment is a copy of ``os.environ`` plus ``AIRFLOW_HOME``, a SQLite metadata database
    in it, ``dags_folder`` = ``<repo>/dags`` and no example DAGs. ``os.environ`` itself is left
    untouched. ``unit_test_mode`` is deliberately not set: it swaps in Airflow's own test config,
    and these runs should behave like a user's.
    """
    home = tmp_path_factory.mktemp("airflow_home")
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            # tests/support/airflow_site: the in-process execution API serves the newest version only
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(AIRFLOW_SITE), str(REPO_ROOT), env.get("PYTHONPATH", "")])
            ),
        }
    )
    result = subprocess.run(
        [*_airflow_command(), "db", "migrate"],
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"`airflow db migrate` failed ({result.returncode}):\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return env


# -- the chaos suite's session counts (tests/support/chaos.py::TALLY) -----------------------------
# Printed at the end of the session and written as JSON with ABP_CHAOS_SUMMARY=<file>. Under
# pytest-xdist (`make test` runs `-n 2`) each worker counts its own cases and sends them to the
# controller, which prints the sum. Nothing is imported unless a chaos case ran.


def pytest_sessionfinish(session: pytest.Session) -> None:
    chaos = sys.modules.get("tests.support.chaos")
    workeroutput = getattr(session.config, "workeroutput", None)
    if chaos is not None and workeroutput is not None:
        workeroutput["chaos_tally"] = chaos.TALLY.raw()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    raw = getattr(node, "workeroutput", {}).get("chaos_tally")
    if raw:
        from tests.support.chaos import TALLY

        TALLY.add(raw)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    chaos = sys.modules.get("tests.support.chaos")
    if chaos is None or getattr(terminalreporter.config, "workerinput", None) is not None:
        return
    tally = chaos.TALLY
    if not tally.cases and not tally.kills:
        return
    data = tally.to_dict()
    terminalreporter.section("chaos suite")
    terminalreporter.write_line(
        f"cases {data['cases']}, kill points {data['kill_points']} ({data['kills']} kills), "
        f"faults {data['faults']}, items {data['items']}, lost {data['lost']}, "
        f"paid twice {data['paid_twice']}, unknown batches {data['unknown_batches']}"
    )
    terminalreporter.write_line(f"kills: {data['kills_by_point']}")
    terminalreporter.write_line(f"faults: {data['faults_by_kind']}")
    path = chaos.summary_path()
    if path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
