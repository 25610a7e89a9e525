"""A run's published answers read a page at a time, each with the sink's record of it (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from airflow_batch_provider.ledger.candidates import candidate_pages
from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import publish_run


def test_a_runs_answers_come_in_key_order_a_page_at_a_time_each_with_what_the_sink_was_last_given(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        publish_run(w, 5)
        first = next(candidate_pages(w.ledger, WORKLOAD, "tickets", RUN, page=2))
        record_deliveries(
            w.ledger,
            WORKLOAD,
            "tickets",
            RUN,
            [
                Delivery(first[0].item_key, first[0].app_id, "v1", "delivered", "h0"),
                Delivery(first[1].item_key, first[1].app_id, "v1", "refused", "h1", "no"),
            ],
        )
        record_deliveries(  # another sink's record is not this sink's
            w.ledger,
            WORKLOAD,
            "emails",
            RUN,
            [Delivery(first[0].item_key, first[0].app_id, "v1", "delivered", "x")],
        )
        pages = list(candidate_pages(w.ledger, WORKLOAD, "tickets", RUN, page=2))
    assert [len(p) for p in pages] == [2, 2, 1]
    answers = [c for p in pages for c in p]
    assert [c.item_key for c in answers] == sorted(c.item_key for c in answers)
    assert sorted(c.app_id for c in answers) == [f"i{k}" for k in range(5)]
    assert [(c.recorded_state, c.recorded_sha256) for c in answers] == [
        ("delivered", "h0"),
        ("refused", "h1"),
        (None, None),
        (None, None),
        (None, None),
    ]
    assert all(c.state == "succeeded" and c.output for c in answers)
