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

Result lines (file input), in processing order::

    {"key": "...", "response": {GenerateContentResponse with usageMetadata}}
    {"key": "...", "error": {"code": 429, "message": "...", "status": "RESOURCE_EXHAUSTED"}}

Items a batch never ran get ``{"code": 499, "status": "CANCELLED"}`` (cancelled) or
``{"code": 504, "status": "DEADLINE_EXCEEDED"}`` (expired) errors. Embedding batches answer
``{"key", "response": {"embedding": {"values": [...]}, "usageMetadata": {...}}}``.

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
from typing import IO, Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from batch_emulator import model
from batch_emulator.app import CUSTOM_ID_HEADER, ApiError, guard_create
from batch_emulator.common import (
    ErrorTable,
    InputScan,
    InputWords,
    another_answer,
    html_page_instead,
    injected_error,
    key_given,
    output_file,
    result_file,
    retrieve_fails,
    settle,
    stable_id,
)
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import retry_after_header
from batch_emulator.lifecycle import ItemLog, ItemOutcome, Job, JobItem, ValidationIssue
from batch_emulator.store import EmulatorState, FileTooLargeError, StoredFile

PROVIDER: Final = "gemini"
API_VERSION: Final = "v1beta"
FILE_TTL_S: Final = 48 * 3600
MAX_ISSUES: Final = 100
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

#: HTTP status -> ``google.rpc.Code`` name, as the REST error body spells it.
STATUS_NAMES: Final[dict[int, str]] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_INTERNAL: Final = "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"
INPUT_WORDS: Final = InputWords(
    too_many="The input has more than {limit} requests; split it.",
    bad_json="Line {number} is not valid JSON.",
)
#: where the API key may be, the first one found wins (a header, else the ``key`` query parameter)
KEY_SOURCES: Final = ("x-goog-api-key", "?key")
_GEN_TYPE: Final = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
_EMBED_TYPE: Final = "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch"


def error_body(
    code: int, message: str, status: str | None = None, details: list[Any] | None = None
) -> dict[str, Any]:
    """Return a Google API error body.

    :param code: HTTP status
    :param message: what went wrong and how to fix it
    :param status: the ``google.rpc.Code`` name (default: from ``code``)
    :param details: ``google.rpc`` detail objects
    """
    err: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": status or STATUS_NAMES.get(code, "UNKNOWN"),
    }
    if details:
        err["details"] = details
    return {"error": err}


def _fail(
    code: int, message: str, status: str | None = None, headers: Mapping[str, str] | None = None
) -> ApiError:
    return ApiError(code, error_body(code, message, status), headers)


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _model_name(raw: str) -> str:
    return raw if raw.startswith(("models/", "tunedModels/")) else f"models/{raw}"


# -- request content ---------------------------------------------------------------------------


def _parts_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, Mapping):
        return []
    parts = content.get("parts")
    if not isinstance(parts, list):
        return []
    return [str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and p.get("text")]


class GeminiPrompt:
    """A ``GenerateContentRequest`` digested for the stand-in model and the token counts.

    :param body: the request
    """

    def __init__(self, body: Mapping[str, Any]) -> None:
        system = body.get("systemInstruction", body.get("system_instruction"))
        self.system = model.join_texts(_parts_text(system))
        contents = body.get("contents")
        self.contents: list[Any] = contents if isinstance(contents, list) else []
        user_texts: list[str] = []
        all_texts: list[str] = []
        for content in self.contents:
            texts = _parts_text(content)
            all_texts.extend(texts)
            if not isinstance(content, Mapping) or content.get("role", "user") == "user":
                user_texts.extend(texts)
        self.user = model.join_texts(user_texts)
        self.prefix_tokens = model.count_tokens(self.system) if self.system else 0
        self.prefix_key = model.prefix_key([self.system]) if self.system else None
        self.prompt_tokens = self.prefix_tokens + sum(model.count_tokens(t) for t in all_texts)
        config = body.get("generationConfig", body.get("generation_config"))
        config = config if isinstance(config, Mapping) else {}
        mime = config.get("responseMimeType", config.get("response_mime_type"))
        self.json_mode = mime == "application/json"
        limit = config.get("maxOutputTokens", config.get("max_output_tokens"))
        self.max_output_tokens = (
            int(limit) if isinstance(limit, int) and not isinstance(limit, bool) else None
        )


def _natural(code: int, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "status": STATUS_NAMES.get(code, "UNKNOWN")}


def generate_request_error(body: Mapping[str, Any], config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error (``code``/``message``/``status``) a ``GenerateContentRequest`` causes, or ``None``.

    :param body: the request
    :param config: emulator settings (context window)
    """
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return _natural(400, "* GenerateContentRequest.contents: contents is not specified")
    for i, content in enumerate(contents):
        if not isinstance(content, Mapping) or content.get("role", "user") not in (
            "user",
            "model",
            "function",
        ):
            return _natural(
                400, f"* GenerateContentRequest.contents[{i}].role: Please use a valid role: user, model."
            )
        if not _parts_text(content):
            return _natural(
                400, f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
    tokens = GeminiPrompt(body).prompt_tokens
    if tokens > config.context_window_tokens:
        return _context_error(tokens, config.context_window_tokens)
    return None


def _context_error(tokens: int, window: int) -> dict[str, Any]:
    return _natural(
        400,
        f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window}). "
        "Shorten the request.",
    )


def embed_request_error(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the error an ``EmbedContentRequest`` causes, or ``None``.

    :param body: the request
    """
    texts = _parts_text(body.get("content"))
    if not texts:
        return _natural(400, "* EmbedContentRequest.content: content is not specified")
    dims = body.get("outputDimensionality", body.get("output_dimensionality"))
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= 3072):
        return _natural(400, "* EmbedContentRequest.output_dimensionality: must be from 1 to 3072.")
    tokens = sum(model.count_tokens(t) for t in texts)
    if tokens > 2048:
        return _natural(
            400, f"The input token count ({tokens}) exceeds the maximum number of tokens allowed (2048)."
        )
    return None


# -- response bodies -------------------------------------------------------------------------


def generate_response(
    body: Mapping[str, Any], *, model_name: str, response_id: str, cached: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer a valid request with a ``GenerateContentResponse``.

    :param body: the request
    :param model_name: the model (``models/...``)
    :param response_id: the response id
    :param cached: prompt tokens to report as cached (implicit caching)
    :return: the object and its usage as ``input``/``cached``/``output`` token counts
    """
    prompt = GeminiPrompt(body)
    reply = model.respond(
        prompt.system or None,
        prompt.user,
        json_mode=prompt.json_mode,
        max_output_tokens=prompt.max_output_tokens,
    )
    usage: dict[str, Any] = {
        "promptTokenCount": prompt.prompt_tokens,
        "candidatesTokenCount": reply.output_tokens,
        "totalTokenCount": prompt.prompt_tokens + reply.output_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt.prompt_tokens}],
    }
    if cached:
        usage["cachedContentTokenCount"] = cached
        usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    obj = {
        "candidates": [
            {
                "content": {"parts": [{"text": reply.text}], "role": "model"},
                "finishReason": "MAX_TOKENS" if reply.truncated else "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": usage,
        "modelVersion": model_name.removeprefix("models/"),
        "responseId": response_id,
    }
    return obj, {"input": prompt.prompt_tokens, "cached": cached, "output": reply.output_tokens}


def embed_response(body: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Answer a valid ``EmbedContentRequest`` with ``{"embedding": {"values"}}`` and usage.

    :param body: the request
    :return: the object and its prompt tokens
    """
    text = model.join_texts(_parts_text(body.get("content")))
    dims = (
        body.get("outputDimensionality", body.get("output_dimensionality"))
        or model.DEFAULT_EMBEDDING_DIMENSIONS
    )
    tokens = model.count_tokens(text)
    obj = {
        "embedding": {"values": model.embed(text, int(dims))},
        "usageMetadata": {"promptTokenCount": tokens, "totalTokenCount": tokens},
    }
    return obj, tokens


def generate_billed(used: Mapping[str, int]) -> dict[str, int]:
    """Return the record's billed tokens of a :func:`generate_response` usage.

    :param used: ``input``/``cached``/``output`` token counts
    """
    return {
        "input_tokens": used["input"] - used["cached"],
        "cached_input_tokens": used["cached"],
        "output_tokens": used["output"],
    }


def _refuse(status: int, headers: Mapping[str, str]) -> ApiError:
    """The answer of a create refused by an injected fault, before anything was created."""
    if status == 429:
        return _fail(429, "Resource has been exhausted (emulated create fault).", headers=headers)
    return _fail(status, "Internal error encountered (emulated create fault).", headers=headers)


#: item fault -> the error entry it becomes
INJECTED_ERRORS: Final[ErrorTable] = {
    "server_error": _natural(500, _INTERNAL),
    "rate_limited": _natural(
        429, "Resource has been exhausted (e.g. check quota). (emulated fault rate_429)"
    ),
    "invalid_request": _natural(400, "Request contains an invalid argument. (emulated fault rate_400)"),
    "context_length": _natural(
        400,
        "The input token count exceeds the maximum number of tokens allowed. "
        "(emulated fault rate_context_length)",
    ),
}


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
        model_name = _model_name(name)
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
            items, issues = await run_in_threadpool(self._parse_file, meta, model_name, kind, config)
        elif isinstance(requests, Mapping) and isinstance(requests.get("requests"), list):
            size = len(json.dumps(requests))
            if size > MAX_INLINE_BYTES:
                raise _fail(
                    400,
                    f"Inline batch requests are {size} bytes; the limit is {MAX_INLINE_BYTES}. Upload a JSONL file instead.",
                )
            attrs["input"] = {"inline": True}
            items, issues, metas = self._parse_inline(requests["requests"], model_name, kind, config)
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

    def _check_line(self, number: int, line_model: Any, model_name: str) -> ValidationIssue | None:
        if isinstance(line_model, str) and line_model and _model_name(line_model) != model_name:
            return ValidationIssue(
                "mismatched_model",
                f"Line {number} asks for model {line_model!r} but the batch runs {model_name!r}; one batch uses one model.",
                number,
                "request.model",
            )
        return None

    def _item(
        self, custom_id: str, number: int, request: Mapping[str, Any], kind: str, config: EmulatorConfig
    ) -> JobItem:
        natural = embed_request_error(request) if kind == "embed" else generate_request_error(request, config)
        return JobItem(
            custom_id=custom_id,
            line=number,
            body=request,
            decision=config.faults.decide_item(config.seed, custom_id),
            natural_error=natural,
        )

    def _parse_file(
        self, meta: StoredFile, model_name: str, kind: str, config: EmulatorConfig
    ) -> tuple[ItemLog | list[JobItem], list[ValidationIssue]]:
        issues: list[ValidationIssue] = []
        items = self.state.item_log()
        if meta.bytes > config.max_batch_bytes:
            return [], [
                ValidationIssue(
                    "file_too_large",
                    f"The input file is {meta.bytes} bytes; the limit is {config.max_batch_bytes} bytes. Split it.",
                )
            ]
        seen: set[str] = set()
        scan = InputScan(INPUT_WORDS, issues, config.max_batch_requests, MAX_ISSUES)
        for number, line in scan.lines(self.state.files.iter_lines(meta.id)):
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
            problem = self._check_line(number, request.get("model"), model_name)
            if problem is not None:
                issues.append(problem)
            items.append(self._item(key, number, request, kind, config))
        if scan.count == 0 and not issues:
            issues.append(
                ValidationIssue("empty_file", "The input file is empty; it needs at least one request line.")
            )
        return items, issues

    def _parse_inline(
        self, requests: list[Any], model_name: str, kind: str, config: EmulatorConfig
    ) -> tuple[list[JobItem], list[ValidationIssue], list[Any]]:
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
            problem = self._check_line(number, request.get("model"), model_name)
            if problem is not None:
                issues.append(problem)
            items.append(self._item(key, number, request, kind, config))
            metas.append(metadata)
        return items, issues, metas

    def operation_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the batch's ``Operation`` at ``now``, writing results on first terminal sight.

        :param job: the batch
        :param now: the current time
        """
        view = settle(self.state, job, now, self._write_results)
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

    def _write_results(self, job: Job, now: float, status: str) -> dict[str, Any]:
        """Render a finished batch's responses (a file, written a line at a time, or inline)."""
        if status == "failed":
            return {}
        inline = "fileName" not in job.attrs["input"]
        metas: list[Any] = job.attrs.get("inline_metadata") or []
        inlined: list[dict[str, Any]] = []
        seen_prefixes: set[str] = set()
        with result_file(self.state, "key") as out:
            for outcome in job.outcomes(now):
                entry = self._entry(job, outcome, seen_prefixes)
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
                    out.write(
                        {"key": item.custom_id, "response": self._answer_again(job, item.custom_id, entry)}
                    )
            if inline:
                return {"output": {"inlinedResponses": {"inlinedResponses": inlined}}}
            out.write_foreign(job.faults.unknown_result_lines, job.id)
            file_meta = output_file(
                self.state, PROVIDER, "gr", f"batch-{job.id}-responses.jsonl", FILE_TTL_S, id_length=20
            )
            out.keep(file_meta)
        return {"output": {"responsesFile": f"files/{file_meta.id}"}}

    @staticmethod
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

    def _entry(self, job: Job, outcome: ItemOutcome, seen_prefixes: set[str]) -> dict[str, Any] | None:
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
            return {"error": _natural(code, message)}
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
            raise _fail(500, _INTERNAL)
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
            raise _fail(500, _INTERNAL)
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
        self._admit("embed", model.count_tokens(model.join_texts(_parts_text(body.get("content")))))
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
            model.count_tokens(model.join_texts(_parts_text(r.get("content"))))
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
            mismatch = self._check_line(i + 1, request.get("model"), model_name)
            if mismatch is not None:
                raise _fail(400, mismatch.message)
            embeddings.append(embed_response(request)[0]["embedding"])
        return JSONResponse(
            {
                "embeddings": embeddings,
                "usageMetadata": {"promptTokenCount": tokens, "totalTokenCount": tokens},
            }
        )
