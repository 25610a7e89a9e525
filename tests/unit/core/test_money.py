"""Money as the ledger stores it: integer nano-dollars, converted exactly both ways."""

from __future__ import annotations

from decimal import Decimal

from airflow_batch_provider.core.money import from_nusd, to_nusd


def test_nano_dollars_convert_exactly_both_ways() -> None:
    assert to_nusd(Decimal("0.000000001")) == 1
    assert to_nusd(Decimal("0.0000000015")) == 2
    assert to_nusd(Decimal("12.345678901")) == 12_345_678_901
    assert from_nusd(12_345_678_901) == Decimal("12.345678901")
