"""Bug 8 end to end: a SIGKILLed ``airflow dags test`` run, then another run of the workload.

The first run's process is killed right after its last submit returned (its batches run at the
emulator, its DagRun and task instance stay ``running`` in Airflow's database, as nobody marks
them failed). A second ``airflow dags test`` run, another run id on the same Airflow database and
ledger, judges the holder as the scheduler would (no task instance with a sign of life younger
than ``[scheduler] task_instance_heartbeat_timeout``), takes the workload's lease over, adopts the
killed run's jobs in its prepare and harvests their batches in its round 1: every item ends
answered once, each item is in one batch at the emulator (bought once), and the second run's
report prices exactly what the emulator billed.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest

from airflow_batch_provider.ledger.adoption import ADOPTED, TAKEOVER
from tests.support.chaos import ChaosRun, Kill, chaos_emulator, check_invariants

pytestmark = pytest.mark.reliability

#: the heartbeat timeout the second run judges the killed one by, in seconds
HEARTBEAT_TIMEOUT_S = 2


def another_run_on_the_same_airflow(first: ChaosRun, day: int) -> ChaosRun:
    """A second DAG run of the same workload, Airflow database and ledger as ``first``.

    :param first: the killed run
    :param day: the day of March 2026 of its logical date
    """
    second = copy.copy(first)
    second.env = {
        **first.env,
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
    }
    second.logical_date = f"2026-03-{day:02d}T00:00:00+00:00"
    second.run_id = f"manual__{second.logical_date}"
    second.attempts = []
    return second


def test_a_run_killed_while_its_batches_run_is_taken_over_and_its_batches_harvested_not_bought_again(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    with chaos_emulator() as url:
        first = ChaosRun(airflow_home, tmp_path, "takeover", url, items=20, chunk=10)
        killed = first.attempt(Kill(after_task="submit:1"))
        assert killed.killed, killed.tail()
        ledger = first.ledger()
        created = [j for j in ledger.get_jobs("chaos", first.run_id) if j.batch_id]
        assert created, "the killed run created no batch before the kill"
        # the killed process can no longer show a sign of life: past the timeout it is dead
        time.sleep(HEARTBEAT_TIMEOUT_S + 1)
        second = another_run_on_the_same_airflow(first, day=2)
        done = second.attempt()
        assert done.returncode == 0, done.tail()
        verdict = check_invariants(url, [second])
        actions = [r.action for r in ledger.audit_log("chaos")]
        adopted = [
            j.job_id
            for j in ledger.get_jobs("chaos", second.run_id)
            if j.job_id.startswith("chaos:" + first.run_id)
        ]
        ledger.engine.dispose()
    assert not verdict.violations, verdict.explain()
    assert TAKEOVER in actions and ADOPTED in actions
    assert {j.job_id for j in created} <= set(adopted)
