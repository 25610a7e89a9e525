"""OpenAI-compatible Files, Batch, Chat Completions and Embeddings endpoints under ``/v1``.

Objects follow the official OpenAPI description (``OpenAIFile``, ``Batch``, ``ListBatchesResponse``,
``ListFilesResponse``, ``DeleteFileResponse``, ``CreateChatCompletionResponse``,
``CreateEmbeddingResponse``, ``ErrorResponse``). Where the description types a field as a plain
string but the live API sends ``null`` (``output_file_id`` of a running batch ...), the emulator
leaves the field out, which both the description and the SDK accept. The one exception is an
empty ``GET /v1/files`` page, whose required ``first_id``/``last_id`` are ``null`` as in the live API.

The request checks and response bodies are in :mod:`batch_emulator.openai_bodies`; a batch's input
file is read and its result files written by :mod:`batch_emulator.openai_lines`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.responses import Response

from batch_emulator import model
from batch_emulator.app import CUSTOM_ID_HEADER, ApiError, guard_create
from batch_emulator.common import (
    BEARER,
    html_page_instead,
    key_accepted,
    retrieve_fails,
    settle,
)
from batch_emulator.faults import RateDecision, retry_after_header
from batch_emulator.lifecycle import Job, ValidationIssue
from batch_emulator.openai_bodies import (
    PROVIDER,
    SERVER_ERROR,
    ChatPrompt,
    chat_completion,
    chat_request_error,
    chat_view,
    embedding_inputs,
    embedding_list,
    embedding_request_error,
    error_body,
    input_tokens,
    moderation_object,
    moderation_request_error,
    response_object,
    response_request_error,
)
from batch_emulator.openai_lines import parse_input, write_results
from batch_emulator.store import EmulatorState, FileTooLargeError, StoredFile

SUPPORTED_ENDPOINTS: Final = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations")
FILE_PURPOSES: Final = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})


def _fail(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    return ApiError(status, error_body(message, type_, param, code), headers)


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


# -- router ----------------------------------------------------------------------------------


def build_router(state: EmulatorState) -> APIRouter:
    """Return the ``/v1`` router bound to the emulator state.

    :param state: the shared state
    """
    api = OpenAIEmulator(state)
    state.finalizers[PROVIDER] = api.batch_json

    def check_auth(request: Request) -> None:
        if not key_accepted(state, request, (BEARER,)):
            raise _fail(401, "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key")

    router = APIRouter(prefix="/v1", dependencies=[Depends(check_auth)])
    router.add_api_route("/files", api.upload_file, methods=["POST"])
    router.add_api_route("/files", api.list_files, methods=["GET"])
    router.add_api_route("/files/{file_id}", api.retrieve_file, methods=["GET"])
    router.add_api_route("/files/{file_id}", api.delete_file, methods=["DELETE"])
    router.add_api_route("/files/{file_id}/content", api.file_content, methods=["GET"])
    router.add_api_route("/batches", api.create_batch, methods=["POST"])
    router.add_api_route("/batches", api.list_batches, methods=["GET"])
    router.add_api_route("/batches/{batch_id}", api.retrieve_batch, methods=["GET"])
    router.add_api_route("/batches/{batch_id}/cancel", api.cancel_batch, methods=["POST"])
    router.add_api_route("/chat/completions", api.chat_completions, methods=["POST"])
    router.add_api_route("/embeddings", api.embeddings, methods=["POST"])
    router.add_api_route("/responses", api.responses, methods=["POST"])
    router.add_api_route("/moderations", api.moderations, methods=["POST"])
    return router


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise _fail(400, f"We could not parse the JSON body of your request: {exc}.") from exc
    if not isinstance(body, dict):
        raise _fail(400, "The request body must be a JSON object.")
    return body


def _int_param(value: str | None, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError as exc:
        raise _fail(400, f"Invalid '{name}': expected an integer.", param=name, code="invalid_value") from exc
    if not low <= number <= high:
        raise _fail(
            400, f"Invalid '{name}': must be between {low} and {high}.", param=name, code="invalid_value"
        )
    return number


def _page(ids: Sequence[str], after: str | None, limit: int) -> tuple[int, int]:
    """Return the slice ``[start, end)`` of a page that follows the cursor ``after``."""
    start = 0
    if after:
        try:
            start = list(ids).index(after) + 1
        except ValueError as exc:
            raise _fail(
                400, f"Invalid 'after': no object with id {after!r}.", param="after", code="invalid_value"
            ) from exc
    return start, min(len(ids), start + limit)


class OpenAIEmulator:
    """The endpoint handlers, bound to the shared state.

    :param state: the shared state
    """

    def __init__(self, state: EmulatorState) -> None:
        self.state = state

    # -- files -----------------------------------------------------------------------------

    @staticmethod
    def file_json(meta: StoredFile) -> dict[str, Any]:
        """Return the ``OpenAIFile`` object of a stored file.

        :param meta: the stored file
        """
        return _drop_none(
            {
                "id": meta.id,
                "object": "file",
                "bytes": meta.bytes,
                "created_at": meta.created_at,
                "expires_at": meta.expires_at,
                "filename": meta.filename,
                "purpose": meta.purpose,
                "status": "processed",
            }
        )

    def _file(self, file_id: str) -> StoredFile:
        meta = self.state.files.get(file_id)
        if meta is None or meta.provider != PROVIDER:
            raise _fail(404, f"No such File object: {file_id}", param="id", code=None)
        return meta

    async def upload_file(self, request: Request) -> Any:
        """``POST /v1/files`` (multipart: ``file``, ``purpose``), under the create faults."""
        return await guard_create(self.state, PROVIDER, "upload", lambda: self._upload_file(request), _refuse)

    async def _upload_file(self, request: Request) -> dict[str, Any]:
        form = await request.form()
        try:
            upload = form.get("file")
            purpose = form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise _fail(
                    400,
                    "Missing required parameter: 'file'.",
                    param="file",
                    code="missing_required_parameter",
                )
            if not isinstance(purpose, str) or purpose not in FILE_PURPOSES:
                raise _fail(
                    400,
                    f"Invalid value for 'purpose': {purpose!r}; expected one of {sorted(FILE_PURPOSES)}.",
                    param="purpose",
                    code="invalid_value",
                )
            config = self.state.config
            meta = StoredFile(
                id=self.state.new_id("file-"),
                filename=upload.filename or "upload.jsonl",
                purpose=purpose,
                bytes=0,
                created_at=int(self.state.now()),
                sha256="",
                provider=PROVIDER,
            )
            try:
                await run_in_threadpool(self.state.files.put, meta, upload.file, config.max_file_bytes)
            except FileTooLargeError as exc:
                raise _fail(
                    413,
                    f"File is larger than the {config.max_file_bytes} byte limit.",
                    param="file",
                    code="file_too_large",
                ) from exc
        finally:
            await form.close()
        self.state.bump(PROVIDER, "files_uploaded")
        return self.file_json(meta)

    def list_files(self, request: Request) -> dict[str, Any]:
        """``GET /v1/files?purpose=&limit=&order=&after=``."""
        q = request.query_params
        limit = _int_param(q.get("limit"), "limit", 10_000, 1, 10_000)
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise _fail(
                400, "Invalid 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value"
            )
        files = [f for f in self.state.files.list(PROVIDER) if q.get("purpose") in (None, f.purpose)]
        if order == "desc":
            files.reverse()
        start, end = _page([f.id for f in files], q.get("after"), limit)
        page = files[start:end]
        return {
            "object": "list",
            "data": [self.file_json(f) for f in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": end < len(files),
        }

    def retrieve_file(self, file_id: str) -> dict[str, Any]:
        """``GET /v1/files/{file_id}``."""
        return self.file_json(self._file(file_id))

    def delete_file(self, file_id: str) -> dict[str, Any]:
        """``DELETE /v1/files/{file_id}``."""
        self._file(file_id)
        self.state.files.delete(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    def file_content(self, file_id: str) -> Response:
        """``GET /v1/files/{file_id}/content``, streamed."""
        meta = self._file(file_id)
        page = html_page_instead(self.state, meta.purpose)
        if page is not None:
            return page
        return StreamingResponse(
            self.state.files.iter_bytes(file_id),
            media_type="application/octet-stream",
            headers={"content-length": str(meta.bytes)},
        )

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, request: Request) -> Any:
        """``POST /v1/batches``, under the create faults."""
        return await guard_create(
            self.state, PROVIDER, "create", lambda: self._create_batch(request), _refuse
        )

    async def _create_batch(self, request: Request) -> dict[str, Any]:
        body = await _json_body(request)
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise _fail(
                    400,
                    f"Missing required parameter: '{name}'.",
                    param=name,
                    code="missing_required_parameter",
                )
        endpoint = body["endpoint"]
        if endpoint not in SUPPORTED_ENDPOINTS:
            raise _fail(
                400,
                f"Invalid value for 'endpoint': {endpoint!r}; the emulator supports {list(SUPPORTED_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body["completion_window"] != "24h":
            raise _fail(
                400,
                "Invalid value for 'completion_window': only '24h' is supported.",
                param="completion_window",
                code="invalid_value",
            )
        metadata = body.get("metadata")
        if metadata is not None:
            _check_metadata(metadata)
        meta = self.state.files.get(body["input_file_id"])
        if meta is None or meta.provider != PROVIDER:
            raise _fail(404, f"No such File object: {body['input_file_id']}", param="input_file_id")
        if meta.purpose != "batch":
            raise _fail(
                400,
                f"File {meta.id} has purpose {meta.purpose!r}; batch input files need purpose 'batch'.",
                param="input_file_id",
                code="invalid_value",
            )

        state = self.state
        config = state.config
        forced_failure = state.consume_validation_failure()
        items, issues = await run_in_threadpool(parse_input, state, meta, endpoint, config)
        if forced_failure and not issues:
            issues = [
                ValidationIssue(
                    "emulated_validation_failure",
                    "The input file failed validation (emulator fault fail_validation).",
                )
            ]
        model_name = next((str(i.body.get("model")) for i in items if i.body.get("model")), None)
        if not issues and state.consume_countdown("fail_token_limit"):
            issues = [
                ValidationIssue(
                    "token_limit_exceeded",
                    f"Enqueued token limit reached for {model_name} in organization org-emulator. "
                    "Limit: 90,000 enqueued tokens. Please try again once some in_progress batches have "
                    "been completed.",
                )
            ]
        tokens = sum(input_tokens(endpoint, i.body) for i in items)
        with state.lock:  # the check and the create are one step for concurrent creates
            limit = state.config.faults.enqueued_token_limit
            held = _enqueued_tokens(state, model_name)
            if not issues and limit is not None and held + tokens > limit:
                state.bump(PROVIDER, "enqueued_limit_refused")
                issues = [
                    ValidationIssue(
                        "token_limit_exceeded",
                        f"Enqueued token limit reached for {model_name} in organization org-emulator. "
                        f"Limit: {limit:,} enqueued tokens ({held:,} enqueued, this batch {tokens:,}). Please "
                        "try again once some in_progress batches have been completed.",
                    )
                ]
            job = state.create_job(
                PROVIDER,
                state.new_id("batch_", 32),
                items,
                issues,
                config,
                {
                    "endpoint": endpoint,
                    "input_file_id": meta.id,
                    "completion_window": "24h",
                    "metadata": metadata,
                    "model": model_name,
                    "enqueued_tokens": 0 if issues else tokens,
                },
            )
            peak = f"{PROVIDER}.enqueued_tokens_peak"
            state.counters[peak] = max(state.counters[peak], held + (0 if issues else tokens))
        return self.batch_json(job, state.now())

    def _job(self, batch_id: str) -> Job:
        job = self.state.jobs.get(batch_id, PROVIDER)
        if job is None:
            raise _fail(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return job

    def batch_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the ``Batch`` object at ``now``, writing result files on first terminal sight.

        :param job: the batch
        :param now: the current time
        """
        view = settle(self.state, job, now, partial(write_results, self.state))
        results = job.results or {}
        usage = results.get("usage")
        data: dict[str, Any] = {
            "id": job.id,
            "object": "batch",
            "endpoint": job.attrs["endpoint"],
            "model": job.attrs.get("model"),
            "errors": {"object": "list", "data": [i.to_dict() for i in job.issues]} if job.issues else None,
            "input_file_id": job.attrs["input_file_id"],
            "completion_window": job.attrs["completion_window"],
            "status": view.status,
            "output_file_id": results.get("output_file_id"),
            "error_file_id": results.get("error_file_id"),
            "created_at": int(job.created),
            "expires_at": int(job.created + job.config.timings.completion_window_s),
            **view.times,
            "request_counts": {"total": view.total, "completed": view.completed, "failed": view.failed},
            "usage": usage,
        }
        out = _drop_none(data)
        out["metadata"] = job.attrs.get("metadata")
        return out

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{batch_id}``; may answer an injected transient 500."""
        state = self.state
        if retrieve_fails(state, PROVIDER):
            raise _fail(500, SERVER_ERROR, "server_error")
        return self.batch_json(self._job(batch_id), state.now())

    def list_batches(self, request: Request) -> dict[str, Any]:
        """``GET /v1/batches?after=&limit=``, newest first."""
        q = request.query_params
        limit = _int_param(q.get("limit"), "limit", 20, 1, 100)
        jobs = self.state.jobs.list(PROVIDER)
        start, end = _page([j.id for j in jobs], q.get("after"), limit)
        now = self.state.now()
        page = [self.batch_json(j, now) for j in jobs[start:end]]
        out: dict[str, Any] = {"object": "list", "data": page, "has_more": end < len(jobs)}
        if page:
            out["first_id"] = page[0]["id"]
            out["last_id"] = page[-1]["id"]
        return out

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{batch_id}/cancel``."""
        job = self._job(batch_id)
        now = self.state.now()
        with self.state.lock:
            if not job.request_cancel(now):
                status = job.view(now).status
                raise _fail(
                    409, f"Cannot cancel a batch with status '{status}'.", code="batch_not_cancellable"
                )
        self.state.bump(PROVIDER, "batches_cancelled")
        return self.batch_json(job, now)

    # -- synchronous endpoints -------------------------------------------------------------

    def _admit(self, kind: str, tokens: int) -> tuple[dict[str, str], float]:
        """Apply request faults and the rate limiter; return the answer's rate-limit headers and its time."""
        state = self.state
        counter = state.bump(PROVIDER, "sync_requests")
        state.bump(PROVIDER, f"sync_requests.{kind}")
        config = state.config
        faults = config.faults
        request_id = state.new_id("req_", 32)
        headers = {"x-request-id": request_id}
        if faults.request_fails(config.seed, "sync429", counter, faults.sync_429_rate):
            state.bump(PROVIDER, "sync_429")
            wait = faults.sync_retry_after_s
            raise _fail(
                429,
                f"Rate limit reached (emulated). Please try again in {wait:.3f}s.",
                "requests",
                code="rate_limit_exceeded",
                headers={
                    **headers,
                    **_retry_headers(wait),
                    **({"x-ratelimit-limit-requests": str(faults.rpm_limit)} if faults.rpm_limit else {}),
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": _duration(wait),
                },
            )
        if faults.request_fails(config.seed, "sync500", counter, faults.sync_500_rate):
            state.bump(PROVIDER, "sync_500")
            raise _fail(500, SERVER_ERROR, "server_error", headers=headers)
        window = config.scaled(config.timings.rate_window_s)
        with state.lock:
            now = state.now()
            decision = state.limiter.check(now, tokens, faults.rpm_limit, faults.tpm_limit, window)
        headers.update(_ratelimit_headers(decision))
        if not decision.allowed:
            state.bump(PROVIDER, "sync_429")
            which = "requests" if decision.remaining_requests == 0 else "tokens"
            raise _fail(
                429,
                f"Rate limit reached for {which} per window. Please try again in {decision.retry_after_s:.3f}s.",
                which,
                code="rate_limit_exceeded",
                headers={**headers, **_retry_headers(decision.retry_after_s)},
            )
        return headers, now

    async def chat_completions(self, request: Request) -> JSONResponse:
        """``POST /v1/chat/completions`` (non-streaming)."""
        body = await _json_body(request)
        problem = chat_request_error(body, self.state.config)  # before the prompt view, as the API checks
        return self._answer(
            request,
            "chat",
            ChatPrompt(body),
            problem,
            lambda cached: chat_completion(
                body,
                completion_id=self.state.new_id("chatcmpl-"),
                created=int(self.state.now()),
                cached=cached,
            ),
        )

    async def responses(self, request: Request) -> JSONResponse:
        """``POST /v1/responses`` (non-streaming, not stored: ``GET`` of a response is not served)."""
        body = await _json_body(request)
        problem = response_request_error(body, self.state.config)
        return self._answer(
            request,
            "responses",
            ChatPrompt(chat_view(body)),
            problem,
            lambda cached: response_object(
                body, response_id=self.state.new_id("resp_"), created=int(self.state.now()), cached=cached
            ),
        )

    def _answer(
        self,
        request: Request,
        kind: str,
        prompt: ChatPrompt,
        problem: dict[str, Any] | None,
        build: Callable[[int], tuple[dict[str, Any], dict[str, int]]],
    ) -> JSONResponse:
        """Admit a real-time generation, refuse it with its problem, or answer it and record its usage.

        :param request: the HTTP request (its custom-id header names the item in the record)
        :param kind: the rate-limit bucket (``chat``, ``responses``)
        :param prompt: the request's prompt view (tokens, cacheable prefix)
        :param problem: the validation problem of the body, if any
        :param build: makes the answer and its token usage from the cached-token count
        """
        config = self.state.config
        ceiling = prompt.prompt_tokens + (prompt.max_output_tokens or 0)
        headers, admitted_at = self._admit(kind, ceiling)
        if problem is not None:
            raise ApiError(
                problem["status"],
                error_body(problem["message"], problem["type"], problem["param"], problem["code"]),
                headers,
            )
        with self.state.lock:
            seen = prompt.prefix_key is not None and prompt.prefix_key in self.state.seen_prefixes
            if prompt.prefix_key is not None:
                self.state.seen_prefixes.add(prompt.prefix_key)
        cached = model.cached_tokens(
            prompt.prefix_tokens, seen, config.cache_min_tokens, config.cache_increment_tokens
        )
        obj, used = build(cached)
        if config.faults.tpm_output == "actual":
            with self.state.lock:
                self.state.limiter.recharge(admitted_at, ceiling, prompt.prompt_tokens + used["output"])
        self.state.record_realtime(
            PROVIDER,
            request.headers.get(CUSTOM_ID_HEADER),
            {
                "input_tokens": used["input"] - used["cached"],
                "cached_input_tokens": used["cached"],
                "output_tokens": used["output"],
            },
        )
        return JSONResponse(obj, headers=headers)

    async def moderations(self, request: Request) -> JSONResponse:
        """``POST /v1/moderations``."""
        body = await _json_body(request)
        problem = moderation_request_error(body, self.state.config)
        headers, _ = self._admit("moderations", 0)
        if problem is not None:
            raise ApiError(
                problem["status"],
                error_body(problem["message"], problem["type"], problem["param"], problem["code"]),
                headers,
            )
        obj, _ = moderation_object(body, moderation_id=self.state.new_id("modr-"))
        self.state.record_realtime(PROVIDER, request.headers.get(CUSTOM_ID_HEADER), {})
        return JSONResponse(obj, headers=headers)

    async def embeddings(self, request: Request) -> JSONResponse:
        """``POST /v1/embeddings``."""
        body = await _json_body(request)
        problem = embedding_request_error(body, self.state.config)
        tokens = sum(t for _, t in embedding_inputs(body) or [])
        headers, _ = self._admit("embeddings", tokens)
        if problem is not None:
            raise ApiError(
                problem["status"],
                error_body(problem["message"], problem["type"], problem["param"], problem["code"]),
                headers,
            )
        obj, used = embedding_list(body)
        self.state.record_realtime(
            PROVIDER, request.headers.get(CUSTOM_ID_HEADER), {"input_tokens": used["input"]}
        )
        return JSONResponse(obj, headers=headers)


def _enqueued_tokens(state: EmulatorState, model_name: str | None) -> int:
    """Input tokens of the organisation's batches for ``model_name`` that have not ended (lock held).

    :param state: the emulator state
    :param model_name: the model
    """
    now = state.now()
    return sum(
        int(job.attrs.get("enqueued_tokens", 0))
        for job in state.jobs.list()
        if job.provider == PROVIDER and job.attrs.get("model") == model_name and not job.view(now).terminal
    )


def _refuse(status: int, headers: Mapping[str, str]) -> ApiError:
    """The answer of a create refused by an injected fault, before anything was created."""
    if status == 429:
        return _fail(
            429,
            "Rate limit reached for requests (emulated create fault). Please try again later.",
            "requests",
            code="rate_limit_exceeded",
            headers=headers,
        )
    return _fail(status, SERVER_ERROR, "server_error", headers=headers)


def _check_metadata(metadata: Any) -> None:
    if not isinstance(metadata, Mapping):
        raise _fail(
            400,
            "Invalid 'metadata': expected an object of string keys and values.",
            param="metadata",
            code="invalid_value",
        )
    if len(metadata) > 16:
        raise _fail(400, "Invalid 'metadata': at most 16 keys.", param="metadata", code="invalid_value")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise _fail(
                400,
                f"Invalid 'metadata.{key}': keys are at most 64 characters, values strings of at most 512.",
                param="metadata",
                code="invalid_value",
            )


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.3f}s"


def _retry_headers(seconds: float) -> dict[str, str]:
    return {"retry-after": retry_after_header(seconds), "retry-after-ms": str(max(1, round(seconds * 1000)))}


def _ratelimit_headers(decision: RateDecision) -> dict[str, str]:
    headers: dict[str, str] = {}
    if decision.limit_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(decision.limit_requests)
        headers["x-ratelimit-remaining-requests"] = str(decision.remaining_requests or 0)
        headers["x-ratelimit-reset-requests"] = _duration(decision.reset_requests_s)
    if decision.limit_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(decision.limit_tokens)
        headers["x-ratelimit-remaining-tokens"] = str(decision.remaining_tokens or 0)
        headers["x-ratelimit-reset-tokens"] = _duration(decision.reset_tokens_s)
    return headers


def iter_jsonl(data: bytes) -> Iterator[str]:
    """Yield the non-empty lines of JSONL bytes as text (a helper for tests and tools).

    :param data: the bytes
    """
    for raw in data.splitlines():
        if raw.strip():
            yield raw.decode("utf-8", errors="replace")
