"""The peers benchmark's accounting (benchmarks/bench_peers.py): slot seconds, provider calls, peak RSS."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_peers  # noqa: E402
from e2e import StageRun  # noqa: E402


def stage(wall: float, peak: float) -> StageRun:
    return StageRun("s", wall / 2, peak, 90.0, wall, {})


def test_slot_seconds_count_whole_task_processes_and_leave_out_the_deferred_waits() -> None:
    runs = {
        "prepare": [stage(10.0, 150.0)],
        bench_peers.WAIT: [stage(100.0, 140.0)],
        "download": [stage(4.0, 200.0), stage(6.0, 120.0)],
    }
    assert bench_peers.slot_seconds(runs, (bench_peers.WAIT,)) == pytest.approx(20.0)
    assert bench_peers.slot_seconds(runs, ()) == pytest.approx(120.0)
    assert bench_peers.peak_rss(runs) == 200.0


def test_provider_calls_are_uploads_creates_and_retrieves_and_nothing_counted_twice() -> None:
    stats = {
        "counters": {
            "openai.upload_calls": 2,
            "files_uploaded": 2,  # the same uploads, counted in total too
            "openai.create_calls": 2,
            "batches_created": 2,
            "openai.retrieve_requests": 7,
            "retrieve_requests": 7,
        }
    }
    assert bench_peers.provider_calls(stats) == 11
    assert bench_peers.provider_calls({}) == 0


def test_task_seconds_split_each_stage_into_its_processes_lives_and_its_own_work() -> None:
    runs = {"prepare": [stage(10.0, 150.0)], "download": [stage(4.0, 200.0), stage(6.0, 120.0)]}
    assert bench_peers.task_seconds(runs) == {
        "prepare": {"process_s": 10.0, "work_s": 5.0},
        "download": {"process_s": 10.0, "work_s": 5.0},
    }
