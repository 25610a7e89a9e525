"""Gemini Batch Mode through the official ``google-genai`` SDK, and Vertex AI batch prediction.

The SDK is imported inside functions only, so importing this module is free.

**Gemini Developer API** (the default). A chunk is a JSONL file with one
``{"key": <custom_id>, "request": <GenerateContentRequest>}`` per line (``EmbedContentRequest``
for embeddings), uploaded with the Files API's resumable protocol (``client.files.upload``),
then ``client.batches.create(model=..., src="files/...", config={"display_name": key})``
(``client.batches.create_embeddings`` for embeddings). Results come back as one JSONL file,
``{"key", "response": GenerateContentResponse}`` or ``{"key", "error": {code, message, status}}``
per line, downloaded with ``client.files.download`` and streamed to the sink; Gemini has no
separate error file, so :meth:`GeminiBatchAdapter.download` of ``errors`` writes nothing.

*Inline or file.* A chat chunk no larger than the connection extra ``inline_max_bytes``
(default ``0``: always a file; the API's ceiling is 20 MB) is sent inline
(``src=[InlinedRequest(..., metadata={"key": custom_id})]``), saving the upload; its responses
arrive inside the batch object and are written to the sink in the same line format. Files are the
default because inline results ride on every later ``batches.get`` of the finished job (the
triggerer would fetch the whole result set) and because a file upload is reused by name on a
retry. Embedding chunks always use a file: the inline embedding form takes one shared config and
no per-request key.

*Model.* The batch's model is part of the create call, not of the contract's ``submit``
arguments; every line carries its ``request.model`` (the API accepts it; the emulator checks
it), and :meth:`~GeminiBatchAdapter.stage` reads it from the chunk's first line. A ``model`` in
``submit``'s metadata, or the connection extra ``model``, wins.

*Idempotency.* The batch's ``display_name`` is the idempotency key; :meth:`find` pages through
the whole batch list (the API promises no order, so it does not stop early; ``find_scan_limit``
caps it when set) and matches it. Uploads are named (``display_name``) after the key and reused
when a file of the same name and size exists. Gemini batches take no labels, so ``submit``'s
metadata is not attached. Create-like calls (upload, batch create) are sent with the SDK's
retries off (``attempts=1``) under :func:`~airflow_batch_provider.adapters.base.create_once`:
429 is sent again after its ``Retry-After``; a timeout, dropped connection or 5xx is followed by
a look-up by display name (and size, for a file) before anything is sent again.

*Progress counts.* The SDK's ``BatchJob`` does not expose the Developer API's ``batchStats``, so
:meth:`~GeminiBatchAdapter.status` (and the async status) read them from the REST answer of a
``GET batches/{id}`` sent through the SDK's own API client (same base URL, version, credentials
and retries); when that answer cannot be read, the counts stay 0 (the contract's "unknown").
Vertex jobs report ``completion_stats`` through the SDK.

*States.* ``JOB_STATE_*`` (and the API's own ``BATCH_STATE_*``): ``QUEUED``/``PENDING`` ->
``validating``; ``RUNNING``/``UPDATING``/``PAUSED`` -> ``in_progress``; ``SUCCEEDED``/
``PARTIALLY_SUCCEEDED`` -> ``completed``; ``FAILED`` -> ``failed``; ``CANCELLING`` ->
``cancelling``; ``CANCELLED`` -> ``cancelled``; ``EXPIRED`` -> ``expired``.

*Per-item errors.* HTTP 408/409/429/5xx and the ``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``,
``INTERNAL`` statuses are retryable; 400 and other 4xx are permanent; ``CANCELLED`` items are
``cancelled``; ``DEADLINE_EXCEEDED`` items (not run before the batch expired) are ``expired``.
gRPC integer codes are mapped to their HTTP equivalents first. A response without a candidate
(prompt blocked) or with a candidate stopped for safety without text is permanent.

*Prompt caching.* The shared prefix goes into ``systemInstruction``, first and byte-identical
across items, which is what Gemini's implicit caching keys on (``cachedContentTokenCount`` in the
usage). Explicit context caches (``client.caches``) are not used in batches: they are per-model
resources with a TTL billed per hour, which a day-long batch window would keep alive for nothing.

**Vertex AI** (connection extras ``{"vertexai": true, "project": ..., "location": ...,
"gcs_prefix": "gs://bucket/folder"}``; credentials: :attr:`AdapterSettings.credentials`, which
the hook resolves from the ``gcp_conn_id`` field, else Application Default Credentials; extra
``gcs_endpoint_url`` overrides the GCS endpoint). The chunk is written to
``<gcs_prefix>/input/<name>`` (through ``gcsfs`` with the same credentials; skipped when an
object of that size is there) and the job is created with ``src="gs://..."`` and
``dest="<gcs_prefix>/output/<key>/"``; results are read from the ``predictions*.jsonl`` files
under the destination. Tested end to end against the emulator's Vertex routes and a GCS server
on loopback. Embedding batches are a Developer API feature (``create_embeddings``); a Vertex
connection refuses them with a clear error.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, ClassVar, Final, Literal

from airflow_batch_provider.adapters.base import (
    CUSTOM_ID_HEADER,
    AdapterSettings,
    AmbiguousReply,
    AsyncRealtimeClient,
    AsyncStatusClient,
    BatchAdapter,
    BatchRef,
    BatchStatus,
    CreateFailure,
    InputRef,
    Limits,
    RealtimeReply,
    create_once,
    http_failure,
    parse_jsonl_results,
    unsupported_reply,
)
from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.gemini_clients import DEFAULT_API_VERSION as DEFAULT_API_VERSION
from airflow_batch_provider.adapters.gemini_clients import client_kwargs as client_kwargs
from airflow_batch_provider.adapters.gemini_clients import gcs_filesystem as gcs_filesystem
from airflow_batch_provider.adapters.gemini_clients import http_options as http_options
from airflow_batch_provider.adapters.gemini_clients import vertex_create_args as vertex_create_args
from airflow_batch_provider.adapters.gemini_format import _EMBED_PARAMS, _model_path, _text_of
from airflow_batch_provider.adapters.gemini_format import gemini_tool_config as gemini_tool_config
from airflow_batch_provider.adapters.gemini_format import gemini_tools as gemini_tools
from airflow_batch_provider.adapters.gemini_format import generation_config as generation_config
from airflow_batch_provider.adapters.gemini_results import GRPC_TO_HTTP as GRPC_TO_HTTP
from airflow_batch_provider.adapters.gemini_results import STATE_MAP as STATE_MAP
from airflow_batch_provider.adapters.gemini_results import _rest_stats, _rest_stats_async, _status
from airflow_batch_provider.adapters.gemini_results import batch_stats as batch_stats
from airflow_batch_provider.adapters.gemini_results import classify_error as classify_error
from airflow_batch_provider.adapters.gemini_results import result_from_line as result_from_line
from airflow_batch_provider.adapters.gemini_results import state_of as state_of
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.ratelimit import parse_duration, parse_retry_after
from airflow_batch_provider.core.requests import (
    CanonicalRequest,
    RequestKind,
)
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import ConfigurationError

if TYPE_CHECKING:
    from google import genai

log = logging.getLogger(__name__)

INLINE_CEILING_BYTES: Final = 20 * 1024 * 1024


def rest_request(request: CanonicalRequest) -> dict[str, Any]:
    """Return the request as Gemini REST JSON: ``GenerateContentRequest`` or ``EmbedContentRequest``.

    Chat: the system prompt (and any ``system`` messages) becomes ``systemInstruction``, placed
    first for implicit caching; ``assistant`` turns become ``model`` turns. Embedding: the input
    text becomes ``content``; ``dimensions``, ``task_type`` and ``title`` are mapped.

    Tools (any form :func:`~airflow_batch_provider.core.requests.canonical_tools` reads) become
    ``tools: [{"functionDeclarations": [...]}]`` and ``tool_choice`` becomes
    ``toolConfig.functionCallingConfig`` (``AUTO``, ``NONE``, ``ANY`` with the allowed names).

    :param request: the canonical request
    :raises ConfigurationError: a kind Gemini does not accept, or an embedding parameter it does not know
    """
    refusal = GeminiBatchAdapter.kind_refusal(request.kind)
    if refusal is not None:
        raise ConfigurationError(f"item {request.app_id!r}: {refusal}")
    if request.kind == "embedding":
        body: dict[str, Any] = {
            "model": _model_path(request.model),
            "content": {"parts": [{"text": request.text}]},
        }
        for name, value in request.params.items():
            if name not in _EMBED_PARAMS:
                raise ConfigurationError(
                    f"embedding parameter {name!r} of prompt {request.prompt_version!r} is not supported by "
                    f"Gemini; use {sorted(set(_EMBED_PARAMS) - {'outputDimensionality', 'taskType'})}."
                )
            body[_EMBED_PARAMS[name]] = value
        return body
    system_parts = [request.system] if request.system else []
    contents: list[dict[str, Any]] = []
    for message in request.messages:
        role = str(message.get("role", "user"))
        text = _text_of(message.get("content"))
        if role in ("system", "developer"):
            system_parts.append(text)
            continue
        contents.append({"role": "model" if role == "assistant" else "user", "parts": [{"text": text}]})
    body = {"model": _model_path(request.model), "contents": contents}
    if system_parts:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system_parts)}]}
    params = dict(request.params)
    if "tools" in params:
        body["tools"] = gemini_tools(params.pop("tools"))
    if "tool_choice" in params:
        tool_config = gemini_tool_config(params.pop("tool_choice"))
        if tool_config is not None:
            body["toolConfig"] = tool_config
    config = generation_config(params)
    if config:
        body["generationConfig"] = config
    return body


def _classify(exc: Exception) -> CreateFailure | None:
    """Read a failed create: 429 refused, 5xx/timeout/connection ambiguous, other 4xx raised."""
    from google.genai import errors

    if isinstance(exc, errors.APIError):
        headers = getattr(exc.response, "headers", None)
        return http_failure(int(exc.code), headers)
    if isinstance(exc, (TimeoutError, ConnectionError, *_transport_errors())):
        return http_failure(None)
    return None


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP clients' transport errors (timeouts, dropped connections) the SDK lets through."""
    found: list[type[Exception]] = []
    for module in ("httpx", "httpx2"):
        try:
            found.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


class _CountingWriter(io.RawIOBase):
    """A writable stream that forwards to ``sink`` and counts bytes."""

    def __init__(self, sink: IO[bytes]) -> None:
        super().__init__()
        self._sink = sink
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._sink.write(chunk)
        self.count += len(chunk)
        return len(chunk)


def _dump(model: Any) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("sdkHttpResponse", None)
    return data


def _peek(chunk: IO[bytes]) -> tuple[str | None, bool]:
    """Return the model of a chunk's first line and whether it is a chat (``contents``) request."""
    start = chunk.tell()
    first = chunk.readline()
    chunk.seek(start)
    try:
        request = json.loads(first).get("request") or {}
    except (ValueError, AttributeError):
        return None, False
    model = request.get("model")
    return (str(model) if model else None), "contents" in request


class _AsyncGeminiStatus(AsyncStatusClient):
    def __init__(self, settings: AdapterSettings) -> None:
        from google import genai

        self._client = genai.Client(**client_kwargs(settings, attempts=1))

    async def status(self, ref: BatchRef) -> BatchStatus:
        job = await self._client.aio.batches.get(name=ref.batch_id)
        stats = None
        if getattr(job, "completion_stats", None) is None:
            stats = await _rest_stats_async(self._client, ref.batch_id)
        return _status(job, stats)

    async def close(self) -> None:
        await self._client.aio.aclose()


def _retry_after(exc: Any) -> float | None:
    """The wait a Gemini error asked for: its ``Retry-After`` header, else the ``RetryInfo`` detail."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    found = parse_retry_after(headers if hasattr(headers, "items") else None)
    if found is not None:
        return found
    details = getattr(exc, "details", None) or {}
    error = details.get("error") if isinstance(details, Mapping) else None
    for detail in (error or {}).get("details") or []:
        delay = parse_duration(str(detail.get("retryDelay") or "")) if isinstance(detail, Mapping) else None
        if delay is not None:
            return delay
    return None


class _GeminiRealtime(AsyncRealtimeClient):
    def __init__(self, settings: AdapterSettings) -> None:
        from google import genai

        self._client = genai.Client(**client_kwargs(settings, attempts=1))

    async def complete(self, request: CanonicalRequest, custom_id: str) -> RealtimeReply:
        from google.genai import errors, types

        try:
            body = rest_request(request)
        except ConfigurationError as exc:
            return unsupported_reply(custom_id, exc)
        aio = self._client.aio
        try:
            if request.kind == "embedding":
                config = {k: v for k, v in body.items() if k not in ("model", "content")}
                emb = await aio.models.embed_content(
                    model=request.model,
                    contents=request.text,
                    config=types.EmbedContentConfig.model_validate(config) if config else None,
                )
                values = emb.embeddings[0].values if emb.embeddings else None
                meta = _dump(emb).get("usageMetadata") or {}
                line: dict[str, Any] = {"response": {"embedding": {"values": values}, "usageMetadata": meta}}
            else:
                gen_config = dict(body.get("generationConfig") or {})
                for name in ("systemInstruction", "tools", "toolConfig"):
                    if name in body:
                        gen_config[name] = body[name]
                gen_config["http_options"] = {"headers": {CUSTOM_ID_HEADER: custom_id}}
                response = await aio.models.generate_content(
                    model=request.model,
                    contents=[types.Content.model_validate(c) for c in body["contents"]],
                    config=types.GenerateContentConfig.model_validate(gen_config),
                )
                line = {"response": _dump(response)}
        except errors.APIError as exc:
            headers = getattr(getattr(exc, "response", None), "headers", None) or {}
            rate = {
                k.lower(): str(v) for k, v in dict(headers).items() if k.lower().startswith("x-ratelimit")
            }
            return RealtimeReply(
                ItemResult(
                    custom_id,
                    classify_error(exc.code, exc.status),
                    error_code=str(exc.status or exc.code),
                    error_message=exc.message,
                    raw={"code": exc.code},
                ),
                retry_after=_retry_after(exc),
                rate_limit=rate,
            )
        return RealtimeReply(result_from_line(custom_id, line))

    async def close(self) -> None:
        await self._client.aio.aclose()


class GeminiBatchAdapter(BatchAdapter):
    """Gemini Batch Mode (Developer API) and Vertex AI batch prediction.

    Connection: password = API key, host = API base URL (optional; the emulator in tests).
    Extras: ``api_version`` (default ``v1beta``), ``inline_max_bytes`` (default 0, at most 20 MB),
    ``find_scan_limit`` (optional cap on a look-up; default none), ``max_retries``, ``timeout``, ``model`` (fallback batch
    model); Vertex: ``vertexai``, ``project``, ``location``, ``gcs_prefix``.
    """

    declaration: ClassVar[ProviderDeclaration] = ProviderDeclaration(
        name="gemini",
        conn_type="gemini_batch",
        # Batch Mode takes input files up to 2 GB; no published request count ceiling, so the
        # chunker uses OpenAI's 50,000 to keep jobs (and their retries) a manageable size.
        limits=Limits(max_requests=50_000, max_bytes=2 * 1024 * 1024 * 1024),
        # google.rpc.Code names (Gemini, Vertex AI)
        retryable_errors=frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "ABORTED", "UNKNOWN"}),
        compare_model="gemini-2.5-flash",
    )
    result_id_field: ClassVar[str] = "key"
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat", "embedding"})

    def __init__(self, settings: AdapterSettings) -> None:
        super().__init__(settings)
        self._client_obj: genai.Client | None = None
        self._create_obj: genai.Client | None = None
        self._gcs_obj: Any = None
        self._models: dict[str, str] = {}
        self._inline: dict[str, list[dict[str, Any]]] = {}

    @property
    def client(self) -> genai.Client:
        """The SDK client, built on first use."""
        if self._client_obj is None:
            from google import genai

            self._client_obj = genai.Client(**client_kwargs(self.settings))
        return self._client_obj

    @property
    def _create_client(self) -> genai.Client:
        """The client for create-like calls: SDK retries off (see :func:`create_once`)."""
        if self._create_obj is None:
            from google import genai

            self._create_obj = genai.Client(**client_kwargs(self.settings, attempts=1))
        return self._create_obj

    @property
    def vertex(self) -> bool:
        """True for a Vertex AI connection."""
        return bool(self.settings.extra.get("vertexai"))

    def probe(self) -> str:
        """List one batch (SDK retries off); for Vertex AI also list the GCS prefix."""
        pager = self._create_client.batches.list(config={"page_size": 1})
        detail = f"listed {len(pager.page)} batch job(s) on the first page"
        if self.vertex:
            bucket = self._gcs_prefix().removeprefix("gs://").split("/", 1)[0]
            self.gcs.ls(bucket)
            detail += f"; GCS bucket {bucket} is readable"
        return detail

    @property
    def inline_max_bytes(self) -> int:
        """Chunks up to this size are sent inline (chat only)."""
        value = int(self.settings.extra.get("inline_max_bytes", 0))
        if value > INLINE_CEILING_BYTES:
            raise ConfigurationError(
                f"inline_max_bytes={value} exceeds Gemini's 20 MB inline request limit; use at most "
                f"{INLINE_CEILING_BYTES}."
            )
        return value

    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        line = {"key": custom_id, "request": rest_request(request)}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
            source: IO[bytes] = chunk
            # The SDK needs a seekable io.IOBase (it measures the size); object-store streams are
            # often neither, so they are spooled (to disk past 64 MB).
            if not isinstance(chunk, io.IOBase) or not chunk.seekable():
                shutil.copyfileobj(chunk, spool)
                spool.seek(0)
                source = spool  # type: ignore[assignment]
            model, chat = _peek(source)
            if self.vertex:
                ref = self._stage_gcs(source, name, size)
            elif chat and 0 < size <= self.inline_max_bytes:
                self._inline[name] = [json.loads(raw) for raw in source if raw.strip()]
                ref = InputRef("inline", name)
            else:
                ref = self._upload(source, name, size)
        if model:
            self._models[ref.value] = model
        return ref

    def _find_file(self, name: str, size: int) -> InputRef | None:
        limit = self.scan_limit()
        for i, existing in enumerate(self.client.files.list(config={"page_size": 100})):
            if limit is not None and i >= limit:
                break
            if existing.display_name == name and int(existing.size_bytes or 0) == size and existing.name:
                return InputRef("file", existing.name)
        return None

    def _upload(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        found = self._find_file(name, size)
        if found is not None:
            return found
        start = chunk.tell()

        def upload() -> InputRef:
            chunk.seek(start)
            uploaded = self._create_client.files.upload(
                file=chunk,  # type: ignore[arg-type]
                config={"mime_type": "jsonl", "display_name": name},
            )
            if not uploaded.name:
                raise AmbiguousReply(f"Gemini answered the upload of {name} without a file name")
            return InputRef("file", uploaded.name)

        return create_once(
            key=name,
            what=f"upload of {name}",
            create=upload,
            lookup=lambda: self._find_file(name, size),
            classify=_classify,
            policy=self.create_policy(),
            created_after=utcnow(),
        )

    def _gcs_prefix(self) -> str:
        prefix = str(self.settings.extra.get("gcs_prefix") or "")
        if not prefix.startswith("gs://"):
            raise ConfigurationError(
                'a Vertex AI Gemini connection needs the extra "gcs_prefix" (a gs:// folder for batch input and '
                f"output); got {prefix!r}."
            )
        return prefix.rstrip("/")

    @property
    def gcs(self) -> Any:
        """The ``gcsfs`` filesystem of the Vertex input and output (credentials of the connection)."""
        if self._gcs_obj is None:
            extra = self.settings.extra
            self._gcs_obj = gcs_filesystem(
                self.settings.credentials, extra.get("project"), extra.get("gcs_endpoint_url") or None
            )
        return self._gcs_obj

    def _stage_gcs(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        uri = f"{self._gcs_prefix()}/input/{name}"
        fs, path = self.gcs, uri.removeprefix("gs://")
        if not (fs.exists(path) and int(fs.size(path) or -1) == size):
            with fs.open(path, "wb") as out:
                shutil.copyfileobj(chunk, out, 1 << 20)
        return InputRef("uri", uri)

    def _model_for(self, input_ref: InputRef, metadata: Mapping[str, str]) -> str:
        model = metadata.get("model") or self._models.get(input_ref.value) or self.settings.extra.get("model")
        if not model:
            raise ConfigurationError(
                f"no model known for Gemini batch input {input_ref.value!r}: stage it with this adapter first "
                '(the model is read from the lines), or set the connection extra "model".'
            )
        return str(model)

    def submit(
        self,
        input_ref: InputRef,
        key: str,
        metadata: Mapping[str, str],
        kind: RequestKind = "chat",
        *,
        created_after: datetime | None = None,
    ) -> BatchRef:
        found = self.find(key, created_after=created_after)
        if found is not None:
            return found
        model = self._model_for(input_ref, metadata)
        if self.vertex and kind == "embedding":
            raise ConfigurationError(
                "Vertex AI batch prediction through google-genai has no embeddings batch; use a Gemini "
                "Developer API connection (vertexai false) for embedding workloads."
            )
        entries: list[dict[str, Any]] | None = None
        if not self.vertex and input_ref.kind == "inline":
            entries = self._inline.get(input_ref.value)
            if entries is None:
                raise ConfigurationError(
                    f"inline chunk {input_ref.value!r} is no longer in memory (stage and submit ran in different "
                    "processes); rerun the submit task, which stages it again."
                )
        client = self._create_client

        def create() -> BatchRef:
            if self.vertex:
                job = client.batches.create(
                    **vertex_create_args(model, input_ref.value, key, self._gcs_prefix())
                )
            elif entries is not None:
                job = client.batches.create(
                    model=model, src=self.inline_requests(entries), config={"display_name": key}
                )
            elif kind == "embedding":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # create_embeddings is marked experimental in the SDK
                    job = client.batches.create_embeddings(
                        model=model, src={"file_name": input_ref.value}, config={"display_name": key}
                    )
            else:
                job = client.batches.create(model=model, src=input_ref.value, config={"display_name": key})
            if not job.name:
                raise AmbiguousReply(f"Gemini answered the create of batch {key} without a name")
            return BatchRef(self.name, job.name, key)

        started = utcnow()
        ref = create_once(
            key=key,
            what="batch create",
            create=create,
            lookup=lambda: self.find(key, created_after=started),
            classify=_classify,
            policy=self.create_policy(),
            created_after=created_after or started,
        )
        self._inline.pop(input_ref.value, None)
        return ref

    @staticmethod
    def inline_requests(entries: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Turn parsed JSONL lines into the SDK's ``InlinedRequest`` objects (key in ``metadata``).

        :param entries: ``{"key", "request"}`` lines
        """
        from google.genai import types

        out = []
        for entry in entries:
            body = dict(entry["request"])
            config = dict(body.get("generationConfig") or {})
            if "systemInstruction" in body:
                config["systemInstruction"] = body["systemInstruction"]
            out.append(
                types.InlinedRequest(
                    contents=[types.Content.model_validate(c) for c in body.get("contents") or []],
                    config=types.GenerateContentConfig.model_validate(config) if config else None,
                    metadata={"key": str(entry["key"])},
                )
            )
        return out

    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        # The list has no documented order, so every page is read (the key is exact; created_after
        # cannot shorten the scan here).
        del created_after
        limit = self.scan_limit()
        for i, job in enumerate(self.client.batches.list(config={"page_size": 100})):
            if limit is not None and i >= limit:
                break
            if job.display_name == key and job.name:
                return BatchRef(self.name, job.name, key)
        return None

    def status(self, ref: BatchRef) -> BatchStatus:
        job = self.client.batches.get(name=ref.batch_id)
        stats = (
            _rest_stats(self.client, ref.batch_id) if getattr(job, "completion_stats", None) is None else None
        )
        return _status(job, stats)

    def async_client(self) -> AsyncStatusClient:
        return _AsyncGeminiStatus(self.settings)

    def realtime_client(self) -> AsyncRealtimeClient:
        return _GeminiRealtime(self.settings)

    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        if kind == "errors":
            return 0  # Gemini writes errors into the responses file
        job = self.client.batches.get(name=ref.batch_id)
        dest = job.dest
        if dest is None:
            return 0
        writer = _CountingWriter(sink)
        if dest.file_name:
            self.client.files.download(file=dest.file_name, destination=writer)
        elif dest.inlined_responses is not None or dest.inlined_embed_content_responses is not None:
            responses: list[Any] = list(dest.inlined_responses or dest.inlined_embed_content_responses or [])
            for position, item in enumerate(responses):
                key = (item.metadata or {}).get("key", f"request-{position + 1}")
                line: dict[str, Any] = {"key": key}
                if item.error is not None:
                    line["error"] = _dump(item.error)
                elif item.response is not None:
                    line["response"] = _dump(item.response)
                writer.write(
                    json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
                )
        elif dest.gcs_uri:
            self._download_gcs(dest.gcs_uri, writer)
        return writer.count

    def _download_gcs(self, uri: str, writer: _CountingWriter) -> None:
        fs, path = self.gcs, uri.removeprefix("gs://")
        for name in sorted(fs.glob(f"{path.rstrip('/')}/**/predictions*.jsonl")):
            with fs.open(name, "rb") as src:
                shutil.copyfileobj(src, writer, 1 << 20)

    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        return parse_jsonl_results(lines, self.result_id_field, result_from_line)

    def cancel(self, ref: BatchRef) -> None:
        from google.genai import errors

        try:
            self.client.batches.cancel(name=ref.batch_id)
        except errors.APIError as exc:
            if exc.status != "FAILED_PRECONDITION":
                raise
            # already terminal: nothing to cancel, and its results stay downloadable
