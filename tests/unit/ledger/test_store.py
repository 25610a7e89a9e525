from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import InvalidTransitionError, LedgerError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import PreparedItem, UpsertStats, from_nusd, to_nusd

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


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    opened = Ledger.from_url(ledger_url)
    try:
        yield opened
    finally:
        opened.engine.dispose()


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
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": WL,
            "run_id": run_id,
            "round": round_,
            "chunk_index": chunk,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "idempotency_key": f"key-{job_id}",
            "staged_path": f"/staging/{job_id}.jsonl",
            "input_sha256": "0" * 64,
            "lines": len(placements),
            "size_bytes": 100 * len(placements),
        },
        placements,
    )
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


def test_upserting_again_in_the_same_run_changes_nothing(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    before = snapshot(ledger)
    assert ledger.upsert_items(WL, "r1", [prep("a"), prep("b", text="edited meanwhile")]) == UpsertStats(
        already_in_run=2
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
    assert [j["job_id"] for j in ledger.jobs_for(WL, "r1")] == [job_id]


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
        ledger.job("nope")


def test_mark_submitted_records_the_batch_and_moves_only_that_jobs_staged_items(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b"), prep("c")])
    job0, _ = stage(ledger, "r1", ["a", "b"], chunk=0)
    job1, _ = stage(ledger, "r1", ["c"], chunk=1)
    ledger.mark_submitted(job0, "batch_abc", "file-xyz")
    job = ledger.job(job0)
    assert (job["state"], job["batch_id"], job["input_ref"]) == ("submitted", "batch_abc", "file-xyz")
    assert job["submitted_at"] is not None
    assert ledger.job(job1)["state"] == "staged"
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


def test_nano_dollars_convert_exactly_both_ways() -> None:
    assert to_nusd(Decimal("0.000000001")) == 1
    assert to_nusd(Decimal("0.0000000015")) == 2
    assert to_nusd(Decimal("12.345678901")) == 12_345_678_901
    assert from_nusd(12_345_678_901) == Decimal("12.345678901")
