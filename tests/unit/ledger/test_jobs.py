"""The jobs room: recording and submitting jobs, typed job rows, claims and jobs in doubt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.exceptions import (
    JobClaimedError,
    JobNotClaimableError,
    LedgerError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow, job_id_for
from tests.unit.ledger import race_worker
from tests.unit.ledger.store_support import (
    WL,
    attempts_of,
    item,
    prep,
    race_in_processes,
    race_in_threads,
    snapshot,
    stage,
    staged_job,
)

# ---------------------------------------------------------------------------------------------- jobs


def test_recording_a_job_twice_keeps_one_job_and_one_attempt_per_line(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b"), prep("c")])
    job_id, cids = stage(ledger, "r1", ["a", "b", "c"])
    before = snapshot(ledger)
    ledger.record_job(ledger.job(job_id) | {}, [])  # a rerun of the task: the job is already there
    assert snapshot(ledger) == before
    assert len(before["abp_jobs"]) == 1
    assert sorted(r["custom_id"] for r in before["abp_attempts"]) == sorted(cids.values())
    job = ledger.job(job_id)
    assert (job["state"], job["lines"], job["round"]) == ("staged", 3, 1)
    for app_id in "abc":
        row = item(ledger, app_id)
        assert (row["state"], row["job_id"], row["custom_id"], row["attempts"]) == (
            "staged",
            job_id,
            cids[app_id],
            1,
        )
    assert [j.job_id for j in ledger.get_jobs(WL, "r1")] == [job_id]


def test_the_same_placements_recorded_twice_do_not_add_attempts(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job_id, cids = stage(ledger, "r1", ["a", "b"])
    job = {
        k: v
        for k, v in ledger.job(job_id).items()
        if k
        in {
            "job_id",
            "workload",
            "run_id",
            "round",
            "chunk_index",
            "provider",
            "model",
            "idempotency_key",
            "staged_path",
            "input_sha256",
            "lines",
            "size_bytes",
        }
    }
    ledger.record_job(job, [(item_key(a), "v1", cids[a], 1) for a in ("a", "b")])
    assert len(attempts_of(ledger, "a")) == 1
    assert len(snapshot(ledger)["abp_attempts"]) == 2


def test_an_unknown_job_is_an_error_that_says_what_to_check(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="job 'nope' is not in the ledger; was the prepare task"):
        ledger.get_job("nope")


def test_mark_submitted_records_the_batch_and_moves_only_that_jobs_staged_items(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b"), prep("c")])
    job0, _ = stage(ledger, "r1", ["a", "b"], chunk=0)
    job1, _ = stage(ledger, "r1", ["c"], chunk=1)
    ledger.mark_submitted(job0, "batch_abc", "file-xyz")
    job = ledger.get_job(job0)
    assert (job.state, job.batch_id, job.input_ref) == ("submitted", "batch_abc", "file-xyz")
    assert job.submitted_at is not None
    assert ledger.get_job(job1).state == "staged"
    assert ledger.count_states(WL, "r1") == {"submitted": 2, "staged": 1}
    before = snapshot(ledger)["abp_items"]
    ledger.mark_submitted(job0, "batch_abc", "file-xyz")
    assert snapshot(ledger)["abp_items"] == before


# ---------------------------------------------------------------------------------------------- typed rows


def test_get_job_and_get_jobs_return_frozen_typed_rows_with_aware_utc_times(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job0, _ = stage(ledger, "r1", ["a"], chunk=0)
    job1, _ = stage(ledger, "r1", ["b"], round_=2, chunk=1)
    row = ledger.get_job(job0)
    assert isinstance(row, JobRow)
    assert (row.job_id, row.state, row.lines, row.claim_count, row.in_doubt) == (job0, "staged", 1, 0, False)
    assert row.created_at.tzinfo is not None and row.created_at.utcoffset() == timedelta(0)
    with pytest.raises(FrozenInstanceError):
        row.state = "submitted"  # type: ignore[misc]
    assert [j.job_id for j in ledger.get_jobs(WL, "r1")] == [job0, job1]
    assert [j.job_id for j in ledger.get_jobs(WL, "r1", round_=2)] == [job1]
    with pytest.raises(LedgerError, match="not in the ledger"):
        ledger.get_job("nope")


def test_a_job_id_for_a_run_id_too_long_for_the_column_is_recorded_on_both_databases(ledger: Ledger) -> None:
    run_id = "manual__" + "x" * 240
    job_id = job_id_for(WL, run_id, 1, 0)
    assert len(job_id) <= 250
    ledger.upsert_items(WL, run_id, [prep("a")])
    placements = [(item_key("a"), "v1", make_custom_id(item_key("a"), 1, 0), 1)]
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": WL,
            "run_id": run_id,
            "round": 1,
            "chunk_index": 0,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "idempotency_key": "k-long",
            "staged_path": "/s/long.jsonl",
            "input_sha256": "0" * 64,
            "lines": 1,
            "size_bytes": 10,
        },
        placements,
    )
    assert ledger.get_job(job_id).run_id == run_id
    assert item(ledger, "a")["job_id"] == job_id


# ---------------------------------------------------------------------------------------------- claims


def test_the_first_claim_wins_and_counts_one(ledger: Ledger) -> None:
    job_id = staged_job(ledger)
    claim = ledger.claim_job(job_id, "attempt-1", 60)
    assert (claim.job_id, claim.owner, claim.claim_count) == (job_id, "attempt-1", 1)
    assert claim.expires_at > utcnow()
    row = ledger.get_job(job_id)
    assert (row.claim_owner, row.claim_count, row.claim_expires_at) == ("attempt-1", 1, claim.expires_at)


def test_a_second_owner_is_refused_with_the_holder_and_its_expiry(ledger: Ledger) -> None:
    job_id = staged_job(ledger)
    claim = ledger.claim_job(job_id, "zombie", 60)
    with pytest.raises(JobClaimedError) as caught:
        ledger.claim_job(job_id, "retry", 60)
    assert caught.value.holder == "zombie"
    assert caught.value.expires_at == claim.expires_at.isoformat()
    assert "'zombie'" in str(caught.value) and claim.expires_at.isoformat() in str(caught.value)
    assert ledger.get_job(job_id).claim_count == 1


def test_the_same_owner_claims_again_and_the_count_says_it_may_have_sent_before(ledger: Ledger) -> None:
    job_id = staged_job(ledger)
    ledger.claim_job(job_id, "attempt-1", 60)
    assert ledger.claim_job(job_id, "attempt-1", 60).claim_count == 2


def test_an_expired_claim_is_taken_over_by_another_owner(ledger: Ledger) -> None:
    job_id = staged_job(ledger)
    ledger.claim_job(job_id, "dead-attempt", -1)  # already expired
    taken = ledger.claim_job(job_id, "retry", 60)
    assert (taken.owner, taken.claim_count) == ("retry", 2)


def test_a_released_claim_may_be_taken_by_another_owner_and_a_stranger_cannot_release_it(
    ledger: Ledger,
) -> None:
    job_id = staged_job(ledger)
    ledger.claim_job(job_id, "attempt-1", 60)
    assert not ledger.release_job_claim(job_id, "stranger")
    assert ledger.get_job(job_id).claim_owner == "attempt-1"
    assert ledger.release_job_claim(job_id, "attempt-1")
    assert ledger.claim_job(job_id, "attempt-2", 60).claim_count == 2


def test_a_job_with_a_batch_id_can_never_be_claimed_for_create(ledger: Ledger) -> None:
    job_id = staged_job(ledger)
    ledger.mark_submitted(job_id, "batch_1", "file-1")
    with pytest.raises(JobNotClaimableError, match="batch_1"):
        ledger.claim_job(job_id, "attempt-1", 60)
    assert ledger.get_job(job_id).claim_count == 0


def test_claiming_an_unknown_job_says_so(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="'nope' is not in the ledger"):
        ledger.claim_job("nope", "attempt-1", 60)


def test_two_threads_racing_for_one_claim_never_both_win(ledger: Ledger, ledger_url: str) -> None:
    job_ids = [staged_job(ledger, [f"i{n}"], chunk=n) for n in range(50)]
    outcomes = race_in_threads(
        ledger_url, job_ids, lambda led, job_id, who: led.claim_job(job_id, f"o{who}", 600)
    )
    assert all(a != b for a, b in outcomes)
    assert all(ledger.get_job(j).claim_count == 1 for j in job_ids)


def test_two_processes_racing_for_the_same_claims_never_both_win(ledger: Ledger, ledger_url: str) -> None:
    job_ids = [staged_job(ledger, [f"i{n}"], chunk=n) for n in range(20)]
    winners = race_in_processes(race_worker.claim_each, ledger_url, job_ids, ["p1", "p2"])
    assert all(len(w) == 1 for w in winners.values()), winners
    assert {ledger.get_job(j).claim_owner for j in job_ids} <= {"p1", "p2"}


# ---------------------------------------------------------------------------------------------- in doubt


def test_a_job_in_doubt_cannot_be_claimed_and_is_listed(ledger: Ledger) -> None:
    job_id = staged_job(ledger, ["a", "b"])
    ledger.claim_job(job_id, "attempt-1", 60)
    ledger.mark_job_in_doubt(job_id, "create timed out; provider cannot be listed")
    with pytest.raises(JobNotClaimableError, match="create timed out"):
        ledger.claim_job(job_id, "attempt-1", 60)
    [doubt] = ledger.jobs_in_doubt()
    assert (doubt.job_id, doubt.state, doubt.in_doubt, doubt.claim_owner) == (job_id, "in_doubt", True, None)
    assert doubt.in_doubt_reason == "create timed out; provider cannot be listed"
    assert doubt.in_doubt_at is not None and doubt.in_doubt_at.tzinfo is not None
    assert ledger.jobs_in_doubt("other-workload") == []
    assert ledger.count_states(WL, "r1") == {"staged": 2}


def test_resolving_a_job_in_doubt_with_its_batch_attaches_it_and_audits_the_decision(ledger: Ledger) -> None:
    job_id = staged_job(ledger, ["a", "b"])
    ledger.mark_job_in_doubt(job_id, "lost reply")
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    job = ledger.resolve_job(job_id, "batch_found", "alice", "seen in the console", submitted_at=created)
    assert (job.state, job.batch_id, job.submitted_at) == ("submitted", "batch_found", created)
    assert ledger.count_states(WL, "r1") == {"submitted": 2}
    assert ledger.jobs_in_doubt() == []
    [entry] = ledger.audit_log(WL)
    assert (entry.actor, entry.action, entry.item_count, entry.reason) == (
        "alice",
        "resolve_job",
        2,
        "seen in the console",
    )
    assert json.loads(entry.target)["batch_id"] == "batch_found"
    with pytest.raises(JobNotClaimableError):
        ledger.claim_job(job_id, "attempt-2", 60)


def test_a_job_proven_absent_goes_back_to_staged_and_may_be_claimed_again(ledger: Ledger) -> None:
    job_id = staged_job(ledger, ["a"])
    ledger.claim_job(job_id, "attempt-1", 60)
    ledger.mark_job_in_doubt(job_id, "lost reply")
    job = ledger.resolve_job(job_id, None, "provider-list", "no batch with this key after the intent")
    assert (job.state, job.batch_id, job.claim_owner) == ("staged", None, None)
    assert ledger.claim_job(job_id, "attempt-2", 60).claim_count == 2
    assert ledger.count_states(WL, "r1") == {"staged": 1}
    assert ledger.audit_log(WL)[0].action == "resolve_job"


def test_a_job_that_is_not_in_doubt_cannot_be_resolved_or_put_in_doubt_after_its_batch(
    ledger: Ledger,
) -> None:
    job_id = staged_job(ledger)
    with pytest.raises(LedgerError, match="not in doubt"):
        ledger.resolve_job(job_id, "batch_x", "alice", "guess")
    ledger.mark_submitted(job_id, "batch_1", "file-1")
    with pytest.raises(LedgerError, match="has batch 'batch_1' already"):
        ledger.mark_job_in_doubt(job_id, "late worry")
    assert ledger.get_job(job_id).state == "submitted"


# ---------------------------------------------------------------------------------------------- time zones


TZ_SCRIPT = """
import sys
from datetime import datetime, timezone
from airflow_batch_provider.ledger import Ledger
ledger = Ledger.from_url(sys.argv[1])
written = datetime(2026, 3, 8, 12, 30, 15, 123456, tzinfo=timezone.utc)
ledger.update_job(sys.argv[2], submitted_at=written)
read = ledger.get_job(sys.argv[2]).submitted_at
raw = ledger.job(sys.argv[2])["submitted_at"]
assert read == written and read.timestamp() == written.timestamp(), (read, written)
assert read.utcoffset().total_seconds() == 0 and raw.timestamp() == written.timestamp(), raw
print("ok", read.isoformat())
"""


def test_a_timestamp_reads_back_as_written_under_a_local_time_zone(ledger: Ledger, ledger_url: str) -> None:
    job_id = staged_job(ledger)
    env = {**os.environ, "TZ": "America/New_York", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run(
        [sys.executable, "-c", TZ_SCRIPT, ledger_url, job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok 2026-03-08T12:30:15.123456+00:00"


def test_a_second_batch_for_one_job_is_refused_by_name_and_a_repeat_keeps_the_first_time(
    ledger: Ledger,
) -> None:
    job_id = staged_job(ledger)
    ledger.mark_submitted(job_id, "batch_1", "file-1")
    first = ledger.get_job(job_id).submitted_at
    ledger.mark_submitted(job_id, "batch_1", "file-1")
    assert ledger.get_job(job_id).submitted_at == first
    with pytest.raises(LedgerError, match="has batch 'batch_1' already, and batch 'batch_2' was created"):
        ledger.mark_submitted(job_id, "batch_2", "file-2")
    assert ledger.get_job(job_id).batch_id == "batch_1"
