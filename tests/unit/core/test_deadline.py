"""Deadlines: parsing the forms a DAG writes, resolving them per run, and refusing a missing policy."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

import pendulum
import pytest

from airflow_batch_provider.core.deadline import DeadlineSpec, check_policy, deadline_passed
from airflow_batch_provider.exceptions import ConfigurationError


def test_a_time_of_day_resolves_to_the_next_occurrence_after_the_logical_date() -> None:
    spec = DeadlineSpec.parse("06:30 Europe/Berlin", "sync_fallback")
    logical = pendulum.datetime(2026, 1, 15, 2, 0, tz="UTC")  # 03:00 in Berlin (CET, UTC+1)
    assert spec.resolve(logical) == pendulum.datetime(2026, 1, 15, 5, 30, tz="UTC")


def test_a_time_of_day_already_passed_moves_to_the_next_day() -> None:
    spec = DeadlineSpec.parse("06:30 Europe/Berlin", "skip")
    logical = pendulum.datetime(2026, 1, 15, 6, 0, tz="UTC")  # 07:00 in Berlin
    assert spec.resolve(logical) == pendulum.datetime(2026, 1, 16, 5, 30, tz="UTC")


def test_a_time_of_day_follows_daylight_saving_time() -> None:
    spec = DeadlineSpec.parse("06:30 Europe/Berlin", "skip")
    summer = pendulum.datetime(2026, 7, 15, 2, 0, tz="UTC")  # CEST, UTC+2
    assert spec.resolve(summer) == pendulum.datetime(2026, 7, 15, 4, 30, tz="UTC")


def test_a_time_of_day_is_anchored_to_the_logical_date_not_a_late_start() -> None:
    spec = DeadlineSpec.parse("06:30 UTC", "publish_pending")
    logical = datetime(2026, 1, 15, 2, 0, tzinfo=timezone.utc)
    late_start = datetime(2026, 1, 15, 7, 0, tzinfo=timezone.utc)
    assert spec.resolve(late_start, logical) == datetime(2026, 1, 15, 6, 30, tzinfo=timezone.utc)


def test_an_iso_duration_is_an_offset_from_the_run_start() -> None:
    spec = DeadlineSpec.parse("PT4H", "sync_fallback", margin_s=300)
    start = datetime(2026, 1, 15, 2, 0, 5, tzinfo=timezone.utc)
    assert spec.offset == timedelta(hours=4)
    assert spec.resolve(start, datetime(2026, 1, 14, tzinfo=timezone.utc)) == start + timedelta(hours=4)
    assert spec.stop_at(spec.resolve(start)) == start + timedelta(hours=4) - timedelta(minutes=5)


def test_a_timedelta_and_a_pendulum_duration_are_offsets() -> None:
    assert DeadlineSpec.parse(timedelta(minutes=90), "skip").offset == timedelta(minutes=90)
    assert DeadlineSpec.parse(pendulum.duration(seconds=12), "skip").offset == timedelta(seconds=12)


def test_a_deadline_without_a_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="sync_fallback"):
        DeadlineSpec.parse("PT4H", None)
    with pytest.raises(ConfigurationError, match="without deadline_policy"):
        check_policy(None, True)


def test_a_policy_without_a_deadline_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="without a deadline"):
        check_policy("skip", False)


def test_no_deadline_and_no_policy_is_fine() -> None:
    assert check_policy(None, False) is None


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="'retry_forever'"):
        DeadlineSpec.parse("PT1H", "retry_forever")


@pytest.mark.parametrize("value", ["06:30", "25:00 UTC", "06:30 Mars/Olympus", "tomorrow", "", "P1Z"])
def test_unreadable_deadlines_are_refused_with_the_forms_that_work(value: str) -> None:
    with pytest.raises(ConfigurationError):
        DeadlineSpec.parse(value, "skip")


def test_a_naive_run_start_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="naive"):
        DeadlineSpec.parse("PT1H", "skip").resolve(datetime(2026, 1, 1))


def test_a_spec_round_trips_through_primitives() -> None:
    for spec in (
        DeadlineSpec.parse("06:30:15 Europe/Berlin", "skip", margin_s=30),
        DeadlineSpec.parse("PT90S", "sync_fallback"),
    ):
        assert DeadlineSpec.from_dict(spec.to_dict()) == spec
    assert DeadlineSpec.parse("06:30:15 UTC", "skip").time_of_day == time(6, 30, 15)


def test_a_spec_describes_itself_for_the_log() -> None:
    text = DeadlineSpec.parse("06:30 Europe/Berlin", "publish_pending", margin_s=60).describe()
    assert "06:30:00 Europe/Berlin" in text and "publish_pending" in text and "60s" in text


def test_deadline_passed_counts_the_margin() -> None:
    deadline = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    assert not deadline_passed(deadline, 0, deadline - timedelta(seconds=1))
    assert deadline_passed(deadline, 10, deadline - timedelta(seconds=5))
    assert deadline_passed(deadline.isoformat(), 0, deadline)
    assert not deadline_passed(None, 0, deadline)
