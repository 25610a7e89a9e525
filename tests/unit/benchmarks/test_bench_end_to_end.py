"""The end-to-end benchmark's arithmetic (benchmarks/bench_end_to_end.py): which items and which process each figure counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_end_to_end as e2e_bench  # noqa: E402
from e2e import StageRun  # noqa: E402


def stage(name: str, seconds: float, peak: float, imported: float = 100.0) -> StageRun:
    return StageRun(name, seconds, peak, imported, seconds + 3.0, {})


def test_the_prepare_process_time_is_split_into_prepare_and_chunk_and_both_carry_its_peak_rss() -> None:
    runs = {"prepare": [stage("abp.prepare", 10.0, 180.0)]}
    got = e2e_bench.stage_figures(runs, 1_000, {"prepare_s": 6.0, "chunk_s": 4.0})
    assert got["prepare"]["items_per_s"] == pytest.approx(1_000 / 6.0)
    assert got["chunk"]["items_per_s"] == pytest.approx(1_000 / 4.0)
    assert got["prepare"]["peak_rss_mib"] == got["chunk"]["peak_rss_mib"] == 180.0


def test_round_2_counts_only_the_resubmitted_items_and_its_peak_is_the_largest_process() -> None:
    runs = {
        e2e_bench.ROUND_2: [stage("abp.resubmit", 1.0, 150.0), stage("abp.submit", 1.0, 170.0)],
        "publish": [stage("abp.publish", 5.0, 160.0)],
    }
    got = e2e_bench.stage_figures(runs, 1_000, items={e2e_bench.ROUND_2: 20})
    assert got[e2e_bench.ROUND_2]["items_per_s"] == pytest.approx(20 / 2.0)
    assert got[e2e_bench.ROUND_2]["peak_rss_mib"] == 170.0
    assert got["publish"]["items_per_s"] == pytest.approx(1_000 / 5.0)


def test_a_stage_the_blueprint_lacks_is_reported_without_a_baseline_and_others_with_their_ratio() -> None:
    abp = {
        "prepare": {"items": 10, "items_per_s": 5.0, "peak_rss_mib": 150.0, "import_rss_mib": 100.0},
        "chunk": {"items": 10, "items_per_s": 20.0, "peak_rss_mib": 150.0, "import_rss_mib": 100.0},
    }
    naive = {"prepare": {"items": 10, "items_per_s": 10.0, "peak_rss_mib": 300.0, "import_rss_mib": 100.0}}
    figures = {
        "abp": {"stages": abp, "emulator_peak_rss_mib": 60.0, "wall_s": 10.0},
        "naive": {"stages": naive, "emulator_peak_rss_mib": 61.0, "wall_s": 5.0},
    }
    rows = {r["case"]: r for r in e2e_bench.size_rows(10, figures)}
    assert rows["10 items: prepare"]["ratio"] == pytest.approx(0.5)
    assert rows["10 items: prepare, task process"]["ratio"] == pytest.approx(0.5)
    assert rows["10 items: chunk"]["baseline"] is None
    assert rows["10 items: the whole run"]["ratio"] == pytest.approx(0.5)
