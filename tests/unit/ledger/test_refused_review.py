"""Rows a sink refused, listed beside the review queue's items until a later delivery writes them."""

from __future__ import annotations

from pathlib import Path

from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries
from airflow_batch_provider.ledger.refused_review import SINK_REFUSED, refused_review_rows
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
