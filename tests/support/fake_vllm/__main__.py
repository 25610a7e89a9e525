"""Entry point of the stand-in ``vllm`` (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_batch_provider.adapters.vllm_input import engine_refusal, unserved_reason
from batch_emulator.openai_bodies import chat_completion, embedding_list

VERSION = "0.33.0+stand-in"


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


async def _get(url: str) -> str:
    import aiohttp  # only an http(s) input or output needs it

    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        resp.raise_for_status()  # a 4xx/5xx fails the run: exit 1
        return await resp.text()


def _read_input(source: str) -> str:
    """The input file's text: a local path, or an http(s) URL read with one aiohttp GET (as vLLM does).

    aiohttp is the engine's client: it re-encodes the URL's query (``%2F`` becomes ``/``, ``%40``
    becomes ``@``), so a presigned URL reaches the object store as the engine would send it.
    """
    if not _is_url(source):
        return Path(source).read_text(encoding="utf-8")
    return asyncio.run(_get(source))


async def _put(url: str, path: Path) -> str | None:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=1000)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with path.open("rb") as fh:
                async with session.put(url, data=fh) as resp:
                    if not 200 <= resp.status < 300:
                        return f"Failed to upload file.\nStatus: {resp.status}\nResponse: {await resp.text()}"
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return str(exc)
    return None


def _upload(url: str, path: Path) -> None:
    """PUT the staged output file once, as vLLM does: aiohttp, 5 tries 5 s apart, any 2xx is success.

    No content type of its own (aiohttp sends ``application/octet-stream`` for a file).
    """
    delay = float(os.environ.get("FAKE_VLLM_UPLOAD_RETRY_S") or 5)
    for attempt in range(1, 6):
        problem = asyncio.run(_put(url, path))
        if problem is None:
            return
        if attempt == 5:
            raise RuntimeError(f"Failed to upload data (attempt {attempt}). Error message: {problem}.")
        print(f"ERROR Failed to upload data (attempt {attempt}). Error message: {problem}.\n"
              f"Retrying in {delay:g} seconds...", flush=True)  # fmt: skip
        time.sleep(delay)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run-batch")
    run.add_argument("-i", "--input-file", required=True)
    run.add_argument("-o", "--output-file", required=True)
    run.add_argument("--model", default="Qwen/Qwen3-0.6B")
    run.add_argument("--served-model-name", nargs="*", default=None)
    run.add_argument("--output-tmp-dir", default=None)
    for flag in ("--tensor-parallel-size", "--max-model-len", "--gpu-memory-utilization",
                 "--max-num-seqs", "--download-dir", "--max-inflight", "--dtype"):  # fmt: skip
        run.add_argument(flag)
    return parser


def _knob(name: str) -> float:
    return float(os.environ.get(f"FAKE_VLLM_{name}") or 0)


def _scripted_refusal(line: Any) -> str | None:
    """A refusal by a rule the lane's own checks do not know (a newer engine's): the line whose
    ``custom_id`` is ``FAKE_VLLM_REFUSE_CUSTOM_ID`` is refused as the engine refuses a line."""
    refused = os.environ.get("FAKE_VLLM_REFUSE_CUSTOM_ID")
    if not refused or not isinstance(line, dict) or line.get("custom_id") != refused:
        return None
    return (
        "1 validation error for BatchRequestInput\nbody\n  Value error, a rule of this engine "
        "(stand-in) refuses the request [type=value_error]"
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    version = os.environ.get("FAKE_VLLM_VERSION") or VERSION
    print(f"INFO vLLM batch processing API version {version}", flush=True)
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
    except Exception as exc:  # OSError, aiohttp.ClientError: the engine exits 1 either way
        print(f"ERROR cannot read the input file: {exc}", flush=True)
        return 1
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            line, refusal = None, f"Invalid JSON: {exc}"
        else:
            refusal = engine_refusal(line) or _scripted_refusal(line)
        if refusal is not None:  # as the engine: one bad line fails the whole file, nothing written
            print(f"ValueError: Invalid request on line {number}: {refusal}", flush=True)
            return 1
        requests.append(line)
    print(f"INFO Loading model {args.model} (stand-in; no GPU)", flush=True)
    crash_after = int(_knob("CRASH_AFTER"))
    string_every, null_every = int(_knob("STRING_ERROR_EVERY")), int(_knob("NULL_BODY_EVERY"))
    delay, slow_after = _knob("DELAY_S"), int(_knob("SLOW_AFTER"))
    # an output URL: staged in --output-tmp-dir (else a temporary folder), uploaded once the whole
    # file is done
    staged = Path(tempfile.mkdtemp(dir=args.output_tmp_dir)) / "tmp_batch_output.jsonl" if to_url else out
    with open(staged, "w", encoding="utf-8") as fh:
        for index, req in enumerate(requests, start=1):
            if crash_after and index > crash_after:
                print("ERROR EngineDeadError: the engine died unexpectedly (stand-in crash)", flush=True)
                return 1
            if delay and index > slow_after:
                time.sleep(delay)
            line = json.dumps(_answer(req, index, names, string_every, null_every))
            fh.write(line + "\n")
            fh.flush()
            print(f"Running batch: {100 * index // len(requests)}% Completed | {index}/{len(requests)}",
                  flush=True)  # fmt: skip
    if to_url:
        print("INFO Uploading outputs to the output URL", flush=True)
        _upload(args.output_file, staged)
    print(f"INFO Wrote {len(requests)} lines to {'the output URL' if to_url else out}", flush=True)
    return 0


def _answer(
    req: dict[str, Any], index: int, names: set[str], string_every: int, null_every: int
) -> dict[str, Any]:
    body = req["body"]
    request_id = f"vllm-batch-{uuid.uuid4().hex}"
    out: dict[str, Any] = {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": req["custom_id"]}
    unserved = unserved_reason(req)
    if unserved or body.get("stream") or (string_every and index % string_every == 0):
        reason = (
            unserved
            or ("Request must not be sent in stream mode" if body.get("stream") else None)
            or f"URL {req.get('url')} is not a supported endpoint"
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
    if req.get("url") == "/v1/embeddings":
        return {**out, "response": {"status_code": 200, "request_id": request_id,
                                    "body": _embeddings(body, names)}, "error": None}  # fmt: skip
    return {**out, "response": {"status_code": 200, "request_id": request_id, "body": _chat(body, names)},
            "error": None}  # fmt: skip


def _chat(body: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """A chat answer in the engine's shape (vLLM 0.32's ``ChatCompletionResponse``, as seen).

    The emulator's model writes the message; the keys around it are the engine's: its own fields
    (``stop_reason``, ``token_ids``, ``kv_transfer_params`` ...) as ``null``, usage details ``null``.
    """
    obj, _ = chat_completion(
        {**body, "model": body.get("model") or next(iter(names))},
        completion_id=f"chatcmpl-{uuid.uuid4().hex[:16]}",
        created=int(time.time()),
        cached=0,
    )
    engine_message = {
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    choices = [
        {
            "index": choice["index"],
            "message": {"role": "assistant", "content": choice["message"].get("content"), **engine_message},
            "logprobs": None,
            "finish_reason": choice.get("finish_reason"),
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
        }
        for choice in obj["choices"]
    ]
    usage = obj["usage"]
    return {
        "id": obj["id"],
        "object": "chat.completion",
        "created": obj["created"],
        "model": obj["model"],
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": f"vllm-{VERSION}",
        "usage": {
            "prompt_tokens": usage["prompt_tokens"],
            "total_tokens": usage["total_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        **dict.fromkeys(
            (
                "prompt_logprobs",
                "prompt_token_ids",
                "prompt_text",
                "kv_transfer_params",
                "ec_transfer_params",
                "metrics",
            )
        ),
    }


def _embeddings(body: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """An embeddings answer in the engine's shape (``EmbeddingResponse``)."""
    obj, _ = embedding_list({**body, "model": body.get("model") or next(iter(names))})
    tokens = obj["usage"]["prompt_tokens"]
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": obj["model"],
        "data": obj["data"],
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
