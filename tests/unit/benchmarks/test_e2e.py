"""The end-to-end benchmarks' machinery (benchmarks/e2e.py): records, stage processes, the emulator process.

No speed or memory figure is asserted: only that each is measured where it claims to be.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import e2e  # noqa: E402


def test_a_record_text_has_the_asked_size_and_no_two_records_share_one() -> None:
    texts = [e2e.record_text(i) for i in range(500)]
    assert {len(t) for t in texts} == {e2e.RECORD_TEXT_BYTES}
    assert len(set(texts)) == 500
    assert len(e2e.record_text(7, size=40)) == 40


def test_the_records_file_has_one_json_record_per_line_with_unique_sortable_ids(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    written = e2e.write_records(path, 120)
    lines = path.read_text().splitlines()
    assert written == path.stat().st_size
    ids = [json.loads(line)["id"] for line in lines]
    assert len(ids) == 120 and len(set(ids)) == 120 and ids == sorted(ids)


def test_a_status_field_is_read_in_kib_and_a_missing_or_malformed_one_is_none() -> None:
    text = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t   1024 kB\nVmBad:\t  x kB\n"
    assert e2e.parse_status_kib(text, "VmHWM") == 204800
    assert e2e.parse_status_kib(text, "VmRSS") == 1024
    assert e2e.parse_status_kib(text, "VmBad") is None
    assert e2e.parse_status_kib(text, "VmSwap") is None
    assert e2e.proc_status_kib(2**22 + 12345, "VmHWM") is None  # no such process


def test_a_stage_runs_in_its_own_process_and_reports_its_work_and_its_peak_rss(tmp_path: Path) -> None:
    merged = tmp_path / "merged.jsonl"
    merged.write_text(
        "".join(
            json.dumps({"id": f"c{i}", "state": "succeeded" if i % 4 else "failed", "output": "x"}) + "\n"
            for i in range(40)
        )
    )
    got = e2e.run_stage("naive.publish", {"merged": str(merged), "dir": str(tmp_path)}, tmp_path, {})
    assert got.out == {"counts": {"failed": 10, "succeeded": 30}}
    assert 0 < got.import_rss_mib <= got.peak_rss_mib
    assert 0 <= got.seconds < got.wall_s
    assert len((tmp_path / "naive-published.jsonl").read_text().splitlines()) == 40


def test_a_failing_stage_raises_with_the_stage_name_and_its_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)stage naive\.publish failed \(exit 1\).*FileNotFoundError"):
        e2e.run_stage(
            "naive.publish", {"merged": str(tmp_path / "absent"), "dir": str(tmp_path)}, tmp_path, {}
        )


def test_the_emulator_runs_as_its_own_process_and_its_peak_rss_is_read_when_it_stops(tmp_path: Path) -> None:
    with e2e.EmulatorProcess(tmp_path, faults=["rate_500=0.02"]) as emulator:
        assert emulator.stats()["batches_created"] == 0
        peak, now = emulator.rss_kib()
        assert peak is not None and now is not None and peak >= now > 0
        pid = emulator.process.pid  # type: ignore[union-attr]
    assert emulator.peak_rss_kib is not None and emulator.peak_rss_kib >= peak
    assert e2e.proc_status_kib(pid, "VmRSS") is None  # stopped
