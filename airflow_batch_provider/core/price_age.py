"""How old the price table is: a report priced from a table older than 90 days says so."""

from __future__ import annotations

from datetime import date
from typing import Final

#: a table older than this many days is flagged in the run's report
STALE_AFTER_DAYS: Final = 90


def price_age_warning(as_of: str, today: date) -> str | None:
    """Return a warning when the prices were read more than ``STALE_AFTER_DAYS`` before ``today``.

    :param as_of: the table's ``as_of`` date (ISO, ``2025-11-01``)
    :param today: the report's date
    """
    try:
        read = date.fromisoformat(as_of[:10])
    except ValueError:
        return f"warning: the price table's date {as_of!r} is not an ISO date; check its as_of."
    age = (today - read).days
    if age <= STALE_AFTER_DAYS:
        return None
    return (
        f"warning: prices as of {as_of} are {age} days old (more than {STALE_AFTER_DAYS}); check the "
        "source of each row in pricing.json and correct it with [batch_provider] pricing_override."
    )
