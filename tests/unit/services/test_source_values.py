"""Each driver value type becomes JSON explicitly, or a reject that names its column and the fix."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest

from airflow_batch_provider.services.source_values import UnsupportedValue, json_safe, row_record


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("12.50"), "12.50"),
        (Decimal("100"), 100),
        (Decimal("1E+2"), 100),
        (dt.datetime(2026, 12, 1, 10, 30, tzinfo=dt.timezone.utc), "2026-12-01T10:30:00+00:00"),
        (dt.date(2026, 12, 1), "2026-12-01"),
        (dt.time(7, 5), "07:05:00"),
        (dt.timedelta(minutes=2), 120.0),
        (b"caf\xc3\xa9", "café"),
        (memoryview(b"ok"), "ok"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        ([Decimal("1.5"), dt.date(2026, 1, 2)], ["1.5", "2026-01-02"]),
        ({"at": dt.date(2026, 1, 2)}, {"at": "2026-01-02"}),
        (None, None),
        (True, True),
    ],
)
def test_a_driver_value_becomes_the_json_the_template_renders(value: object, expected: object) -> None:
    assert json_safe(value, "c") == expected
    json.dumps(json_safe(value, "c"))


@pytest.mark.parametrize(
    ("value", "code", "fix"),
    [
        (b"\xff\xfe", "invalid_utf8", "convert them to text in the query"),
        (float("nan"), "unsupported_value", "map it to NULL"),
        (Decimal("NaN"), "unsupported_value", "filter it out"),
        (object(), "unsupported_value", "CAST(c AS TEXT)"),
    ],
)
def test_a_value_json_cannot_hold_is_refused_naming_the_column_and_the_fix(
    value: object, code: str, fix: str
) -> None:
    with pytest.raises(UnsupportedValue, match="column 'c'") as caught:
        json_safe(value, "c")
    assert caught.value.code == code and fix in str(caught.value)


def test_a_row_gives_its_id_column_to_the_prompts_id_field_and_keeps_its_fields_when_a_value_is_bad() -> None:
    rec = row_record(
        {"ticket_id": 7, "text": "hi", "raw": b"\xff"},
        id_column="ticket_id",
        id_field="id",
        position=3,
        where="page 2, row 1",
    )
    assert rec.value == {"ticket_id": 7, "text": "hi", "id": 7}
    assert (
        rec.problem is not None
        and rec.problem[0] == "invalid_utf8"
        and rec.problem[1].startswith("page 2, row 1:")
    )
    assert rec.position == 3 and rec.line is None and json.loads(rec.raw or "")["id"] == 7


def test_a_row_with_a_null_id_is_a_missing_id_reject_naming_its_place() -> None:
    rec = row_record(
        {"id": None, "text": "hi"}, id_column="id", id_field="id", position=0, where="row group 1, row 4"
    )
    assert (
        rec.problem is not None and rec.problem[0] == "missing_id" and "row group 1, row 4" in rec.problem[1]
    )
