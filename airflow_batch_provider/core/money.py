"""Money as the ledger stores it: integer nano-dollars (no float ever holds a price or a cost)."""

from __future__ import annotations

from decimal import Decimal

#: Nano-dollars in a dollar.
NANO = Decimal(1_000_000_000)


def to_nusd(amount: Decimal) -> int:
    """Convert dollars to integer nano-dollars (rounded half-up).

    :param amount: dollars
    """
    return int((amount * NANO).to_integral_value(rounding="ROUND_HALF_UP"))


def from_nusd(nusd: int) -> Decimal:
    """Convert integer nano-dollars to dollars.

    :param nusd: nano-dollars
    """
    return Decimal(nusd) / NANO
