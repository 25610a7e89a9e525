"""Gemini Developer API (``generativelanguage``, ``v1beta``) batch, file and model endpoints.

The routes are the ones the ``google-genai`` SDK calls when its ``base_url`` points at the
emulator (``genai.Client(api_key=..., http_options=types.HttpOptions(base_url=<emulator>,
api_version="v1beta"))``). Only ``v1beta`` is served, the version that documents Batch Mode: the
SDK's own default (``v1``) would collide with the OpenAI routes under ``/v1``, so clients pin it
(the adapter does):

- ``POST /upload/v1beta/files``: the resumable upload protocol. A ``start`` command (JSON body
  ``{"file": {"displayName", "mimeType", "sizeBytes"}}``) answers an ``x-goog-upload-url``; the
  SDK then posts the bytes there with ``upload`` / ``upload, finalize`` commands and an
  ``x-goog-upload-offset``; the finalize answer is ``{"file": File}`` with
  ``x-goog-upload-status: final``.
- ``GET /v1beta/files``, ``GET|DELETE /v1beta/files/{id}``, ``GET /v1beta/files/{id}:download?alt=media``.
- ``POST /v1beta/models/{model}:batchGenerateContent`` and ``:asyncBatchEmbedContent``: create a
  batch from ``{"batch": {"displayName", "inputConfig": {"fileName"} | {"requests": {"requests":
  [...]}}}}``; answer the batch as a long-running ``Operation``.
- ``GET /v1beta/batches``, ``GET|DELETE /v1beta/batches/{id}``, ``POST /v1beta/batches/{id}:cancel``.
- ``POST /v1beta/models/{model}:generateContent``, ``:embedContent``, ``:batchEmbedContents``: the
  synchronous endpoints (rate limiter and request faults apply).

A batch is an ``Operation`` whose ``metadata`` (``GenerateContentBatch``) holds ``model``,
``displayName``, ``state`` (``BATCH_STATE_PENDING``, ``RUNNING``, ``SUCCEEDED``, ``FAILED``,
``CANCELLED``, ``EXPIRED``), ``batchStats`` (``requestCount``, ``successfulRequestCount``,
``failedRequestCount``, ``pendingRequestCount``, int64 written as strings like the live API),
times, and once finished ``output``: ``{"responsesFile": "files/..."}`` for a file input,
``{"inlinedResponses": {"inlinedResponses": [...]}}`` for inline requests. The neutral lifecycle
maps ``validating`` to ``PENDING``; ``in_progress``, ``finalizing`` and ``cancelling`` to
``RUNNING``.

A batch's input is read and its responses written by :mod:`batch_emulator.gemini_lines`; the
request checks and answers are in :mod:`batch_emulator.gemini_bodies`.

Fault knobs are the shared :class:`~batch_emulator.faults.FaultConfig`, rendered
in Google's error format (``{"error": {"code", "message", "status", "details"}}``, a 429 carries
a ``google.rpc.RetryInfo`` detail and a ``Retry-After`` header). Implicit prompt caching: a system
instruction seen before (earlier in the batch, or earlier in the emulator's life for the
synchronous endpoints) is reported as ``cachedContentTokenCount`` under OpenAI's size rule.
Token counts come from :mod:`~batch_emulator.model`; embedding vectors default
to :data:`~batch_emulator.model.DEFAULT_EMBEDDING_DIMENSIONS` values (the live
``gemini-embedding-001`` default is 3072) unless ``outputDimensionality`` says otherwise.
"""

from __future__ import annotations

import base64
import json
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import IO, Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from batch_emulator import model
from batch_emulator.app import CUSTOM_ID_HEADER, ApiError, guard_create
from batch_emulator.common import (
    html_page_instead,
    key_given,
    retrieve_fails,
    settle,
)
from batch_emulator.faults import retry_after_header
from batch_emulator.gemini_bodies import (
    INTERNAL,
    PROVIDER,
    GeminiPrompt,
    embed_request_error,
    embed_response,
    error_body,
    generate_billed,
    generate_request_error,
    generate_response,
    model_resource,
    parts_text,
)
from batch_emulator.gemini_lines import FILE_TTL_S, check_line, parse_file, parse_inline, write_results
from batch_emulator.lifecycle import Job, ValidationIssue
from batch_emulator.store import EmulatorState, FileTooLargeError, StoredFile

API_VERSION: Final = "v1beta"
MAX_INLINE_BYTES: Final = 20 * 1024 * 1024

#: Neutral lifecycle status -> Gemini ``BatchState``.
BATCH_STATES: Final[dict[str, str]] = {
    "validating": "BATCH_STATE_PENDING",
    "in_progress": "BATCH_STATE_RUNNING",
    "finalizing": "BATCH_STATE_RUNNING",
    "cancelling": "BATCH_STATE_RUNNING",
    "completed": "BATCH_STATE_SUCCEEDED",
    "failed": "BATCH_STATE_FAILED",
    "expired": "BATCH_STATE_EXPIRED",
    "cancelled": "BATCH_STATE_CANCELLED",
}
#: where the API key may be, the first one found wins (a header, else the ``key`` query parameter)
KEY_SOURCES: Final = ("x-goog-api-key", "?key")
_GEN_TYPE: Final = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
_EMBED_TYPE: Final = "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch"


def _fail(
    code: int, message: str, status: str | None = None, headers: Mapping[str, str] | None = None
) -> ApiError:
    return ApiError(code, error_body(code, message, status), headers)


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _refuse(status: int, headers: Mapping[str, str]) -> ApiError:
    """The answer of a create refused by an injected fault, before anything was created."""
    if status == 429:
        return _fail(429, "Resource has been exhausted (emulated create fault).", headers=headers)
    return _fail(status, "Internal error encountered (emulated create fault).", headers=headers)


# -- router ----------------------------------------------------------------------------------


@dataclass
class _Upload:
    meta: StoredFile
    declared: int
    sink: IO[bytes]
    received: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def build_router(state: EmulatorState) -> APIRouter:
    """Return the Gemini router bound to the emulator state.

    :param state: the shared state
    """
    api = GeminiEmulator(state)
    state.finalizers[PROVIDER] = api.operation_json
    router = APIRouter()
    router.add_api_route(f"/upload/{API_VERSION}/files", api.upload, methods=["POST"])
    router.add_api_route(f"/{API_VERSION}/files", api.list_files, methods=["GET"])
    router.add_api_route(f"/{API_VERSION}/files/{{file_ref}}", api.get_file, methods=["GET"])
    router.add_api_route(f"/{API_VERSION}/files/{{file_ref}}", api.delete_file, methods=["DELETE"])
    router.add_api_route(f"/{API_VERSION}/models/{{model_ref}}", api.model_action, methods=["POST"])
    router.add_api_route(f"/{API_VERSION}/batches", api.list_batches, methods=["GET"])
    router.add_api_route(f"/{API_VERSION}/batches/{{batch_ref}}", api.get_batch, methods=["GET"])
    router.add_api_route(f"/{API_VERSION}/batches/{{batch_ref}}", api.batch_action, methods=["POST"])
    router.add_api_route(f"/{API_VERSION}/batches/{{batch_ref}}", api.delete_batch, methods=["DELETE"])
    return router


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _fail(400, f"Invalid JSON payload received. {exc}") from exc
    if not isinstance(body, dict):
        raise _fail(400, "Invalid JSON payload received. The body must be a JSON object.")
    return body


def _page_args(request: Request, default: int, high: int) -> tuple[int, int]:
    q = request.query_params
    try:
        size = int(q.get("pageSize") or default)
        start = int(q.get("pageToken") or 0)
    except ValueError as exc:
        raise _fail(
            400, "pageSize and pageToken must be integers (the emulator's page tokens are offsets)."
        ) from exc
    return start, max(1, min(size, high))


class GeminiEmulator:
    """The endpoint handlers, bound to the shared state.

    :param state: the shared state
    """

    def __init__(self, state: EmulatorState) -> None:
        self.state = state
        self._uploads: dict[str, _Upload] = {}
        #: finished sessions: a repeated command on one answers its file again (a session makes one file)
        self._finished: dict[str, str] = {}
        self._mimes: dict[str, str] = {}

    def check_auth(self, request: Request) -> None:
        """Refuse a request without the configured key (``x-goog-api-key`` or ``?key=``)."""
        expected = self.state.config.api_key
        if expected is None:
            return
        given = key_given(request, KEY_SOURCES)
        if (given[0] if given else None) != expected:
            raise _fail(400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT")

    # -- files -----------------------------------------------------------------------------

    def file_json(self, meta: StoredFile, request: Request) -> dict[str, Any]:
        """Return the ``File`` resource of a stored file.

        :param meta: the stored file
        :param request: the request (for absolute URIs)
        """
        base = str(request.base_url).rstrip("/")
        generated = meta.purpose == "batch_output"
        out: dict[str, Any] = {
            "name": f"files/{meta.id}",
            "displayName": meta.filename,
            "mimeType": self._mimes.get(meta.id, "application/jsonl"),
            "sizeBytes": str(meta.bytes),
            "createTime": _rfc3339(meta.created_at),
            "updateTime": _rfc3339(meta.created_at),
            "expirationTime": _rfc3339(meta.expires_at or meta.created_at + FILE_TTL_S),
            "sha256Hash": base64.b64encode(bytes.fromhex(meta.sha256)).decode() if meta.sha256 else "",
            "uri": f"{base}/{API_VERSION}/files/{meta.id}",
            "state": "ACTIVE",
            "source": "GENERATED" if generated else "UPLOADED",
        }
        if generated:
            out["downloadUri"] = f"{base}/{API_VERSION}/files/{meta.id}:download?alt=media"
        return out

    def _file(self, ref: str) -> StoredFile:
        file_id = ref.removeprefix("files/")
        meta = self.state.files.get(file_id)
        if meta is None or meta.provider != PROVIDER:
            raise _fail(
                403,
                f"You do not have permission to access the File {file_id} or it may not exist.",
                "PERMISSION_DENIED",
            )
        return meta

    async def upload(self, request: Request) -> Response:
        """``POST /upload/v1beta/files``: resumable upload ``start``, ``upload`` and ``finalize``.

        The ``finalize`` command (which creates the file) runs under the create faults.
        """
        command = request.headers.get("x-goog-upload-command", "").lower()
        if "finalize" in command:
            answer: Response = await guard_create(
                self.state, PROVIDER, "upload", lambda: self._upload(request, command), _refuse
            )
            return answer
        return await self._upload(request, command)

    async def _upload(self, request: Request, command: str) -> Response:
        if "start" in command:
            self.check_auth(request)  # later commands are authorised by the session's upload_id
            return await self._upload_start(request)
        upload_id = request.query_params.get("upload_id", "")
        session = self._uploads.get(upload_id)
        done = self.state.files.get(self._finished.get(upload_id, ""))
        if session is None and done is not None:
            return JSONResponse(
                {"file": self.file_json(done, request)}, headers={"x-goog-upload-status": "final"}
            )
        if session is None:
            raise _fail(404, f"No upload session {upload_id!r}; start a resumable upload first.")
        try:
            offset = int(request.headers.get("x-goog-upload-offset", "-1"))
        except ValueError:
            offset = -1
        data = await request.body()
        config = self.state.config
        with session.lock:
            if offset != session.received:
                raise _fail(
                    400,
                    f"Upload offset {offset} does not match the {session.received} bytes received so far.",
                    headers={"x-goog-upload-status": "active"},
                )
            session.sink.write(data)
            session.received += len(data)
            if session.received > config.max_file_bytes:
                self._uploads.pop(upload_id, None)
                session.sink.close()
                raise _fail(
                    400,
                    f"File is larger than the {config.max_file_bytes} byte limit; split it.",
                    headers={"x-goog-upload-status": "final"},
                )
        if "finalize" not in command:
            return Response(status_code=200, headers={"x-goog-upload-status": "active"})
        self._uploads.pop(upload_id, None)
        session.sink.seek(0)
        try:
            meta = await run_in_threadpool(
                self.state.files.put, session.meta, session.sink, config.max_file_bytes
            )
        except FileTooLargeError as exc:
            raise _fail(400, str(exc), headers={"x-goog-upload-status": "final"}) from exc
        finally:
            session.sink.close()
        self.state.bump(PROVIDER, "files_uploaded")
        self._finished[upload_id] = meta.id
        return JSONResponse(
            {"file": self.file_json(meta, request)}, headers={"x-goog-upload-status": "final"}
        )

    async def _upload_start(self, request: Request) -> Response:
        body = await _json_body(request)
        file = body.get("file") if isinstance(body.get("file"), dict) else {}
        assert isinstance(file, dict)
        declared_raw = (
            request.headers.get("x-goog-upload-header-content-length")
            or file.get("sizeBytes")
            or file.get("size_bytes")
            or 0
        )
        try:
            declared = int(declared_raw)
        except ValueError as exc:
            raise _fail(400, "X-Goog-Upload-Header-Content-Length must be an integer.") from exc
        config = self.state.config
        if declared > config.max_file_bytes:
            raise _fail(
                400,
                f"File of {declared} bytes is larger than the {config.max_file_bytes} byte limit; split it.",
            )
        name = str(file.get("name") or "").removeprefix("files/")
        file_id = name or self.state.new_id("g", 20)
        now = self.state.now()
        meta = StoredFile(
            id=file_id,
            filename=str(file.get("displayName") or file.get("display_name") or file_id),
            purpose="batch",
            bytes=0,
            created_at=int(now),
            sha256="",
            expires_at=int(now + FILE_TTL_S),
            provider=PROVIDER,
        )
        mime = (
            request.headers.get("x-goog-upload-header-content-type")
            or file.get("mimeType")
            or file.get("mime_type")
        )
        if mime:
            self._mimes[file_id] = str(mime)
        upload_id = self.state.new_id("up", 32)
        sink = tempfile.SpooledTemporaryFile(max_size=8 << 20)  # noqa: SIM115 - closed at finalize
        self._uploads[upload_id] = _Upload(meta, declared, sink)
        base = str(request.base_url).rstrip("/")
        url = f"{base}/upload/{API_VERSION}/files?upload_id={upload_id}&upload_protocol=resumable"
        return Response(status_code=200, headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"})

    def list_files(self, request: Request) -> dict[str, Any]:
        """``GET /v1beta/files?pageSize=&pageToken=``, newest first."""
        self.check_auth(request)
        start, size = _page_args(request, 10, 100)
        files = self.state.files.list(PROVIDER)[::-1]
        page = files[start : start + size]
        out: dict[str, Any] = {"files": [self.file_json(f, request) for f in page]}
        if start + size < len(files):
            out["nextPageToken"] = str(start + size)
        return out

    def get_file(self, file_ref: str, request: Request) -> Response:
        """``GET /v1beta/files/{id}`` or ``GET /v1beta/files/{id}:download?alt=media`` (streamed)."""
        self.check_auth(request)
        file_id, _, action = file_ref.partition(":")
        meta = self._file(file_id)
        if action == "download":
            page = html_page_instead(self.state, meta.purpose)
            if page is not None:
                return page
            return StreamingResponse(
                self.state.files.iter_bytes(meta.id),
                media_type="application/octet-stream",
                headers={"content-length": str(meta.bytes)},
            )
        if action:
            raise _fail(404, f"Unknown method {action!r} on files.")
        return JSONResponse(self.file_json(meta, request))

    def delete_file(self, file_ref: str, request: Request) -> dict[str, Any]:
        """``DELETE /v1beta/files/{id}``."""
        self.check_auth(request)
        meta = self._file(file_ref)
        self.state.files.delete(meta.id)
        return {}

    # -- models: batch create and synchronous calls -----------------------------------------

    async def model_action(self, model_ref: str, request: Request) -> Response:
        """``POST /v1beta/models/{model}:{method}``."""
        self.check_auth(request)
        name, _, action = model_ref.partition(":")
        model_name = model_resource(name)
        body = await _json_body(request)
        if action in ("batchGenerateContent", "asyncBatchEmbedContent"):
            kind = "generate" if action == "batchGenerateContent" else "embed"

            async def act() -> JSONResponse:
                return JSONResponse(await self.create_batch(model_name, body, kind))

            answer: Response = await guard_create(self.state, PROVIDER, "create", act, _refuse)
            return answer
        custom_id = request.headers.get(CUSTOM_ID_HEADER)
        if action == "generateContent":
            return self.generate_content(model_name, body, custom_id)
        if action == "embedContent":
            return self.embed_content(model_name, body, custom_id)
        if action == "batchEmbedContents":
            return self.batch_embed_contents(model_name, body)
        raise _fail(
            404,
            f"Method {action!r} is not found for {model_name} (the emulator serves batchGenerateContent, asyncBatchEmbedContent, generateContent, embedContent, batchEmbedContents).",
            "NOT_FOUND",
        )

    async def create_batch(self, model_name: str, body: Mapping[str, Any], kind: str) -> dict[str, Any]:
        """Create a batch from ``{"batch": {...}}`` and answer its ``Operation``.

        :param model_name: ``models/...``
        :param body: the request body
        :param kind: ``generate`` or ``embed``
        """
        batch = body.get("batch")
        if not isinstance(batch, Mapping):
            raise _fail(400, "* batch: batch is not specified")
        input_config = batch.get("inputConfig", batch.get("input_config"))
        if not isinstance(input_config, Mapping):
            raise _fail(400, "* batch.input_config: input_config is not specified")
        file_name = input_config.get("fileName", input_config.get("file_name"))
        requests = input_config.get("requests")
        state = self.state
        config = state.config
        attrs: dict[str, Any] = {
            "kind": kind,
            "model": model_name,
            "display_name": str(batch.get("displayName") or batch.get("display_name") or ""),
        }
        if isinstance(file_name, str) and file_name:
            meta = self._file(file_name)
            attrs["input"] = {"fileName": f"files/{meta.id}"}
            items, issues = await run_in_threadpool(parse_file, state, meta, model_name, kind, config)
        elif isinstance(requests, Mapping) and isinstance(requests.get("requests"), list):
            size = len(json.dumps(requests))
            if size > MAX_INLINE_BYTES:
                raise _fail(
                    400,
                    f"Inline batch requests are {size} bytes; the limit is {MAX_INLINE_BYTES}. Upload a JSONL file instead.",
                )
            attrs["input"] = {"inline": True}
            items, issues, metas = parse_inline(requests["requests"], model_name, kind, config)
            attrs["inline_metadata"] = metas
        else:
            raise _fail(400, "* batch.input_config: exactly one of file_name or requests must be set.")
        if state.consume_validation_failure() and not issues:
            issues = [
                ValidationIssue(
                    "emulated_validation_failure",
                    "The input failed validation (emulator fault fail_validation).",
                )
            ]
        job = state.create_job(PROVIDER, state.new_id("gb", 24), items, issues, config, attrs)
        return self.operation_json(job, state.now())

    def operation_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the batch's ``Operation`` at ``now``, writing results on first terminal sight.

        :param job: the batch
        :param now: the current time
        """
        view = settle(self.state, job, now, partial(write_results, self.state))
        results = job.results or {}
        total = len(job.items) if not job.issues else 0
        pending = 0 if view.terminal else total - view.completed - view.failed
        times = view.times
        update = max([job.created, *times.values()])
        metadata: dict[str, Any] = {
            "@type": _EMBED_TYPE if job.attrs["kind"] == "embed" else _GEN_TYPE,
            "model": job.attrs["model"],
            "displayName": job.attrs["display_name"],
            "inputConfig": job.attrs["input"] if "fileName" in job.attrs["input"] else {"requests": {}},
            "createTime": _rfc3339(job.created),
            "updateTime": _rfc3339(update),
            "batchStats": {
                "requestCount": str(total),
                "successfulRequestCount": str(view.completed),
                "failedRequestCount": str(view.failed),
                "pendingRequestCount": str(max(0, pending)),
            },
            "state": BATCH_STATES[view.status],
        }
        op: dict[str, Any] = {"name": f"batches/{job.id}", "metadata": metadata, "done": view.terminal}
        if view.terminal:
            metadata["endTime"] = _rfc3339(update)
            output = results.get("output")
            if output:
                metadata["output"] = output
            if view.status == "failed":
                issue = job.issues[0] if job.issues else None
                op["error"] = {
                    "code": 3,
                    "message": issue.message if issue else "The batch failed.",
                    "details": [i.to_dict() for i in job.issues[:10]],
                }
            elif output:
                op["response"] = {"@type": metadata["@type"] + "Output", **output}
        return op

    def _job(self, ref: str) -> Job:
        job_id = ref.removeprefix("batches/")
        job = self.state.jobs.get(job_id, PROVIDER)
        if job is None or job.attrs.get("deleted"):
            raise _fail(404, f"Batch batches/{job_id} not found.")
        return job

    def get_batch(self, batch_ref: str, request: Request) -> dict[str, Any]:
        """``GET /v1beta/batches/{id}``; may answer an injected transient 500."""
        self.check_auth(request)
        state = self.state
        if retrieve_fails(state, PROVIDER):
            raise _fail(500, INTERNAL)
        return self.operation_json(self._job(batch_ref), state.now())

    def batch_action(self, batch_ref: str, request: Request) -> dict[str, Any]:
        """``POST /v1beta/batches/{id}:cancel``."""
        self.check_auth(request)
        job_id, _, action = batch_ref.partition(":")
        if action != "cancel":
            raise _fail(404, f"Unknown method {action!r} on batches; the emulator serves ':cancel'.")
        job = self._job(job_id)
        now = self.state.now()
        with self.state.lock:
            if not job.request_cancel(now):
                status = BATCH_STATES[job.view(now).status]
                raise _fail(
                    400,
                    f"Batch batches/{job.id} is already {status} and cannot be cancelled.",
                    "FAILED_PRECONDITION",
                )
        self.state.bump(PROVIDER, "batches_cancelled")
        return {}

    def delete_batch(self, batch_ref: str, request: Request) -> dict[str, Any]:
        """``DELETE /v1beta/batches/{id}``: forget the batch (its result file stays)."""
        self.check_auth(request)
        job = self._job(batch_ref)
        job.attrs["deleted"] = True
        return {}

    def list_batches(self, request: Request) -> dict[str, Any]:
        """``GET /v1beta/batches?pageSize=&pageToken=``, newest first."""
        self.check_auth(request)
        start, size = _page_args(request, 50, 1000)
        jobs = [j for j in self.state.jobs.list(PROVIDER) if not j.attrs.get("deleted")]
        now = self.state.now()
        out: dict[str, Any] = {
            "operations": [self.operation_json(j, now) for j in jobs[start : start + size]]
        }
        if start + size < len(jobs):
            out["nextPageToken"] = str(start + size)
        return out

    # -- synchronous endpoints -------------------------------------------------------------

    def _admit(self, kind: str, tokens: int) -> None:
        state = self.state
        counter = state.bump(PROVIDER, "sync_requests")
        state.bump(PROVIDER, f"sync_requests.{kind}")
        config = state.config
        faults = config.faults
        if faults.request_fails(config.seed, "sync429", counter, faults.sync_429_rate):
            state.bump(PROVIDER, "sync_429")
            raise self._rate_error(
                "Resource has been exhausted (emulated sync_429_rate).", faults.sync_retry_after_s
            )
        if faults.request_fails(config.seed, "sync500", counter, faults.sync_500_rate):
            state.bump(PROVIDER, "sync_500")
            raise _fail(500, INTERNAL)
        window = config.scaled(config.timings.rate_window_s)
        with state.lock:
            decision = state.limiter.check(state.now(), tokens, faults.rpm_limit, faults.tpm_limit, window)
        if not decision.allowed:
            state.bump(PROVIDER, "sync_429")
            which = "requests" if decision.remaining_requests == 0 else "tokens"
            raise self._rate_error(
                f"Resource has been exhausted: quota of {which} per window reached. Retry in {decision.retry_after_s:.3f}s.",
                decision.retry_after_s,
            )

    @staticmethod
    def _rate_error(message: str, wait: float) -> ApiError:
        details = [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{max(0.0, wait):.3f}s"}
        ]
        return ApiError(
            429, error_body(429, message, details=details), {"retry-after": retry_after_header(wait)}
        )

    def generate_content(
        self, model_name: str, body: Mapping[str, Any], custom_id: str | None = None
    ) -> JSONResponse:
        """``POST /v1beta/models/{model}:generateContent``."""
        problem = generate_request_error(body, self.state.config)
        prompt = GeminiPrompt(body)
        self._admit("generate", prompt.prompt_tokens + (prompt.max_output_tokens or 0))
        if problem is not None:
            raise ApiError(
                problem["code"], error_body(problem["code"], problem["message"], problem["status"])
            )
        config = self.state.config
        with self.state.lock:
            seen = prompt.prefix_key is not None and prompt.prefix_key in self.state.seen_prefixes
            if prompt.prefix_key is not None:
                self.state.seen_prefixes.add(prompt.prefix_key)
        cached = model.cached_tokens(prompt.prefix_tokens, seen, config.cache_min_tokens, 1)
        obj, used = generate_response(
            body, model_name=model_name, response_id=self.state.new_id("", 20), cached=cached
        )
        self.state.record_realtime(PROVIDER, custom_id, generate_billed(used))
        return JSONResponse(obj)

    def embed_content(
        self, model_name: str, body: Mapping[str, Any], custom_id: str | None = None
    ) -> JSONResponse:
        """``POST /v1beta/models/{model}:embedContent``."""
        del model_name
        problem = embed_request_error(body)
        self._admit("embed", model.count_tokens(model.join_texts(parts_text(body.get("content")))))
        if problem is not None:
            raise ApiError(
                problem["code"], error_body(problem["code"], problem["message"], problem["status"])
            )
        obj, tokens = embed_response(body)
        self.state.record_realtime(PROVIDER, custom_id, {"input_tokens": tokens})
        return JSONResponse(obj)

    def batch_embed_contents(self, model_name: str, body: Mapping[str, Any]) -> JSONResponse:
        """``POST /v1beta/models/{model}:batchEmbedContents`` (what ``models.embed_content`` calls)."""
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise _fail(400, "* BatchEmbedContentsRequest.requests: requests is not specified")
        if len(requests) > 100:
            raise _fail(400, "* BatchEmbedContentsRequest.requests: at most 100 requests per call.")
        tokens = sum(
            model.count_tokens(model.join_texts(parts_text(r.get("content"))))
            for r in requests
            if isinstance(r, Mapping)
        )
        self._admit("embed", tokens)
        embeddings = []
        for i, request in enumerate(requests):
            if not isinstance(request, Mapping):
                raise _fail(400, f"* BatchEmbedContentsRequest.requests[{i}]: must be an object.")
            problem = embed_request_error(request)
            if problem is not None:
                raise _fail(problem["code"], f"requests[{i}]: {problem['message']}")
            mismatch = check_line(i + 1, request.get("model"), model_name)
            if mismatch is not None:
                raise _fail(400, mismatch.message)
            embeddings.append(embed_response(request)[0]["embedding"])
        return JSONResponse(
            {
                "embeddings": embeddings,
                "usageMetadata": {"promptTokenCount": tokens, "totalTokenCount": tokens},
            }
        )
