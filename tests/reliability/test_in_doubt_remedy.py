"""Bug 1 end to end: the in-doubt remedy the task's message gives, followed on a whole DAG, pays once.

Anthropic, whose running batches cannot be matched to a job: the first create's reply is lost
after the batch exists (the emulator's ``create:500_after``), so the job is in doubt. The run's
worker dies right after submit (SIGKILL), and the run is resumed once its deadline has passed
while the job is still in doubt (the batch runs on: the emulator's clock decides, not the
machine's speed), so the wait task sends the items to review (``in_doubt``) and the run
publishes. Then, as the task's message says, a person runs the real CLI: ``airflow-batch jobs
resolve JOB --batch-id ID`` with the batch the provider shows, and ``airflow-batch review redrive
--error-code in_doubt`` (the re-drive the issue saw pay twice). The batch ends, a second run of
the workload follows, and every item is answered once, each custom id is in one batch (bought
once), and the two reports together price exactly what the emulator billed.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from airflow_batch_provider.ledger.late_harvest import LATE_HARVEST
from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.faults import FaultConfig
from batch_emulator.testing import run_emulator
from tests.support.chaos import WORKLOAD, ChaosRun, Kill, check_invariants

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(1500)]

#: before the resume: a deadline nobody reaches; after it: one that has passed
FAR, PAST = "2099-01-01T00:00:00+00:00", "2001-01-01T00:00:00+00:00"
#: the real command line the task's message names
CLI = str(Path(sys.executable).with_name("airflow-batch"))


@contextmanager
def batches_that_end_only_when_told() -> Iterator[str]:
    """The emulator, the first create's reply lost, its batches running until its clock is moved on."""
    timings = Timings(validating_s=1.0, in_progress_s=1_000_000.0, finalizing_s=1.0, cancelling_s=0.0)
    faults = FaultConfig.from_mapping({"create_script": ["create:500_after"]})
    with run_emulator(EmulatorConfig(seed=7, time_scale=1.0, timings=timings, faults=faults)) as url:
        yield url


def airflow_batch(run: ChaosRun, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``airflow-batch`` command on the run's ledger."""
    return subprocess.run(
        [CLI, "--ledger-url", run.ledger_url, *args],
        env=run.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_resolving_the_in_doubt_job_and_redriving_as_the_message_says_answers_each_item_once_and_pays_once(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    start = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0).isoformat()
    with batches_that_end_only_when_told() as url:
        first = ChaosRun(
            airflow_home,
            tmp_path,
            "in-doubt",
            url,
            provider="anthropic",
            items=10,
            chunk=10,
            attempts=1,
            deadline=FAR,
            logical_date=start,
        )
        first.env["ABP_CHAOS_HARVEST_TIMEOUT"] = "5"
        killed = first.attempt(Kill(after_task="submit:0"))
        assert killed.killed, killed.tail()
        ledger = first.ledger()
        (job,) = ledger.get_jobs(WORKLOAD, first.run_id)
        assert job.state == "in_doubt", f"the lost create reply left job {job.job_id} {job.state}"
        # resumed after the deadline, with the job still in doubt (its batch runs on)
        first.env["ABP_CHAOS_DEADLINE"] = PAST
        resumed = first.attempt(resume=True)
        assert resumed.returncode == 0, resumed.tail()
        states = ledger.count_states(WORKLOAD, first.run_id)
        assert states == {"review": 10}, states

        # what the message says: resolve the job to the batch the provider shows, then re-drive
        ((batch,),) = httpx.get(f"{url}/_emulator/record").json()["batches"].values()
        resolved = airflow_batch(
            first, "jobs", "resolve", job.job_id, "--batch-id", batch["id"], "--note", "seen in the console"
        )
        assert resolved.returncode == 0, resolved.stdout + resolved.stderr
        redriven = airflow_batch(
            first,
            *("review", "redrive", "--workload", WORKLOAD, "--error-code", "in_doubt"),
            *("--reason", "as the message says", "--actor", "tester"),
        )
        httpx.post(f"{url}/_emulator/clock", json={"advance_s": 2_000_000}).raise_for_status()

        second = copy.copy(first)
        second.env = {**first.env, "ABP_CHAOS_DEADLINE": FAR}
        second.logical_date = (
            (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0).isoformat()
        )
        second.run_id = f"manual__{second.logical_date}"
        second.attempts = []
        done = second.attempt()
        assert done.returncode == 0, done.tail()
        verdict = check_invariants(url, [first, second])
        late = [r for r in ledger.audit_log(WORKLOAD) if r.action == LATE_HARVEST]
        answers = dict(first.published_answers() + second.published_answers())
        ledger.engine.dispose()
    assert not verdict.violations, verdict.explain()
    assert verdict.states == {"succeeded": 10}, verdict.states
    assert verdict.batches == 1  # the resolved batch was harvested, never bought again
    assert len(late) == 1, late
    assert len(answers) == 10, answers
    print(
        f"redrive after the resolve: exit {redriven.returncode}: {(redriven.stdout + redriven.stderr)[-400:]}"
    )
