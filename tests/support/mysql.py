"""A real, throw-away MariaDB server for the test session (the MySQL lane, ``make test-mysql``).

The binaries (``mariadbd`` and ``mariadb-install-db``) are looked up in ``ABP_MYSQL_BIN_DIR`` if
set, else on ``PATH``, then in ``/usr/sbin``, ``/usr/bin``, ``/usr/libexec`` and
``/usr/local/mysql/bin``; ``apt-get install mariadb-server`` (Debian, Ubuntu) installs them.

``mariadb-install-db`` makes a fresh data directory in a private temporary folder, and ``mariadbd``
(a direct child of the test process) serves it on 127.0.0.1 only, on a free port (another is tried
if that one is taken meanwhile), with a Unix socket in the same folder, ``--skip-grant-tables``
(every client is ``root`` with no password), no option file read (``--no-defaults``), the server's
default strict SQL mode, ``utf8mb4``, and a small InnoDB with no flushing at commit. When the tests
run as root the server runs as root (``--user=root``). It is stopped with SIGTERM (then SIGKILL)
and its folder is removed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

from tests.support.ports import LOOPBACK, free_port
from tests.support.postgres import plain_dbname, wait_for_server

SERVER_NAMES: Final = ("mariadbd", "mysqld")
INSTALL_DB_NAMES: Final = ("mariadb-install-db", "mysql_install_db")
SEARCH_DIRS: Final = ("/usr/sbin", "/usr/bin", "/usr/libexec", "/usr/local/mysql/bin", "/usr/local/bin")
INSTALL_HINT: Final = (
    "no MariaDB server (mariadbd and mariadb-install-db) was found: apt-get install mariadb-server "
    "(Debian/Ubuntu; dnf install mariadb-server on Fedora/RHEL, brew install mariadb on macOS), or point "
    "ABP_MYSQL_BIN_DIR at the folder holding them"
)
#: Options of both the bootstrap and the server: small, fast, nothing read from /etc/mysql.
_INNODB: Final = (
    "--innodb-log-file-size=4M",
    "--innodb-data-file-path=ibdata1:4M:autoextend",
    "--innodb-buffer-pool-size=16M",
    "--innodb-use-native-aio=0",
)
_SERVER: Final = (
    "--skip-grant-tables",
    "--skip-name-resolve",
    "--skip-performance-schema",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--default-time-zone=+00:00",
    "--max-connections=50",
)


class MysqlUnavailable(RuntimeError):
    """No MariaDB server could be found or started."""


def find_binaries() -> tuple[Path, Path]:
    """Return the server binary and the data-directory installer (``mariadbd``, ``mariadb-install-db``).

    :raises MysqlUnavailable: when either is missing, with the install hint
    """
    override = os.environ.get("ABP_MYSQL_BIN_DIR")
    folders = [Path(override)] if override else []
    found: list[Path] = []
    for names in (SERVER_NAMES, INSTALL_DB_NAMES):
        candidates = [folder / name for folder in folders for name in names]
        if not override:
            candidates += [Path(p) for p in map(shutil.which, names) if p]
            candidates += [Path(folder) / name for folder in SEARCH_DIRS for name in names]
        usable = [path for path in candidates if path.is_file() and os.access(path, os.X_OK)]
        if not usable:
            raise MysqlUnavailable(INSTALL_HINT)
        found.append(usable[0])
    return found[0], found[1]


@dataclass
class MysqlServer:
    """A running MariaDB server; use as a context manager or call :meth:`stop`.

    :param server: the ``mariadbd`` binary
    :param workdir: the folder of its data directory, socket and log (removed on stop)
    :param port: the TCP port on 127.0.0.1
    """

    server: Path
    workdir: Path
    port: int = 0
    host: str = LOOPBACK
    user: str = "root"
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: the data directory and the error log, in ``workdir``
    data_dir: Path = field(init=False)
    log_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir, self.log_file = self.workdir / "data", self.workdir / "error.log"

    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL (the mysqlclient driver) of a database on this server.

        :param dbname: the database name
        """
        return f"mysql+mysqldb://{self.user}@{self.host}:{self.port}/{dbname}?charset=utf8mb4"

    def conn_json(self, dbname: str) -> str:
        """An Airflow ``mysql`` connection to a database on this server (``AIRFLOW_CONN_<ID>``'s JSON).

        :param dbname: the database name
        """
        conn = {"conn_type": "mysql", "host": self.host, "port": self.port, "login": self.user}
        return json.dumps({**conn, "schema": dbname, "extra": {"charset": "utf8mb4"}})

    def _connect(self, dbname: str | None = None) -> Any:
        import MySQLdb

        extra = {"database": dbname} if dbname else {}
        return MySQLdb.connect(
            host=self.host, port=self.port, user=self.user, connect_timeout=2, charset="utf8mb4", **extra
        )

    def execute(self, sql: str, dbname: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement, committed, and return its rows (empty for no result set).

        :param sql: the statement
        :param dbname: the database to run it in (none: the server's)
        """
        connection = self._connect(dbname)
        try:
            cursor = connection.cursor()
            cursor.execute(sql)
            rows = list(cursor.fetchall()) if cursor.description else []
            connection.commit()
            return rows
        finally:
            connection.close()

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database and return its name.

        :param name: a lower-case identifier; a unique ``db_<hex>`` when omitted
        """
        name = plain_dbname(name)
        self.execute(f"CREATE DATABASE `{name}`")
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database.

        :param name: the database name
        """
        self.execute(f"DROP DATABASE IF EXISTS `{plain_dbname(name)}`")

    def launch(self) -> None:
        """Start ``mariadbd`` on :attr:`port` as a child of this process (so it is reaped)."""
        user = ("--user=root",) if os.geteuid() == 0 else ()
        args = [
            str(self.server),
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--socket={self.workdir / 'mysql.sock'}",
            f"--pid-file={self.workdir / 'mysqld.pid'}",
            f"--log-error={self.log_file}",
            f"--tmpdir={self.workdir}",
            f"--port={self.port}",
            f"--bind-address={self.host}",
            *user,
            *_INNODB,
            *_SERVER,
        ]
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches pytest, which then stops the server
        )

    def wait_until_ready(self, timeout: float = 60.0) -> None:
        """Block until the server accepts a connection.

        :param timeout: seconds before giving up
        :raises MysqlUnavailable: the server exited, or did not answer in time (with its log)
        """
        wait_for_server(
            lambda: self._connect().close(),
            self._process,
            self.log_file,
            f"MariaDB on port {self.port}",
            MysqlUnavailable,
            timeout,
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its folder; idempotent."""
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> MysqlServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _install_db(install_db: Path, server: MysqlServer) -> None:
    """Make the data directory (the system tables) with ``mariadb-install-db``."""
    user = ("--user=root",) if os.geteuid() == 0 else ()
    args: Sequence[str] = [
        str(install_db),
        "--no-defaults",
        f"--datadir={server.data_dir}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        *user,
        *_INNODB,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise MysqlUnavailable(
            f"{install_db.name} exited with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


def start_mysql(attempts: int = 3, timeout: float = 60.0) -> MysqlServer:
    """Make a data directory and start a MariaDB server on it.

    :param attempts: how many free ports to try when another process takes the chosen one first
    :param timeout: seconds to wait for the server to accept connections
    :raises MysqlUnavailable: no binaries (with the install hint), or the server did not start
    """
    server_bin, install_db = find_binaries()
    # short and private: a Unix socket's path is at most 107 bytes
    server = MysqlServer(server=server_bin, workdir=Path(tempfile.mkdtemp(prefix="abp-my-")))
    try:
        _install_db(install_db, server)
        for attempt in range(1, max(1, attempts) + 1):
            server.port = free_port()
            server.launch()
            try:
                server.wait_until_ready(timeout)
                break
            except MysqlUnavailable as exc:
                if attempt == attempts or "already in use" not in str(exc):
                    raise
        atexit.register(server.stop)
        return server
    except BaseException:
        server.stop()
        raise


@contextlib.contextmanager
def running_mysql(**kwargs: Any) -> Iterator[MysqlServer]:
    """Context manager around :func:`start_mysql` that always stops the server.

    :param kwargs: passed to :func:`start_mysql`
    """
    server = start_mysql(**kwargs)
    try:
        yield server
    finally:
        server.stop()


NO_PROVIDER: Final = (
    "no MySQL provider in this environment (apache-airflow-providers-mysql, mysqlclient): "
    "`make test-mysql` runs these tests in .venv-mysql"
)


def require_mysql(lane: bool, ci: bool) -> None:
    """Skip (or fail) a MySQL test where it cannot run.

    Without the MySQL provider and its driver it skips (the main venv has neither), except in the
    MySQL lane (``ABP_MYSQL_LANE=1``, set by ``make test-mysql``), where that fails. Without the
    server's binaries it skips with the install hint, except under CI, where that fails.

    :param lane: running in the MySQL lane
    :param ci: running under CI (``CI=true``)
    """
    import importlib.util

    from tests.support.ci import missing_program

    if (
        importlib.util.find_spec("MySQLdb") is None
        or importlib.util.find_spec("airflow.providers.mysql") is None
    ):
        if lane:
            pytest.fail(NO_PROVIDER)
        pytest.skip(NO_PROVIDER)
    try:
        find_binaries()
    except MysqlUnavailable as exc:
        missing_program(str(exc), ci)
