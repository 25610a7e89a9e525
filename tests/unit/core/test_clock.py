"""The package's one clock: aware UTC, and a moment as a message reads it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_batch_provider.core.clock import iso_or_unknown, utcnow


def test_the_clock_reads_aware_utc() -> None:
    now = utcnow()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)


def test_a_recorded_moment_reads_as_iso_and_a_missing_one_as_unknown() -> None:
    moment = datetime(2026, 12, 2, 6, 0, tzinfo=timezone.utc)
    assert iso_or_unknown(moment) == "2026-12-02T06:00:00+00:00"
    assert iso_or_unknown(None) == "unknown"
