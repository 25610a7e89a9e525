"""Smoke tests of the benchmark runner: every benchmark runs at a tiny size and reports its figures.

Nothing here asserts a speed or a memory figure: those are ratios recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
RUN_ALL = BENCH / "run_all.py"
ROW_KEYS = {"case", "metric", "value", "baseline", "ratio", "subject", "baseline_name", "note"}


def load_run_all() -> ModuleType:
    return load_script(RUN_ALL, "bench_run_all_under_test")


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def test_every_benchmark_runs_at_the_tiny_size_and_writes_rows_with_ratios(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(RUN_ALL), "--size", "tiny", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())

    assert report["size"] == "tiny"
    assert report["machine"]["cpus"] >= 1
    expected = {p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py")}
    assert set(report["benchmarks"]) == expected
    assert {"chunking", "ledger", "reconcile"} <= expected
    for name in ("chunking", "ledger", "reconcile"):
        bench = report["benchmarks"][name]
        assert bench["status"] == "ok", bench
        assert bench["size"] == "tiny"
        assert bench["rows"], f"{name} reported no figures"
        for row in bench["rows"]:
            assert set(row) == ROW_KEYS, row
            assert is_number(row["value"]) and row["value"] >= 0, row
            assert is_number(row["baseline"]) and row["baseline"] > 0, (
                f"{name}: every figure has a baseline: {row}"
            )
            assert row["ratio"] == pytest.approx(row["value"] / row["baseline"]), row
        for skip in bench["skipped"]:
            assert skip["reason"].startswith("skipped: "), skip
    for bench in report["benchmarks"].values():
        assert bench["status"] in {"ok", "skipped"}, bench
        if bench["status"] == "skipped":
            assert bench["reason"], bench

    # Both databases, or PostgreSQL reported as skipped with its reason.
    ledger = report["benchmarks"]["ledger"]
    cases = " ".join(r["case"] for r in ledger["rows"])
    assert "sqlite, 300: upsert_items, all new" in cases
    assert "postgresql" in cases or any(s["case"] == "postgresql" for s in ledger["skipped"])
    # The printed table names every figure.
    assert "ratio" in proc.stdout
    assert "write 2,000 request lines" in proc.stdout


def test_the_runner_records_a_module_without_run_as_skipped_and_a_failing_one_as_an_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "bench_good.py").write_text(
        textwrap.dedent(
            """
            def run(size):
                return {"rows": [{"case": "c", "metric": "x/s", "value": 2.0, "baseline": 4.0, "ratio": 0.5}]}
            """
        )
    )
    (tmp_path / "bench_script_only.py").write_text("print('a script with no run()')\n")
    (tmp_path / "bench_broken.py").write_text("def run(size):\n    raise RuntimeError('boom at ' + size)\n")
    (tmp_path / "helper.py").write_text("x = 1\n")
    run_all = load_run_all()

    found = run_all.discover(tmp_path)
    assert list(found) == ["broken", "good", "script_only"]
    results = [run_all.run_one(name, path, "tiny") for name, path in found.items()]
    by_name = {r["name"]: r for r in results}

    assert by_name["good"]["status"] == "ok"
    assert by_name["script_only"]["status"] == "skipped"
    assert "no run(size)" in by_name["script_only"]["reason"]
    assert by_name["broken"]["status"] == "error"
    assert by_name["broken"]["error"] == "RuntimeError: boom at tiny"
    table = run_all.table(results)
    assert "0.500" in table
    assert "broken: error: RuntimeError: boom at tiny" in table


def test_the_runner_refuses_a_benchmark_name_it_does_not_know() -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN_ALL), "--only", "no_such_bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "no benchmark named no_such_bench" in proc.stderr
    assert "chunking" in proc.stderr


def test_a_module_without_the_asked_size_is_skipped_with_its_sizes_and_the_others_still_run(
    tmp_path: Path,
) -> None:
    (tmp_path / "bench_big.py").write_text(
        "SIZES = {'tiny': 1, 'large': 2}\ndef run(size):\n    return {'rows': [], 'size': size}\n"
    )
    (tmp_path / "bench_small_only.py").write_text(
        "SIZES = {'tiny': 1, 'default': 3}\n"
        "def run(size):\n    raise AssertionError('must not run at ' + size)\n"
    )
    run_all = load_run_all()
    results = {n: run_all.run_one(n, p, "large") for n, p in run_all.discover(tmp_path).items()}
    assert results["big"]["status"] == "ok" and results["big"]["size"] == "large"
    assert results["small_only"]["status"] == "skipped"
    assert (
        results["small_only"]["reason"] == "bench_small_only.py has no size 'large' (it has tiny, default)."
    )
