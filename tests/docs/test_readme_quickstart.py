"""The README's quick start runs as written: its files and commands, verbatim, against the emulator.

The blocks are taken from README.md by their captions (a file block follows a line naming
``dags/...``); the bash blocks run in a shell, the ``batch-emulator`` one in the background, with
the ``bin`` folder of a fresh virtualenv first on ``PATH``: Airflow at the floor the built wheel's
metadata declares, then the wheel with the extras the quick start names, installed by ``pip`` as the
README says (the ``floor_env`` fixture of ``tests/docs/conftest.py``); nothing from the source tree.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.floor_env import FloorEnv
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
pytestmark = pytest.mark.airflow_e2e


def quickstart_blocks() -> list[tuple[str, str, str]]:
    """``(caption, language, code)`` of each block of the quick start section, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start: copy, paste, run", 1)[1].split("\n## ", 1)[0]
    parts = section.split("```")
    found = []
    for caption, block in zip(parts[0::2], parts[1::2], strict=False):
        language, _, code = block.partition("\n")
        found.append((caption.strip().split("\n\n")[-1], language.strip(), code))
    return found


def wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the emulator accepts connections (or has exited)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the emulator did not listen on {port} (exit code {proc.poll()})")


def test_the_readme_quick_start_runs_verbatim_against_the_emulator(
    tmp_path: Path, floor_env: FloorEnv
) -> None:
    assert floor_env.after["apache-airflow"] == floor_env.airflow_floor, (
        "the README runs with Airflow at its floor"
    )
    blocks = quickstart_blocks()
    port = str(free_port())
    env = floor_env.environ()
    emulator = None
    try:
        for caption, language, code in blocks:
            code = code.replace("8089", port)
            named = re.match(r"`(dags/[^`]+)`", caption)
            if named:
                target = tmp_path / named[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(code, encoding="utf-8")
            elif language == "bash" and code.startswith("batch-emulator"):
                emulator = subprocess.Popen(
                    ["bash", "-c", "exec " + code.strip()], cwd=tmp_path, env=env, start_new_session=True
                )
                wait_for_port(int(port), emulator)
            elif language == "bash":
                script = tmp_path / "steps.sh"
                previous = script.read_text(encoding="utf-8") if script.exists() else "set -euo pipefail\n"
                script.write_text(previous + code, encoding="utf-8")
                if "dags test" in code:
                    done = subprocess.run(
                        ["bash", str(script)],
                        cwd=tmp_path,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=600,
                    )
                    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
                    log = done.stdout + done.stderr
                    assert "cost per usable result" in log, log[-4000:]
                    assert "succeeded 3" in log, log[-4000:]
        assert (tmp_path / "airflow" / "batch_ledger.sqlite").exists()
    finally:
        if emulator is not None:
            os.killpg(emulator.pid, signal.SIGTERM)
            emulator.wait(timeout=30)
