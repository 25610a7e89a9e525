"""The stand-in ``vllm run-batch``: vLLM's command line, ordering, error shapes and failure knobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
VLLM = ROOT / "tests" / "support" / "fake_vllm" / "bin" / "vllm"


def line(custom_id: str, model: str = "m", url: str = "/v1/chat/completions") -> str:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": "sentiment"}, {"role": "user", "content": "great"}],
    }
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run(tmp_path: Path, lines: list[str], **knobs: str) -> tuple[int, list[dict[str, Any]], str]:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "FAKE_VLLM_PYTHON": sys.executable, "PYTHONPATH": str(ROOT), **knobs}
    proc = subprocess.run(
        [str(VLLM), "run-batch", "-i", str(src), "-o", str(out), "--model", "m", "--tensor-parallel-size", "2"],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    rows = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    return proc.returncode, rows, proc.stdout + proc.stderr


def test_every_line_is_answered_in_input_order_and_exit_is_zero_even_with_errors(tmp_path: Path) -> None:
    code, rows, _ = run(tmp_path, [line("a"), line("b", url="/v1/completions"), line("c", model="other")])
    assert code == 0 and [r["custom_id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["response"]["status_code"] == 200 and rows[0]["error"] is None
    assert rows[1]["response"]["body"] is None and isinstance(rows[1]["error"], str)
    assert rows[2]["response"]["status_code"] == 404 and rows[2]["error"]["error"]["code"] == 404


def test_an_invalid_line_fails_the_whole_file_before_anything_is_written(tmp_path: Path) -> None:
    code, rows, output = run(tmp_path, [line("a"), "{not json"])
    assert code == 1 and rows == [] and "Invalid request on line 2" in output


def test_a_crash_leaves_the_lines_finished_before_it(tmp_path: Path) -> None:
    code, rows, _ = run(tmp_path, [line(f"i{n}") for n in range(5)], FAKE_VLLM_CRASH_AFTER="3")
    assert code == 1 and [r["custom_id"] for r in rows] == ["i0", "i1", "i2"]


def test_null_bodies_and_string_errors_come_where_asked_and_a_missing_token_stops_the_start(
    tmp_path: Path,
) -> None:
    lines = [line(f"i{n}") for n in range(6)]
    code, rows, _ = run(tmp_path, lines, FAKE_VLLM_NULL_BODY_EVERY="2", FAKE_VLLM_STRING_ERROR_EVERY="3")
    assert code == 0
    kinds = ["ok" if r["error"] is None else type(r["error"]).__name__ for r in rows]
    assert kinds == ["ok", "dict", "str", "dict", "ok", "str"]
    code, _, output = run(tmp_path, lines, FAKE_VLLM_REQUIRE_ENV="HF_TOKEN_UNSET_HERE")
    assert code == 1 and "HF_TOKEN_UNSET_HERE is not set" in output
