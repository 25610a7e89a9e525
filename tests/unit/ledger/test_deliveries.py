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
    delivery_rows,
    record_delivered,
    record_deliveries,
)
from airflow_batch_provider.ledger.digests import delivery_key
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


def test_a_batch_recorded_whole_as_delivered_moves_each_row_as_the_same_rows_recorded_one_by_one_do(
    tmp_path: Path, ledger_url: str
) -> None:
    before = [
        Delivery("k1", "a1", "v1", "delivered", "h1"),
        Delivery("k2", "a2", "v1", "refused", "h2", "no"),
        Delivery("k3", "a3", "v1", "delivered", "h3"),
    ]
    batch = [
        ("k1", "a1", "v1", "h1"),
        ("k2", "a2", "v1", "h2"),
        ("k3", "a3", "v1", "h3b"),
        ("k4", "a4", "v2", "h4"),
    ]
    with world(tmp_path, ledger_url=ledger_url) as w:
        for sink in ("whole", "rows"):
            record_deliveries(w.ledger, WORKLOAD, sink, RUN, before)
        record_delivered(w.ledger, WORKLOAD, "whole", "run2", batch)
        record_deliveries(
            w.ledger, WORKLOAD, "rows", "run2", [Delivery(k, a, v, "delivered", h) for k, a, v, h in batch]
        )
        found = {}
        for sink in ("whole", "rows"):
            rows = delivery_rows(w.ledger, WORKLOAD, sink)
            assert [r["delivery_key"] for r in rows] == [
                delivery_key(WORKLOAD, sink, r["app_id"], r["prompt_version"]) for r in rows
            ]
            found[sink] = [
                tuple(
                    r[k]
                    for k in (
                        "app_id",
                        "prompt_version",
                        "item_key",
                        "state",
                        "result_sha256",
                        "error",
                        "run_id",
                        "writes",
                    )
                )
                for r in rows
            ]
    assert (
        found["whole"]
        == found["rows"]
        == [
            ("a1", "v1", "k1", "delivered", "h1", None, RUN, 1),  # the same values: not written again
            ("a2", "v1", "k2", "delivered", "h2", None, "run2", 2),
            ("a3", "v1", "k3", "delivered", "h3b", None, "run2", 2),
            ("a4", "v2", "k4", "delivered", "h4", None, "run2", 1),
        ]
    )


def test_a_batchs_rows_go_to_json_each_as_the_standard_encoder_writes_them_whatever_their_text() -> None:
    rows = [
        ('a"b', "v\\1", "k\u00e9", "\n\t\x00\x1f", "\u65e5\u672c", None),
        ("\U0001f600", "", "\u2028", "</script>", "0" * 64, "it's"),
    ]
    written = deliveries._rows_json(rows)
    assert written == json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(written) == [list(row) for row in rows]


def stored_keys(ledger: Ledger) -> dict[tuple[str, str], str]:
    """Each row's delivery key as the table keeps it, by (sink, application id)."""
    with ledger.engine.connect() as conn:
        found = conn.exec_driver_sql("SELECT sink, app_id, delivery_key FROM abp_deliveries").all()
    return {(sink, app_id): key for sink, app_id, key in found}


def test_a_sinks_rows_are_kept_without_their_delivery_key_a_consumers_with_it_and_every_row_is_read_with_it(
    tmp_path: Path, ledger_url: str
) -> None:
    def key(sink: str, app_id: str) -> str:
        return delivery_key(WORKLOAD, sink, app_id, "v1")

    with world(tmp_path, ledger_url=ledger_url) as w:
        # a sink's row an earlier version of the package wrote with its key: rewritten, it keeps it
        record_deliveries(w.ledger, WORKLOAD, "sink", RUN, [Delivery("k0", "a0", "v1", "delivered", "h0")])
        record_delivered(
            w.ledger, WORKLOAD, "sink", "run2", [("k0", "a0", "v1", "h0b"), ("k1", "a1", "v1", "h1")]
        )
        record_deliveries(
            w.ledger,
            WORKLOAD,
            "sink",
            "run2",
            [
                Delivery("k2", "a2", "v1", "refused", "h2", "no"),
                Delivery("k3", "a3", "v1", "delivered", "h3"),
            ],
            keyed=False,
        )
        record_deliveries(w.ledger, WORKLOAD, "consumer", RUN, [Delivery("k1", "a1", "v1", "offered", "c1")])
        record_deliveries(
            w.ledger, WORKLOAD, "consumer", RUN, [Delivery("k1", "a1", "v1", "refused", "c1", "x")]
        )
        assert stored_keys(w.ledger) == {
            ("sink", "a0"): key("sink", "a0"),
            ("sink", "a1"): "",
            ("sink", "a2"): "",
            ("sink", "a3"): "",
            ("consumer", "a1"): key("consumer", "a1"),
        }
        for sink in ("sink", "consumer"):
            rows = delivery_rows(w.ledger, WORKLOAD, sink)
            assert [r["delivery_key"] for r in rows] == [key(sink, r["app_id"]) for r in rows]
        assert [r["result_sha256"] for r in delivery_rows(w.ledger, WORKLOAD, "sink")] == [
            "h0b",
            "h1",
            "h2",
            "h3",
        ]
