"""Entry point of the stand-in ``vllm`` (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from batch_emulator.openai_api import chat_completion

SUPPORTED = ("/v1/chat/completions",)
VERSION = "0.33.0+stand-in"


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def _read_input(source: str) -> str:
    """The input file's text: a local path, or an http(s) URL read with one GET (as vLLM does)."""
    if not _is_url(source):
        return Path(source).read_text(encoding="utf-8")
    request = urllib.request.Request(source, headers={"User-Agent": f"vLLM/{VERSION}"})
    with urllib.request.urlopen(request, timeout=300) as resp:  # an HTTP error raises: exit 1
        return str(resp.read().decode("utf-8"))


def _upload(url: str, data: bytes) -> None:
    """PUT the whole output once, as vLLM does: 5 tries, 5 s apart, success only on 200.

    No content type of its own (aiohttp sends ``application/octet-stream`` for bytes).
    """
    delay = float(os.environ.get("FAKE_VLLM_UPLOAD_RETRY_S") or 5)
    for attempt in range(1, 6):
        request = urllib.request.Request(
            url, data=data, method="PUT", headers={"Content-Type": "application/octet-stream"}
        )
        try:
            with urllib.request.urlopen(request, timeout=1000) as resp:
                if resp.status == 200:
                    return
                problem = f"Status: {resp.status}"
        except urllib.error.HTTPError as exc:
            problem = f"Status: {exc.code}"
        except OSError as exc:
            problem = str(exc)
        if attempt == 5:
            raise RuntimeError(f"Failed to upload data (attempt {attempt}). Error message: {problem}.")
        print(f"ERROR Failed to upload data (attempt {attempt}): {problem}. Retrying in {delay:g} seconds...",
              flush=True)  # fmt: skip
        time.sleep(delay)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run-batch")
    run.add_argument("-i", "--input-file", required=True)
    run.add_argument("-o", "--output-file", required=True)
    run.add_argument("--model", default="Qwen/Qwen3-0.6B")
    run.add_argument("--served-model-name", nargs="*", default=None)
    for flag in ("--tensor-parallel-size", "--max-model-len", "--gpu-memory-utilization",
                 "--max-num-seqs", "--download-dir", "--max-inflight", "--dtype"):  # fmt: skip
        run.add_argument(flag)
    return parser


def _knob(name: str) -> float:
    return float(os.environ.get(f"FAKE_VLLM_{name}") or 0)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    print(f"INFO vLLM batch processing API version {VERSION}", flush=True)
    print(f"INFO args: {args}", flush=True)  # as vLLM logs them: input and output URLs included
    required = os.environ.get("FAKE_VLLM_REQUIRE_ENV")
    if required and not os.environ.get(required):
        print(f"ERROR: {required} is not set; cannot download the model", flush=True)
        return 1
    to_url = _is_url(args.output_file)
    out = Path(args.output_file)
    if not to_url and not out.parent.is_dir():
        print(f"ValueError: output folder {out.parent} does not exist", flush=True)
        return 1
    names = {args.model, *(args.served_model_name or [])}
    requests: list[dict[str, Any]] = []
    try:
        text = _read_input(args.input_file)
    except (OSError, urllib.error.URLError) as exc:
        print(f"ERROR cannot read the input file: {exc}", flush=True)
        return 1
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
            if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
                raise ValueError("not a batch request line")
            if not isinstance(line.get("body"), dict):
                raise ValueError("no body")
        except ValueError as exc:
            print(f"ValueError: Invalid request on line {number}: {exc}", flush=True)
            return 1
        requests.append(line)
    print(f"INFO Loading model {args.model} (stand-in; no GPU)", flush=True)
    crash_after = int(_knob("CRASH_AFTER"))
    string_every, null_every = int(_knob("STRING_ERROR_EVERY")), int(_knob("NULL_BODY_EVERY"))
    delay, slow_after = _knob("DELAY_S"), int(_knob("SLOW_AFTER"))
    answers: list[str] = []  # an output URL: kept in memory, uploaded once the whole file is done
    with open(os.devnull if to_url else out, "w", encoding="utf-8") as fh:
        for index, req in enumerate(requests, start=1):
            if crash_after and index > crash_after:
                print("ERROR EngineDeadError: the engine died unexpectedly (stand-in crash)", flush=True)
                return 1
            if delay and index > slow_after:
                time.sleep(delay)
            line = json.dumps(_answer(req, index, names, string_every, null_every))
            answers.append(line)
            fh.write(line + "\n")
            fh.flush()
            print(f"Running batch: {100 * index // len(requests)}% Completed | {index}/{len(requests)}",
                  flush=True)  # fmt: skip
    if to_url:
        print("INFO Uploading outputs to the output URL", flush=True)
        _upload(args.output_file, "\n".join(answers).strip().encode("utf-8"))
    print(f"INFO Wrote {len(requests)} lines to {'the output URL' if to_url else out}", flush=True)
    return 0


def _answer(
    req: dict[str, Any], index: int, names: set[str], string_every: int, null_every: int
) -> dict[str, Any]:
    body = req["body"]
    request_id = f"vllm-batch-{uuid.uuid4().hex}"
    out: dict[str, Any] = {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": req["custom_id"]}
    if req.get("url") not in SUPPORTED or body.get("stream") or (string_every and index % string_every == 0):
        reason = (
            "Request must not be sent in stream mode"
            if body.get("stream")
            else (f"URL {req.get('url')} is not a supported endpoint")
        )
        return {
            **out,
            "response": {"status_code": 400, "request_id": request_id, "body": None},
            "error": reason,
        }
    if body.get("model") not in (None, "", *names):
        error = {"message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError",
                 "param": None, "code": 404}  # fmt: skip
        return {**out, "response": {"status_code": 404, "request_id": request_id, "body": None},
                "error": {"error": error}}  # fmt: skip
    if null_every and index % null_every == 0:
        error = {"message": "CUDA error: an illegal memory access was encountered (stand-in)",
                 "type": "InternalServerError", "param": None, "code": 500}  # fmt: skip
        return {**out, "response": {"status_code": 500, "request_id": request_id, "body": None},
                "error": {"error": error}}  # fmt: skip
    obj, _ = chat_completion(
        {**body, "model": body.get("model") or next(iter(names))},
        completion_id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
        created=int(time.time()),
        cached=0,
    )
    return {**out, "response": {"status_code": 200, "request_id": request_id, "body": obj}, "error": None}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
