"""`make demo` (scripts/demo.sh), the README's first command, runs end to end and prints its report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.airflow_e2e
def test_the_demo_runs_the_nightly_dag_and_prints_the_report_with_the_cost_per_usable_result(
    tmp_path: Path,
) -> None:
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "ABP_DEMO_DIR": str(tmp_path / "demo"),
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh")],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "provider batches over" in out
    assert "cost per usable result" in out
    assert "items by state:" in out and "succeeded" in out
    assert (tmp_path / "demo" / "ledger.sqlite").exists(), "the demo wrote outside its folder"
