"""Delivery records: one row per sink, item and prompt version, written through one guarded upsert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batch_provider.ledger.deliveries import (
    Delivery,
    delivery_counts,
    delivery_rows,
    record_deliveries,
    values_sha256,
)
from tests.unit.services.workload import RUN, WORKLOAD, world

WL = "consumers"


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


def test_a_rows_digest_is_the_sha256_of_its_values_as_sorted_json_whatever_their_types() -> None:
    import hashlib
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
