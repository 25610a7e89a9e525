"""The workload lease against real ``airflow dags test`` runs: a killed holder loses it, a live one keeps it.

``airflow dags test`` runs tasks in its own process and no scheduler watches the run: SIGKILLed,
the run stays ``running`` in Airflow's database for ever, and so does its last task instance. The
next run of the workload must take the lease over once that task instance's heartbeat is older than
``[scheduler] task_instance_heartbeat_timeout`` (the scheduler's own rule), and finish every item
once; a run whose holder is alive must keep failing on the lease.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from airflow_batch_provider.ledger import schema as s
from tests.support.chaos import WORKLOAD, ChaosRun, Kill, chaos_emulator, check_invariants

pytestmark = pytest.mark.reliability

#: the heartbeat timeout the second run's Airflow is configured with (seconds)
HEARTBEAT_TIMEOUT_S = 3


def beside(run: ChaosRun, holder: ChaosRun) -> ChaosRun:
    """Point ``run`` at the Airflow database, ledger, staging and records of ``holder``.

    :param run: the second run (its own logical date, so its own run id)
    :param holder: the run that holds the workload
    """
    for key in (
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__BATCH_PROVIDER__LEDGER_URL",
        "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT",
        "ABP_CHAOS_RECORDS",
    ):
        run.env[key] = holder.env[key]
    run.ledger_url = holder.ledger_url
    return run


def test_a_run_killed_where_no_scheduler_marks_it_failed_loses_its_workload_to_the_next_run(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    with chaos_emulator() as url:
        killed = ChaosRun(airflow_home, tmp_path, "killed", url, items=20, day=1)
        attempt = killed.attempt(Kill(after_task="prepare"))
        assert attempt.killed, attempt.tail()
        lease = killed.ledger().workload_lease(WORKLOAD)
        assert lease is not None and lease.run_id == killed.run_id
        nxt = beside(ChaosRun(airflow_home, tmp_path, "next", url, items=20, day=2), killed)
        nxt.env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] = str(HEARTBEAT_TIMEOUT_S)
        time.sleep(HEARTBEAT_TIMEOUT_S)  # a lower bound: a loaded machine only makes the gap longer
        done = nxt.attempt()
        assert done.returncode == 0, done.tail()
        verdict = check_invariants(url, [killed, nxt])
        ledger = nxt.ledger()
        with ledger.engine.connect() as conn:
            audit = (
                conn.execute(select(s.audit.c.action).where(s.audit.c.workload == WORKLOAD)).scalars().all()
            )
    assert not verdict.violations, verdict.explain()
    (takeover,) = [target for action, target in audit if action == "takeover_lease"]
    assert killed.run_id in takeover and nxt.run_id in takeover
    assert ledger.workload_lease(WORKLOAD) is None  # the second run published and gave it back


def test_a_run_whose_holder_is_alive_keeps_failing_on_the_lease(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    # the holder's only batch is stuck: the holder waits on it, alive, until the test ends it
    with chaos_emulator({"stuck_batches": [0]}) as url:
        holder = ChaosRun(airflow_home, tmp_path, "holder", url, items=5, chunk=10, day=1)
        proc = holder.start()
        try:
            ledger = holder.ledger()
            while not ledger.get_jobs(WORKLOAD, holder.run_id) or not any(
                j.batch_id for j in ledger.get_jobs(WORKLOAD, holder.run_id)
            ):
                assert proc.poll() is None, "the holder ended before its batch was created"
                time.sleep(0.5)
            second = beside(ChaosRun(airflow_home, tmp_path, "second", url, items=5, chunk=10, day=2), holder)
            refused = second.attempt()
        finally:
            proc.kill()
            holder.finish(proc)
    assert refused.returncode != 0
    assert f"held by DAG 'chaos_workload', run '{holder.run_id}'" in refused.output
