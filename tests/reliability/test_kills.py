"""SIGKILL at every fail point and at every step boundary, then the run resumed as a user would.

Each case kills real Airflow processes (``DAG.test`` runs tasks and triggers in its own process,
so the kill takes the whole worker, as an OOM kill or a lost node does), resumes the same run
until it succeeds, and checks the invariant against the emulator's own record: every row in
exactly one final state, no custom id in two batches, no batch the ledger does not know, the
published cost equal to what the emulator billed, each chunk uploaded once and its batch created from
the file its job recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from airflow_batch_provider.core.failpoints import FAILPOINTS
from airflow_batch_provider.ledger.deliveries import delivery_rows
from airflow_batch_provider.ledger.digests import delivery_key
from tests.support.chaos import WORKLOAD, ChaosRun, Kill, chaos_emulator, check_invariants, count_faults

pytestmark = pytest.mark.reliability

#: every fail point of the batch path, in three independent runs (a kill that is not reached lets
#: its run finish, and the later kills of that run could no longer be reached either); each
#: segment's kills are in the order a run reaches them, the N picks a later job so that the kill
#: lands with earlier jobs done
BATCH_PATH_KILLS = {
    "prepare": (Kill(failpoint="prepare.after_upsert"), Kill(failpoint="prepare.after_stage")),
    "submit": (
        Kill(failpoint="upload.after_upload=2"),
        Kill(failpoint="submit.after_claim"),
        Kill(failpoint="submit.after_create"),
    ),
    "harvest": (Kill(failpoint="download.mid"), Kill(failpoint="reconcile.mid=2")),
    # after publish: the consumer made its third call, the ledger does not know it was acknowledged;
    # then the sink committed its second batch of 10 rows, the ledger does not know it
    "deliver": (Kill(failpoint="consume.after_act=3"), Kill(failpoint="deliver.after_sink_commit=2")),
}
#: a kill right after each kind of task returned, before Airflow recorded it
STEP_KILLS = (
    Kill(after_task="upload:1"),  # between upload and submit: the rerun upload reuses the recorded file
    Kill(after_task="submit:1"),
    Kill(after_task="wait:0"),
    Kill(after_task="reconcile:1"),
    Kill(after_task="resubmit_2"),
    Kill(after_task="publish"),
)


def test_every_fail_point_is_exercised_by_a_case() -> None:
    from tests.reliability.test_faults import DEADLINE_KILLS

    kills = [*(k for segment in BATCH_PATH_KILLS.values() for k in segment), *DEADLINE_KILLS]
    covered = {k.failpoint.partition("=")[0] for k in kills if k.failpoint}
    assert covered == set(FAILPOINTS)


@pytest.mark.parametrize("segment", list(BATCH_PATH_KILLS))
def test_a_kill_at_each_fail_point_of_the_batch_path_loses_nothing_and_pays_once(
    airflow_home: dict[str, str], tmp_path: Path, segment: str
) -> None:
    with chaos_emulator() as url:
        run = ChaosRun(
            airflow_home, tmp_path, segment, url, sink=segment == "deliver", consumer=segment == "deliver"
        )
        missed = run.survive(BATCH_PATH_KILLS[segment])
        verdict = check_invariants(url, [run])
        count_faults(url)
    assert not verdict.violations, verdict.explain()
    assert not missed, f"kill points never reached (not placed, or the run no longer passes there): {missed}"
    if run.sink_path is not None:  # every sink row exists once, with the published answer
        assert run.sink_rows() == run.published_answers() != []
        [report] = [
            json.loads(r["report_json"]) for r in run.ledger().runs(WORKLOAD) if r["run_id"] == run.run_id
        ]
        assert report["deliveries"]["results"]["delivered"] == len(run.sink_rows())
        assert report["deliveries"]["results"]["refused"] == 0
    if run.consumer_log is not None:  # each kept answer's key was sent; only the killed call's twice
        calls = run.consumer_calls()
        kept = {app for app, _ in run.published_answers() if int(app[1:]) % 3 != 0}
        keys = {app: delivery_key(WORKLOAD, "actions", app, "v1") for app in kept}
        assert set(calls) == set(keys.items())
        repeated = [call for call, n in Counter(calls).items() if n > 1]
        assert repeated == [calls[2]] and len(calls) == len(keys) + 1
        states = Counter(r["state"] for r in delivery_rows(run.ledger(), WORKLOAD, "actions"))
        assert states == {"acknowledged": len(kept), "left_out": len(run.published_answers()) - len(kept)}
        [stored] = [r["report_json"] for r in run.ledger().runs(WORKLOAD) if r["run_id"] == run.run_id]
        entry = json.loads(stored)["deliveries"]["actions"]
        assert entry["acted"] + entry["already_acknowledged"] == len(kept) and entry["failed"] == 0


def test_a_kill_at_each_step_boundary_on_postgresql_loses_nothing_and_pays_once(
    airflow_home: dict[str, str], tmp_path: Path, postgres_server: object
) -> None:
    from tests.support.postgres import PostgresServer

    assert isinstance(postgres_server, PostgresServer)
    name = postgres_server.create_database("chaos_steps")
    try:
        # one item in six fails retryably, so that a second round runs and can be killed too
        with chaos_emulator({"rate_500": 0.17}) as url:
            run = ChaosRun(airflow_home, tmp_path, "steps", url, ledger_url=postgres_server.url_for(name))
            missed = run.survive(STEP_KILLS)
            verdict = check_invariants(url, [run])
            count_faults(url)
            run.ledger().engine.dispose()
    finally:
        postgres_server.drop_database(name)
    assert not verdict.violations, verdict.explain()
    assert not missed, f"step boundaries never reached: {missed}"
