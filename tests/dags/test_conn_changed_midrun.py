"""A run keeps the connection it started on: a Variable changed mid-run stops the next task
before it talks to the other connection, and nothing is created there."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from airflow_batch_provider.ledger import Ledger
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import openai_connection, openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e
DAGS = Path(__file__).parent / "dags"


def test_a_connection_variable_changed_during_the_run_stops_the_next_task_and_nothing_reaches_the_other(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    with (
        run_emulator(EmulatorConfig()) as other,
        openai_dag_env(
            airflow_home, tmp_path, dags=DAGS, connections={"openai_batch_other": openai_connection(other)}
        ) as (first, env),
    ):
        proc = run_airflow(env, "dags", "test", "conn_changed_midrun")
        seen = {url: httpx.get(f"{url}/_emulator/stats").json() for url in (first, other)}
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, tail(proc)
    assert "batch_conn_id is 'openai_batch_other' but run" in output, tail(proc)
    assert "started on 'openai_batch_default'" in output and "Set it back to 'openai_batch_default'" in output
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    [run] = ledger.runs("conn_changed_midrun")
    assert ledger.run_batch_conn_id("conn_changed_midrun", run["run_id"]) == "openai_batch_default"
    # upload, the first task after prepare, stopped before it uploaded anything anywhere
    for stats in seen.values():
        assert (stats["files_uploaded"], stats["batches_created"], stats["sync_requests"]) == (0, 0, 0)
    jobs = ledger.get_jobs("conn_changed_midrun", run["run_id"])
    assert jobs and all(j.state == "staged" for j in jobs)
