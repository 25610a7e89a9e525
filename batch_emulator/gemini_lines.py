"""Gemini batch input read and checked (a JSONL file or inline requests), and the responses of a batch that ended.

Input lines (file input) are ``{"key": "...", "request": {GenerateContentRequest}}``; inline
requests are ``{"request": {...}, "metadata": {"key": ...}}``. Result lines (file input), in
processing order::

    {"key": "...", "response": {GenerateContentResponse with usageMetadata}}
    {"key": "...", "error": {"code": 429, "message": "...", "status": "RESOURCE_EXHAUSTED"}}

Items a batch never ran get ``{"code": 499, "status": "CANCELLED"}`` (cancelled) or
``{"code": 504, "status": "DEADLINE_EXCEEDED"}`` (expired) errors. Embedding batches answer
``{"key", "response": {"embedding": {"values": [...]}, "usageMetadata": {...}}}``. Inline batches
answer the same entries inline, with each request's ``metadata``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from batch_emulator import model
from batch_emulator.common import (
    InputScan,
    InputWords,
    another_answer,
    injected_error,
    output_file,
    result_file,
    stable_id,
)
from batch_emulator.config import EmulatorConfig
from batch_emulator.gemini_bodies import (
    INJECTED_ERRORS,
    PROVIDER,
    GeminiPrompt,
    embed_request_error,
    embed_response,
    generate_billed,
    generate_request_error,
    generate_response,
    model_resource,
    status_error,
)
from batch_emulator.lifecycle import ItemLog, ItemOutcome, Job, JobItem, ValidationIssue
from batch_emulator.store import EmulatorState, StoredFile

FILE_TTL_S: Final = 48 * 3600
MAX_ISSUES: Final = 100
INPUT_WORDS: Final = InputWords(
    too_many="The input has more than {limit} requests; split it.",
    bad_json="Line {number} is not valid JSON.",
)


def check_line(number: int, line_model: Any, model_name: str) -> ValidationIssue | None:
    """The issue of a request naming another model than its batch's (``None``: it names none, or the same).

    :param number: the request's line (or position) in the input
    :param line_model: the ``model`` the request names
    :param model_name: the batch's model (``models/...``)
    """
    if isinstance(line_model, str) and line_model and model_resource(line_model) != model_name:
        return ValidationIssue(
            "mismatched_model",
            f"Line {number} asks for model {line_model!r} but the batch runs {model_name!r}; one batch uses one model.",
            number,
            "request.model",
        )
    return None


def _item(
    custom_id: str, number: int, request: Mapping[str, Any], kind: str, config: EmulatorConfig
) -> JobItem:
    natural = embed_request_error(request) if kind == "embed" else generate_request_error(request, config)
    return JobItem(
        custom_id=custom_id,
        line=number,
        body=request,
        decision=config.faults.decide_item(config.seed, custom_id),
        natural_error=natural,
    )


def parse_file(
    state: EmulatorState, meta: StoredFile, model_name: str, kind: str, config: EmulatorConfig
) -> tuple[ItemLog | list[JobItem], list[ValidationIssue]]:
    """Read a batch's JSONL input file: its items, and what makes the batch fail validation (none: it runs).

    :param state: the shared state (the file's bytes, the item log)
    :param meta: the input file
    :param model_name: the batch's model (``models/...``); a line may name only it
    :param kind: ``generate`` or ``embed``
    :param config: the configuration the batch was created under (limits, faults, seed)
    """
    issues: list[ValidationIssue] = []
    items = state.item_log()
    if meta.bytes > config.max_batch_bytes:
        return [], [
            ValidationIssue(
                "file_too_large",
                f"The input file is {meta.bytes} bytes; the limit is {config.max_batch_bytes} bytes. Split it.",
            )
        ]
    seen: set[str] = set()
    scan = InputScan(INPUT_WORDS, issues, config.max_batch_requests, MAX_ISSUES)
    for number, line in scan.lines(state.files.iter_lines(meta.id)):
        request = line.get("request") if isinstance(line, dict) else None
        key = line.get("key") if isinstance(line, dict) else None
        if not isinstance(request, dict):
            issues.append(
                ValidationIssue(
                    "missing_request", f"Line {number} has no 'request' object.", number, "request"
                )
            )
            continue
        if not isinstance(key, str) or not key:
            issues.append(
                ValidationIssue(
                    "missing_key",
                    f"Line {number} has no 'key' string; every line needs a unique key.",
                    number,
                    "key",
                )
            )
            continue
        if key in seen:
            issues.append(
                ValidationIssue(
                    "duplicate_key",
                    f"The key {key!r} is used more than once; keys must be unique.",
                    number,
                    "key",
                )
            )
        seen.add(key)
        problem = check_line(number, request.get("model"), model_name)
        if problem is not None:
            issues.append(problem)
        items.append(_item(key, number, request, kind, config))
    if scan.count == 0 and not issues:
        issues.append(
            ValidationIssue("empty_file", "The input file is empty; it needs at least one request line.")
        )
    return items, issues


def parse_inline(
    requests: list[Any], model_name: str, kind: str, config: EmulatorConfig
) -> tuple[list[JobItem], list[ValidationIssue], list[Any]]:
    """Read a batch's inline requests: its items, what fails it, and each request's ``metadata``.

    :param requests: the ``inputConfig.requests.requests`` list
    :param model_name: the batch's model (``models/...``)
    :param kind: ``generate`` or ``embed``
    :param config: the configuration the batch was created under
    """
    issues: list[ValidationIssue] = []
    items: list[JobItem] = []
    metas: list[Any] = []
    if not requests:
        issues.append(ValidationIssue("empty_input", "The batch has no requests."))
    if len(requests) > config.max_batch_requests:
        issues.append(
            ValidationIssue(
                "too_many_requests",
                f"The batch has more than {config.max_batch_requests} requests; split it.",
            )
        )
        return [], issues, []
    for number, entry in enumerate(requests, start=1):
        request = entry.get("request") if isinstance(entry, Mapping) else None
        if not isinstance(request, Mapping):
            issues.append(
                ValidationIssue(
                    "missing_request", f"Request {number} has no 'request' object.", number, "request"
                )
            )
            continue
        metadata = entry.get("metadata") if isinstance(entry.get("metadata"), Mapping) else None
        key = str(metadata.get("key")) if metadata and metadata.get("key") else f"request-{number}"
        problem = check_line(number, request.get("model"), model_name)
        if problem is not None:
            issues.append(problem)
        items.append(_item(key, number, request, kind, config))
        metas.append(metadata)
    return items, issues, metas


def write_results(state: EmulatorState, job: Job, now: float, status: str) -> dict[str, Any]:
    """Render a finished batch's responses (a file, written a line at a time, or inline).

    :param state: the shared state (where the file is kept)
    :param job: the batch
    :param now: the time it was seen ended
    :param status: its final status (a ``failed`` batch gets no responses)
    """
    if status == "failed":
        return {}
    inline = "fileName" not in job.attrs["input"]
    metas: list[Any] = job.attrs.get("inline_metadata") or []
    inlined: list[dict[str, Any]] = []
    seen_prefixes: set[str] = set()
    with result_file(state, "key") as out:
        for outcome in job.outcomes(now):
            entry = _entry(job, outcome, seen_prefixes)
            if entry is None:
                continue
            if inline:
                meta = metas[outcome.index] if 0 <= outcome.index < len(metas) else None
                if meta is not None:
                    entry["metadata"] = meta
                inlined.append(entry)
                continue
            item = outcome.item
            answered = "response" in entry
            if answered and item.decision.error_first:
                out.write({"key": item.custom_id, "error": dict(INJECTED_ERRORS["server_error"])})
            out.write({"key": item.custom_id, **entry}, item.decision if answered else None)
            if answered and item.decision.other_answer and "candidates" in entry["response"]:
                out.write({"key": item.custom_id, "response": _answer_again(job, item.custom_id, entry)})
        if inline:
            return {"output": {"inlinedResponses": {"inlinedResponses": inlined}}}
        out.write_foreign(job.faults.unknown_result_lines, job.id)
        file_meta = output_file(
            state, PROVIDER, "gr", f"batch-{job.id}-responses.jsonl", FILE_TTL_S, id_length=20
        )
        out.keep(file_meta)
    return {"output": {"responsesFile": f"files/{file_meta.id}"}}


def _answer_again(job: Job, custom_id: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """A second response to an item with another answer, billed again (``rate_duplicate_other``)."""
    again: dict[str, Any] = json.loads(json.dumps(entry["response"]))
    part = again["candidates"][0]["content"]["parts"][0]
    part["text"] = another_answer(part.get("text"))
    usage = again["usageMetadata"]
    usage["candidatesTokenCount"] += 1
    usage["totalTokenCount"] += 1
    cached = int(usage.get("cachedContentTokenCount") or 0)
    used = {"input": usage["promptTokenCount"], "cached": cached, "output": usage["candidatesTokenCount"]}
    job.bill_again(custom_id, **generate_billed(used))
    return again


def _entry(job: Job, outcome: ItemOutcome, seen_prefixes: set[str]) -> dict[str, Any] | None:
    """One item's response or error entry (``None``: fault ``missing``, no line at all); bills it.

    :param job: the batch
    :param outcome: how the item ended
    :param seen_prefixes: prompt prefixes met earlier in the batch (prompt caching)
    """
    item = outcome.item
    if outcome.end != "processed":
        code = 499 if outcome.end == "cancelled" else 504
        message = (
            "The request was not run because the batch was cancelled."
            if code == 499
            else "The request was not run before the batch expired."
        )
        return {"error": status_error(code, message)}
    error = item.natural_error or injected_error(item, INJECTED_ERRORS)
    if error is not None:
        return {"error": dict(error)}
    if item.decision.fault == "missing":
        return None
    if job.attrs["kind"] == "embed":
        entry = {"response": embed_response(item.body)[0]}
        job.bill(item.custom_id, input_tokens=entry["response"]["usageMetadata"]["promptTokenCount"])
        return entry
    config = job.config
    prompt = GeminiPrompt(item.body)
    seen = prompt.prefix_key is not None and prompt.prefix_key in seen_prefixes
    if prompt.prefix_key is not None:
        seen_prefixes.add(prompt.prefix_key)
    cached = model.cached_tokens(prompt.prefix_tokens, seen, config.cache_min_tokens, 1)
    answer, used = generate_response(
        item.body,
        model_name=job.attrs["model"],
        response_id=stable_id("", job.id, item.custom_id, length=20),
        cached=cached,
    )
    job.bill(item.custom_id, **generate_billed(used))
    return {"response": answer}
