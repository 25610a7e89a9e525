"""``make stack``: the provider under a real Airflow, without Docker, on this machine.

``python scripts/stack.py up`` starts, each as its own process and all bound to 127.0.0.1:

- PostgreSQL (found and started the way the test suite does, ``tests/support/postgres.py``) with
  two databases: ``airflow`` (Airflow's metadata) and ``ledger`` (the provider's ledger);
- the provider emulator (OpenAI, Anthropic, Gemini, Bedrock batch APIs, with a few faults);
- Airflow's ``api-server``, ``scheduler`` (LocalExecutor), ``dag-processor`` and ``triggerer``,
  with the example DAGs of ``dags/`` and SimpleAuthManager logins (``admin``, ``viewer``) whose
  passwords are printed.

With ``ABP_STACK_EXECUTOR=celery`` it starts the distributed form instead: CeleryExecutor with a
Redis broker (Debian's ``redis-server``), two Celery workers that share nothing on disk (each its
own logs, sample data and temp folder; staging on S3, served on loopback by moto; the ledger on
PostgreSQL), naming themselves ``worker-1`` and ``worker-2`` in their task instances.

A supervisor process owns them: it restarts a component that dies (a crashed or killed triggerer
comes back, as under systemd or Kubernetes) and stops everything, in order, on ``down``. State,
logs, staging and sample data live in ``.stack/`` (``$ABP_STACK_DIR`` elsewhere); PostgreSQL's
data is started fresh each time. ``python scripts/stack.py down`` stops it; ``status`` prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Airflow components, in start order (stopped in reverse).
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: The Celery form's workers (``ABP_STACK_EXECUTOR=celery``): two, sharing nothing on disk.
WORKERS = ("worker-1", "worker-2")
EXECUTORS = ("local", "celery")
STAGING_BUCKET = "abp-staging"
USERS = {"admin": "admin", "viewer": "viewer"}
READY_TIMEOUT_S = float(os.environ.get("ABP_STACK_READY_TIMEOUT", "600"))
STOP_TIMEOUT_S = 30.0


def stack_dir() -> Path:
    """Where the stack keeps its state: ``$ABP_STACK_DIR``, else ``<repo>/.stack``."""
    return Path(os.environ.get("ABP_STACK_DIR") or ROOT / ".stack").resolve()


def state_file(base: Path) -> Path:
    """The JSON state the supervisor writes (pids, ports, users)."""
    return base / "state.json"


def read_state(base: Path) -> dict[str, Any] | None:
    """The stack's state, or ``None`` when no stack was started here."""
    try:
        loaded = json.loads(state_file(base).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def write_state(base: Path, state: dict[str, Any]) -> None:
    """Replace the state file atomically."""
    tmp = state_file(base).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    tmp.chmod(0o600)
    tmp.replace(state_file(base))


def alive(pid: int | None) -> bool:
    """Whether a process exists and is not a zombie."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _free_port() -> int:
    from tests.support.ports import free_port

    return free_port()


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process serving {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status < 500:
                    return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(1)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s: {last}")


# --------------------------------------------------------------------------- the supervisor


class Supervisor:
    """Starts the stack's processes, restarts one that dies, stops them all on SIGTERM."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.logs = base / "logs"
        self.stopping = False
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, int] = {}
        self.log_start: dict[str, int] = {}
        self.state: dict[str, Any] = {"supervisor_pid": os.getpid(), "ready": False, "root": str(ROOT)}
        self.postgres: Any = None
        self.s3: Any = None
        self.env: dict[str, str] = {}
        self.executor = os.environ.get("ABP_STACK_EXECUTOR", "local")
        if self.executor not in EXECUTORS:
            raise SystemExit(
                f"ABP_STACK_EXECUTOR must be one of {', '.join(EXECUTORS)}; got {self.executor!r}"
            )
        self.components = COMPONENTS + (WORKERS if self.executor == "celery" else ())
        self.state["executor"] = self.executor

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self._start()
            self.state["ready"] = True
            self._save()
            print("stack ready", flush=True)
            while not self.stopping:
                self._watch()
                time.sleep(1)
        except Exception as exc:
            self.state["error"] = f"{type(exc).__name__}: {exc}"
            self._save()
            print(f"stack failed: {self.state['error']}", flush=True)
            return 1
        finally:
            self._stop_all()
        return 0

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True
        if not self.state.get("ready"):
            raise SystemExit(128 + signum)  # still starting: leave the blocking call, then stop

    def _save(self) -> None:
        self.state["components"] = {
            name: {"pid": proc.pid, "restarts": self.restarts.get(name, 0)}
            for name, proc in self.procs.items()
        }
        write_state(self.base, self.state)

    def _start(self) -> None:
        from tests.support.postgres import start_postgres

        for folder in (self.logs, self.base / "staging", self.base / "sample-data", self.base / "airflow"):
            folder.mkdir(parents=True, exist_ok=True)
        print("starting PostgreSQL", flush=True)
        self.postgres = start_postgres(self.base / "postgres", dbname="airflow")
        self.postgres.create_database("ledger")
        self.state["postgres"] = {
            "pid": self.postgres.postmaster_pid(),
            "port": self.postgres.port,
            "airflow_url": self.postgres.url_for("airflow"),
            "ledger_url": self.postgres.url_for("ledger"),
        }
        self._save()

        print("starting the emulator", flush=True)
        emulator = self._spawn(
            "emulator",
            [
                sys.executable,
                "-m",
                "batch_emulator",
                "--port",
                "0",
                "--time-scale",
                os.environ.get("ABP_STACK_EMULATOR_TIME_SCALE", "0.05"),
                "--seed",
                "7",
                "--fault",
                "rate_500=0.02",
                "--fault",
                "rate_missing=0.01",
                "--fault",
                "rate_duplicate=0.01",
                "--log-level",
                "info",
            ],
            env={**os.environ, "PYTHONPATH": _pythonpath()},
        )
        emulator_url = self._emulator_url(emulator)
        self.state["emulator_url"] = emulator_url
        self._save()

        if self.executor == "celery":
            self._start_celery_services()
        port = int(os.environ.get("ABP_STACK_PORT") or 0) or _free_port()
        self.state["api_url"] = f"http://127.0.0.1:{port}"
        self.env = self._airflow_env(port, emulator_url)
        print("migrating Airflow's metadata database", flush=True)
        with (self.logs / "db-migrate.log").open("ab") as log:
            done = subprocess.run(
                [_airflow(), "db", "migrate"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
                timeout=900,
            )
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed; see {self.logs / 'db-migrate.log'}")
        for name in self.components:
            print(f"starting airflow {name}", flush=True)
            self._start_component(name)
        self._save()
        _wait_http(f"{self.state['api_url']}/api/v2/version", READY_TIMEOUT_S, self.procs["api-server"])

    def _start_celery_services(self) -> None:
        """Redis (the broker) as a process, S3 (moto, for staging) in this process's threads."""
        from tests.support.ports import is_listening
        from tests.support.s3 import start_s3

        redis_dir = self.base / "redis"
        redis_dir.mkdir(exist_ok=True)
        port = _free_port()
        print("starting Redis", flush=True)
        redis = self._spawn(
            "redis",
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(redis_dir),
            ],
            env=dict(os.environ),
        )
        deadline = time.monotonic() + 60
        while not is_listening(port):
            if redis.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start; see {self.logs / 'redis.log'}")
            time.sleep(0.2)
        self.state["redis_url"] = f"redis://127.0.0.1:{port}/0"
        print("starting S3 (moto) for staging", flush=True)
        self.s3 = start_s3()
        self.state["s3_endpoint"] = self.s3.endpoint_url
        import boto3

        boto3.client("s3", endpoint_url=self.s3.endpoint_url, **_DUMMY_AWS_KWARGS).create_bucket(
            Bucket=STAGING_BUCKET
        )
        self._save()

    def _emulator_url(self, proc: subprocess.Popen[bytes]) -> str:
        log = self.logs / "emulator.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log.read_bytes()[self.log_start.get("emulator", 0) :].decode(errors="replace")
            found = re.search(r"http://127\.0\.0\.1:\d+", text)
            if found:
                return found.group(0)
            if proc.poll() is not None:
                raise RuntimeError(f"the emulator exited with {proc.returncode}; see {log}")
            time.sleep(0.2)
        raise RuntimeError(f"the emulator printed no address within 120 s; see {log}")

    def _airflow_env(self, port: int, emulator_url: str) -> dict[str, str]:
        home = self.base / "airflow"
        passwords = home / "simple_auth_manager_passwords.json"
        if not passwords.exists():
            passwords.write_text(json.dumps({u: secrets.token_urlsafe(12) for u in USERS}), encoding="utf-8")
            passwords.chmod(0o600)
        secret_file = home / "secrets.json"
        if not secret_file.exists():
            secret_file.write_text(
                json.dumps({"jwt": secrets.token_urlsafe(32), "api": secrets.token_urlsafe(32)}),
                encoding="utf-8",
            )
            secret_file.chmod(0o600)
        keys = json.loads(secret_file.read_text(encoding="utf-8"))
        self.state["passwords_file"] = str(passwords)
        self.state["users"] = dict(USERS)
        conns = {
            "OPENAI_BATCH_DEFAULT": {
                "conn_type": "openai_batch",
                "host": f"{emulator_url}/v1",
                "password": "sk-emulator",
            },
            "ANTHROPIC_BATCH_DEFAULT": {
                "conn_type": "anthropic_batch",
                "host": emulator_url,
                "password": "sk-ant-emulator",
            },
            "GEMINI_BATCH_DEFAULT": {
                "conn_type": "gemini_batch",
                "host": emulator_url,
                "password": "gemini-emulator",
            },
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            {
                "PYTHONPATH": _pythonpath(),
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": os.environ.get("ABP_STACK_DAGS_FOLDER") or str(ROOT / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": os.environ.get("ABP_STACK_PARALLELISM", "4"),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url_for("airflow"),
                "AIRFLOW__CORE__AUTH_MANAGER": (
                    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
                "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt"],
                "AIRFLOW__API__SECRET_KEY": keys["api"],
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs / "tasks"),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
                "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": self.postgres.url_for("ledger"),
                "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT": f"file://{self.base / 'staging'}",
                "AIRFLOW__BATCH_PROVIDER__POLL_INITIAL_INTERVAL": "1",
                "AIRFLOW__BATCH_PROVIDER__POLL_FACTOR": "1.5",
                "AIRFLOW__BATCH_PROVIDER__POLL_MAX_INTERVAL": "5",
                "ABP_SAMPLE_DATA_DIR": str(self.base / "sample-data"),
                # "console pages" of the emulator's batches: its own batch JSON
                "AIRFLOW__BATCH_PROVIDER__CONSOLE_URLS": json.dumps(
                    {"openai": f"{emulator_url}/v1/batches/{{batch_id}}"}
                ),
                **{f"AIRFLOW_CONN_{k}": json.dumps(v) for k, v in conns.items()},
            }
        )
        env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(_free_port())
        if self.executor == "celery":
            env.update(
                {
                    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                    "AIRFLOW__CELERY__BROKER_URL": self.state["redis_url"],
                    # psycopg2 named: SQLAlchemy's default PostgreSQL driver is psycopg (3), not installed
                    "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.postgres.url_for("airflow"),
                    "AIRFLOW__CELERY__WORKER_CONCURRENCY": os.environ.get(
                        "ABP_STACK_WORKER_CONCURRENCY", "2"
                    ),
                    # staging on S3: the workers share no folder
                    "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT": f"s3://{STAGING_BUCKET}/llm-batch",
                    "AIRFLOW__BATCH_PROVIDER__STAGING_CONN_ID": "stack_s3",
                    "AIRFLOW_CONN_STACK_S3": json.dumps(
                        {
                            "conn_type": "aws",
                            "login": _DUMMY_AWS_KWARGS["aws_access_key_id"],
                            "password": _DUMMY_AWS_KWARGS["aws_secret_access_key"],
                            "extra": {"endpoint_url": self.state["s3_endpoint"], "region_name": "us-east-1"},
                        }
                    ),
                    **_DUMMY_AWS_ENV,
                }
            )
        (self.base / "env.json").write_text(json.dumps(env, indent=1, sort_keys=True), encoding="utf-8")
        (self.base / "env.json").chmod(0o600)
        return env

    def _command(self, name: str) -> list[str]:
        if name == "api-server":
            return [
                _airflow(),
                "api-server",
                "--host",
                "127.0.0.1",
                "--port",
                self.env["AIRFLOW__API__PORT"],
                "-w",
                "1",
            ]
        if name in WORKERS:
            # no log server: it would bind every interface, and the workers share no log folder
            return [_airflow(), "celery", "worker", "--celery-hostname", f"{name}@%h", "--skip-serve-logs"]
        return [_airflow(), name]

    def _component_env(self, name: str) -> dict[str, str]:
        """A worker gets folders of its own (logs, sample data, temp) and names itself in task instances."""
        if name not in WORKERS:
            return self.env
        own = self.base / name
        for sub in ("logs", "sample-data", "tmp"):
            (own / sub).mkdir(parents=True, exist_ok=True)
        return {
            **self.env,
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(own / "logs"),
            "ABP_SAMPLE_DATA_DIR": str(own / "sample-data"),
            "TMPDIR": str(own / "tmp"),
            "ABP_STACK_WORKER": name,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "stack_hostname.hostname",
            "PYTHONPATH": os.pathsep.join([self.env["PYTHONPATH"], str(ROOT / "scripts")]),
        }

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        path = self.logs / f"{name}.log"
        self.log_start[name] = path.stat().st_size if path.exists() else 0
        with path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd or self.base,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped with everything it started
            )
        self.procs[name] = proc
        return proc

    def _start_component(self, name: str) -> None:
        own = self.base / name if name in WORKERS else None
        self._spawn(name, self._command(name), self._component_env(name), cwd=own)

    def _watch(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is None or self.stopping:
                continue
            _kill_group(proc.pid, signal.SIGKILL)  # what it left behind
            self.restarts[name] = self.restarts.get(name, 0) + 1
            print(f"{name} exited with {proc.returncode}; restart {self.restarts[name]}", flush=True)
            if name in ("emulator", "redis"):
                raise RuntimeError(f"the {name} died; its state is gone: stop the stack")
            self._start_component(name)
            self._save()

    def _stop_all(self) -> None:
        self.stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for name in [*reversed(self.components), "redis", "emulator"]:
            proc = self.procs.get(name)
            if proc is None:
                continue
            _kill_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT_S)
            _kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        if self.s3 is not None:
            self.s3.stop()
        if self.postgres is not None:
            self.postgres.stop()
        self.state["ready"] = False
        self.state["stopped"] = True
        self.procs.clear()
        self._save()


_DUMMY_AWS_KWARGS = {
    "aws_access_key_id": "stack",
    "aws_secret_access_key": "stack-secret",
    "region_name": "us-east-1",
}
_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "stack",
    "AWS_SECRET_ACCESS_KEY": "stack-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/abp-stack/aws/config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/abp-stack/aws/credentials",
}


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _pythonpath() -> str:
    extra = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(ROOT), *([extra] if extra else [])])


def _airflow() -> str:
    candidate = Path(sys.executable).parent / "airflow"
    return str(candidate) if candidate.exists() else "airflow"


# --------------------------------------------------------------------------- the commands


def up(base: Path) -> int:
    """Start the stack in the background and wait until Airflow answers; print how to reach it."""
    state = read_state(base)
    if state and alive(state.get("supervisor_pid")) and state.get("ready"):
        print(summary(base, state))
        return 0
    if state and alive(state.get("supervisor_pid")):
        print("a stack is starting or stopping here; run `make stack-down` first", file=sys.stderr)
        return 1
    base.mkdir(parents=True, exist_ok=True)
    state_file(base).unlink(missing_ok=True)
    logs = base / "logs"
    if logs.exists():  # the last run's logs stay one run, in logs.previous
        shutil.rmtree(base / "logs.previous", ignore_errors=True)
        logs.rename(base / "logs.previous")
    logs.mkdir()
    with (base / "logs" / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "_supervise"],
            env={**os.environ, "ABP_STACK_DIR": str(base)},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    print(f"starting the stack in {base} (logs in {base / 'logs'})", flush=True)
    deadline = time.monotonic() + READY_TIMEOUT_S + 300
    while time.monotonic() < deadline:
        state = read_state(base)
        if state and state.get("ready"):
            print(summary(base, state))
            return 0
        if (state and state.get("error")) or proc.poll() is not None:
            print(_tail(base / "logs" / "supervisor.log"), file=sys.stderr)
            print("the stack did not start; `make stack-down` cleans up what did", file=sys.stderr)
            return 1
        time.sleep(1)
    print("the stack did not get ready in time; `make stack-down` stops it", file=sys.stderr)
    return 1


def down(base: Path) -> int:
    """Stop the stack: the supervisor stops each process in order; leftovers are killed."""
    state = read_state(base)
    if not state:
        print(f"no stack state in {base}: nothing to stop")
        return 0
    pid = int(state.get("supervisor_pid") or 0)
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S * (len(COMPONENTS) + len(WORKERS) + 3) + 60
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if alive(pid):
            _kill_group(pid, signal.SIGKILL)
    # whatever the supervisor could not stop (it was killed itself): each component's group
    state = read_state(base) or state
    for info in (state.get("components") or {}).values():
        if alive(info.get("pid")):
            _kill_group(int(info["pid"]), signal.SIGKILL)
    pg = int((state.get("postgres") or {}).get("pid") or 0)
    if alive(pg):
        os.kill(pg, signal.SIGQUIT)
    state_file(base).unlink(missing_ok=True)
    print("stack stopped")
    return 0


def summary(base: Path, state: dict[str, Any]) -> str:
    """How to reach the running stack, passwords included (they are local-only)."""
    passwords = json.loads(Path(state["passwords_file"]).read_text(encoding="utf-8"))
    api = state["api_url"]
    logins = ", ".join(f"{u} / {passwords[u]} ({role})" for u, role in state["users"].items())
    return "\n".join(
        [
            f"Airflow      {api}    log in as {logins}",
            f"LLM batch    {api}/llm-batch/",
            f"emulator     {state['emulator_url']}",
            f"PostgreSQL   {state['postgres']['airflow_url']} (and /ledger)",
            *(
                [
                    f"Celery       {', '.join(WORKERS)} (CeleryExecutor), broker {state['redis_url']}",
                    f"staging      s3://{STAGING_BUCKET}/llm-batch on {state['s3_endpoint']} (moto)",
                ]
                if state.get("executor") == "celery"
                else []
            ),
            f"state, logs  {base}",
            "stop it with `make stack-down`",
        ]
    )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """``up``, ``down`` or ``status`` (``_supervise`` is the background supervisor itself)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "_supervise"])
    args = parser.parse_args(argv)
    base = stack_dir()
    if args.command == "up":
        return up(base)
    if args.command == "down":
        return down(base)
    if args.command == "status":
        state = read_state(base)
        running = bool(state and alive(state.get("supervisor_pid")) and state.get("ready"))
        print(summary(base, state) if running and state else "not running")
        return 0 if running else 3
    return Supervisor(base).run()


if __name__ == "__main__":
    sys.exit(main())
