"""Delivery records: one row per sink, item and prompt version, written through one guarded upsert."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_batch_provider.ledger.deliveries import (
    Delivery,
    acknowledge,
    delivery_counts,
    delivery_rows,
    pending_for,
    record_deliveries,
    values_sha256,
)
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import publish_run


def test_a_repeated_delivery_adds_no_row_and_a_changed_answer_updates_the_one_it_has(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        first = [
            Delivery("k1", "a1", "v1", "delivered", "h1"),
            Delivery("k2", "a2", "v1", "refused", "h2", "no"),
        ]
        record_deliveries(w.ledger, WORKLOAD, "sink", RUN, first)
        record_deliveries(w.ledger, WORKLOAD, "sink", RUN, first)  # a cleared try records the same
        rows = delivery_rows(w.ledger, WORKLOAD, "sink")
        assert [(r["app_id"], r["state"], r["writes"], r["error"]) for r in rows] == [
            ("a1", "delivered", 1, None),
            ("a2", "refused", 1, "no"),
        ]
        record_deliveries(
            w.ledger,
            WORKLOAD,
            "sink",
            "run2",
            [Delivery("k1", "a1", "v1", "delivered", "h1b"), Delivery("k2", "a2", "v1", "delivered", "h2")],
        )
        rows = delivery_rows(w.ledger, WORKLOAD, "sink")
        assert [(r["app_id"], r["state"], r["result_sha256"], r["writes"], r["run_id"]) for r in rows] == [
            ("a1", "delivered", "h1b", 2, "run2"),
            ("a2", "delivered", "h2", 2, "run2"),
        ]
        assert delivery_counts(w.ledger, WORKLOAD, "run2") == {"sink": {"delivered": 2}}


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


def test_a_rows_digest_is_the_sha256_of_its_values_as_sorted_json_whatever_their_types() -> None:
    import hashlib
    import json
    from datetime import date
    from decimal import Decimal

    cases: list[dict[Any, Any]] = [
        {"ticket_id": 12, "sentiment": "neutral", "confidence": 0.73},
        {"b": 'quote " back \\ tab \t nl \n ctl \x01 é 雪 \u2028', "a": None, "c": True, "d": False},
        {"x": float("nan"), "y": float("inf"), "z": -float("inf"), "w": -0.0, "v": 1e300, "u": 10**30},
        {"nested": {"k": [1, "two"]}, "day": date(2026, 12, 1), "money": Decimal("1.10")},
        {"1": "one", "10": "ten", "2": "two", "B": 1, "a": 2},
        {},
    ]
    for values in cases:
        expected = json.dumps(values, sort_keys=True, ensure_ascii=False, default=str)
        assert values_sha256(values) == hashlib.sha256(expected.encode("utf-8")).hexdigest(), values
