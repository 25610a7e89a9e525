"""The one clock of the package: timezone-aware UTC, and how a moment reads in a message."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    """Return the current UTC time (timezone-aware)."""
    return datetime.now(timezone.utc)


def iso_or_unknown(value: datetime | None) -> str:
    """A moment in ISO 8601 for a message, or ``unknown`` when none was recorded.

    :param value: the moment, or ``None``
    """
    return value.isoformat() if value is not None else "unknown"
