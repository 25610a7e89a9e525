"""Run ``airflow dags test`` / ``airflow tasks test`` as a user would, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


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
