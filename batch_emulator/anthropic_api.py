"""Anthropic Message Batches (``/v1/messages/batches``) and Messages (``POST /v1/messages``).

Objects follow the shapes of the ``anthropic`` SDK's own types (``MessageBatch``,
``MessageBatchIndividualResponse``, ``Message``, ``ErrorResponse``), which parse them without
error; the tests drive every route through the real SDK.

Lifecycle: the provider-neutral :class:`~batch_emulator.lifecycle.Job` schedule
(same timings, time scale, faults and seeded processing order as the OpenAI routes) is mapped to
Anthropic's three words: ``validating``, ``in_progress`` and ``finalizing`` are ``in_progress``;
``cancelling`` is ``canceling``; every terminal state is ``ended``. As the SDK documents,
``request_counts`` holds every request under ``processing`` until the batch ends, then splits
them into ``succeeded`` / ``errored`` / ``canceled`` / ``expired``. ``results_url`` appears once
the batch has ended and points back at this emulator
(``GET /v1/messages/batches/{id}/results``, JSONL streamed, lines in processing order).

Faults, in Anthropic's formats (the knobs are :class:`~batch_emulator.faults.FaultConfig`'s):

- ``rate_500`` -> ``errored`` result, error type ``overloaded_error`` (Anthropic's transient
  capacity error, HTTP 529 on the synchronous API); ``rate_429`` -> ``rate_limit_error``;
  ``rate_400`` -> ``invalid_request_error``; ``rate_context_length`` -> ``invalid_request_error``
  "prompt is too long: N tokens > M maximum"; ``rate_missing`` -> no line at all (the item still
  counts as ``succeeded``); ``rate_duplicate`` / ``rate_malformed`` -> the line twice / truncated;
- ``expire_batches`` / ``expire_rate`` -> the batch ends at ``expire_after_fraction`` of its work,
  the rest of the requests get ``{"type": "expired"}`` results;
- ``fail_validation`` -> the create call is refused with HTTP 400 ``invalid_request_error``
  (Anthropic validates a batch when it is created; it has no ``failed`` batch state);
- ``retrieve_5xx_rate`` -> ``GET /v1/messages/batches/{id}`` answers HTTP 500 ``api_error``;
- ``sync_429_rate`` / ``rpm_limit`` / ``tpm_limit`` -> ``POST /v1/messages`` answers HTTP 429
  ``rate_limit_error`` with ``retry-after`` and ``anthropic-ratelimit-*`` headers;
  ``sync_500_rate`` -> HTTP 529 ``overloaded_error``.

Prompt caching, as Anthropic reports it: the cacheable prefix is every system block up to and
including the last one marked ``cache_control`` (a plain-string ``system`` is never cached). When
that prefix is at least ``cache_min_tokens`` (1,024 by default: Anthropic's minimum for Sonnet and
Opus models; the real minimum is 2,048 for Haiku 3/3.5 and 4,096 for Haiku 4.5 and Opus 4.5, set
``cache_min_tokens`` to emulate those), the first request with that prefix in a batch (in
processing order) reports it as ``cache_creation_input_tokens``, later requests as
``cache_read_input_tokens``; ``input_tokens`` is always the rest of the prompt only. No rounding
to 128-token blocks (that is OpenAI's rule). The synchronous endpoint remembers prefixes across
requests for the emulator's life.

Limits enforced at create: at most 100,000 requests and 256 MB of request body; ``custom_id``
matches ``^[a-zA-Z0-9_-]{1,64}$`` and is unique in the batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from batch_emulator import model
from batch_emulator.app import CUSTOM_ID_HEADER, ApiError, guard_create
from batch_emulator.common import (
    ErrorTable,
    another_answer,
    html_page_instead,
    injected_error,
    key_accepted,
    output_file,
    result_file,
    retrieve_fails,
    settle,
    stable_id,
)
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import RateDecision, retry_after_header
from batch_emulator.lifecycle import Job, JobItem
from batch_emulator.store import EmulatorState

PROVIDER: Final = "anthropic"
MAX_REQUESTS: Final = 100_000
MAX_BODY_BYTES: Final = 256 * 1024 * 1024
CUSTOM_ID: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
RESULTS_TTL_S: Final = 29 * 86_400
_STATUS: Final[dict[str, str]] = {
    "validating": "in_progress",
    "in_progress": "in_progress",
    "finalizing": "in_progress",
    "cancelling": "canceling",
    "completed": "ended",
    "failed": "ended",
    "expired": "ended",
    "cancelled": "ended",
}
_OVERLOADED: Final = "Overloaded"
#: where the API key may be (the API reads x-api-key; recent SDKs send a bearer token)
KEY_SOURCES: Final = ("x-api-key", "bearer")


def error_body(type_: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    """Return an Anthropic ``ErrorResponse`` body.

    :param type_: the error type (``invalid_request_error``, ``rate_limit_error`` ...)
    :param message: what went wrong
    :param request_id: the request id, when there is one
    """
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": request_id}


def _fail(status: int, type_: str, message: str, headers: Mapping[str, str] | None = None) -> ApiError:
    return ApiError(status, error_body(type_, message), headers)


def rfc3339(seconds: float | None) -> str | None:
    """Format unix seconds as an RFC 3339 UTC timestamp (``None`` stays ``None``).

    :param seconds: unix seconds
    """
    if seconds is None:
        return None
    return datetime.fromtimestamp(int(seconds), tz=timezone.utc).isoformat().replace("+00:00", "Z")


# -- request content ---------------------------------------------------------------------------


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, Mapping):
        return str(block.get("text") or "")
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return model.join_texts([_block_text(b) for b in content])
    return _block_text(content)


class MessagesPrompt:
    """A Messages request digested for the stand-in model and the token counts.

    :param params: the request's params (the ``POST /v1/messages`` body)
    """

    def __init__(self, params: Mapping[str, Any]) -> None:
        system = params.get("system")
        blocks: list[Any] = (
            list(system) if isinstance(system, list) else ([system] if isinstance(system, str) else [])
        )
        texts = [_block_text(b) for b in blocks]
        self.system = model.join_texts(texts)
        last_marked = -1
        for i, block in enumerate(blocks):
            if isinstance(block, Mapping) and block.get("cache_control"):
                last_marked = i
        prefix = texts[: last_marked + 1]
        self.prefix_tokens = sum(model.count_tokens(t) for t in prefix)
        self.prefix_key = model.prefix_key(["anthropic", *prefix]) if prefix else None
        messages = params.get("messages")
        self.messages: list[Mapping[str, Any]] = (
            [m for m in messages if isinstance(m, Mapping)] if isinstance(messages, list) else []
        )
        message_texts = [_content_text(m.get("content")) for m in self.messages]
        self.user = model.join_texts(
            [t for m, t in zip(self.messages, message_texts, strict=True) if m.get("role") == "user"]
        )
        self.prompt_tokens = sum(model.count_tokens(t) for t in texts) + sum(
            model.message_tokens(t) for t in message_texts
        )
        output_config = params.get("output_config")
        self.json_mode = isinstance(output_config, Mapping) and isinstance(
            output_config.get("format"), Mapping
        )
        limit = params.get("max_tokens")
        self.max_tokens = limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def _natural(type_: str, message: str, status: int = 400) -> dict[str, Any]:
    return {"status": status, "type": type_, "message": message, "param": None, "code": type_}


def _too_long(tokens: int, window: int) -> dict[str, Any]:
    return _natural("invalid_request_error", f"prompt is too long: {tokens} tokens > {window} maximum")


def request_error(params: Any, config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error a Messages request causes by itself (``status``/``type``/``message``), or ``None``.

    :param params: the request params
    :param config: emulator settings (context window)
    """
    if not isinstance(params, Mapping):
        return _natural("invalid_request_error", "params: Input should be a valid dictionary")
    if not isinstance(params.get("model"), str) or not params["model"]:
        return _natural("invalid_request_error", "model: Field required")
    limit = params.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return _natural("invalid_request_error", "max_tokens: Field required (an integer of at least 1)")
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        return _natural("invalid_request_error", "messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            return _natural(
                "invalid_request_error",
                f"messages.{i}.role: Input should be 'user' or 'assistant' "
                "(the system prompt goes in the top-level 'system' field)",
            )
    if params.get("stream"):
        return _natural("invalid_request_error", "stream: batch and emulator requests cannot stream")
    tokens = MessagesPrompt(params).prompt_tokens
    if tokens > config.context_window_tokens:
        return _too_long(tokens, config.context_window_tokens)
    return None


def message_object(
    params: Mapping[str, Any], *, message_id: str, cache_read: int, cache_write: int, service_tier: str
) -> dict[str, Any]:
    """Answer a valid request with a ``Message`` object.

    :param params: the request params
    :param message_id: the ``msg_...`` id
    :param cache_read: prompt tokens read from the cache
    :param cache_write: prompt tokens written to the cache
    :param service_tier: ``batch`` or ``standard``
    """
    prompt = MessagesPrompt(params)
    reply = model.respond(
        prompt.system or None, prompt.user, json_mode=prompt.json_mode, max_output_tokens=prompt.max_tokens
    )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": str(params["model"]),
        "content": [{"type": "text", "text": reply.text, "citations": None}],
        "stop_reason": "max_tokens" if reply.truncated else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(0, prompt.prompt_tokens - cache_read - cache_write),
            "output_tokens": reply.output_tokens,
            "cache_creation_input_tokens": cache_write,
            "cache_read_input_tokens": cache_read,
            "cache_creation": {"ephemeral_5m_input_tokens": cache_write, "ephemeral_1h_input_tokens": 0},
            "server_tool_use": None,
            "service_tier": service_tier,
        },
    }


def message_billed(usage: Mapping[str, Any]) -> dict[str, int]:
    """Return the record's billed tokens of a ``Message`` usage object.

    :param usage: the message's ``usage``
    """
    return {
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cached_input_tokens": int(usage.get("cache_read_input_tokens") or 0),
        "cache_write_tokens": int(usage.get("cache_creation_input_tokens") or 0),
    }


def cache_split(prompt: MessagesPrompt, seen: bool, config: EmulatorConfig) -> tuple[int, int]:
    """Return ``(cache_read, cache_write)`` tokens of one request.

    :param prompt: the digested request
    :param seen: its prefix was processed before (in this batch, or by the sync endpoint)
    :param config: settings (``cache_min_tokens``)
    """
    if prompt.prefix_key is None or prompt.prefix_tokens < config.cache_min_tokens:
        return 0, 0
    return (prompt.prefix_tokens, 0) if seen else (0, prompt.prefix_tokens)


# -- router ----------------------------------------------------------------------------------


def build_router(state: EmulatorState) -> APIRouter:
    """Return the ``/v1/messages`` router bound to the emulator state.

    :param state: the shared state
    """
    api = AnthropicEmulator(state)
    state.finalizers[PROVIDER] = api.batch_json

    def check_auth(request: Request) -> None:
        # The API takes the key as x-api-key; recent SDKs send it as a bearer token.
        if not key_accepted(state, request, KEY_SOURCES):
            raise _fail(401, "authentication_error", "invalid x-api-key")

    router = APIRouter(prefix="/v1/messages", dependencies=[Depends(check_auth)])
    router.add_api_route("", api.create_message, methods=["POST"])
    router.add_api_route("/batches", api.create_batch, methods=["POST"])
    router.add_api_route("/batches", api.list_batches, methods=["GET"])
    router.add_api_route("/batches/{batch_id}", api.retrieve_batch, methods=["GET"])
    router.add_api_route("/batches/{batch_id}/cancel", api.cancel_batch, methods=["POST"])
    router.add_api_route("/batches/{batch_id}/results", api.results, methods=["GET"])
    return router


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > limit:
        raise _fail(
            413, "request_too_large", f"Request exceeds the maximum allowed number of bytes ({limit})."
        )
    try:
        body = await run_in_threadpool(json.loads, raw)
    except ValueError as exc:
        raise _fail(400, "invalid_request_error", f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _fail(400, "invalid_request_error", "the request body must be a JSON object")
    return body


def _int_param(value: str | None, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError as exc:
        raise _fail(400, "invalid_request_error", f"{name}: Input should be a valid integer") from exc
    if not low <= number <= high:
        raise _fail(400, "invalid_request_error", f"{name}: must be between {low} and {high}")
    return number


class AnthropicEmulator:
    """The endpoint handlers, bound to the shared state.

    :param state: the shared state
    """

    def __init__(self, state: EmulatorState) -> None:
        self.state = state

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, request: Request) -> Any:
        """``POST /v1/messages/batches`` (``{"requests": [{"custom_id", "params"}, ...]}``), faulty."""
        return await guard_create(
            self.state, PROVIDER, "create", lambda: self._create_batch(request), _refuse
        )

    async def _create_batch(self, request: Request) -> dict[str, Any]:
        body = await _json_body(request, MAX_BODY_BYTES)
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise _fail(400, "invalid_request_error", "requests: at least one request is required")
        if len(requests) > MAX_REQUESTS:
            raise _fail(
                400,
                "invalid_request_error",
                f"requests: a Message Batch holds at most {MAX_REQUESTS} requests, got {len(requests)}",
            )
        state = self.state
        config = state.config
        seen: set[str] = set()
        items = state.item_log()
        for number, entry in enumerate(requests):
            custom_id = entry.get("custom_id") if isinstance(entry, Mapping) else None
            if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
                raise _fail(
                    400,
                    "invalid_request_error",
                    f"requests.{number}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'",
                )
            if custom_id in seen:
                raise _fail(
                    400,
                    "invalid_request_error",
                    f"requests.{number}.custom_id: duplicate custom_id {custom_id!r}; "
                    "custom_id values must be unique within a batch",
                )
            seen.add(custom_id)
            params = entry.get("params")
            if not isinstance(params, Mapping):
                raise _fail(400, "invalid_request_error", f"requests.{number}.params: Field required")
            items.append(
                JobItem(
                    custom_id=custom_id,
                    line=number + 1,
                    body=params,
                    decision=config.faults.decide_item(config.seed, custom_id),
                    natural_error=request_error(params, config),
                )
            )
        if state.consume_validation_failure():
            raise _fail(
                400,
                "invalid_request_error",
                "The batch was rejected at validation (emulator fault fail_validation).",
            )
        base = str(request.base_url).rstrip("/")
        job = state.create_job(PROVIDER, state.new_id("msgbatch_", 24), items, [], config, {"base_url": base})
        return self.batch_json(job, state.now())

    def _job(self, batch_id: str) -> Job:
        job = self.state.jobs.get(batch_id, PROVIDER)
        if job is None:
            raise _fail(404, "not_found_error", f"No message batch found with id '{batch_id}'.")
        return job

    def batch_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the ``MessageBatch`` object at ``now``, writing the results on first terminal sight.

        :param job: the batch
        :param now: the current time
        """
        view = settle(self.state, job, now, self._write_results)
        results = job.results or {}
        status = _STATUS[view.status]
        n = len(job.items)
        counts = {"processing": n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        ended_at = None
        if status == "ended":
            counts = {"processing": 0, **results["counts"]}
            ended_at = next(
                (view.times[k] for k in ("completed_at", "expired_at", "cancelled_at") if k in view.times),
                int(now),
            )
        return {
            "id": job.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "ended_at": rfc3339(ended_at),
            "created_at": rfc3339(job.created),
            "expires_at": rfc3339(job.created + job.config.timings.completion_window_s),
            "archived_at": None,
            "cancel_initiated_at": rfc3339(job.cancel_requested_at),
            "results_url": (
                f"{job.attrs['base_url']}/v1/messages/batches/{job.id}/results" if status == "ended" else None
            ),
        }

    def _write_results(self, job: Job, now: float, status: str) -> dict[str, Any]:
        """Render and store the results file of a batch that just ended, a line at a time."""
        del status  # an ended batch has one results file, whatever ended it
        counts = {"succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        seen_prefixes: set[str] = set()
        config = job.config
        with result_file(self.state, "custom_id") as out:
            for outcome in job.outcomes(now):
                item = outcome.item
                if outcome.end != "processed":
                    kind = "expired" if outcome.end == "expired" else "canceled"
                    counts[kind] += 1
                    out.write({"custom_id": item.custom_id, "result": {"type": kind}})
                    continue
                error = item.natural_error or injected_error(item, INJECTED_ERRORS)
                if error is not None:
                    counts["errored"] += 1
                    request_id = stable_id("req_", job.id, item.custom_id)
                    result = {
                        "type": "errored",
                        "error": error_body(error["type"], error["message"], request_id),
                    }
                    out.write({"custom_id": item.custom_id, "result": result})
                    continue
                counts["succeeded"] += 1
                if item.decision.fault == "missing":
                    continue
                if item.decision.error_first:
                    first = INJECTED_ERRORS["server_error"]
                    request_id = stable_id("req_", job.id, item.custom_id, "first")
                    result = {
                        "type": "errored",
                        "error": error_body(first["type"], first["message"], request_id),
                    }
                    out.write({"custom_id": item.custom_id, "result": result})
                prompt = MessagesPrompt(item.body)
                seen = prompt.prefix_key is not None and prompt.prefix_key in seen_prefixes
                read, write = cache_split(prompt, seen, config)
                if prompt.prefix_key is not None and prompt.prefix_tokens >= config.cache_min_tokens:
                    seen_prefixes.add(prompt.prefix_key)
                message = message_object(
                    item.body,
                    message_id=stable_id("msg_", job.id, item.custom_id),
                    cache_read=read,
                    cache_write=write,
                    service_tier="batch",
                )
                job.bill(item.custom_id, **message_billed(message["usage"]))
                out.write(
                    {"custom_id": item.custom_id, "result": {"type": "succeeded", "message": message}},
                    item.decision,
                )
                if item.decision.other_answer:
                    again = json.loads(json.dumps(message))
                    for block in again["content"]:
                        if block.get("type") == "text":
                            block["text"] = another_answer(block["text"])
                    again["usage"]["output_tokens"] += 1
                    job.bill_again(item.custom_id, **message_billed(again["usage"]))
                    out.write(
                        {"custom_id": item.custom_id, "result": {"type": "succeeded", "message": again}}
                    )
            out.write_foreign(job.faults.unknown_result_lines, job.id)
            meta = output_file(self.state, PROVIDER, "file-", f"{job.id}_results.jsonl", RESULTS_TTL_S)
            out.keep(meta)
        return {"file_id": meta.id, "counts": counts}

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/messages/batches/{batch_id}``; may answer an injected transient 500."""
        state = self.state
        if retrieve_fails(state, PROVIDER):
            raise _fail(500, "api_error", "Internal server error")
        return self.batch_json(self._job(batch_id), state.now())

    def list_batches(self, request: Request) -> dict[str, Any]:
        """``GET /v1/messages/batches?before_id=&after_id=&limit=``, newest first."""
        q = request.query_params
        limit = _int_param(q.get("limit"), "limit", 20, 1, 1000)
        jobs = self.state.jobs.list(PROVIDER)
        ids = [j.id for j in jobs]
        before, after = q.get("before_id"), q.get("after_id")
        if before and after:
            raise _fail(400, "invalid_request_error", "give before_id or after_id, not both")
        start, end = 0, min(len(ids), limit)
        if after or before:
            cursor = after or before
            try:
                at = ids.index(str(cursor))
            except ValueError as exc:
                raise _fail(
                    400,
                    "invalid_request_error",
                    f"{'after_id' if after else 'before_id'}: no batch {cursor!r}",
                ) from exc
            start, end = (at + 1, min(len(ids), at + 1 + limit)) if after else (max(0, at - limit), at)
        now = self.state.now()
        page = [self.batch_json(j, now) for j in jobs[start:end]]
        has_more = start > 0 if before else end < len(ids)
        return {
            "data": page,
            "has_more": has_more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/messages/batches/{batch_id}/cancel``; cancelling an ended batch changes nothing."""
        job = self._job(batch_id)
        now = self.state.now()
        with self.state.lock:
            accepted = job.request_cancel(now)
        if accepted:
            self.state.bump(PROVIDER, "batches_cancelled")
        return self.batch_json(job, now)

    def results(self, batch_id: str) -> Response:
        """``GET /v1/messages/batches/{batch_id}/results``: the JSONL results, streamed."""
        job = self._job(batch_id)
        view = self.batch_json(job, self.state.now())
        if view["processing_status"] != "ended" or job.results is None:
            raise _fail(
                400,
                "invalid_request_error",
                f"Message Batch {batch_id} has not ended yet; results are available once "
                "processing_status is 'ended'.",
            )
        file_id = job.results["file_id"]
        meta = self.state.files.get(file_id)
        assert meta is not None
        page = html_page_instead(self.state, meta.purpose)
        if page is not None:
            return page
        return StreamingResponse(
            self.state.files.iter_bytes(file_id),
            media_type="application/binary",
            headers={"content-length": str(meta.bytes)},
        )

    # -- synchronous endpoint ------------------------------------------------------------------

    def _admit(self, tokens: int) -> dict[str, str]:
        """Apply request faults and the rate limiter; return rate-limit headers for the answer."""
        state = self.state
        counter = state.bump(PROVIDER, "sync_requests")
        config = state.config
        faults = config.faults
        headers = {"request-id": state.new_id("req_", 24)}
        if faults.request_fails(config.seed, "sync429", counter, faults.sync_429_rate):
            state.bump(PROVIDER, "sync_429")
            wait = faults.sync_retry_after_s
            raise _fail(
                429,
                "rate_limit_error",
                "This request would exceed the rate limit (emulated fault sync_429_rate).",
                {
                    **headers,
                    "retry-after": retry_after_header(wait),
                    "anthropic-ratelimit-requests-remaining": "0",
                },
            )
        if faults.request_fails(config.seed, "sync500", counter, faults.sync_500_rate):
            state.bump(PROVIDER, "sync_529")
            raise _fail(529, "overloaded_error", _OVERLOADED, headers)
        window = config.scaled(config.timings.rate_window_s)
        with state.lock:
            decision = state.limiter.check(state.now(), tokens, faults.rpm_limit, faults.tpm_limit, window)
        headers.update(_ratelimit_headers(decision, state.now()))
        if not decision.allowed:
            state.bump(PROVIDER, "sync_429")
            which = "requests" if decision.remaining_requests == 0 else "tokens"
            raise _fail(
                429,
                "rate_limit_error",
                f"This request would exceed the rate limit for {which} per window.",
                {**headers, "retry-after": retry_after_header(decision.retry_after_s)},
            )
        return headers

    async def create_message(self, request: Request) -> JSONResponse:
        """``POST /v1/messages`` (non-streaming)."""
        params = await _json_body(request, 32 * 1024 * 1024)
        config = self.state.config
        problem = request_error(params, config)
        prompt = MessagesPrompt(params)
        headers = self._admit(prompt.prompt_tokens + (prompt.max_tokens or 0))
        if problem is not None:
            raise ApiError(problem["status"], error_body(problem["type"], problem["message"]), headers)
        with self.state.lock:
            seen = prompt.prefix_key is not None and prompt.prefix_key in self.state.seen_prefixes
            if prompt.prefix_key is not None and prompt.prefix_tokens >= config.cache_min_tokens:
                self.state.seen_prefixes.add(prompt.prefix_key)
        read, write = cache_split(prompt, seen, config)
        obj = message_object(
            params,
            message_id=self.state.new_id("msg_"),
            cache_read=read,
            cache_write=write,
            service_tier="standard",
        )
        self.state.record_realtime(
            PROVIDER, request.headers.get(CUSTOM_ID_HEADER), message_billed(obj["usage"])
        )
        return JSONResponse(obj, headers=headers)


def _refuse(status: int, headers: Mapping[str, str]) -> ApiError:
    """The answer of a create refused by an injected fault, before anything was created."""
    if status == 429:
        return _fail(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your rate limit (emulated create fault).",
            headers,
        )
    return _fail(status, "api_error", "Internal server error (emulated create fault).", headers)


#: item fault -> the ``errored`` result it becomes
INJECTED_ERRORS: Final[ErrorTable] = {
    "server_error": _natural("overloaded_error", f"{_OVERLOADED} (emulated fault rate_500)", 529),
    "rate_limited": _natural("rate_limit_error", "Rate limited (emulated fault rate_429)", 429),
    "invalid_request": _natural("invalid_request_error", "Invalid request (emulated fault rate_400)"),
    "context_length": _natural(
        "invalid_request_error",
        "prompt is too long: 210000 tokens > 200000 maximum (emulated fault rate_context_length)",
    ),
}


def _ratelimit_headers(decision: RateDecision, now: float) -> dict[str, str]:
    headers: dict[str, str] = {}
    if decision.limit_requests is not None:
        headers["anthropic-ratelimit-requests-limit"] = str(decision.limit_requests)
        headers["anthropic-ratelimit-requests-remaining"] = str(decision.remaining_requests or 0)
        headers["anthropic-ratelimit-requests-reset"] = str(rfc3339(now + decision.reset_requests_s))
    if decision.limit_tokens is not None:
        headers["anthropic-ratelimit-tokens-limit"] = str(decision.limit_tokens)
        headers["anthropic-ratelimit-tokens-remaining"] = str(decision.remaining_tokens or 0)
        headers["anthropic-ratelimit-tokens-reset"] = str(rfc3339(now + decision.reset_tokens_s))
    return headers


def iter_results(data: bytes) -> Sequence[dict[str, Any]]:
    """Parse a results file's bytes into objects (a helper for tests and tools; skips broken lines).

    :param data: the bytes
    """
    out: list[dict[str, Any]] = []
    for raw in data.splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out
