"""What the pages show of deliveries (``plugins.deliveries``), from a run's stored report and the ledger's refused rows.

The same tables on the rendered pages, after real deliveries, are in ``test_api.py`` and
``test_review.py``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from airflow_batch_provider.plugins.deliveries import consumer_table, delivery_table, refused_delivery_rows

REPORT: dict[str, Any] = {
    "deliveries": {
        "tickets_db": {"delivered": 7, "unchanged": 2, "refused": 1, "messages": ["a1: too long"]},
        "ticket_opener": {"kind": "consumer", "acted": 3, "already_acknowledged": 1, "left_out": 5},
        "a_vectors": {"delivered": "4"},
        "broken": "not an entry",
    }
}


def test_sinks_and_consumers_are_told_apart_sorted_by_name_with_every_count_a_number() -> None:
    assert delivery_table(REPORT) == [
        {"sink": "a_vectors", "delivered": 4, "unchanged": 0, "refused": 0},
        {"sink": "tickets_db", "delivered": 7, "unchanged": 2, "refused": 1},
    ]
    assert consumer_table(REPORT) == [
        {"consumer": "ticket_opener", "acted": 3, "already_acknowledged": 1, "left_out": 5, "failed": 0},
    ]


def test_a_run_not_published_or_delivered_shows_no_table() -> None:
    for report in (None, {}, {"deliveries": None}, {"deliveries": ["tickets_db"]}):
        assert delivery_table(report) == [] and consumer_table(report) == []


def test_a_refused_row_is_shown_json_safe_with_the_moment_in_utc() -> None:
    row = {
        "sink": "tickets_db",
        "app_id": "t-7",
        "prompt_version": "v2",
        "error": 'value too long for type character varying(8): "negative!"',
        "run_id": "scheduled__2026-12-01T02:00:00+00:00",
        "delivered_at": datetime(2026, 12, 1, 2, 5, 0),  # naive, as SQLite returns it: UTC
        "item_key": "not shown",
    }
    [shown] = refused_delivery_rows([row])
    assert shown == {
        "sink": "tickets_db",
        "app_id": "t-7",
        "prompt_version": "v2",
        "error": row["error"],
        "run_id": row["run_id"],
        "since": "2026-12-01T02:05:00+00:00",
    }
    aware = {**row, "delivered_at": datetime(2026, 12, 1, 3, 5, tzinfo=timezone.utc)}
    assert refused_delivery_rows([aware])[0]["since"] == "2026-12-01T03:05:00+00:00"
    json.dumps(refused_delivery_rows([row, aware]))  # JSON-safe
