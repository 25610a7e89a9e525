from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from batch_emulator.__main__ import _parse_args, build_config, main


def test_non_loopback_hosts_are_refused_with_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "loopback" in err


def test_faults_come_from_a_file_and_single_settings_win(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps({"rate_500": 0.1, "rate_429": 0.2}))
    args = _parse_args(
        [
            "--faults",
            str(path),
            "--fault",
            "rate_429=0.3",
            "--fault",
            "expire_batches=[0,2]",
            "--time-scale",
            "0.1",
        ]
    )
    config = build_config(args)
    assert (config.faults.rate_500, config.faults.rate_429) == (0.1, 0.3)
    assert config.faults.expire_batches == (0, 2)
    assert config.time_scale == 0.1


@pytest.mark.parametrize("fault", ["rate_500", "rate_500=2", "nope=1"])
def test_bad_fault_settings_stop_the_start(fault: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fault", fault]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_the_module_starts_a_server_and_announces_its_address() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_emulator", "--port", "0", "--time-scale", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("emulator listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]
        assert httpx.get(url + "/_emulator/config").json()["time_scale"] == 0.05
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_emulator_leaves_no_data_directory_behind(stop: signal.Signals, tmp_path: Path) -> None:
    """Without ``--data-dir`` the emulator spools to a temporary folder: ``kill`` (as the demo, the
    stack and docker compose stop it) or Ctrl-C must remove it, uploaded files and all."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_emulator", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().rsplit(" ", 1)[1]
        upload = httpx.post(
            url + "/v1/files",
            headers={"Authorization": "Bearer sk-test"},
            data={"purpose": "batch"},
            files={"file": ("in.jsonl", b'{"custom_id": "a"}\n')},
        )
        assert upload.status_code == 200, upload.text
        assert [p.name[:15] for p in tmp_path.iterdir()] == ["batch-emulator-"]
        assert any(p.is_file() for p in next(tmp_path.iterdir()).rglob("*"))
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=20)
    assert list(tmp_path.iterdir()) == []
