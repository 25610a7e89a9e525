"""Submit exactly once: claims, re-attach, find by key, in-doubt jobs (against the emulator)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.exceptions import BatchNotHarvestedError, JobClaimedError, SubmitError
from airflow_batch_provider.services import report, submit
from airflow_batch_provider.services.submit import epoch, submit_job, upload_job
from tests.unit.services.workload import RUN, WORKLOAD, World, world


def created(w: World) -> int:
    return int(w.stats()["batches_created"])


def one_job(w: World, *, upload: bool = True) -> str:
    """Stage one job of 3 items and (unless told) run its upload step, as the upload task does."""
    (manifest,) = w.stage(3)
    job_id = str(manifest["job_id"])
    return w.upload(job_id) if upload else job_id


def test_a_job_is_created_once_and_a_rerun_reattaches_to_the_recorded_batch(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w)
        first = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="try1")
        again = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="try2")
        assert (first.how, again.how) == ("created", "recorded")
        assert first.batch_id == again.batch_id
        assert created(w) == 1


def test_a_lost_create_reply_is_found_by_its_key_and_not_created_again(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w)
        job = w.ledger.get_job(job_id)
        # the provider acted, the reply was lost: the ledger never heard of this batch
        with w.staging.at(job.staged_path).open("rb") as fh:
            ref = w.adapter.submit(w.adapter.stage(fh, "x.jsonl", job.size_bytes), job.idempotency_key, {})
        got = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="try2")
        assert (got.how, got.batch_id) == ("found", ref.batch_id)
        assert created(w) == 1
        # the poll timeout counts from the intent, not from the re-attach
        assert got.submitted_at == epoch(job.created_at)
        assert w.ledger.get_job(job_id).batch_id == ref.batch_id


def test_a_zombie_and_its_retry_never_both_create_the_retry_attaches_to_the_zombies_batch(
    tmp_path: Path,
) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w)
        w.ledger.claim_job(job_id, "zombie-try1", 600)
        calls: list[float] = []

        def zombie_finishes(_: float) -> None:
            # while the retry waits, the zombie's create returns and it records its batch
            calls.append(_)
            job = w.ledger.get_job(job_id)
            with w.staging.at(job.staged_path).open("rb") as fh:
                ref = w.adapter.submit(
                    w.adapter.stage(fh, "x.jsonl", job.size_bytes), job.idempotency_key, {}
                )
            w.ledger.mark_submitted(job_id, ref.batch_id, "file")

        got = submit_job(
            ledger=w.ledger,
            adapter=w.adapter,
            staging=w.staging,
            job_id=job_id,
            owner="retry-try2",
            sleep=zombie_finishes,
        )
        assert got.how == "recorded" and len(calls) == 1
        assert created(w) == 1


def test_a_claim_held_by_a_live_attempt_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w)
        w.ledger.claim_job(job_id, "zombie-try1", 600)
        with pytest.raises(JobClaimedError, match="zombie-try1"):
            w.ledger.claim_job(job_id, "retry-try2", 600)


def test_the_claim_owner_names_the_task_attempt_and_the_process() -> None:
    owner = submit.claim_owner("dag", "run", "g.submit", 3, 2)
    assert owner.startswith("dag/run/g.submit/3/2@") and ":" in owner


# ---------------------------------------------------------------------------- in doubt (Anthropic)


def test_an_ambiguous_create_leaves_the_job_in_doubt_and_no_later_attempt_creates_it_again(
    tmp_path: Path,
) -> None:
    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        job_id = one_job(w)
        w.arm("create:500_after")  # the provider acts, the reply is lost; Anthropic cannot be asked
        first = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="try1")
        assert first.in_doubt and first.batch_id is None
        assert w.ledger.get_job(job_id).in_doubt
        again = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="try2")
        assert again.in_doubt
        assert w.batches_created() == 1
        # still running: the batch list cannot tell, nothing changes
        assert submit.resolve_in_doubt(w.ledger, w.adapter, job_id, "try2") == ("unknown", None)
        w.advance(3600)
        how, batch_id = submit.resolve_in_doubt(w.ledger, w.adapter, job_id, "try2")
        assert how == "found" and batch_id
        job = w.ledger.get_job(job_id)
        assert (job.state, job.batch_id) == ("submitted", batch_id)
        assert w.ledger.count_states(WORKLOAD, RUN) == {"submitted": 3}
        assert w.batches_created() == 1


def test_a_create_begun_by_a_stopped_attempt_is_in_doubt_while_anthropic_cannot_match_its_running_batch(
    tmp_path: Path,
) -> None:
    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        job_id = one_job(w)
        job = w.ledger.get_job(job_id)
        # an attempt recorded `submitting`, its create reached the provider, then its process died
        w.ledger.update_job(job_id, state="submitting")
        dead = type(w.adapter)(w.adapter.settings)  # the dead process's adapter: its memory is gone
        with w.staging.at(job.staged_path).open("rb") as fh:
            ref = dead.submit(dead.stage(fh, "x.jsonl", job.size_bytes), job.idempotency_key, {})
        retry = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="try2")
        # the batch still runs, so Anthropic shows no custom ids to match: in doubt, nothing created
        assert retry.in_doubt and retry.batch_id is None
        assert w.batches_created() == 1
        assert "stopped after it began creating" in str(w.ledger.get_job(job_id).in_doubt_reason)
        w.advance(3600)
        assert submit.resolve_in_doubt(w.ledger, w.adapter, job_id, "try2") == ("found", ref.batch_id)
        assert w.batches_created() == 1


def test_a_job_in_doubt_that_is_proven_absent_is_created_once_in_the_same_task(tmp_path: Path) -> None:
    with world(tmp_path, provider="anthropic") as w:
        job_id = one_job(w)
        w.arm("create:500")  # refused before acting, but a 500 cannot say so
        assert submit_job(
            ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1"
        ).in_doubt
        assert w.batches_created() == 0
        assert submit.resolve_in_doubt(w.ledger, w.adapter, job_id, "t1") == ("absent", None)
        made = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        assert made.how == "created" and made.batch_id
        assert w.batches_created() == 1


def test_items_of_a_job_still_in_doubt_go_to_review_with_the_code_in_doubt(tmp_path: Path) -> None:
    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        job_id = one_job(w)
        w.arm("create:500_after")
        submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        assert submit.settle_in_doubt(w.ledger, job_id, "the deadline came") == 3
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state", "error_code", "error_message"]))
        assert {(r["state"], r["error_code"]) for r in rows} == {("review", "in_doubt")}
        assert "the deadline came" in rows[0]["error_message"]
        assert [
            j["job_id"]
            for j in report.build_report(w.ledger, WORKLOAD, RUN, "anthropic", None)["in_doubt_jobs"]
        ] == [job_id]


def test_the_documented_in_doubt_remedy_harvests_the_batch_and_bills_each_item_once(tmp_path: Path) -> None:
    # issue 18, bug 1 and 2: a lost create reply, the deadline while in doubt, then the task's own
    # message followed: re-drive first (refused), resolve to the batch, harvest; never sent again.
    from decimal import Decimal

    from airflow_batch_provider.core.results import Usage
    from airflow_batch_provider.services.harvest import reconcile_job

    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        job_id = one_job(w)
        w.arm("create:500_after")
        assert submit_job(
            ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1"
        ).in_doubt
        assert submit.settle_in_doubt(w.ledger, job_id, "the deadline came") == 3
        with pytest.raises(BatchNotHarvestedError, match=re.escape(job_id)):
            w.ledger.redrive(WORKLOAD, error_code="in_doubt", actor="ops", reason="as the task said")
        (batch,) = httpx.get(f"{w.url}/_emulator/record").json()["batches"]["anthropic"]
        w.ledger.resolve_job(job_id, batch["id"], "ops", "found in the console")
        w.wait_terminal(job_id)
        # what the run's publish does when cleared (its late harvest of the run's unharvested jobs)
        reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, lambda u: Decimal(0))
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"]))
        assert {r["state"] for r in rows} == {"succeeded"}
        assert w.ledger.redrive(WORKLOAD, error_code="in_doubt", actor="ops", reason="again") == 0
        (batch,) = httpx.get(f"{w.url}/_emulator/record").json()["batches"]["anthropic"]
        billed = [Usage(**u) for u in batch["billed"].values()]
        totals = w.ledger.attempt_totals(WORKLOAD, RUN)
        assert len(billed) == 3 and created(w) == 1
        assert sum(t["input_tokens"] for t in totals) == sum(u.input_tokens for u in billed)
        assert sum(t["output_tokens"] for t in totals) == sum(u.output_tokens for u in billed)


def test_the_claim_outlasts_the_create_steps_at_their_worst(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        policy = w.adapter.create_policy()
        timeout = float(w.adapter.settings.extra.get("timeout", submit.SDK_TIMEOUT_S))
        one_call = policy.max_attempts * (timeout + policy.max_retry_after)
        assert submit.claim_lease_s(w.adapter) >= max(3 * one_call, submit.CLAIM_LEASE_S)


def test_a_claim_left_by_a_killed_process_of_this_host_is_taken_at_once(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    gone = (
        submit.claim_owner("d", "r", "t.submit", 0, 1).rpartition(":")[0] + ":" + dead.stdout.decode().strip()
    )
    with world(tmp_path) as w:
        job_id = one_job(w)
        w.ledger.claim_job(job_id, gone, 3600)  # killed after the claim, e.g. at submit.after_claim
        slept: list[float] = []
        got = submit_job(
            ledger=w.ledger,
            adapter=w.adapter,
            staging=w.staging,
            job_id=job_id,
            owner="t2",
            sleep=slept.append,
        )
        assert got.how == "created" and slept == []
        assert created(w) == 1


def test_a_claim_of_a_live_process_or_another_host_is_never_taken_early() -> None:
    assert not submit.holder_is_dead(submit.claim_owner("d", "r", "t", 0, 1))  # this very process
    assert not submit.holder_is_dead("d/r/t/0/1@another-host:1")
    assert not submit.holder_is_dead("zombie-try1")


# ---------------------------------------------------------------------------- a kill, and who is told


def test_a_kill_before_the_upload_sends_nothing_and_leaves_the_job_claimable_at_once(tmp_path: Path) -> None:
    from airflow_batch_provider.exceptions import SubmitError

    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        with pytest.raises(
            SubmitError, match=re.escape(f"job {job_id}: the task was killed before the upload")
        ):
            upload_job(
                ledger=w.ledger,
                adapter=w.adapter,
                staging=w.staging,
                job_id=job_id,
                owner="t1",
                stop=lambda: True,
            )
        assert (w.files_uploaded(), w.batches_created()) == (0, 0)
        assert (
            upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t2").how
            == "uploaded"
        )
        retry = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t3")
        assert retry.how == "created" and (w.files_uploaded(), w.batches_created()) == (1, 1)


def test_a_kill_releases_the_claim_only_while_nothing_of_the_job_can_be_in_flight(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w)
        w.ledger.claim_job(job_id, "t1", 600)
        assert submit.release_on_kill(w.ledger, job_id, "t2") is False  # not the holder: left alone
        assert submit.release_on_kill(w.ledger, job_id, "t1") is True
        w.ledger.claim_job(job_id, "t3", 600)
        w.ledger.update_job(job_id, state="uploaded")  # between upload and create: nothing in flight
        assert submit.release_on_kill(w.ledger, job_id, "t3") is True
        w.ledger.claim_job(job_id, "t3", 600)
        w.ledger.update_job(job_id, state="submitting")  # an upload or a create may be in flight
        assert submit.release_on_kill(w.ledger, job_id, "t3") is False
        with pytest.raises(JobClaimedError, match="t3"):
            w.ledger.claim_job(job_id, "t4", 600)
        assert w.ledger.get_job(job_id).state == "submitting"  # nothing marked


def test_the_in_doubt_callback_hears_of_the_job_once_and_a_failing_one_changes_nothing(
    tmp_path: Path,
) -> None:
    heard: list[tuple[str, str]] = []

    def tell(job: object, reason: str) -> None:
        heard.append((job.job_id, reason))  # type: ignore[index]
        raise ConnectionError("the pager is down")

    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        job_id = one_job(w)
        w.arm("create:500_after")
        first = submit_job(
            ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1", on_in_doubt=tell
        )
        assert first.in_doubt and w.ledger.get_job(job_id).in_doubt
        again = submit_job(
            ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t2", on_in_doubt=tell
        )
        assert again.in_doubt
        assert [j for j, _ in heard] == [job_id]
        assert heard[0][1]


# ---------------------------------------------------------------------------- upload, its own step


def batch_input_file(w: World, batch_id: str | None) -> str:
    """The input file id the emulator's batch was created from."""
    return str(httpx.get(f"{w.url}/v1/batches/{batch_id}", headers=AUTH).json()["input_file_id"])


AUTH = {"Authorization": "Bearer sk-test"}


def test_submit_never_uploads_a_job_whose_upload_is_not_recorded_is_refused_with_the_remedy(
    tmp_path: Path,
) -> None:
    from airflow_batch_provider.exceptions import SubmitError

    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        with pytest.raises(SubmitError, match="submit never uploads: run \\(or clear\\) its upload task"):
            submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        assert (w.files_uploaded(), w.batches_created()) == (0, 0)
        assert w.ledger.get_job(job_id).claim_owner is None  # the refusal gives the claim back


def test_a_cleared_upload_reuses_the_recorded_file_and_never_creates_a_batch(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        first = upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        again = upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t2")
        assert (first.how, again.how) == ("uploaded", "recorded")
        assert again.input_ref == first.input_ref and first.input_kind == "file"
        job = w.ledger.get_job(job_id)
        assert (job.state, job.input_kind, job.input_ref) == ("uploaded", "file", first.input_ref)
        assert (w.files_uploaded(), w.batches_created()) == (1, 0)
        # after the batch exists, a cleared upload still sends nothing
        submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t3")
        late = upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t4")
        assert late.how == "submitted" and (w.files_uploaded(), w.batches_created()) == (1, 1)


class Staged:
    """The real adapter, counting the calls that put a chunk at the provider (or look one up for it)."""

    def __init__(self, adapter: object) -> None:
        self.adapter, self.stage_calls = adapter, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.adapter, name)

    def stage(self, chunk: object, name: str, size: int) -> object:
        self.stage_calls += 1
        return self.adapter.stage(chunk, name, size)  # type: ignore[attr-defined]


def test_a_cleared_submit_creates_from_the_recorded_file_and_never_uploads_again(tmp_path: Path) -> None:
    from airflow_batch_provider.exceptions import SubmitError

    with world(tmp_path) as w:
        job_id = one_job(w)
        recorded = w.ledger.get_job(job_id).input_ref
        counted = Staged(w.adapter)
        adapter: Any = counted
        # killed between upload and create (the task stops before the create)
        with pytest.raises(SubmitError, match="killed before the create"):
            submit_job(
                ledger=w.ledger,
                adapter=adapter,
                staging=w.staging,
                job_id=job_id,
                owner="t1",
                stop=lambda: True,
            )
        made = submit_job(ledger=w.ledger, adapter=adapter, staging=w.staging, job_id=job_id, owner="t2")
        cleared = submit_job(ledger=w.ledger, adapter=adapter, staging=w.staging, job_id=job_id, owner="t3")
        assert (made.how, cleared.how) == ("created", "recorded")
        assert batch_input_file(w, made.batch_id) == recorded
        assert counted.stage_calls == 0  # submit never uploads, nor looks a file up to upload
        assert (w.files_uploaded(), w.batches_created()) == (1, 1)


def test_an_upload_whose_reply_was_lost_is_found_by_its_key_and_one_file_is_used(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        w.arm("upload:500_after")  # the file is stored, the reply is lost
        got = upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        assert got.how == "uploaded" and w.files_uploaded() == 1
        made = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t2")
        assert batch_input_file(w, made.batch_id) == got.input_ref


def test_a_kill_after_the_upload_before_it_was_recorded_finds_the_file_and_uploads_nothing_more(
    tmp_path: Path,
) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        job = w.ledger.get_job(job_id)
        # the dead attempt's upload reached the provider; the ledger never heard of it
        with w.staging.at(job.staged_path).open("rb") as fh:
            orphan = w.adapter.stage(fh, f"{job.idempotency_key}.jsonl", job.size_bytes)
        got = upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t2")
        assert (got.how, got.input_ref) == ("uploaded", orphan.value)
        assert w.files_uploaded() == 1


class RacedUpload:
    """An adapter whose upload returns after another attempt recorded a different file for the chunk."""

    def __init__(self, w: World, job_id: str) -> None:
        self.w, self.job_id = w, job_id

    def __getattr__(self, name: str) -> object:
        return getattr(self.w.adapter, name)

    def stage(self, chunk: object, name: str, size: int) -> object:
        ref = self.w.adapter.stage(chunk, f"other-{name}", size)  # type: ignore[arg-type]
        self.w.ledger.record_upload(self.job_id, "file", "file-recorded-first")
        return ref


def test_when_two_files_exist_for_a_chunk_the_first_recorded_is_used_and_the_other_is_reported(
    tmp_path: Path,
) -> None:
    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        raced: object = RacedUpload(w, job_id)
        got = upload_job(ledger=w.ledger, adapter=raced, staging=w.staging, job_id=job_id, owner="t1")  # type: ignore[arg-type]
        assert (got.how, got.input_ref) == ("recorded", "file-recorded-first")
        assert got.orphan and got.orphan != got.input_ref
        assert got.to_xcom()["orphan_input"] == got.orphan
        assert w.ledger.get_job(job_id).input_ref == "file-recorded-first"


def test_an_inline_provider_uploads_nothing_and_submit_posts_the_staged_chunk(tmp_path: Path) -> None:
    with world(tmp_path, provider="anthropic") as w:
        job_id = one_job(w, upload=False)
        got = upload_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        assert (got.how, got.input_kind, got.input_ref) == ("uploaded", "inline", None)
        assert not list((tmp_path / "abp-anthropic").glob("*.jsonl"))  # the check's local copy is gone
        assert w.batches_created() == 0
        made = submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t2")
        assert made.how == "created" and w.batches_created() == 1
        assert w.ledger.count_states(WORKLOAD, RUN) == {"submitted": 3}


def test_a_chunk_below_the_providers_minimum_is_not_uploaded(tmp_path: Path) -> None:
    from dataclasses import replace

    with world(tmp_path) as w:
        job_id = one_job(w, upload=False)
        small = SmallMinimum(w.adapter, replace(w.adapter.limits, min_requests=10))
        got = upload_job(ledger=w.ledger, adapter=small, staging=w.staging, job_id=job_id, owner="t1")  # type: ignore[arg-type]
        assert got.how == "sync" and w.files_uploaded() == 0


class SmallMinimum:
    """An adapter with a larger minimum job size than the chunk."""

    def __init__(self, adapter: object, limits: object) -> None:
        self.adapter, self.limits = adapter, limits

    def __getattr__(self, name: str) -> object:
        return getattr(self.adapter, name)


def test_a_finished_run_creates_no_batch_and_says_which_run_finished_and_what_to_do(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, provider="anthropic", ledger_url=ledger_url) as w:
        (manifest,) = w.stage(3)
        job_id = w.upload(str(manifest["job_id"]))
        w.ledger.finish_run(WORKLOAD, RUN, report.build_report(w.ledger, WORKLOAD, RUN, "anthropic", None))
        with pytest.raises(SubmitError) as caught:
            submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
        message = str(caught.value)
        assert job_id in message and f"run {RUN}" in message and "late_harvest" in message
        assert httpx.get(f"{w.url}/_emulator/record").json()["batches"].get("anthropic", []) == []
        assert w.ledger.get_job(job_id).batch_id is None
