"""A cleared task of a run whose job another run took on leaves that job alone, and says whose it is."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batch_provider.operators.takeover import MOVED, PASS_THROUGH_ROUTES, moved_to_another_run


def _job(run_id: str) -> Any:
    return SimpleNamespace(job_id="job-7", run_id=run_id)


def test_a_job_of_the_tasks_own_run_is_its_to_act_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert moved_to_another_run(_job("manual__r1"), {"run_id": "manual__r1"}) is False
    assert not caplog.records


def test_a_job_another_run_took_on_is_left_to_that_run_and_the_log_names_both_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert moved_to_another_run(_job("manual__r2"), {"run_id": "manual__r1"}) is True
    (record,) = caplog.records
    message = record.getMessage()
    assert "job-7" in message and "manual__r2" in message and "manual__r1" in message


def test_the_moved_route_is_one_the_wait_and_the_harvest_pass_through() -> None:
    assert MOVED in PASS_THROUGH_ROUTES
