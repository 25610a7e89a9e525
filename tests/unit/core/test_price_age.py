"""A report priced from an old table says so, naming the age, the limit and the fix."""

from __future__ import annotations

from datetime import date, timedelta

from airflow_batch_provider.core.price_age import STALE_AFTER_DAYS, price_age_warning

TODAY = date(2026, 12, 2)


def test_a_table_up_to_the_limit_is_silent_and_one_day_past_it_is_flagged_with_its_age() -> None:
    at_limit = (TODAY - timedelta(days=STALE_AFTER_DAYS)).isoformat()
    assert price_age_warning(at_limit, TODAY) is None
    past = (TODAY - timedelta(days=STALE_AFTER_DAYS + 1)).isoformat()
    warning = price_age_warning(past, TODAY)
    assert warning is not None
    assert f"{STALE_AFTER_DAYS + 1} days old" in warning
    assert f"more than {STALE_AFTER_DAYS}" in warning and "pricing_override" in warning


def test_a_timestamp_is_read_by_its_date_and_a_date_that_is_no_date_is_named() -> None:
    assert price_age_warning(f"{TODAY.isoformat()}T23:59:00Z", TODAY) is None
    warning = price_age_warning("last spring", TODAY)
    assert warning is not None and "'last spring'" in warning and "as_of" in warning
