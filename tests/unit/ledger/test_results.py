"""The results room: result lines applied by custom id, missing lines, the set-based reconcile."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.money import to_nusd
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import results as results_room
from airflow_batch_provider.ledger import schema as s
from tests.unit.ledger.store_support import (
    HOSTILE,
    NO_USAGE,
    SOME_USAGE,
    WL,
    attempts_of,
    cost_of,
    fail,
    item,
    ok,
    prep,
    snapshot,
    submit,
)

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
    monkeypatch.setattr(results_room, "APPLY_SLICE", 2)
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
        {
            "job_id": job_id,
            "workload": WL,
            "run_id": "r1",
            "round": 1,
            "chunk_index": 0,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "idempotency_key": f"key-{job_id}",
            "staged_path": "/staging/x.jsonl",
            "input_sha256": "0" * 64,
            "lines": 2,
            "size_bytes": 200,
        },
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
    monkeypatch.setattr(results_room, "APPLY_SLICE", 2)
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
    monkeypatch.setattr(results_room, "APPLY_SLICE", 3)
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
