"""OpenAI batch files: an input file read and checked line by line, and the output and error files of a batch that ended.

Batch result files use the documented line formats::

    {"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
     "body": {...chat.completion or embedding list...}}, "error": null}

Items that fail with a non-2xx status go to the *error* file with the same shape (the body holds
``{"error": {...}}``); items a batch never ran (expired, cancelled) go to the error file with
``"response": null`` and ``"error": {"code": "batch_expired" | "batch_cancelled", "message": ...}``.
Lines are written in processing order, which is a seeded shuffle of the input order.

Input validation (the batch becomes ``failed`` with ``errors.data[]`` entries of ``code``,
``message``, ``line``, ``param``) uses these codes: ``empty_file``, ``file_too_large``,
``too_many_requests``, ``invalid_json_line``, ``missing_required_parameter``, ``invalid_method``,
``invalid_url``, ``duplicate_custom_id``, ``mismatched_model``, ``emulated_validation_failure``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from batch_emulator import model
from batch_emulator.common import (
    InputScan,
    InputWords,
    ResultWriter,
    another_answer,
    injected_error,
    output_file,
    result_file,
    stable_id,
)
from batch_emulator.config import EmulatorConfig
from batch_emulator.lifecycle import ItemLog, Job, JobItem, ValidationIssue
from batch_emulator.openai_bodies import (
    INJECTED_ERRORS,
    PROVIDER,
    REQUEST_CHECKS,
    ChatPrompt,
    chat_completion,
    chat_view,
    embedding_list,
    error_body,
    moderation_object,
    response_object,
)
from batch_emulator.store import EmulatorState, StoredFile

OUTPUT_FILE_TTL_S: Final = 30 * 86_400
MAX_ISSUES: Final = 100
INPUT_WORDS: Final = InputWords(
    too_many="The input file has more than {limit} requests; split it into smaller batches.",
    bad_json="This line is not parseable as valid JSON.",
)


def parse_input(
    state: EmulatorState, meta: StoredFile, endpoint: str, config: EmulatorConfig
) -> tuple[ItemLog | list[JobItem], list[ValidationIssue]]:
    """Read a batch's input file: its items, and what makes the batch fail validation (none: it runs).

    :param state: the shared state (the file's bytes, the item log)
    :param meta: the input file
    :param endpoint: the batch's endpoint (each line's ``url`` must name it)
    :param config: the configuration the batch was created under (limits, faults, seed)
    """
    issues: list[ValidationIssue] = []
    items = state.item_log()
    if meta.bytes > config.max_batch_bytes:
        return [], [
            ValidationIssue(
                "file_too_large",
                f"The input file is {meta.bytes} bytes; the limit is {config.max_batch_bytes} bytes. Split it into smaller batches.",
            )
        ]
    seen: set[str] = set()
    first_model: str | None = None
    check = REQUEST_CHECKS[endpoint]
    faults = config.faults
    scan = InputScan(INPUT_WORDS, issues, config.max_batch_requests, MAX_ISSUES)
    for number, line in scan.lines(state.files.iter_lines(meta.id)):
        if not isinstance(line, dict):
            issues.append(ValidationIssue("invalid_json_line", "This line is not a JSON object.", number))
            continue
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            issues.append(
                ValidationIssue(
                    "missing_required_parameter",
                    "Missing required parameter: 'custom_id'.",
                    number,
                    "custom_id",
                )
            )
            continue
        if line.get("method") != "POST":
            issues.append(
                ValidationIssue(
                    "invalid_method", "The 'method' of every request must be 'POST'.", number, "method"
                )
            )
        if line.get("url") != endpoint:
            issues.append(
                ValidationIssue(
                    "invalid_url",
                    f"The 'url' {line.get('url')!r} does not match the batch endpoint {endpoint!r}.",
                    number,
                    "url",
                )
            )
        body = line.get("body")
        if not isinstance(body, dict):
            issues.append(
                ValidationIssue(
                    "missing_required_parameter", "Missing required parameter: 'body'.", number, "body"
                )
            )
            continue
        if custom_id in seen:
            issues.append(
                ValidationIssue(
                    "duplicate_custom_id",
                    f"The custom_id {custom_id!r} is used more than once; custom_id values must be unique.",
                    number,
                    "custom_id",
                )
            )
        seen.add(custom_id)
        line_model = body.get("model")
        if isinstance(line_model, str):
            if first_model is None:
                first_model = line_model
            elif line_model != first_model:
                issues.append(
                    ValidationIssue(
                        "mismatched_model",
                        f"The model {line_model!r} differs from {first_model!r} on an earlier line; a batch input file may only use one model.",
                        number,
                        "body.model",
                    )
                )
        items.append(
            JobItem(
                custom_id=custom_id,
                line=number,
                body=body,
                decision=faults.decide_item(config.seed, custom_id),
                natural_error=check(body, config),
            )
        )
    if scan.count == 0 and not issues:
        issues.append(
            ValidationIssue("empty_file", "The input file is empty; it needs at least one request line.")
        )
    return items, issues


def write_results(state: EmulatorState, job: Job, now: float, status: str) -> dict[str, Any]:
    """Render and store the output and error files of a job that just ended, a line at a time.

    :param state: the shared state (where the files are kept)
    :param job: the batch
    :param now: the time it was seen ended
    :param status: its final status (a ``failed`` batch gets no files, only its usage)
    """
    usage = {"input": 0, "cached": 0, "output": 0, "reasoning": 0}
    seen_prefixes: set[str] = set()
    created = int(job.view(now).times.get("finalizing_at", now))
    results: dict[str, Any] = {}
    with result_file(state, "custom_id") as out, result_file(state, "custom_id") as err:
        for outcome in job.outcomes(now):
            item = outcome.item
            line_id = stable_id("batch_req_", job.id, item.custom_id, length=32)
            request_id = stable_id("req_", job.id, item.custom_id, "request", length=32)
            if outcome.end != "processed":
                code = "batch_expired" if outcome.end == "expired" else "batch_cancelled"
                message = (
                    "This request could not be executed before the completion window expired."
                    if outcome.end == "expired"
                    else "This request was not executed because the batch was cancelled."
                )
                err.write(
                    {
                        "id": line_id,
                        "custom_id": item.custom_id,
                        "response": None,
                        "error": {"code": code, "message": message},
                    }
                )
                continue
            error = item.natural_error or injected_error(item, INJECTED_ERRORS)
            if error is not None:
                response = {
                    "status_code": error["status"],
                    "request_id": request_id,
                    "body": error_body(error["message"], error["type"], error["param"], error["code"]),
                }
                err.write({"id": line_id, "custom_id": item.custom_id, "response": response, "error": None})
                continue
            if item.decision.fault == "missing":
                continue
            if item.decision.error_first:
                first = INJECTED_ERRORS["server_error"]
                response = {
                    "status_code": first["status"],
                    "request_id": request_id,
                    "body": error_body(first["message"], first["type"], first["param"], first["code"]),
                }
                err.write({"id": line_id, "custom_id": item.custom_id, "response": response, "error": None})
            body, used = _answer_item(job, item, created, seen_prefixes)
            for key in usage:
                usage[key] += used.get(key, 0)
            job.bill(
                item.custom_id,
                input_tokens=used["input"] - used["cached"],
                cached_input_tokens=used["cached"],
                output_tokens=used["output"],
            )
            out.write(
                {
                    "id": line_id,
                    "custom_id": item.custom_id,
                    "response": {"status_code": 200, "request_id": request_id, "body": body},
                    "error": None,
                },
                item.decision,
            )
            if item.decision.other_answer and "choices" in body:
                _answer_again(job, item.custom_id, line_id, request_id, body, out)
        results["usage"] = {
            "input_tokens": usage["input"],
            "input_tokens_details": {"cached_tokens": usage["cached"]},
            "output_tokens": usage["output"],
            "output_tokens_details": {"reasoning_tokens": usage["reasoning"]},
            "total_tokens": usage["input"] + usage["output"],
        }
        if status == "failed":
            return results
        out.write_foreign(job.faults.unknown_result_lines, job.id)
        if out.lines or status == "completed":
            results["output_file_id"] = _keep_result(state, job, "output", out)
        if err.lines:
            results["error_file_id"] = _keep_result(state, job, "error", err)
    return results


def _answer_again(
    job: Job, custom_id: str, line_id: str, request_id: str, body: Mapping[str, Any], out: ResultWriter
) -> None:
    """Write a second success line for a chat item with another answer, and bill it again."""
    again = json.loads(json.dumps(body))
    message = again["choices"][0]["message"]
    message["content"] = another_answer(message.get("content"))
    usage = again["usage"]
    usage["completion_tokens"] += 1
    usage["total_tokens"] += 1
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    job.bill_again(
        custom_id,
        input_tokens=usage["prompt_tokens"] - cached,
        cached_input_tokens=cached,
        output_tokens=usage["completion_tokens"],
    )
    response = {"status_code": 200, "request_id": request_id, "body": again}
    out.write({"id": line_id, "custom_id": custom_id, "response": response, "error": None})


def _answer_item(
    job: Job, item: JobItem, created: int, seen_prefixes: set[str]
) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer one batch item at its endpoint; prompt caching counts the prefixes seen in the batch."""
    config = job.config
    endpoint = job.attrs["endpoint"]
    if endpoint == "/v1/embeddings":
        return embedding_list(item.body)
    if endpoint == "/v1/moderations":
        return moderation_object(item.body, moderation_id=stable_id("modr-", job.id, item.custom_id))
    prompt = ChatPrompt(chat_view(item.body) if endpoint == "/v1/responses" else item.body)
    seen = prompt.prefix_key is not None and prompt.prefix_key in seen_prefixes
    cached = model.cached_tokens(
        prompt.prefix_tokens, seen, config.cache_min_tokens, config.cache_increment_tokens
    )
    if prompt.prefix_key is not None:
        seen_prefixes.add(prompt.prefix_key)
    if endpoint == "/v1/responses":
        return response_object(
            item.body,
            response_id=stable_id("resp_", job.id, item.custom_id),
            created=created,
            cached=cached,
        )
    return chat_completion(
        item.body,
        completion_id=stable_id("chatcmpl-", job.id, item.custom_id),
        created=created,
        cached=cached,
    )


def _keep_result(state: EmulatorState, job: Job, kind: str, writer: ResultWriter) -> str:
    """Keep a result file written by ``writer`` as the batch's ``kind`` file (``output``, ``error``); return its id."""
    meta = output_file(state, PROVIDER, "file-", f"batch_{job.id}_{kind}.jsonl", OUTPUT_FILE_TTL_S)
    writer.keep(meta)
    return meta.id
