"""The scheduler's rule for a live task instance, applied to the run that holds a workload."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_batch_provider.operators.liveness import (
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    TaskInstanceSign,
    heartbeat_timeout_s,
    live_task_instances,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
TIMEOUT_S = 300.0


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_a_running_task_instance_is_live_until_its_heartbeat_is_older_than_the_timeout() -> None:
    assert TaskInstanceSign("submit", 0, "running", ago(299)).live(NOW, TIMEOUT_S)
    assert not TaskInstanceSign("submit", 0, "running", ago(301)).live(NOW, TIMEOUT_S)


@pytest.mark.parametrize("state", ["queued", "deferred", "scheduled", "up_for_retry", "restarting"])
def test_an_unfinished_task_instance_without_a_recent_sign_of_life_is_dead(state: str) -> None:
    assert TaskInstanceSign("wait", 0, state, ago(10)).live(NOW, TIMEOUT_S)
    assert not TaskInstanceSign("wait", 0, state, ago(3600)).live(NOW, TIMEOUT_S)


def test_a_task_instance_a_live_scheduler_queued_is_live_whatever_its_heartbeat() -> None:
    assert TaskInstanceSign("submit", 0, "running", ago(3600), watched=True).live(NOW, TIMEOUT_S)
    assert not TaskInstanceSign("submit", 0, "success", ago(3600), watched=True).live(NOW, TIMEOUT_S)


def test_a_deferred_task_instance_whose_trigger_exists_is_live_however_long_it_waits() -> None:
    assert TaskInstanceSign("wait", 0, "deferred", ago(86_400), trigger_pending=True).live(NOW, TIMEOUT_S)


def test_a_task_instance_that_ended_recently_keeps_a_run_between_two_tasks_live() -> None:
    signs = [TaskInstanceSign("lease", -1, "success", ago(2)), TaskInstanceSign("prepare", -1, None)]
    assert [s.task_id for s in live_task_instances(signs, NOW, TIMEOUT_S)] == ["lease"]


def test_a_killed_run_whose_signs_of_life_are_all_old_has_no_live_task_instance() -> None:
    signs = [
        TaskInstanceSign("lease", -1, "success", ago(900)),
        TaskInstanceSign("submit", 1, "running", ago(600)),
        TaskInstanceSign("submit", 2, "scheduled", ago(600)),
        TaskInstanceSign("publish", -1, None),
    ]
    assert live_task_instances(signs, NOW, TIMEOUT_S) == []


def test_only_the_state_known_counts_an_unfinished_task_instance_as_live() -> None:
    assert TaskInstanceSign("submit", -1, "running").live(NOW, TIMEOUT_S)
    assert not TaskInstanceSign("submit", -1, "failed").live(NOW, TIMEOUT_S)


def test_the_timeout_is_airflows_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT", raising=False)
    assert heartbeat_timeout_s() == DEFAULT_HEARTBEAT_TIMEOUT_S
    monkeypatch.setenv("AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT", "42")
    assert heartbeat_timeout_s() == 42.0
