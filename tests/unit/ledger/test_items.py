"""The items room: upsert, reject and the guarded moves of a run's items."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.exceptions import (
    InvalidTransitionError,
    LedgerError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import PreparedItem, UpsertStats
from tests.unit.ledger.store_support import (
    HOSTILE,
    WL,
    cost_of,
    fail,
    first_run_all_succeeded,
    item,
    ok,
    prep,
    snapshot,
    stage,
    submit,
)

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


def test_a_reject_in_a_new_run_leaves_an_item_another_run_has_sent_alone(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    submit(ledger, "r1", ["a"], chunk=0)
    job_b, cids = submit(ledger, "r1", ["b"], chunk=1)
    ledger.apply_results(job_b, [ok(cids["b"])], cost_of)
    rejected = [(prep(a), a, "too_long", "over the limit") for a in ("a", "b")]
    assert ledger.reject_items(WL, "r2", rejected) == 1
    assert (item(ledger, "a")["state"], item(ledger, "a")["run_id"]) == ("submitted", "r1")
    assert (item(ledger, "b")["state"], item(ledger, "b")["error_code"]) == ("review", "too_long")


# ---------------------------------------------------------------------------------------------- bulk paths


def test_a_new_item_written_in_bulk_reads_back_its_text_and_utc_timestamps_exactly(ledger: Ledger) -> None:
    """New items bypass SQLAlchemy's per-row binding (COPY / a raw executemany): nothing may shift."""
    before = utcnow()
    ledger.upsert_items(WL, "r1", [prep("a", text=HOSTILE)])
    after = utcnow()
    row = item(ledger, "a")
    assert CanonicalRequest.from_dict(json.loads(row["request_json"])) == prep("a", text=HOSTILE).request
    assert row["created_at"].utcoffset() == timedelta(0)
    assert before <= row["created_at"] == row["updated_at"] <= after
