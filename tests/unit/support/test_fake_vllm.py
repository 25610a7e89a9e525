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


def test_a_line_the_engine_refuses_fails_the_file_with_the_engine_s_field_and_words(tmp_path: Path) -> None:
    bad = json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "m", "messages": "not a list"}})  # fmt: skip
    code, rows, output = run(tmp_path, [line("a"), bad, line("c")])
    assert code == 1 and rows == []
    assert "Invalid request on line 2: 1 validation error for BatchRequestInput\nbody.messages" in output


def test_the_engine_s_endpoints_are_served_embeddings_included_and_others_get_its_400(tmp_path: Path) -> None:
    embed = json.dumps(
        {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "hi"}}
    )
    code, rows, _ = run(tmp_path, [embed, line("r", url="/v1/responses")])
    assert code == 0
    body = rows[0]["response"]["body"]
    assert body["object"] == "list" and isinstance(body["data"][0]["embedding"], list)
    assert rows[1]["response"]["status_code"] == 400 and rows[1]["error"].startswith(
        "URL /v1/responses was used."
    )


def test_an_output_url_is_staged_in_the_tmp_dir_and_put_once_with_any_2xx_accepted(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[tuple[str, str, bytes]] = []

    class Store(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_PUT(self) -> None:
            size = int(self.headers["Content-Length"])
            got.append((self.path, self.headers.get("User-Agent", ""), self.rfile.read(size)))
            self.send_response(201)  # S3 answers 200, GCS 200, others 201/204: any 2xx is success
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        src, staging = tmp_path / "in.jsonl", tmp_path / "staging"
        staging.mkdir()
        src.write_text(line("a") + "\n" + line("b") + "\n")
        url = f"http://127.0.0.1:{server.server_port}/out.jsonl?X-Amz-Credential=AK%2F20261201%2Fs3"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_VLLM_UPLOAD_RETRY_S": "0"}
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.fake_vllm", "run-batch", "-i", str(src), "-o", url,
             "--model", "m", "--output-tmp-dir", str(staging)],
            env=env, capture_output=True, text=True, check=False, timeout=60, cwd=ROOT,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stdout
    [(path, agent, data)] = got  # one PUT, accepted on 201
    assert "aiohttp" in agent and "X-Amz-Credential=AK/20261201/s3" in path  # aiohttp re-encoded the query
    assert [json.loads(x)["custom_id"] for x in data.decode().splitlines()] == ["a", "b"]
    assert [p.name for p in staging.iterdir()]  # the output was staged on disk in the tmp dir
