"""What a delivery row is keyed and compared by: an item's key for one sink, the digest of its values."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_batch_provider.ledger import digests
from airflow_batch_provider.ledger.digests import (
    delivery_key,
    delivery_keys,
    text_sha256,
    value_json,
    values_sha256,
)


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


@pytest.mark.parametrize("c_encoder", [True, False], ids=["C encoder", "Python encoder"])
def test_a_json_writer_writes_what_the_standard_encoder_writes_with_the_same_settings(
    monkeypatch: pytest.MonkeyPatch, c_encoder: bool
) -> None:
    from datetime import date

    if not c_encoder:  # an interpreter without the C encoder
        monkeypatch.setattr(digests, "c_make_encoder", None)
    value: Any = {
        "b": ['quote " é 雪 \u2028', None, True, 0.1, float("nan")],
        "a": {"z": 1, "y": date(2026, 12, 4)},
    }
    for item, key in ((", ", ": "), (",", ":")):
        for sort_keys in (True, False):
            expected = json.dumps(
                value, ensure_ascii=False, default=str, sort_keys=sort_keys, separators=(item, key)
            )
            assert digests.json_writer(item, key, sort_keys=sort_keys)(value) == expected


@pytest.mark.parametrize("c_encoder", [True, False], ids=["C encoder", "Python encoder"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["NaN", "inf", "-inf"])
def test_a_finite_json_writer_refuses_a_nan_or_an_infinity_anywhere_and_writes_finite_values_as_before(
    monkeypatch: pytest.MonkeyPatch, c_encoder: bool, bad: float
) -> None:
    if not c_encoder:
        monkeypatch.setattr(digests, "c_make_encoder", None)
    write = digests.json_writer(",", ":", sort_keys=False, finite=True)
    assert write([[1, "a\tb", 0.5, None, True]]) == '[[1,"a\\tb",0.5,null,true]]'
    with pytest.raises(ValueError):
        write([[1, "a", 0.5], [2, "b", bad]])
    assert digests.json_writer(",", ":", sort_keys=False)([bad]) == json.dumps([bad])
