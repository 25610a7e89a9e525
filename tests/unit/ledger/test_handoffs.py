"""Consumer hand-offs: the answers a consumer has not acknowledged, each with a stable key, once acted on never again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import delivery_rows
from airflow_batch_provider.ledger.handoffs import (
    acknowledge,
    handoff_states,
    note_handoffs_in_report,
    pending_for,
    settle,
)
from tests.unit.ledger.nights import night
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import publish_run

WL = "consumers"


def test_a_consumer_that_crashes_before_acknowledging_gets_the_same_keys_and_never_an_acknowledged_item(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        publish_run(w, 4)
        offered = pending_for(w.ledger, WORKLOAD, "tickets")
        assert sorted(h.app_id for h in offered) == ["i0", "i1", "i2", "i3"]
        # the consumer crashed before acknowledging: the same items, the same keys
        again = pending_for(w.ledger, WORKLOAD, "tickets")
        assert [(h.app_id, h.key) for h in again] == [(h.app_id, h.key) for h in offered]
        assert len({h.key for h in offered}) == 4
        assert acknowledge(w.ledger, WORKLOAD, "tickets", [offered[0].key, offered[1].key]) == 2
        assert acknowledge(w.ledger, WORKLOAD, "tickets", [offered[0].key, "never-offered"]) == 0
        rest = pending_for(w.ledger, WORKLOAD, "tickets")
        assert [(h.app_id, h.key) for h in rest] == [(h.app_id, h.key) for h in offered[2:]]
        # another consumer keeps its own keys and acknowledgements
        other = pending_for(w.ledger, WORKLOAD, "emails", run_id=RUN)
        assert len(other) == 4 and not {h.key for h in other} & {h.key for h in offered}
        assert acknowledge(w.ledger, WORKLOAD, "tickets", [h.key for h in rest]) == 2
        assert pending_for(w.ledger, WORKLOAD, "tickets") == []
        states = {r["state"] for r in delivery_rows(w.ledger, WORKLOAD, "tickets")}
        assert states == {"acknowledged"}


def test_a_consumer_pages_past_the_hand_offs_it_leaves_unacknowledged_and_its_filter_left_out_stay_out(
    ledger: Ledger,
) -> None:
    night(ledger, WL, "r1", {f"a{n}": "text" for n in range(5)})
    first = pending_for(ledger, WL, "crm", "r1", limit=2)
    assert settle(ledger, WL, "crm", [first[0].key], "refused", "HTTP 503") == 1
    assert settle(ledger, WL, "crm", [first[1].key], "left_out") == 1
    second = pending_for(
        ledger, WL, "crm", "r1", limit=2, after=(first[-1].item_key, first[-1].prompt_version)
    )
    third = pending_for(
        ledger, WL, "crm", "r1", limit=2, after=(second[-1].item_key, second[-1].prompt_version)
    )
    assert [h.app_id for h in [*first, *second, *third]] == sorted(
        (f"a{n}" for n in range(5)), key=lambda a: item_key(a)
    )
    assert (
        pending_for(ledger, WL, "crm", "r1", limit=2, after=(third[-1].item_key, third[-1].prompt_version))
        == []
    )
    # the next try: the failed one again (its key unchanged), the left-out one not; a key twice counts once
    assert [h.key for h in pending_for(ledger, WL, "crm", "r1", limit=1)] == [first[0].key]
    assert acknowledge(ledger, WL, "crm", [first[0].key, first[0].key, first[1].key]) == 1
    assert settle(ledger, WL, "crm", [first[0].key], "refused", "late") == 0  # acknowledged stays
    assert handoff_states(ledger, WL, "crm", "r1") == {"acknowledged": 1, "left_out": 1, "offered": 3}


def test_a_consumers_counts_in_the_report_are_the_ledgers_and_a_rerun_replaces_them(ledger: Ledger) -> None:
    night(ledger, WL, "r1", {"a1": "x", "a2": "y", "a3": "z"})
    a1, a2, a3 = sorted(pending_for(ledger, WL, "crm", "r1"), key=lambda h: h.app_id)
    acknowledge(ledger, WL, "crm", [a1.key])
    settle(ledger, WL, "crm", [a2.key], "left_out")
    settle(ledger, WL, "crm", [a3.key], "refused", "HTTP 503")
    written: list[dict[str, Any]] = []
    report = note_handoffs_in_report(
        ledger, WL, "r1", "crm", {"acted": 1, "messages": ["a3: HTTP 503"]}, then=written.append
    )
    entry = {
        "kind": "consumer",
        "acted": 1,
        "already_acknowledged": 0,
        "left_out": 1,
        "failed": 1,
        "pending": 0,
        "messages": ["a3: HTTP 503"],
    }
    assert report is not None and report["deliveries"]["crm"] == entry and written == [report]
    assert report["night"] == "r1"  # the rest of the report is kept
    (again,) = pending_for(ledger, WL, "crm", "r1")
    acknowledge(ledger, WL, "crm", [again.key])
    rerun = note_handoffs_in_report(ledger, WL, "r1", "crm", {"acted": 1})
    assert rerun is not None and rerun["deliveries"]["crm"] == {
        **entry,
        "already_acknowledged": 1,
        "failed": 0,
        "messages": [],
    }
    stored = json.loads(ledger.runs(WL)[0]["report_json"])
    assert stored["deliveries"] == rerun["deliveries"]
    assert note_handoffs_in_report(ledger, WL, "never-published", "crm", {}) is None


def test_an_acknowledged_item_is_not_offered_again_when_a_later_run_changes_its_answer_under_that_version(
    ledger: Ledger,
) -> None:
    night(ledger, WL, "r1", {"a1": "first text"}, outputs={"a1": {"label": "negative"}})
    (handed,) = pending_for(ledger, WL, "crm")
    assert acknowledge(ledger, WL, "crm", [handed.key]) == 1
    # the input changed, so r2 answers it again under v1, with another answer
    night(ledger, WL, "r2", {"a1": "second text"}, outputs={"a1": {"label": "positive"}})
    assert pending_for(ledger, WL, "crm") == []  # the side effect happened once: never a second time
    assert pending_for(ledger, WL, "crm", "r2") == []
