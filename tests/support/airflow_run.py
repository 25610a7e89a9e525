"""Run ``airflow dags test`` / ``airflow tasks test`` as a user would, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

#: the emulator most DAG tests run against: its batches move 20 times faster than the real API's
FAST = EmulatorConfig(time_scale=0.05)


def airflow_command() -> list[str]:
    """The ``airflow`` CLI of the interpreter that runs the tests."""
    candidate = Path(sys.executable).parent / "airflow"
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "airflow"]


def batch_env(
    airflow_home: dict[str, str], tmp: Path, connections: dict[str, dict[str, Any]], **settings: str
) -> dict[str, str]:
    """Environment for a batch DAG run: connections, a private ledger and staging, fast polling.

    :param airflow_home: the ``airflow_home`` fixture's environment
    :param tmp: a folder for the ledger and staging
    :param connections: connection id -> connection JSON
    :param settings: extra ``[batch_provider]`` settings (lower-case keys)
    """
    env = dict(airflow_home)
    for conn_id, conn in connections.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
    defaults = {
        "ledger_url": f"sqlite:///{tmp / 'ledger.sqlite'}",
        "staging_root": f"file://{tmp / 'staging'}",
        "poll_initial_interval": "0.3",
        "poll_factor": "1.3",
        "poll_max_interval": "1.5",
    }
    for key, value in {**defaults, **settings}.items():
        env[f"AIRFLOW__BATCH_PROVIDER__{key.upper()}"] = value
    return env


def openai_connection(base_url: str, password: str = "k") -> dict[str, Any]:
    """The ``openai_batch`` connection JSON for an emulator at ``base_url``.

    :param base_url: the emulator's root URL (``/v1`` is added)
    :param password: the API key the SDK sends
    """
    return {"conn_type": "openai_batch", "host": f"{base_url}/v1", "password": password}


def anthropic_connection(base_url: str, password: str = "sk-ant-test") -> dict[str, Any]:
    """The ``anthropic_batch`` connection JSON for an emulator at ``base_url``.

    :param base_url: the emulator's root URL
    :param password: the API key the SDK sends
    """
    return {"conn_type": "anthropic_batch", "host": base_url, "password": password}


@contextmanager
def openai_dag_env(
    airflow_home: dict[str, str],
    tmp: Path,
    config: EmulatorConfig = FAST,
    *,
    dags: Path | None = None,
    connections: dict[str, dict[str, Any]] | None = None,
    password: str = "k",
    **settings: str,
) -> Iterator[tuple[str, dict[str, str]]]:
    """Start an emulator and yield its URL and a :func:`batch_env` whose ``openai_batch_default`` is it.

    The emulator stops when the block ends.

    :param airflow_home: the ``airflow_home`` fixture's environment
    :param tmp: a folder for the ledger and staging
    :param config: the emulator's configuration
    :param dags: the DAGs folder, where it is not the repository's ``dags/``
    :param connections: further connections (id -> connection JSON)
    :param password: the API key of ``openai_batch_default``
    :param settings: extra ``[batch_provider]`` settings (lower-case keys)
    """
    with run_emulator(config) as url:
        env = batch_env(
            airflow_home,
            tmp,
            {"openai_batch_default": openai_connection(url, password), **(connections or {})},
            **settings,
        )
        if dags is not None:
            env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
        yield url, env


def run_airflow(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run an ``airflow`` command and return the finished process (output captured).

    :param env: the environment
    :param args: the command's arguments, e.g. ``("dags", "test", "my_dag")``
    :param timeout: seconds before the command is killed
    """
    return subprocess.run(
        [*airflow_command(), *args],
        env=env,
        cwd=env["AIRFLOW_HOME"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tail(proc: subprocess.CompletedProcess[str], chars: int = 6000) -> str:
    """The end of a process's output, for assertion messages.

    :param proc: the finished process
    :param chars: how much to keep
    """
    return (proc.stdout + proc.stderr)[-chars:]
