"""Delivery records: one row per sink, item and prompt version, written through one guarded upsert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.ledger import Ledger, deliveries
from airflow_batch_provider.ledger.deliveries import (
    Delivery,
    delivery_counts,
    delivery_key,
    delivery_keys,
    delivery_rows,
    record_deliveries,
    text_sha256,
    value_json,
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


def test_an_items_delivery_key_is_the_same_sha256_prefix_one_at_a_time_or_many_for_one_sink() -> None:
    import hashlib

    # the key a consumer passes on to an external API: it must never change for the same item
    cases = [("wl", "tickets", "12", "v1"), ("wl é", "sink_雪", "a\x1fb", ""), ("", "", "", "v2")]
    for workload, sink, app_id, version in cases:
        raw = "\x1f".join((workload, sink, app_id, version)).encode("utf-8")
        expected = hashlib.sha256(raw).hexdigest()[:32]
        assert delivery_key(workload, sink, app_id, version) == expected
        assert delivery_keys(workload, sink)(app_id, version) == expected
    many = delivery_keys("wl", "tickets")
    assert [many(str(i), "v1") for i in range(3)] == [
        delivery_key("wl", "tickets", str(i), "v1") for i in range(3)
    ]


def test_a_values_json_is_what_the_digests_encoder_writes_for_it_whatever_its_type() -> None:
    import enum
    from datetime import date
    from decimal import Decimal

    class Label(str):
        pass

    class Level(enum.IntEnum):
        HIGH = 3

    class Ratio(float):
        def __repr__(self) -> str:
            return "a ratio"

    values: list[Any] = [
        'quote " back \\ tab \t nl \n ctl \x01 é 雪 \u2028',
        "",
        Label("sub"),
        0,
        -7,
        10**40,
        True,
        False,
        None,
        Level.HIGH,
        0.1,
        -0.0,
        1e300,
        5e-324,
        float("nan"),
        float("inf"),
        -float("inf"),
        Ratio(0.5),
        Decimal("1.10"),
        date(2026, 12, 4),
        [1, "two"],
        {"k": None},
        (1, 2),
    ]
    for value in values:
        assert value_json(value) == json.dumps(value, ensure_ascii=False, sort_keys=True, default=str), value
        members = {"a": value, "b": 1}
        text = "{" + f'"a": {value_json(value)}, "b": 1' + "}"
        assert text_sha256(text) == values_sha256(members), value


#: Every move of :data:`MOVES`, and the writes its guard refuses, as (sink, run, rows) in order.
MOVES_IN_ORDER: list[tuple[str, str, list[Delivery]]] = [
    # a key given twice in one write goes with its later values; text the JSON must carry as is
    (
        "sink",
        "r1",
        [
            Delivery("k1", "a1", "v1", "delivered", "h1"),
            Delivery("k2", "a2", "v1", "refused", "h2", 'bad "quote" \\ \u2028 é'),
            Delivery("k1", "a1", "v1", "delivered", "h1b"),
        ],
    ),
    (
        "sink",
        "r2",
        [Delivery("k1", "a1", "v1", "delivered", "h1b"), Delivery("k2", "a2", "v1", "delivered", "h2")],
    ),
    ("sink", "r3", [Delivery("k1", "a1", "v1", "refused", "h1c", "type")]),
    (
        "consumer",
        "r1",
        [Delivery("k1", "a1", "v1", "offered", "c1"), Delivery("k2", "a2", "v1", "offered", "c2")],
    ),
    (
        "consumer",
        "r1",
        [Delivery("k1", "a1", "v1", "acknowledged", "c1"), Delivery("k2", "a2", "v1", "left_out", "c2")],
    ),
    ("consumer", "r2", [Delivery("k1", "a1", "v1", "offered", "c1")]),  # acknowledged: never offered again
    (
        "consumer",
        "r2",
        [Delivery("k2", "a2", "v1", "offered", "c2b"), Delivery("k3", "a3", "v2", "refused", "c3", "x")],
    ),
]


def moved(ledger: Ledger) -> list[tuple[Any, ...]]:
    """Every delivery row, all but its time."""
    rows = delivery_rows(ledger, WORKLOAD, "sink") + delivery_rows(ledger, WORKLOAD, "consumer")
    return [tuple(v for k, v in row.items() if k != "delivered_at") for row in rows]


def test_a_sqlite_ledgers_write_through_json_each_moves_each_row_as_the_staged_write_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found: list[list[tuple[Any, ...]]] = []
    for json_functions in (True, False):
        monkeypatch.setattr(deliveries, "sqlite_json", lambda on=json_functions: on)
        ledger = Ledger.from_url(f"sqlite:///{tmp_path / f'ledger_{json_functions}.sqlite'}")
        try:
            for sink, run, rows in MOVES_IN_ORDER:
                record_deliveries(ledger, WORKLOAD, sink, run, rows)
            found.append(moved(ledger))
        finally:
            ledger.engine.dispose()
    assert found[0] == found[1]
    states = {
        (row[1], row[2]): (row[5], row[6], row[8], row[10]) for row in found[0]
    }  # state, sha, run, writes
    assert states == {
        ("sink", "a1"): ("refused", "h1c", "r3", 2),
        ("sink", "a2"): ("delivered", "h2", "r2", 2),
        ("consumer", "a1"): ("acknowledged", "c1", "r1", 2),
        ("consumer", "a2"): ("offered", "c2b", "r2", 3),
        ("consumer", "a3"): ("refused", "c3", "r2", 1),
    }
