"""The review and audit room: the review queue and a person's re-drive, resolve and skip."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import ItemRow
from airflow_batch_provider.ledger.store import UpsertStats
from tests.unit.ledger.store_support import (
    WL,
    in_review_after_run_one,
    item,
    prep,
    submit,
)

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
