"""The chaos harness tells a process's own SIGKILL (the armed kill) from one it gave a hung process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import chaos


def _bare_run(home: Path) -> chaos.ChaosRun:
    run = object.__new__(chaos.ChaosRun)
    run.env = {"AIRFLOW_HOME": str(home)}
    run.attempts = []
    (home / "attempt-0.log").write_text("running\n", encoding="utf-8")
    return run


def test_a_process_the_harness_stops_past_its_limit_is_timed_out_not_taken_for_the_armed_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chaos, "RUN_TIMEOUT_S", 0.5)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    attempt = _bare_run(tmp_path).finish(proc, chaos.Kill(after_task="submit:0"))
    assert attempt.returncode == -signal.SIGKILL
    assert attempt.timed_out and not attempt.killed
    assert "timed out" in attempt.tail()


def test_a_process_that_kills_itself_is_killed(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.Popen([sys.executable, "-c", code], text=True)
    attempt = _bare_run(tmp_path).finish(proc, chaos.Kill(after_task="submit:0"))
    assert attempt.killed and not attempt.timed_out
