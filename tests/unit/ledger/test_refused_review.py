"""Rows a sink refused, listed beside the review queue's items until a later delivery writes them."""

from __future__ import annotations

from pathlib import Path

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries
from airflow_batch_provider.ledger.handoffs import acknowledge, pending_for, settle
from airflow_batch_provider.ledger.refused_review import SINK_REFUSED, refused_review_rows
from tests.unit.ledger.nights import night
from tests.unit.services.workload import RUN, WORKLOAD, world


def test_a_refused_row_is_listed_with_the_sinks_message_under_sink_refused_and_under_no_other_code(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        record_deliveries(
            w.ledger,
            WORKLOAD,
            "tickets",
            RUN,
            [
                Delivery("k1", "a1", "v1", "delivered", "h1"),
                Delivery("k2", "a2", "v1", "refused", "h2", 'null value in column "label"'),
            ],
        )
        (row,) = refused_review_rows(w.ledger, WORKLOAD)
        assert (row.item_key, row.app_id, row.prompt_version, row.sink, row.run_id) == (
            "k2",
            "a2",
            "v1",
            "tickets",
            RUN,
        )
        assert (row.error_code, row.error_message) == (SINK_REFUSED, 'null value in column "label"')
        assert refused_review_rows(w.ledger, WORKLOAD, error_code=SINK_REFUSED) == [row]
        assert refused_review_rows(w.ledger, WORKLOAD, error_code="in_doubt") == []
        assert refused_review_rows(w.ledger, "another_workload") == []


def test_a_refused_row_leaves_the_listing_once_a_later_delivery_writes_it(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        refused = [Delivery(f"k{i}", f"a{i}", "v1", "refused", f"h{i}", "too long") for i in range(3)]
        record_deliveries(w.ledger, WORKLOAD, "tickets", RUN, refused)
        assert len(refused_review_rows(w.ledger, WORKLOAD)) == 3
        assert len(refused_review_rows(w.ledger, WORKLOAD, limit=2)) == 2
        record_deliveries(
            w.ledger, WORKLOAD, "tickets", "run2", [Delivery("k1", "a1", "v1", "delivered", "h1")]
        )
        assert sorted(r.app_id for r in refused_review_rows(w.ledger, WORKLOAD)) == ["a0", "a2"]


def test_a_consumers_failed_hand_off_is_listed_until_a_newer_answer_of_its_item_is_acknowledged_or_left_out(
    ledger: Ledger,
) -> None:
    inputs = {"a1": "one", "a2": "two"}
    night(ledger, "wl", "r1", inputs)
    offered = pending_for(ledger, "wl", "crm", "r1")
    assert [settle(ledger, "wl", "crm", [h.key], "refused", "HTTP 503") for h in offered] == [1, 1]
    assert [(r.sink, r.app_id, r.error_message) for r in refused_review_rows(ledger, "wl")] == [
        ("crm", "a2", "HTTP 503"),
        ("crm", "a1", "HTTP 503"),
    ]
    # a new prompt version: a1's new answer is acted on, a2's left out; the v1 failures are moot
    night(ledger, "wl", "r2", inputs, version="v2")
    a1, a2 = pending_for(ledger, "wl", "crm", "r2")
    assert acknowledge(ledger, "wl", "crm", [a1.key]) == 1
    assert [r.app_id for r in refused_review_rows(ledger, "wl")] == ["a2"]
    assert settle(ledger, "wl", "crm", [a2.key], "left_out") == 1
    assert refused_review_rows(ledger, "wl") == []
