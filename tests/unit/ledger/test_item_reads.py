"""The item-reads room: a run's items streamed back in key order, a page per short read."""

from __future__ import annotations

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import ItemOutcome, ItemRef, ItemRow, JobRow, OpenItem
from tests.unit.ledger.store_support import (
    WL,
    prep,
    stage,
)

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
