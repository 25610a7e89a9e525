from __future__ import annotations

import ast
import json
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import (
    InvalidTransitionError,
    JobClaimedError,
    JobNotClaimableError,
    LedgerError,
    WorkloadLeasedError,
)
from airflow_batch_provider.ledger import Ledger, store
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.records import ItemOutcome, ItemRef, ItemRow, JobRow, OpenItem, job_id_for
from airflow_batch_provider.ledger.store import (
    Moved,
    PreparedItem,
    UpsertStats,
    _transition,
    from_nusd,
    to_nusd,
    utcnow,
)
from tests.unit.ledger import race_worker
from tests.unit.ledger.jobs import job_row

WL = "feedback"
SOME_USAGE = Usage(100, 10)
NO_USAGE = Usage()


def cost_of(usage: Usage) -> Decimal:
    """$1 per million input tokens, $2 per million output tokens."""
    return (Decimal(usage.input_tokens) + 2 * Decimal(usage.output_tokens)) / Decimal(1_000_000)


def prep(app_id: str, text: str = "hello", version: str = "v1", model: str = "gpt-4o-mini") -> PreparedItem:
    return PreparedItem(
        item_key(app_id),
        CanonicalRequest(
            app_id=app_id,
            prompt_version=version,
            model=model,
            system="label it",
            messages=({"role": "user", "content": text},),
            params={"max_tokens": 10},
        ),
    )


def ok(custom_id: str, output: Any = None, usage: Usage = SOME_USAGE) -> ItemResult:
    return ItemResult(
        custom_id, "succeeded", output=output if output is not None else {"label": custom_id}, usage=usage
    )


def fail(custom_id: str, outcome: str = "failed_retryable", usage: Usage = NO_USAGE) -> ItemResult:
    return ItemResult(custom_id, outcome, usage=usage, error_code="500", error_message="server error")  # type: ignore[arg-type]


def item(ledger: Ledger, app_id: str, version: str = "v1") -> dict[str, Any]:
    with ledger.engine.connect() as conn:
        row = (
            conn.execute(
                select(s.items).where(
                    s.items.c.workload == WL,
                    s.items.c.item_key == item_key(app_id),
                    s.items.c.prompt_version == version,
                )
            )
            .mappings()
            .one()
        )
    return dict(row)


def attempts_of(ledger: Ledger, app_id: str) -> list[dict[str, Any]]:
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(s.attempts).where(s.attempts.c.item_key == item_key(app_id)).order_by(s.attempts.c.attempt)
        ).mappings()
        return [dict(r) for r in rows]


def snapshot(ledger: Ledger) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, in primary-key order."""
    out: dict[str, list[dict[str, Any]]] = {}
    with ledger.engine.connect() as conn:
        for table in s.metadata.sorted_tables:
            rows = conn.execute(select(table).order_by(*table.primary_key.columns)).mappings()
            out[table.name] = [dict(r) for r in rows]
    return out


def stage(
    ledger: Ledger,
    run_id: str,
    app_ids: Sequence[str],
    round_: int = 1,
    chunk: int = 0,
    version: str = "v1",
) -> tuple[str, dict[str, str]]:
    """Record one job for ``app_ids`` the way the prepare and resubmit tasks do; return its id and custom ids."""
    job_id = f"{WL}:{run_id}:r{round_}:c{chunk:05d}"
    cids: dict[str, str] = {}
    placements = []
    for app_id in app_ids:
        attempt = int(item(ledger, app_id, version)["attempts"]) + 1
        cid = make_custom_id(item_key(app_id), attempt, chunk)
        cids[app_id] = cid
        placements.append((item_key(app_id), version, cid, attempt))
    ledger.record_job(job_row(WL, run_id, len(placements), round_=round_, chunk=chunk), placements)
    return job_id, cids


def submit(
    ledger: Ledger, run_id: str, app_ids: Sequence[str], round_: int = 1, chunk: int = 0
) -> tuple[str, dict[str, str]]:
    job_id, cids = stage(ledger, run_id, app_ids, round_, chunk)
    ledger.mark_submitted(job_id, f"batch_{round_}_{chunk}", f"file-{round_}-{chunk}")
    return job_id, cids


def first_run_all_succeeded(ledger: Ledger, app_ids: Iterable[str], run_id: str = "r1") -> dict[str, str]:
    ids = list(app_ids)
    ledger.upsert_items(WL, run_id, [prep(a) for a in ids])
    job_id, cids = submit(ledger, run_id, ids)
    ledger.apply_results(job_id, [ok(cids[a], {"label": a}) for a in ids], cost_of)
    return cids


# ---------------------------------------------------------------------------------------------- upsert


def test_new_items_are_pending_with_their_request_stored(ledger: Ledger) -> None:
    stats = ledger.upsert_items(WL, "r1", [prep("a"), prep("b"), prep("with space")])
    assert stats == UpsertStats(new=3)
    assert ledger.count_states(WL, "r1") == {"pending": 3}
    row = item(ledger, "with space")
    assert row["item_key"].startswith("x-")
    assert row["app_id"] == "with space"
    assert CanonicalRequest.from_dict(json.loads(row["request_json"])) == prep("with space").request
    assert row["input_hash"] == prep("with space").request.input_hash
    assert row["attempts"] == 0


def test_upserting_the_same_input_again_in_the_same_run_changes_nothing(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    before = snapshot(ledger)
    assert ledger.upsert_items(WL, "r1", [prep("a"), prep("b")]) == UpsertStats(already_in_run=2)
    assert snapshot(ledger) == before


def test_an_item_edited_before_it_is_staged_is_prepared_again_in_the_same_run(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    stats = ledger.upsert_items(WL, "r1", [prep("a"), prep("b", text="edited meanwhile")])
    assert stats == UpsertStats(already_in_run=1, changed=1)
    rows = {r["app_id"]: r for r in ledger.iter_items(WL, "r1", columns=["app_id", "state", "request_json"])}
    assert rows["b"]["state"] == "pending" and "edited meanwhile" in rows["b"]["request_json"]


def test_an_item_of_the_run_already_staged_keeps_its_request_when_the_input_is_edited(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    submit(ledger, "r1", ["a"])
    before = snapshot(ledger)
    assert ledger.upsert_items(WL, "r1", [prep("a", text="edited after it was sent")]) == UpsertStats(
        already_in_run=1
    )
    assert snapshot(ledger) == before


def test_a_new_run_skips_unchanged_successes_and_sends_changed_or_failed_items_again(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("same"), prep("edited"), prep("failed")])
    job_id, cids = submit(ledger, "r1", ["same", "edited", "failed"])
    ledger.apply_results(
        job_id,
        [ok(cids["same"], {"label": "S"}), ok(cids["edited"], {"label": "E"}), fail(cids["failed"])],
        cost_of,
    )

    stats = ledger.upsert_items(
        WL, "r2", [prep("same"), prep("edited", text="new text"), prep("failed"), prep("fresh")]
    )

    assert stats == UpsertStats(new=1, changed=2, unchanged=1)
    same = item(ledger, "same")
    assert (same["state"], same["route"], same["run_id"]) == ("unchanged", "unchanged", "r2")
    assert json.loads(same["output_json"]) == {"label": "S"}
    edited = item(ledger, "edited")
    assert (edited["state"], edited["output_json"], edited["attempts"], edited["custom_id"]) == (
        "pending",
        None,
        0,
        None,
    )
    assert edited["input_hash"] == prep("edited", text="new text").request.input_hash
    assert json.loads(edited["request_json"])["messages"][0]["content"] == "new text"
    failed = item(ledger, "failed")
    assert (failed["state"], failed["error_code"], failed["attempts"]) == ("pending", None, 0)
    assert ledger.count_states(WL, "r2") == {"unchanged": 1, "pending": 3}
    assert ledger.count_states(WL, "r1") == {}


def test_an_unchanged_item_stays_unchanged_run_after_run(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a"])
    assert ledger.upsert_items(WL, "r2", [prep("a")]) == UpsertStats(unchanged=1)
    assert ledger.upsert_items(WL, "r3", [prep("a")]) == UpsertStats(unchanged=1)
    row = item(ledger, "a")
    assert (row["state"], row["run_id"], json.loads(row["output_json"])) == (
        "unchanged",
        "r3",
        {"label": "a"},
    )


def test_a_new_prompt_version_is_a_new_item(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a"])
    assert ledger.upsert_items(WL, "r2", [prep("a", version="v2")]) == UpsertStats(new=1)
    assert item(ledger, "a", "v1")["state"] == "succeeded"
    assert item(ledger, "a", "v2")["state"] == "pending"


def test_the_same_item_in_another_workload_is_another_row(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    assert ledger.upsert_items("other", "r1", [prep("a")]) == UpsertStats(new=1)


def test_two_application_ids_on_one_key_are_refused_by_name(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [PreparedItem("k1", prep("first").request)])
    with pytest.raises(LedgerError) as caught:
        ledger.upsert_items(WL, "r2", [PreparedItem("k1", prep("second").request)])
    message = str(caught.value)
    assert "'first'" in message and "'second'" in message and "'k1'" in message
    assert "rename one of them" in message
    with ledger.engine.connect() as conn:
        assert conn.execute(select(s.items.c.app_id, s.items.c.run_id)).all() == [("first", "r1")]


def test_two_application_ids_on_one_key_in_the_same_call_are_refused_by_name(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="'first' and 'second' map to the same item key 'k1'"):
        ledger.upsert_items(
            WL, "r1", [PreparedItem("k1", prep("first").request), PreparedItem("k1", prep("second").request)]
        )


def test_upsert_streams_more_items_than_one_write_slice(ledger: Ledger) -> None:
    stats = ledger.upsert_items(WL, "r1", (prep(f"id-{i}") for i in range(2500)))
    assert stats == UpsertStats(new=2500)
    assert ledger.count_states(WL, "r1") == {"pending": 2500}


# ---------------------------------------------------------------------------------------------- reject


def test_rejected_records_go_to_review_with_their_reason_and_the_rest_go_on(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("good"), prep("too-big")])
    count = ledger.reject_items(
        WL,
        "r1",
        [
            (None, "no template field", "template_variable_missing", "record 3: 'channel' is undefined"),
            (prep("too-big"), "too-big", "item_too_large", "line is 300 bytes; limit 200"),
        ],
    )
    assert count == 2
    unrenderable = item(ledger, "no template field", version="-")
    assert (unrenderable["state"], unrenderable["error_code"], unrenderable["model"]) == (
        "review",
        "template_variable_missing",
        "-",
    )
    assert unrenderable["error_message"] == "record 3: 'channel' is undefined"
    big = item(ledger, "too-big")
    assert (big["state"], big["error_code"]) == ("review", "item_too_large")
    assert item(ledger, "good")["state"] == "pending"
    assert ledger.count_states(WL, "r1") == {"pending": 1, "review": 2}


def test_rejecting_the_same_records_twice_keeps_one_row_each(ledger: Ledger) -> None:
    rejected = [(None, "bad", "missing_id", "no id")]
    ledger.reject_items(WL, "r1", rejected)
    ledger.reject_items(WL, "r1", rejected)
    assert ledger.count_states(WL, "r1") == {"review": 1}


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


# ---------------------------------------------------------------------------------------------- results


def test_results_in_any_order_land_on_their_own_items(ledger: Ledger) -> None:
    ids = [f"id-{i}" for i in range(6)]
    ledger.upsert_items(WL, "r1", [prep(a) for a in ids])
    job_id, cids = submit(ledger, "r1", ids)
    stats = ledger.apply_results(job_id, [ok(cids[a], {"label": a}) for a in reversed(ids)], cost_of)
    assert (stats.applied, stats.late, stats.duplicates, stats.unknown) == (6, 0, 0, 0)
    assert stats.outcomes == {"succeeded": 6}
    for a in ids:
        row = item(ledger, a)
        assert (row["state"], json.loads(row["output_json"]), row["route"]) == (
            "succeeded",
            {"label": a},
            "batch",
        )
        assert row["succeeded_hash"] == row["input_hash"]


def test_failures_set_the_outcome_state_and_keep_the_error(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("r", "p", "e", "c", "bad")])
    job_id, cids = submit(ledger, "r1", ["r", "p", "e", "c", "bad"])
    ledger.apply_results(
        job_id,
        [
            fail(cids["r"], "failed_retryable"),
            fail(cids["p"], "failed_permanent"),
            fail(cids["e"], "expired"),
            fail(cids["c"], "cancelled"),
            ItemResult(
                cids["bad"],
                "invalid_output",
                output="nope",
                usage=Usage(50, 5),
                error_code="invalid_output",
                error_message="output is not JSON",
            ),
        ],
        cost_of,
    )
    states = {a: item(ledger, a)["state"] for a in ("r", "p", "e", "c", "bad")}
    assert states == {
        "r": "failed_retryable",
        "p": "failed_permanent",
        "e": "expired",
        "c": "cancelled",
        "bad": "failed_retryable",
    }
    assert (item(ledger, "r")["error_code"], item(ledger, "r")["error_message"]) == ("500", "server error")
    assert item(ledger, "bad")["error_code"] == "invalid_output"
    bad = attempts_of(ledger, "bad")[0]
    assert (bad["outcome"], bad["discarded"], bad["cost_nusd"]) == (
        "invalid_output",
        True,
        to_nusd(cost_of(Usage(50, 5))),
    )


def test_a_duplicate_line_is_counted_once_and_paid_once(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job_id, cids = submit(ledger, "r1", ["a", "b"])
    stats = ledger.apply_results(
        job_id, [ok(cids["a"], {"n": 1}), ok(cids["b"]), ok(cids["a"], {"n": 2})], cost_of
    )
    assert (stats.applied, stats.duplicates) == (2, 1)
    assert stats.outcomes == {"succeeded": 2}
    assert json.loads(item(ledger, "a")["output_json"]) == {"n": 1}
    assert [r["cost_nusd"] for r in attempts_of(ledger, "a")] == [to_nusd(cost_of(Usage(100, 10)))]


def test_lines_this_job_never_sent_are_counted_as_unknown(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job0, _ = submit(ledger, "r1", ["a"], chunk=0)
    _, cids1 = submit(ledger, "r1", ["b"], chunk=1)
    before = snapshot(ledger)["abp_items"]
    stats = ledger.apply_results(job0, [ok(cids1["b"]), ok("stranger__a1c0"), ok("not a custom id")], cost_of)
    assert (stats.unknown, stats.applied, stats.late) == (3, 0, 0)
    assert snapshot(ledger)["abp_items"] == before


def test_results_for_an_unknown_job_are_refused(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="not in the ledger"):
        ledger.apply_results("nope", [], cost_of)


def retried_once(ledger: Ledger, app_id: str = "a") -> tuple[str, str, str, str]:
    """Attempt 1 fails, attempt 2 goes out in round 2; return both jobs and custom ids."""
    ledger.upsert_items(WL, "r1", [prep(app_id)])
    job1, cids1 = submit(ledger, "r1", [app_id], round_=1)
    ledger.apply_results(job1, [fail(cids1[app_id])], cost_of)
    job2, cids2 = submit(ledger, "r1", [app_id], round_=2)
    return job1, cids1[app_id], job2, cids2[app_id]


def test_a_late_failure_for_an_older_attempt_keeps_its_cost_and_leaves_the_item_alone(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job1, cids1 = submit(ledger, "r1", ["a"], round_=1)
    ledger.mark_missing(job1)  # the first batch ended without a word about "a"
    _, cids2 = submit(ledger, "r1", ["a"], round_=2)
    assert cids2["a"].endswith("__a2c0")
    stats = ledger.apply_results(job1, [fail(cids1["a"], "failed_retryable", usage=Usage(30, 0))], cost_of)
    assert (stats.late, stats.applied) == (1, 0)
    row = item(ledger, "a")
    assert (row["state"], row["custom_id"]) == ("submitted", cids2["a"])
    old = attempts_of(ledger, "a")[0]
    assert (old["outcome"], old["cost_nusd"], old["input_tokens"]) == (
        "failed_retryable",
        to_nusd(cost_of(Usage(30, 0))),
        30,
    )


def test_a_late_success_after_the_current_attempt_succeeded_is_kept_as_discarded_cost(ledger: Ledger) -> None:
    job1, cid1, job2, cid2 = retried_once(ledger)
    ledger.apply_results(job2, [ok(cid2, {"from": 2})], cost_of)
    stats = ledger.apply_results(job1, [ok(cid1, {"from": 1}, usage=Usage(7, 7))], cost_of)
    assert (stats.late, stats.applied, stats.duplicates) == (1, 0, 0)
    row = item(ledger, "a")
    assert (row["state"], json.loads(row["output_json"]), row["custom_id"], row["route"]) == (
        "succeeded",
        {"from": 2},
        cid2,
        "resubmitted",
    )
    first, second = attempts_of(ledger, "a")
    assert (first["outcome"], first["discarded"], first["input_tokens"]) == ("succeeded", True, 7)
    assert (second["outcome"], second["discarded"]) == ("succeeded", False)


def test_a_late_success_is_taken_while_the_item_has_no_usable_result(ledger: Ledger) -> None:
    job1, cid1, job2, cid2 = retried_once(ledger)
    stats = ledger.apply_results(job1, [ok(cid1, {"from": 1})], cost_of)
    assert (stats.applied, stats.late) == (1, 0)
    row = item(ledger, "a")
    assert (row["state"], json.loads(row["output_json"]), row["custom_id"], row["job_id"], row["route"]) == (
        "succeeded",
        {"from": 1},
        cid1,
        job1,
        "batch",
    )
    # the attempt sent meanwhile answers too: it is paid for and discarded, never a second result
    stats = ledger.apply_results(job2, [ok(cid2, {"from": 2})], cost_of)
    assert (stats.applied, stats.late) == (0, 1)
    assert json.loads(item(ledger, "a")["output_json"]) == {"from": 1}
    assert [a["discarded"] for a in attempts_of(ledger, "a")] == [False, True]


def test_a_success_that_arrives_after_the_item_was_skipped_is_kept_as_discarded_cost(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job, cids = submit(ledger, "r1", ["a"])
    ledger.transition(WL, "r1", "skipped", ["submitted"], route="skipped")  # the deadline passed
    stats = ledger.apply_results(job, [ok(cids["a"], usage=Usage(10, 10))], cost_of)
    assert (stats.applied, stats.late) == (0, 1)
    row = item(ledger, "a")
    assert (row["state"], row["output_json"]) == ("skipped", None)
    (att,) = attempts_of(ledger, "a")
    assert (att["outcome"], att["discarded"], att["cost_nusd"]) == (
        "succeeded",
        True,
        to_nusd(cost_of(Usage(10, 10))),
    )


def test_applying_the_same_results_again_changes_nothing(ledger: Ledger) -> None:
    job1, cid1, job2, cid2 = retried_once(ledger, "a")
    ledger.upsert_items(WL, "r1", [prep("b"), prep("c")])
    ledger.upsert_items(WL, "r1b", [])  # nothing
    job3, cids3 = submit(ledger, "r1", ["b", "c"], round_=2, chunk=1)
    lines = [
        ok(cid2, {"x": 1}),
        ok(cid1, {"late": True}),
        fail(cids3["b"]),
        ok(cids3["c"]),
        ok("ghost__a1c0"),
    ]
    ledger.apply_results(job2, lines[:2], cost_of)
    ledger.apply_results(job1, lines[1:2], cost_of)
    ledger.apply_results(job3, lines[2:], cost_of)
    ledger.mark_missing(job3)
    before = snapshot(ledger)
    ledger.apply_results(job2, lines[:2], cost_of)
    ledger.apply_results(job1, lines[1:2], cost_of)
    ledger.apply_results(job3, lines[2:], cost_of)
    ledger.mark_missing(job3)
    assert snapshot(ledger) == before


# ---------------------------------------------------------------------------------------------- missing


def test_lines_no_result_file_mentions_become_retryable_with_error_code_missing(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b"), prep("c")])
    job_id, cids = submit(ledger, "r1", ["a", "b", "c"])
    ledger.apply_results(job_id, [ok(cids["b"])], cost_of)
    assert ledger.mark_missing(job_id) == 2
    for app_id in ("a", "c"):
        row = item(ledger, app_id)
        assert (row["state"], row["error_code"]) == ("failed_retryable", "missing")
        assert row["error_message"] == "absent from every result file of the batch"
        (att,) = attempts_of(ledger, app_id)
        assert (att["outcome"], att["error_code"], att["cost_nusd"]) == ("missing", "missing", 0)
    assert item(ledger, "b")["state"] == "succeeded"
    before = snapshot(ledger)
    assert ledger.mark_missing(job_id) == 2  # a rerun reports the same figure and writes nothing
    assert snapshot(ledger) == before


def test_a_missing_line_of_an_older_attempt_leaves_the_item_alone(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job1, _ = submit(ledger, "r1", ["a"], round_=1)
    ledger.transition(WL, "r1", "failed_retryable", ["submitted"])
    _, cids2 = submit(ledger, "r1", ["a"], round_=2)
    assert ledger.mark_missing(job1) == 1
    row = item(ledger, "a")
    assert (row["state"], row["custom_id"], row["error_code"]) == ("submitted", cids2["a"], None)


# ---------------------------------------------------------------------------------------------- rounds


def test_retry_candidates_sends_exhausted_and_permanent_failures_to_review(ledger: Ledger) -> None:
    ids = ["retry", "exhausted", "expired", "permanent", "done"]
    ledger.upsert_items(WL, "r1", [prep(a) for a in ids])
    job, cids = submit(ledger, "r1", ids, round_=1)
    ledger.apply_results(
        job,
        [
            fail(cids["retry"]),
            fail(cids["exhausted"]),
            fail(cids["expired"], "expired"),
            fail(cids["permanent"], "failed_permanent"),
            ok(cids["done"]),
        ],
        cost_of,
    )
    for round_ in (2, 3):  # "exhausted" fails twice more and reaches the cap of 3
        job, cids = submit(ledger, "r1", ["exhausted"], round_=round_)
        ledger.apply_results(job, [fail(cids["exhausted"])], cost_of)
    assert item(ledger, "exhausted")["attempts"] == 3

    assert ledger.retry_candidates(WL, "r1", max_attempts=3) == (2, 2)
    states = {a: item(ledger, a)["state"] for a in ids}
    assert states == {
        "retry": "failed_retryable",
        "exhausted": "review",
        "expired": "expired",
        "permanent": "review",
        "done": "succeeded",
    }
    assert ledger.retry_candidates(WL, "r1", max_attempts=3) == (2, 0)
    assert ledger.retry_candidates(WL, "r1", max_attempts=1) == (0, 2)
    assert ledger.count_states(WL, "r1") == {"review": 4, "succeeded": 1}


def test_retry_candidates_only_touch_their_own_run(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job, cids = submit(ledger, "r1", ["a"])
    ledger.apply_results(job, [fail(cids["a"], "failed_permanent")], cost_of)
    assert ledger.retry_candidates(WL, "other-run", max_attempts=1) == (0, 0)
    assert item(ledger, "a")["state"] == "failed_permanent"


# ---------------------------------------------------------------------------------------------- transition


def test_a_forbidden_transition_is_refused_and_changes_nothing(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    before = snapshot(ledger)
    with pytest.raises(InvalidTransitionError) as caught:
        ledger.transition(WL, "r1", "staged", ["failed_retryable", "succeeded"])
    assert "['succeeded']" in str(caught.value) and "'staged'" in str(caught.value)
    with pytest.raises(InvalidTransitionError):
        ledger.transition(WL, "r1", "unchanged", ["submitted"])
    with pytest.raises(LedgerError):
        ledger.transition(WL, "r1", "succeeded", ["review"])
    assert snapshot(ledger) == before


def test_a_transition_moves_only_the_given_states_and_keys_and_sets_the_values(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("a", "b", "c")])
    stage(ledger, "r1", ["a"])
    moved = ledger.transition(WL, "r1", "skipped", ["pending"], keys=[(item_key("b"), "v1")], route="skipped")
    assert moved == 1
    assert {a: item(ledger, a)["state"] for a in "abc"} == {"a": "staged", "b": "skipped", "c": "pending"}
    assert item(ledger, "b")["route"] == "skipped"
    assert ledger.transition(WL, "r1", "fallback", ["pending", "staged"]) == 2
    assert ledger.transition(WL, "r1", "fallback", ["pending", "staged"]) == 0
    assert ledger.transition(WL, "other", "review", ["fallback"]) == 0
    assert ledger.count_states(WL, "r1") == {"fallback": 2, "skipped": 1}


def test_a_transition_below_an_attempts_count_leaves_items_at_or_over_it_alone(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in "abc"])
    job, cids = submit(ledger, "r1", ["a", "b", "c"], round_=1)
    ledger.apply_results(job, [fail(cids[a]) for a in "abc"], cost_of)
    job, cids = submit(ledger, "r1", ["b"], round_=2)
    ledger.apply_results(job, [fail(cids["b"])], cost_of)
    moved = ledger.transition(
        WL, "r1", "review", ["failed_retryable"], attempts_below=2, error_code="budget_exceeded"
    )
    assert moved == 2
    rows = {a: item(ledger, a) for a in "abc"}
    assert {a: (r["state"], r["attempts"]) for a, r in rows.items()} == {
        "a": ("review", 1),
        "b": ("failed_retryable", 2),
        "c": ("review", 1),
    }
    assert rows["a"]["error_code"] == "budget_exceeded"
    assert rows["b"]["error_code"] != "budget_exceeded"


def test_a_transition_by_keys_handles_more_keys_than_one_write_slice(ledger: Ledger) -> None:
    ids = [f"id-{i}" for i in range(1200)]
    ledger.upsert_items(WL, "r1", [prep(a) for a in ids])
    keys = [(item_key(a), "v1") for a in ids[:1100]]
    assert ledger.transition(WL, "r1", "skipped", ["pending"], keys=keys) == 1100
    assert ledger.count_states(WL, "r1") == {"skipped": 1100, "pending": 100}


# ---------------------------------------------------------------------------------------------- iteration

AWKWARD_IDS = ["a", "A", "a-b", "a_b", "ab", "a b", "Z", "z", "0", "_", "-", "x-1", "é", "a.b"] + [
    f"n{i:03d}" for i in range(40)
]


def test_iter_items_returns_every_row_once_while_rows_are_updated_during_iteration(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in AWKWARD_IDS])
    seen: list[str] = []
    for row in ledger.iter_items(WL, "r1", page=4):
        seen.append(row["app_id"])
        key = (row["item_key"], row["prompt_version"])
        ledger.transition(WL, "r1", "staged", ["pending"], keys=[key])
        ledger.transition(WL, "r1", "skipped", ["staged"], keys=[key])
    assert sorted(seen) == sorted(AWKWARD_IDS)
    assert ledger.count_states(WL, "r1") == {"skipped": len(AWKWARD_IDS)}


def test_iter_items_filtered_by_state_keeps_its_place_while_yielded_rows_leave_the_filter(
    ledger: Ledger,
) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in AWKWARD_IDS])
    seen = []
    for row in ledger.iter_items(WL, "r1", states=["pending"], columns=["app_id"], page=3):
        assert set(row.keys()) == {"item_key", "prompt_version", "app_id"}
        seen.append(row["app_id"])
        ledger.transition(WL, "r1", "fallback", ["pending"], keys=[(row["item_key"], row["prompt_version"])])
    assert sorted(seen) == sorted(AWKWARD_IDS)
    assert len(seen) == len(set(seen))


def test_iter_items_yields_rows_in_key_order_and_only_of_its_run_and_states(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("c", "a", "b")])
    ledger.upsert_items(WL, "r2", [prep("other")])
    ledger.transition(WL, "r1", "skipped", ["pending"], keys=[(item_key("b"), "v1")])
    assert [r["app_id"] for r in ledger.iter_items(WL, "r1", page=1)] == ["a", "b", "c"]
    assert [r["app_id"] for r in ledger.iter_items(WL, "r1", states=["pending"], page=1)] == ["a", "c"]
    assert list(ledger.iter_items(WL, "r3")) == []


def test_iter_item_rows_streams_typed_rows_of_only_the_shapes_columns_in_key_order(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in AWKWARD_IDS])
    ledger.upsert_items(WL, "r2", [prep("other")])
    rows = list(ledger.iter_item_rows(WL, "r1", shape=OpenItem, page=4))
    assert all(isinstance(r, OpenItem) for r in rows)
    assert [r.item_key for r in rows] == sorted(item_key(a) for a in AWKWARD_IDS)
    assert {(r.state, r.attempts) for r in rows} == {("pending", 0)}
    assert [r.app_id for r in ledger.iter_item_rows(WL, "r2", shape=ItemOutcome)] == ["other"]
    (full,) = ledger.iter_item_rows(WL, "r2")
    assert isinstance(full, ItemRow) and full.created_at.tzinfo is not None


def test_iter_item_rows_keeps_its_place_while_yielded_rows_leave_the_state_filter(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in AWKWARD_IDS])
    seen = []
    for row in ledger.iter_item_rows(WL, "r1", states=["pending"], shape=ItemRef, page=3):
        seen.append(row.app_id)
        ledger.transition(WL, "r1", "fallback", ["pending"], keys=[(row.item_key, row.prompt_version)])
    assert sorted(seen) == sorted(AWKWARD_IDS)
    assert len(seen) == len(set(seen))


def test_iter_item_rows_for_one_job_yields_only_that_jobs_items(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in "abcde"])
    job0, cids = stage(ledger, "r1", ["a", "c", "e"], chunk=0)
    job1, _ = stage(ledger, "r1", ["b", "d"], chunk=1)
    mine = list(ledger.iter_item_rows(WL, "r1", states=["staged"], shape=ItemRef, job_id=job0, page=1))
    assert [(r.app_id, r.job_id, r.custom_id) for r in mine] == [(a, job0, cids[a]) for a in "ace"]
    assert [r.app_id for r in ledger.iter_item_rows(WL, "r1", shape=ItemRef, job_id=job1)] == ["b", "d"]
    assert list(ledger.iter_item_rows(WL, "r1", states=["pending"], shape=ItemRef, job_id=job0)) == []


def test_iter_item_rows_refuses_a_shape_that_is_not_an_item_record(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match=r"reads items as one of .*not .JobRow.; add the shape"):
        next(ledger.iter_item_rows(WL, "r1", shape=JobRow))


# ---------------------------------------------------------------------------------------------- reporting


def test_attempt_totals_sum_tokens_and_cost_by_mode_outcome_and_discard(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("a", "b", "c", "d")])
    job, cids = submit(ledger, "r1", ["a", "b", "c", "d"])
    ledger.apply_results(
        job,
        [
            ok(cids["a"], usage=Usage(1000, 100, 500, 0)),
            ok(cids["b"], usage=Usage(3000, 300, 0, 200)),
            ItemResult(cids["c"], "invalid_output", output="x", usage=Usage(2000, 50)),
            fail(cids["d"], usage=Usage(0, 0)),
        ],
        cost_of,
    )
    totals = {(r["mode"], r["outcome"], bool(r["discarded"])): r for r in ledger.attempt_totals(WL, "r1")}
    assert set(totals) == {
        ("batch", "succeeded", False),
        ("batch", "invalid_output", True),
        ("batch", "failed_retryable", False),
    }
    won = totals[("batch", "succeeded", False)]
    assert (
        won["lines"],
        won["input_tokens"],
        won["output_tokens"],
        won["cached_input_tokens"],
        won["cache_write_tokens"],
    ) == (2, 4000, 400, 500, 200)
    assert won["cost_nusd"] == to_nusd(Decimal("0.0048"))
    assert from_nusd(int(won["cost_nusd"])) == Decimal("0.0048")
    lost = totals[("batch", "invalid_output", True)]
    assert (lost["lines"], lost["input_tokens"], lost["cost_nusd"]) == (1, 2000, to_nusd(Decimal("0.0021")))
    assert totals[("batch", "failed_retryable", False)]["cost_nusd"] == 0
    assert ledger.attempt_totals(WL, "other") == []


def test_iter_cost_rows_gives_each_items_attempts_and_an_unchanged_items_earlier_usage(
    ledger: Ledger,
) -> None:
    ledger.upsert_items(WL, "r1", [prep("kept"), prep("retried")])
    job, cids = submit(ledger, "r1", ["kept", "retried"])
    ledger.apply_results(
        job, [ok(cids["kept"], usage=Usage(40, 4)), fail(cids["retried"], usage=Usage(1, 0))], cost_of
    )
    ledger.upsert_items(WL, "r2", [prep("kept"), prep("retried")])
    job, cids = submit(ledger, "r2", ["retried"], round_=1)
    ledger.apply_results(job, [ok(cids["retried"], usage=Usage(9, 9))], cost_of)

    rows = {r["app_id"]: r for r in ledger.iter_cost_rows(WL, "r2")}
    assert rows["kept"] == {
        "app_id": "kept",
        "state": "unchanged",
        "route": "unchanged",
        "model": "gpt-4o-mini",
        "attempts": [],
        "last_usage": Usage(40, 4),
    }
    assert rows["retried"] == {
        "app_id": "retried",
        "state": "succeeded",
        "route": "batch",
        "model": "gpt-4o-mini",
        "attempts": [
            {
                "usage": Usage(9, 9),
                "mode": "batch",
                "discarded": False,
                "outcome": "succeeded",
                "error_code": None,
            }
        ],
        "last_usage": None,
    }
    first = {r["app_id"]: r for r in ledger.iter_cost_rows(WL, "r1")}
    assert first == {}  # every item moved on to r2


def test_iter_cost_rows_leaves_out_attempts_still_without_an_outcome(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    submit(ledger, "r1", ["a"])
    (row,) = ledger.iter_cost_rows(WL, "r1")
    assert (row["state"], row["attempts"], row["last_usage"]) == ("submitted", [], None)


def test_iter_cost_rows_finds_each_pages_attempts_by_item_not_by_reading_the_whole_run(
    tmp_path: Path,
) -> None:
    # SQLite without statistics searched the (workload, run_id) index: every page read every
    # attempt of the run, quadratic in the run (publish took 555 s at a million items).
    from sqlalchemy import event

    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'plan.sqlite'}")
    many = [f"x{n}" for n in range(300)]  # a page's IN list of hundreds of keys, as in a real run
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b", version="v2"), *(prep(k) for k in many)])
    job, cids = submit(ledger, "r1", ["a", *many])
    ledger.apply_results(job, [ok(cids["a"])], cost_of)
    seen: list[tuple[str, Any]] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM abp_attempts" in statement:
            seen.append((statement, params))

    rows = {r["app_id"]: r for r in ledger.iter_cost_rows(WL, "r1")}
    assert [a["outcome"] for a in rows["a"]["attempts"]] == ["succeeded"] and rows["b"]["attempts"] == []
    assert seen
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        for statement, params in seen:
            plan = " ".join(str(r[3]) for r in raw.execute("EXPLAIN QUERY PLAN " + statement, params))
            assert "USING INDEX ix_abp_attempts_item" in plan, plan


def test_count_routes_groups_items_by_state_and_route(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    ledger.upsert_items(WL, "r2", [prep("a"), prep("b", text="new"), prep("c")])
    assert ledger.count_routes(WL, "r2") == {("unchanged", "unchanged"): 1, ("pending", "-"): 2}


def test_publish_upserts_one_row_per_item_and_follows_later_runs(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    ledger.reject_items(WL, "r1", [(None, "bad", "missing_id", "no id")])
    assert ledger.publish(WL, "r1") == 3
    assert ledger.publish(WL, "r1") == 3
    with ledger.engine.connect() as conn:
        rows = {r["app_id"]: dict(r) for r in conn.execute(select(s.published)).mappings()}
    assert set(rows) == {"a", "b", "bad"}
    assert (rows["a"]["state"], json.loads(rows["a"]["output_json"]), rows["a"]["run_id"]) == (
        "succeeded",
        {"label": "a"},
        "r1",
    )
    assert (rows["bad"]["state"], rows["bad"]["output_json"]) == ("review", None)

    ledger.upsert_items(WL, "r2", [prep("a"), prep("b", text="new")])
    assert ledger.publish(WL, "r2") == 2
    with ledger.engine.connect() as conn:
        rows = {r["app_id"]: dict(r) for r in conn.execute(select(s.published)).mappings()}
    assert len(rows) == 3
    assert (rows["a"]["state"], rows["a"]["run_id"], json.loads(rows["a"]["output_json"])) == (
        "unchanged",
        "r2",
        {"label": "a"},
    )
    assert (rows["b"]["state"], rows["b"]["output_json"]) == ("pending", None)
    assert rows["bad"]["run_id"] == "r1"


def test_runs_are_recorded_once_and_keep_their_report(ledger: Ledger) -> None:
    ledger.start_run(WL, "r1", "openai", "gpt-4o-mini")
    ledger.start_run(WL, "r1", "openai", "gpt-4o-mini")
    ledger.finish_run(WL, "r1", {"cost": Decimal("1.5"), "items": 3})
    (run,) = ledger.runs(WL)
    assert (run["run_id"], run["provider"]) == ("r1", "openai")
    assert run["finished_at"] is not None
    assert json.loads(run["report_json"]) == {"cost": "1.5", "items": 3}
    assert ledger.runs("other") == []


def test_a_run_keeps_the_first_batch_connection_it_started_on(ledger: Ledger) -> None:
    assert ledger.run_batch_conn_id(WL, "r1") is None
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_a") == "openai_a"
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_b") == "openai_a"
    assert ledger.run_batch_conn_id(WL, "r1") == "openai_a"
    assert ledger.run_batch_conn_id(WL, "r2") is None


def test_a_run_started_before_connections_were_recorded_takes_the_first_one_given(ledger: Ledger) -> None:
    assert ledger.start_run(WL, "r1", "openai", "m") is None
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_b") == "openai_b"
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_c") == "openai_b"


def test_nano_dollars_convert_exactly_both_ways() -> None:
    assert to_nusd(Decimal("0.000000001")) == 1
    assert to_nusd(Decimal("0.0000000015")) == 2
    assert to_nusd(Decimal("12.345678901")) == 12_345_678_901
    assert from_nusd(12_345_678_901) == Decimal("12.345678901")


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
        job_row(
            WL, run_id, 1, job_id=job_id, size_bytes=10, idempotency_key="k-long", staged_path="/s/long.jsonl"
        ),
        placements,
    )
    assert ledger.get_job(job_id).run_id == run_id
    assert item(ledger, "a")["job_id"] == job_id


# ---------------------------------------------------------------------------------------------- claims


def staged_job(ledger: Ledger, app_ids: Sequence[str] = ("a",), run_id: str = "r1", chunk: int = 0) -> str:
    ledger.upsert_items(WL, run_id, [prep(a) for a in app_ids])
    return stage(ledger, run_id, list(app_ids), chunk=chunk)[0]


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


def race_in_threads(url: str, names: Sequence[str], attempt: Any) -> list[tuple[bool, bool]]:
    """Two threads, each with its own ledger, call ``attempt(ledger, name, who)`` together per name."""
    ledgers = [Ledger.from_url(url), Ledger.from_url(url)]
    barrier = threading.Barrier(2)

    def run_all(who: int) -> list[bool]:
        won = []
        for name in names:
            barrier.wait()
            try:
                attempt(ledgers[who], name, who)
                won.append(True)
            except (JobClaimedError, WorkloadLeasedError):
                won.append(False)
        return won

    try:
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(run_all, [0, 1])
    finally:
        for opened in ledgers:
            opened.engine.dispose()
    return list(zip(first, second, strict=True))


def test_two_threads_racing_for_one_claim_never_both_win(ledger: Ledger, ledger_url: str) -> None:
    job_ids = [staged_job(ledger, [f"i{n}"], chunk=n) for n in range(50)]
    outcomes = race_in_threads(
        ledger_url, job_ids, lambda led, job_id, who: led.claim_job(job_id, f"o{who}", 600)
    )
    assert all(a != b for a, b in outcomes)
    assert all(ledger.get_job(j).claim_count == 1 for j in job_ids)


def race_in_processes(target: Any, url: str, names: list[str], who: list[str]) -> dict[str, list[str]]:
    """Run ``target`` in one spawned process per ``who``; return, per name, who won it."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(who))
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, names, w, barrier, results)) for w in who]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in range(len(names) * len(who))]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    winners: dict[str, list[str]] = {n: [] for n in names}
    for w, name, won in got:
        if won:
            winners[name].append(w)
    return winners


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


# ---------------------------------------------------------------------------------------------- workload lease


def test_one_run_holds_a_workload_and_another_is_told_who_since_when_and_what_to_do(ledger: Ledger) -> None:
    ledger.start_run(WL, "scheduled__1", "openai", "gpt-4o-mini")
    lease = ledger.acquire_workload_lease(WL, "scheduled__1", "prepare-try1", dag_id="nightly")
    assert (lease.run_id, lease.dag_id, lease.owner) == ("scheduled__1", "nightly", "prepare-try1")
    assert ledger.runs(WL)[0]["dag_id"] == "nightly"
    with pytest.raises(WorkloadLeasedError) as caught:
        ledger.acquire_workload_lease(WL, "manual__2", "prepare-try1", dag_id="nightly")
    message = str(caught.value)
    assert "'feedback'" in message and "'nightly'" in message and "'scheduled__1'" in message
    assert lease.acquired_at.isoformat() in message
    assert "max_active_runs=1" in message and "airflow-batch lease release" in message
    assert (caught.value.run_id, caught.value.dag_id) == ("scheduled__1", "nightly")


def test_the_holding_run_acquires_again_keeping_its_since(ledger: Ledger) -> None:
    first = ledger.acquire_workload_lease(WL, "r1", "prepare-try1")
    again = ledger.acquire_workload_lease(WL, "r1", "prepare-try2", dag_id="nightly")
    assert (again.owner, again.dag_id, again.acquired_at) == ("prepare-try2", "nightly", first.acquired_at)
    assert ledger.workload_lease(WL) == again


def test_a_takeover_moves_the_lease_is_audited_and_leaves_in_flight_items_with_their_run(
    ledger: Ledger,
) -> None:
    ledger.acquire_workload_lease(WL, "r1", "t1")
    ledger.upsert_items(WL, "r1", [prep("a")])
    submit(ledger, "r1", ["a"])
    taken = ledger.acquire_workload_lease(WL, "r2", "t2", takeover=True)
    assert (taken.run_id, taken.taken_over_from) == ("r2", "r1")
    assert ledger.audit_log(WL)[0].action == "takeover_lease"
    assert ledger.upsert_items(WL, "r2", [prep("a")]) == UpsertStats(in_flight_elsewhere=1)
    assert item(ledger, "a")["run_id"] == "r1"
    with pytest.raises(WorkloadLeasedError):
        ledger.acquire_workload_lease(WL, "r1", "t1-retry")


def test_a_released_lease_lets_another_run_in_and_only_its_holder_releases_it(ledger: Ledger) -> None:
    ledger.acquire_workload_lease(WL, "r1", "t1")
    assert not ledger.release_workload_lease(WL, "r2")
    assert ledger.release_workload_lease(WL, "r1", actor="bob", reason="run r1 was killed")
    assert ledger.audit_log(WL)[0].action == "release_lease"
    assert ledger.workload_lease(WL) is None
    assert ledger.acquire_workload_lease(WL, "r2", "t2").run_id == "r2"


def test_leases_of_two_workloads_are_independent(ledger: Ledger) -> None:
    ledger.acquire_workload_lease("a", "r1", "t1")
    assert ledger.acquire_workload_lease("b", "r2", "t2").run_id == "r2"


def test_two_runs_racing_for_a_workload_never_both_win(ledger: Ledger, ledger_url: str) -> None:
    workloads = [f"wl{n}" for n in range(20)]
    winners = race_in_processes(race_worker.lease_each, ledger_url, workloads, ["run-a", "run-b"])
    assert all(len(w) == 1 for w in winners.values()), winners
    for wl in workloads:
        lease = ledger.workload_lease(wl)
        assert lease is not None and [lease.run_id] == winners[wl]


def test_two_threads_racing_for_a_workload_never_both_win(ledger_url: str) -> None:
    workloads = [f"wl{n}" for n in range(50)]
    outcomes = race_in_threads(
        ledger_url, workloads, lambda led, wl, who: led.acquire_workload_lease(wl, f"run-{who}", f"t{who}")
    )
    assert all(a != b for a, b in outcomes)


# ---------------------------------------------------------------------------------------------- guarded transition


def test_the_guard_in_sql_refuses_a_move_the_caller_did_not_check(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    ledger.upsert_items(WL, "r1", [prep("c")])
    rows = [
        {"b_workload": WL, "b_key": item_key(a), "b_version": "v1", "state": "staged", "job_id": "j"}
        for a in ("a", "b", "c")
    ]
    with ledger.engine.begin() as conn:
        moved = _transition(conn, utcnow(), rows=rows)
    assert moved == Moved(moved=1, refused=2)
    assert [item(ledger, a)["state"] for a in "abc"] == ["succeeded", "succeeded", "staged"]
    assert item(ledger, "a")["job_id"] != "j"


def test_a_stale_read_loses_the_compare_and_set(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    ledger.reject_items(WL, "r1", [(prep("a"), "a", "too_long", "over the limit")])  # a concurrent writer
    row = {
        "b_workload": WL,
        "b_key": item_key("a"),
        "b_version": "v1",
        "b_from": "pending",
        "state": "staged",
    }
    with ledger.engine.begin() as conn:
        assert _transition(conn, utcnow(), rows=[row]) == Moved(moved=0, refused=1)
    assert item(ledger, "a")["state"] == "review"


def test_a_set_transition_counts_what_it_left_where_it_was(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a"])
    ledger.upsert_items(WL, "r1", [prep("b")])
    with ledger.engine.begin() as conn:
        moved = _transition(conn, utcnow(), target="skipped", where=s.items.c.workload == WL)
    assert moved == Moved(moved=1, refused=1)


def test_nothing_but_the_guarded_transition_writes_an_item_state() -> None:
    """Every ``UPDATE abp_items`` in the store is inside ``_transition``, and inserts start pending or review."""
    source = Path(store.__file__).read_text()
    tree = ast.parse(source)
    writers = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
                and ast.unparse(node.func.value) == "s.items"
            ):
                writers.add(fn.name)
    assert writers == {"_transition"}
    assert "_bulk_update(conn, s.items" not in source


# ---------------------------------------------------------------------------------------------- sticky review


def in_review_after_run_one(ledger: Ledger, app_ids: Sequence[str] = ("a",)) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in app_ids])
    job, cids = submit(ledger, "r1", list(app_ids))
    ledger.apply_results(job, [fail(cids[a], "failed_permanent") for a in app_ids], cost_of)
    ledger.retry_candidates(WL, "r1", max_attempts=3)


def test_an_item_in_review_stays_there_next_night_and_is_not_paid_for_again(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    before = item(ledger, "a")
    assert (before["state"], before["attempts"]) == ("review", 1)

    stats = ledger.upsert_items(WL, "r2", [prep("a")])

    after = item(ledger, "a")
    assert (after["state"], after["attempts"], after["error_code"]) == ("review", 1, "500")
    assert stats == UpsertStats(in_review=1)
    assert ledger.count_states(WL, "r2") == {"review": 1}


def test_a_permanent_failure_left_by_a_dead_run_goes_to_review_not_back_to_pending(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job, cids = submit(ledger, "r1", ["a"])
    ledger.apply_results(job, [fail(cids["a"], "failed_permanent")], cost_of)
    assert ledger.upsert_items(WL, "r2", [prep("a")]) == UpsertStats(in_review=1)
    assert (item(ledger, "a")["state"], item(ledger, "a")["attempts"]) == ("review", 1)


def test_a_review_item_whose_input_changed_is_sent_again(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    assert ledger.upsert_items(WL, "r2", [prep("a", text="fixed input")]) == UpsertStats(changed=1)
    row = item(ledger, "a")
    assert (row["state"], row["attempts"], row["error_code"]) == ("pending", 0, None)


def test_a_review_item_under_a_new_prompt_version_is_a_new_item(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    assert ledger.upsert_items(WL, "r2", [prep("a", version="v2")]) == UpsertStats(new=1)
    assert item(ledger, "a")["state"] == "review"


def test_items_another_run_has_sent_stay_with_it_and_unsent_staged_ones_are_taken(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("sent", "claimed", "doubt", "unsent")])
    submit(ledger, "r1", ["sent"], chunk=0)
    claimed, _ = stage(ledger, "r1", ["claimed"], chunk=1)
    ledger.claim_job(claimed, "t", 60)
    doubt, _ = stage(ledger, "r1", ["doubt"], chunk=2)
    ledger.mark_job_in_doubt(doubt, "lost reply")
    stage(ledger, "r1", ["unsent"], chunk=3)

    stats = ledger.upsert_items(
        WL, "r2", [prep(a, text="new") for a in ("sent", "claimed", "doubt", "unsent")]
    )

    assert stats == UpsertStats(changed=1, in_flight_elsewhere=3)
    assert {
        a: (item(ledger, a)["state"], item(ledger, a)["run_id"]) for a in ("sent", "claimed", "doubt")
    } == {
        "sent": ("submitted", "r1"),
        "claimed": ("staged", "r1"),
        "doubt": ("staged", "r1"),
    }
    assert (item(ledger, "unsent")["state"], item(ledger, "unsent")["run_id"]) == ("pending", "r2")


# ---------------------------------------------------------------------------------------------- re-drive and review


def test_review_items_lists_the_open_queue_by_error_code_in_pages(ledger: Ledger) -> None:
    in_review_after_run_one(ledger, ["a", "b", "c"])
    ledger.reject_items(WL, "r1", [(prep("d"), "d", "context_length_exceeded", "too long")])
    assert [r.app_id for r in ledger.review_items(WL)] == sorted(
        ["a", "b", "c", "d"], key=lambda a: item_key(a)
    )
    [d] = ledger.review_items(WL, error_code="context_length_exceeded")
    assert isinstance(d, ItemRow) and (d.app_id, d.error_message) == ("d", "too long")
    page1 = ledger.review_items(WL, limit=2)
    page2 = ledger.review_items(WL, limit=2, offset=2)
    assert len(page1) == len(page2) == 2 and not {r.item_key for r in page1} & {r.item_key for r in page2}


def test_a_redrive_sends_review_items_back_to_pending_and_the_next_run_sends_them(ledger: Ledger) -> None:
    in_review_after_run_one(ledger, ["a", "b"])
    assert ledger.redrive(WL, app_ids=["a"], actor="alice", reason="prompt fixed") == 1
    row = item(ledger, "a")
    assert (row["state"], row["attempts"], row["error_code"], row["job_id"]) == ("pending", 0, None, None)
    assert item(ledger, "b")["state"] == "review"
    assert ledger.upsert_items(WL, "r2", [prep("a"), prep("b")]) == UpsertStats(changed=1, in_review=1)
    [entry] = ledger.audit_log(WL)
    assert (entry.actor, entry.action, entry.item_count, entry.reason) == (
        "alice",
        "redrive",
        1,
        "prompt fixed",
    )
    assert json.loads(entry.target)["app_ids"] == ["a"]


def test_a_redrive_by_error_code_or_of_the_whole_queue_moves_only_review_items(ledger: Ledger) -> None:
    in_review_after_run_one(ledger, ["a", "b"])
    ledger.reject_items(WL, "r1", [(prep("c"), "c", "too_long", "over")])
    ledger.upsert_items(WL, "r1", [prep("ok")])
    submit(ledger, "r1", ["ok"], chunk=1)
    assert ledger.redrive(WL, error_code="too_long", actor="a", reason="limit raised") == 1
    assert item(ledger, "c")["state"] == "pending"
    assert ledger.redrive(WL, actor="a", reason="all of them") == 2
    assert item(ledger, "ok")["state"] == "submitted"
    assert ledger.redrive(WL, app_ids=["ok"], actor="a", reason="in flight") == 0
    assert item(ledger, "ok")["state"] == "submitted"


def test_resolved_and_skipped_review_items_leave_the_queue_and_stay_out_of_the_next_run(
    ledger: Ledger,
) -> None:
    in_review_after_run_one(ledger, ["a", "b", "c"])
    assert ledger.resolve_review(WL, app_ids=["a"], actor="alice", note="answered by hand") == 1
    assert ledger.skip_review(WL, item_keys=[item_key("b")], actor="alice", reason="not needed") == 1
    assert [r.app_id for r in ledger.review_items(WL)] == ["c"]
    assert (item(ledger, "a")["state"], item(ledger, "a")["review_action"]) == ("review", "resolved")
    assert (item(ledger, "b")["state"], item(ledger, "b")["review_note"]) == ("skipped", "not needed")
    assert ledger.upsert_items(WL, "r2", [prep(a) for a in "abc"]) == UpsertStats(in_review=3)
    assert ledger.count_states(WL, "r2") == {"review": 2, "skipped": 1}
    assert [e.action for e in ledger.audit_log(WL)] == ["skip_review", "resolve_review"]
    assert ledger.redrive(WL, app_ids=["a", "b"], actor="alice", reason="try again") == 2
    assert ledger.upsert_items(WL, "r3", [prep(a) for a in "abc"]) == UpsertStats(changed=2, in_review=1)


def test_a_review_action_needs_an_actor_and_a_reason(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    with pytest.raises(LedgerError, match="actor and a reason"):
        ledger.redrive(WL, actor="", reason="x")
    with pytest.raises(LedgerError, match="actor and a reason"):
        ledger.resolve_review(WL, actor="alice", note="")
    assert item(ledger, "a")["state"] == "review"
    assert ledger.audit_log(WL) == []


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


def test_a_reject_in_a_new_run_leaves_an_item_another_run_has_sent_alone(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    submit(ledger, "r1", ["a"], chunk=0)
    job_b, cids = submit(ledger, "r1", ["b"], chunk=1)
    ledger.apply_results(job_b, [ok(cids["b"])], cost_of)
    rejected = [(prep(a), a, "too_long", "over the limit") for a in ("a", "b")]
    assert ledger.reject_items(WL, "r2", rejected) == 1
    assert (item(ledger, "a")["state"], item(ledger, "a")["run_id"]) == ("submitted", "r1")
    assert (item(ledger, "b")["state"], item(ledger, "b")["error_code"]) == ("review", "too_long")


def test_a_compare_and_set_from_a_state_that_cannot_reach_the_target_is_refused(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a"])
    row = {
        "b_workload": WL,
        "b_key": item_key("a"),
        "b_version": "v1",
        "b_from": "succeeded",
        "state": "staged",
    }
    with ledger.engine.begin() as conn:
        assert _transition(conn, utcnow(), rows=[row]) == Moved(moved=0, refused=1)
    assert item(ledger, "a")["state"] == "succeeded"


def test_many_processes_opening_a_new_ledger_at_once_all_find_one_schema(ledger_url: str) -> None:
    import threading

    opened: list[Ledger] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_ledger() -> None:
        start.wait()
        try:
            opened.append(Ledger.from_url(ledger_url))
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    for _round in range(3):  # each round on the same database: the later ones find it made
        threads = [threading.Thread(target=open_ledger) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert len(opened) == 18
    assert {ledger.schema_version for ledger in opened} == {opened[0].schema_version}
    for ledger in opened:
        ledger.engine.dispose()


# ---------------------------------------------------------------------------------------------- bulk paths
HOSTILE = "tab\there, new\nline, cr\r, backslash \\ and \\N, a quote ' and é"


def test_a_new_item_written_in_bulk_reads_back_its_text_and_utc_timestamps_exactly(ledger: Ledger) -> None:
    """New items bypass SQLAlchemy's per-row binding (COPY / a raw executemany): nothing may shift."""
    before = utcnow()
    ledger.upsert_items(WL, "r1", [prep("a", text=HOSTILE)])
    after = utcnow()
    row = item(ledger, "a")
    assert CanonicalRequest.from_dict(json.loads(row["request_json"])) == prep("a", text=HOSTILE).request
    assert row["created_at"].utcoffset() == timedelta(0)
    assert before <= row["created_at"] == row["updated_at"] <= after


def test_result_text_with_tabs_newlines_and_backslashes_is_stored_exactly(ledger: Ledger) -> None:
    """Result lines go through a staging table (COPY on PostgreSQL): its escaping must be lossless."""
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job, cids = submit(ledger, "r1", ["a", "b"])
    bad = ItemResult(cids["b"], "failed_retryable", usage=NO_USAGE, error_code="e\t1", error_message=HOSTILE)
    ledger.apply_results(job, [ok(cids["a"], {"text": HOSTILE}), bad], cost_of)
    assert json.loads(item(ledger, "a")["output_json"]) == {"text": HOSTILE}
    assert (item(ledger, "b")["error_code"], item(ledger, "b")["error_message"]) == ("e\t1", HOSTILE)
    assert attempts_of(ledger, "b")[0]["error_message"] == HOSTILE


def test_results_applied_over_many_staging_slices_leave_nothing_behind_between_slices(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging table lives on the connection: rows of one slice must never be applied again."""
    monkeypatch.setattr(store, "APPLY_SLICE", 2)
    ids = [f"i{n}" for n in range(7)]
    ledger.upsert_items(WL, "r1", [prep(a) for a in ids])
    job, cids = submit(ledger, "r1", ids)
    results = [ok(cids[a]) if n % 2 else fail(cids[a], "failed_permanent") for n, a in enumerate(ids)]
    stats = ledger.apply_results(job, results, cost_of)
    assert (stats.applied, stats.late, stats.duplicates) == (7, 0, 0)
    assert ledger.count_states(WL, "r1") == {"succeeded": 3, "failed_permanent": 4}
    assert [a["cost_nusd"] for a in attempts_of(ledger, "i1")] == [to_nusd(cost_of(SOME_USAGE))]
    # a rerun over the same slices writes nothing
    before = snapshot(ledger)
    ledger.apply_results(job, results, cost_of)
    assert snapshot(ledger) == before
    # a later pass on the same (pooled) connection stages one of those lines again
    ledger.apply_results(job, [ok(cids["i6"], usage=Usage(5, 5))], cost_of)
    assert [(a["outcome"], a["cost_nusd"]) for a in attempts_of(ledger, "i6")] == [
        ("succeeded", to_nusd(cost_of(Usage(5, 5))))
    ]


def test_a_staged_transition_refuses_moves_the_states_forbid_and_stale_reads_in_sql(ledger: Ledger) -> None:
    """The set-based form (``UPDATE ... FROM`` a staging table) is guarded like the others."""
    first_run_all_succeeded(ledger, ["a"])
    ledger.upsert_items(WL, "r1", [prep("b"), prep("c")])
    staged = [
        (item_key("a"), "v1", "succeeded", "submitted", "x", "r1", None, None, None, None),  # forbidden move
        (item_key("b"), "v1", "pending", "staged", "x", "r1", None, None, None, None),  # allowed
        (item_key("c"), "v1", "staged", "submitted", "x", "r1", None, None, None, None),  # stale read
    ]
    with ledger.engine.begin() as conn:
        store._stage(conn, store.ITEMS_STAGE, staged)
        moved = _transition(
            conn, utcnow(), staged=store.ITEMS_STAGE, workload=WL, targets={"pending", "staged", "submitted"}
        )
    assert moved == Moved(moved=1, refused=2)
    assert [item(ledger, k)["state"] for k in ("a", "b", "c")] == ["succeeded", "staged", "pending"]


# ---------------------------------------------------------------------------------------------- set-based reconcile
# apply_results decides every line in SQL (one UPDATE ... FROM over a staged slice): these try to
# break the rules that path must keep, with slices of 2 lines so that lines meet inside one slice
# and across slices.


def two_attempts_in_one_job(ledger: Ledger) -> tuple[str, str, str]:
    """A job that carries two attempts of item "a" (the chunker never builds one, and ``record_job``
    refuses it on PostgreSQL: the second attempt is a hostile row written by hand): return the job
    and the custom ids of attempts 1 and 2 (2 is the item's current one)."""
    ledger.upsert_items(WL, "r1", [prep("a")])
    key = item_key("a")
    cid1, cid2 = make_custom_id(key, 1, 0), make_custom_id(key, 2, 0)
    job_id = f"{WL}:r1:r1:c00000"
    ledger.record_job(
        job_row(WL, "r1", 2, job_id=job_id, staged_path="/staging/x.jsonl"),
        [(key, "v1", cid2, 2)],
    )
    now = utcnow()
    with ledger.engine.begin() as conn:
        conn.execute(
            s.attempts.insert().values(
                job_id=job_id,
                custom_id=cid1,
                workload=WL,
                item_key=key,
                prompt_version="v1",
                run_id="r1",
                attempt=1,
                mode="batch",
                created_at=now,
                updated_at=now,
            )
        )
    ledger.mark_submitted(job_id, "batch_x", "file-x")
    assert item(ledger, "a")["custom_id"] == cid2
    return job_id, cid1, cid2


def test_two_lines_for_one_item_in_one_slice_apply_in_line_order(ledger: Ledger) -> None:
    """The current attempt fails, then the older attempt's success lands: the success is taken."""
    job_id, cid1, cid2 = two_attempts_in_one_job(ledger)
    stats = ledger.apply_results(job_id, [fail(cid2), ok(cid1, {"from": 1})], cost_of)
    assert (stats.applied, stats.late) == (2, 0)
    row = item(ledger, "a")
    assert (row["state"], row["custom_id"], json.loads(row["output_json"]), row["route"]) == (
        "succeeded",
        cid1,
        {"from": 1},
        "batch",
    )


def test_two_lines_for_one_item_in_one_slice_in_the_other_order_keep_the_first_success(
    ledger: Ledger,
) -> None:
    """The older attempt's success lands first; the current attempt's failure after it is late."""
    job_id, cid1, cid2 = two_attempts_in_one_job(ledger)
    stats = ledger.apply_results(job_id, [ok(cid1, {"from": 1}), fail(cid2)], cost_of)
    assert (stats.applied, stats.late) == (1, 1)
    row = item(ledger, "a")
    assert (row["state"], row["custom_id"], row["error_code"]) == ("succeeded", cid1, None)
    assert [(a["outcome"], a["discarded"]) for a in attempts_of(ledger, "a")] == [
        ("succeeded", False),
        ("failed_retryable", False),
    ]
    before = snapshot(ledger)
    ledger.apply_results(job_id, [ok(cid1, {"from": 1}), fail(cid2)], cost_of)
    assert snapshot(ledger) == before


def test_a_duplicate_line_inside_one_slice_and_across_slices_is_applied_once(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "APPLY_SLICE", 2)
    ids = ["a", "b", "c"]
    ledger.upsert_items(WL, "r1", [prep(x) for x in ids])
    job_id, cids = submit(ledger, "r1", ids)
    lines = [
        ok(cids["a"], {"n": 1}),
        ok(cids["a"], {"n": 2}),  # same slice
        fail(cids["b"]),
        ok(cids["c"]),
        ok(cids["b"], {"n": 3}),  # a later slice contradicts an earlier line: the first one counts
        fail(cids["a"]),
    ]
    stats = ledger.apply_results(job_id, lines, cost_of)
    assert (stats.applied, stats.duplicates, stats.late, stats.unknown) == (3, 3, 0, 0)
    assert stats.outcomes == {"succeeded": 2, "failed_retryable": 1}
    assert json.loads(item(ledger, "a")["output_json"]) == {"n": 1}
    assert item(ledger, "b")["state"] == "failed_retryable"
    assert [len(attempts_of(ledger, x)) for x in ids] == [1, 1, 1]


def test_lines_for_items_already_final_never_change_their_state(ledger: Ledger) -> None:
    """Succeeded, in review, skipped: a line of the current attempt that comes after is kept as cost only."""
    ids = ["done", "reviewed", "skipped"]
    ledger.upsert_items(WL, "r1", [prep(x) for x in ids])
    job_id, cids = submit(ledger, "r1", ids)
    ledger.apply_results(job_id, [ok(cids["done"], {"kept": True})], cost_of)
    ledger.transition(WL, "r1", "review", ["submitted"], keys=[(item_key("reviewed"), "v1")])
    ledger.transition(WL, "r1", "skipped", ["submitted"], keys=[(item_key("skipped"), "v1")])
    before = {x: item(ledger, x) for x in ids}
    stats = ledger.apply_results(
        job_id,
        [
            fail(cids["done"], "failed_permanent", usage=Usage(3, 0)),
            ok(cids["reviewed"]),
            ok(cids["skipped"]),
        ],
        cost_of,
    )
    assert (stats.applied, stats.late) == (0, 3)
    for x in ids:
        after = item(ledger, x)
        assert {k: after[k] for k in ("state", "output_json", "custom_id", "error_code", "route")} == {
            k: before[x][k] for k in ("state", "output_json", "custom_id", "error_code", "route")
        }
    assert [a["discarded"] for x in ("reviewed", "skipped") for a in attempts_of(ledger, x)] == [True, True]
    # the provider's later word on the line is recorded as cost; the item keeps its result
    (done,) = attempts_of(ledger, "done")
    assert (done["outcome"], done["cost_nusd"]) == ("failed_permanent", to_nusd(cost_of(Usage(3, 0))))
    assert json.loads(item(ledger, "done")["output_json"]) == {"kept": True}


def test_unknown_lines_with_ids_of_any_length_or_text_are_counted_and_touch_nothing(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job_id, cids = submit(ledger, "r1", ["a"])
    before = snapshot(ledger)
    strangers = ["x" * 300, HOSTILE, "", cids["a"] + " "]
    stats = ledger.apply_results(job_id, [ok(c) for c in strangers], cost_of)
    assert (stats.unknown, stats.applied, stats.late, stats.outcomes) == (4, 0, 0, {})
    assert snapshot(ledger) == before


def test_a_mixed_batch_over_many_slices_lands_as_line_by_line_application_would(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Current, late, discarded, unknown, duplicate and final-item lines mixed in one pass of 3-line slices."""
    monkeypatch.setattr(store, "APPLY_SLICE", 3)
    job1, cid1, job2, cid2 = retried_once(ledger, "late")  # job1's line for "late" is an older attempt
    ids = ["ok", "retry", "perm", "gone_skipped", "bad"]
    ledger.upsert_items(WL, "r1", [prep(x) for x in ids])
    job3, cids = submit(ledger, "r1", ids, round_=2, chunk=1)
    ledger.transition(WL, "r1", "skipped", ["submitted"], keys=[(item_key("gone_skipped"), "v1")])
    invalid = ItemResult(
        cids["bad"], "invalid_output", output="x", usage=Usage(9, 9), error_code="invalid_output"
    )
    lines = [
        ok(cids["ok"], {"v": "ok"}),
        ok("stranger__a1c9"),
        fail(cids["retry"], usage=Usage(4, 0)),
        ok(cids["ok"], {"v": "again"}),
        fail(cids["perm"], "failed_permanent"),
        ok(cids["gone_skipped"], usage=Usage(8, 8)),
        invalid,
    ]
    stats = ledger.apply_results(job3, lines, cost_of)
    assert (stats.applied, stats.late, stats.duplicates, stats.unknown) == (4, 1, 1, 1)
    assert stats.outcomes == {
        "succeeded": 2,
        "failed_retryable": 1,
        "failed_permanent": 1,
        "invalid_output": 1,
    }
    assert {x: item(ledger, x)["state"] for x in ids} == {
        "ok": "succeeded",
        "retry": "failed_retryable",
        "perm": "failed_permanent",
        "gone_skipped": "skipped",
        "bad": "failed_retryable",
    }
    assert json.loads(item(ledger, "ok")["output_json"]) == {"v": "ok"}
    assert [(a["outcome"], a["discarded"]) for a in attempts_of(ledger, "gone_skipped")] == [
        ("succeeded", True)
    ]
    assert [(a["outcome"], a["discarded"]) for a in attempts_of(ledger, "bad")] == [("invalid_output", True)]
    # the older attempt of "late" answers a success while its newer attempt is out: it is taken
    stats = ledger.apply_results(job1, [ok(cid1, {"from": 1})], cost_of)
    assert (stats.applied, item(ledger, "late")["custom_id"]) == (1, cid1)
    # and the newer attempt's answer after it is paid for, discarded, never a second result
    stats = ledger.apply_results(job2, [ok(cid2, {"from": 2})], cost_of)
    assert (stats.applied, stats.late) == (0, 1)
    assert json.loads(item(ledger, "late")["output_json"]) == {"from": 1}
    assert [a["discarded"] for a in attempts_of(ledger, "late")] == [False, True]
    cost = sum(a["cost_nusd"] for x in [*ids, "late"] for a in attempts_of(ledger, x))
    assert cost == sum(
        to_nusd(cost_of(r.usage))
        for r in [lines[0], lines[2], lines[4], lines[5], invalid, ok("l1"), ok("l2")]
    )


def test_a_staged_write_on_sqlite_takes_the_write_lock_before_it_reads(tmp_path: Path) -> None:
    # A transaction whose first write went to a temporary staging table read the ledger, then
    # wrote it: a commit by another process in between made SQLite refuse the write at once
    # ("database is locked", no busy wait: a stale snapshot), seen in apply_results while a prune
    # ran in another process (tests/unit/ledger/test_retention.py).
    import sqlite3

    path = tmp_path / "lock.sqlite"
    ledger = Ledger.from_url(f"sqlite:///{path}")
    other = sqlite3.connect(path, timeout=0)
    try:
        with ledger.engine.begin() as conn:
            store._stage(conn, store.ITEMS_STAGE, [])
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        ledger.engine.dispose()
