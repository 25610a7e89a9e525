"""OpenAI Batch API (``/v1/batches``) through the official ``openai`` SDK.

Works against api.openai.com, Azure OpenAI (``extra.api_type = "azure"``) and any
OpenAI-compatible base URL (the bundled emulator, a vLLM or LiteLLM server) set on the
connection. The SDK is imported inside methods only, so importing this module is free.

Idempotency: OpenAI's batch create takes no idempotency key, so the key goes into the batch's
``metadata`` and :meth:`find` pages through the batch list for it (newest first, down to the
job's intent) before any create. Uploads are named after the key and reused when a file of the
same name and size exists. Create-like calls (upload, batch create) are sent with the SDK's
retries off and follow :func:`~airflow_batch_provider.adapters.base.create_once`: a 429 is sent
again after ``Retry-After``; a timeout, dropped connection or 5xx is followed by a look-up by key
(file name and size, batch metadata) before anything is sent again, so a retried task never
uploads, creates or pays twice.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, ClassVar, Final, Literal

from airflow_batch_provider.adapters.base import (
    CUSTOM_ID_HEADER,
    AdapterSettings,
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
    failure_code,
    http_failure,
    parse_jsonl_results,
    unsupported_reply,
)
from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.requests import (
    CanonicalRequest,
    RequestKind,
    canonical_tool_choice,
    canonical_tools,
)
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.exceptions import ConfigurationError

if TYPE_CHECKING:
    import openai

METADATA_KEY = "abp_idempotency_key"
_STATES = {
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
}


def api_base_url(url: str) -> str:
    """The SDK's base URL of a connection host: a bare host (``http://127.0.0.1:8089``) gets ``/v1``.

    OpenAI's SDK appends ``/batches`` to its base URL, so a host without the ``/v1`` the API
    lives under would answer 404; a host that names a path (``/v1``, a proxy's ``/openai/v1``)
    is kept as it is.

    :param url: the connection's host
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, _, path = rest.partition("/")
    return url if path.strip("/") else f"{scheme}://{authority}/v1"


def _client_kwargs(settings: AdapterSettings) -> dict[str, Any]:
    extra = settings.extra
    kwargs: dict[str, Any] = {
        "api_key": settings.api_key,
        "max_retries": int(extra.get("max_retries", 3)),
        "timeout": float(extra.get("timeout", 120.0)),
    }
    if extra.get("api_type") == "azure":
        kwargs["api_version"] = extra.get("api_version", "2024-10-21")
        kwargs["azure_endpoint"] = settings.base_url
    else:
        if settings.base_url:
            kwargs["base_url"] = api_base_url(settings.base_url)
        for name in ("organization", "project"):
            if extra.get(name):
                kwargs[name] = extra[name]
    return kwargs


#: Batch (and real-time) path of each request kind, after ``/v1`` (Azure: without it).
KIND_PATHS: Final[Mapping[str, str]] = {
    "chat": "/chat/completions",
    "embedding": "/embeddings",
    "response": "/responses",
    "moderation": "/moderations",
}
#: Chat Completions parameters the Responses API refuses: named at format time, never dropped.
CHAT_ONLY_PARAMS: Final[frozenset[str]] = frozenset(
    {
        "stop",
        "n",
        "seed",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "modalities",
        "audio",
        "prediction",
        "stream_options",
        "functions",
        "function_call",
        "web_search_options",
    }
)
#: What a moderations request takes besides its input.
MODERATION_PARAMS: Final[frozenset[str]] = frozenset({"model"})


def _usage(body: Mapping[str, Any]) -> Usage:
    """Usage of a chat completion, an embedding list or a Responses ``response``."""
    usage = body.get("usage") or {}
    if "input_tokens" in usage:  # Responses
        prompt = int(usage.get("input_tokens") or 0)
        cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        return Usage(
            input_tokens=max(prompt - cached, 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cached_input_tokens=cached,
            reasoning_tokens=int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
        )
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cached_input_tokens=cached,
        reasoning_tokens=int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0),
    )


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Chat Completions ``tools`` (``{"type": "function", "function": {...}}``) for any tool form.

    :param tools: the prompt's ``tools`` param
    """
    out = []
    for tool in canonical_tools(tools):
        function: dict[str, Any] = {"name": tool.name, "parameters": dict(tool.parameters)}
        if tool.description:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """Chat Completions ``tool_choice`` for a canonical one.

    :param choice: the prompt's ``tool_choice`` param
    """
    value = canonical_tool_choice(choice)
    if value in (None, "auto", "none", "required"):
        return value
    return {"type": "function", "function": {"name": value}}


def responses_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses ``tools`` (``{"type": "function", "name", "parameters", ...}``) for any tool form.

    :param tools: the prompt's ``tools`` param
    """
    out = []
    for tool in canonical_tools(tools):
        entry: dict[str, Any] = {
            "type": "function",
            "name": tool.name,
            "parameters": dict(tool.parameters),
            "strict": tool.strict,  # required by the Responses API (null: its default)
        }
        if tool.description:
            entry["description"] = tool.description
        out.append(entry)
    return out


def responses_tool_choice(choice: Any) -> Any:
    """Responses ``tool_choice`` for a canonical one.

    :param choice: the prompt's ``tool_choice`` param
    """
    value = canonical_tool_choice(choice)
    if value in (None, "auto", "none", "required"):
        return value
    return {"type": "function", "name": value}


def text_format(response_format: Any) -> dict[str, Any] | None:
    """The Responses ``text.format`` of a Chat Completions ``response_format``.

    :param response_format: ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema":
        {"name", "schema", "strict", "description"}}`` (or ``text``)
    """
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind != "json_schema":
        return {"type": str(kind)} if kind in ("json_object", "text") else None
    spec = response_format.get("json_schema") or {}
    out: dict[str, Any] = {"type": "json_schema", "name": str(spec.get("name") or "output")}
    out.update({k: spec[k] for k in ("schema", "strict", "description") if k in spec})
    return out


def chat_body(request: CanonicalRequest) -> dict[str, Any]:
    """The Chat Completions body of a canonical request (tools in their chat form).

    :param request: the canonical request
    """
    messages: list[Mapping[str, Any]] = []
    if request.system:
        # The shared prefix goes first: OpenAI caches identical prompt prefixes automatically.
        messages.append({"role": "system", "content": request.system})
    messages.extend(request.messages)
    body: dict[str, Any] = {"model": request.model, "messages": messages, **request.params}
    if "tools" in body:
        body["tools"] = chat_tools(body["tools"])
    if "tool_choice" in body:
        body["tool_choice"] = chat_tool_choice(body["tool_choice"])
    return body


def responses_body(request: CanonicalRequest) -> dict[str, Any]:
    """The Responses API (``CreateResponse``) body of a canonical request.

    The system prompt becomes ``instructions`` (the cached prefix), the messages the ``input``;
    ``max_tokens``/``max_completion_tokens`` become ``max_output_tokens``, ``response_format``
    becomes ``text.format``, ``reasoning_effort`` becomes ``reasoning.effort``, tools take the
    Responses form; anything else passes through.

    :param request: the canonical request
    :raises ConfigurationError: a Chat Completions parameter the Responses API refuses
    """
    params = dict(request.params)
    refused = sorted(CHAT_ONLY_PARAMS & set(params))
    if refused:
        raise ConfigurationError(
            f"item {request.app_id!r} (prompt {request.prompt_version!r}) is a 'response' request but names "
            f"Chat Completions parameters the Responses API refuses: {refused}; remove them from the "
            "prompt's params or use kind 'chat'."
        )
    body: dict[str, Any] = {"model": request.model}
    if request.system:
        body["instructions"] = request.system
    body["input"] = [
        {"role": m.get("role", "user"), "content": m.get("content", "")} for m in request.messages
    ]
    limit = params.pop("max_tokens", None) or params.pop("max_completion_tokens", None)
    params.pop("max_completion_tokens", None)
    if limit is not None:
        body["max_output_tokens"] = int(limit)
    fmt = text_format(params.pop("response_format", None))
    if fmt is not None:
        text = dict(params.pop("text", None) or {})
        text["format"] = fmt
        body["text"] = text
    effort = params.pop("reasoning_effort", None)
    if effort is not None:
        reasoning = dict(params.pop("reasoning", None) or {})
        reasoning["effort"] = effort
        body["reasoning"] = reasoning
    if "tools" in params:
        body["tools"] = responses_tools(params.pop("tools"))
    if "tool_choice" in params:
        body["tool_choice"] = responses_tool_choice(params.pop("tool_choice"))
    body.update(params)
    return body


def moderation_body(request: CanonicalRequest) -> dict[str, Any]:
    """The moderations body (``model``, ``input``: the request's text) of a canonical request.

    :param request: the canonical request
    :raises ConfigurationError: a parameter moderations do not take
    """
    unknown = sorted(set(request.params) - MODERATION_PARAMS)
    if unknown:
        raise ConfigurationError(
            f"item {request.app_id!r} (prompt {request.prompt_version!r}) is a 'moderation' request but names "
            f"parameters moderations do not take: {unknown}; a moderation takes only its model and input."
        )
    return {"model": request.model, "input": request.text}


def _function_call_output(calls: list[Any]) -> Any:
    """The arguments of a lone function call (parsed JSON when they parse), else all of them."""
    parsed = []
    for name, arguments in calls:
        try:
            value = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            value = arguments
        parsed.append({"name": name, "arguments": value})
    if len(parsed) == 1:
        return parsed[0]["arguments"]
    return parsed or None


def response_output(body: Mapping[str, Any]) -> Any:
    """The output of a Responses ``response``: its output text, else its function call arguments.

    :param body: the ``response`` object
    """
    texts: list[str] = []
    calls: list[Any] = []
    for item in body.get("output") or []:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message":
            texts.extend(
                str(part.get("text") or "")
                for part in item.get("content") or []
                if isinstance(part, Mapping) and part.get("type") == "output_text"
            )
        elif item.get("type") == "function_call":
            calls.append((item.get("name"), item.get("arguments")))
    if texts:
        return "".join(texts)
    return _function_call_output(calls)


def _classify(exc: Exception) -> CreateFailure | None:
    """Read a failed create: 429 refused, 5xx/timeout/connection ambiguous, other 4xx raised."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        return http_failure(exc.status_code, exc.response.headers)
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return http_failure(None)
    return None


def _status(batch: Any) -> BatchStatus:
    counts = batch.request_counts
    raw = str(batch.status)
    reason = None
    error_code = error_message = None
    errors = getattr(batch, "errors", None)
    if errors is not None and getattr(errors, "data", None):
        reason = "; ".join(
            f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else "") for e in errors.data[:5]
        )
        if raw == "failed":
            first = errors.data[0]
            error_code, error_message = failure_code(first.code, first.message), first.message
    return BatchStatus(
        state=raw if raw in _STATES else "in_progress",  # type: ignore[arg-type]
        total=int(counts.total) if counts else 0,
        completed=int(counts.completed) if counts else 0,
        failed=int(counts.failed) if counts else 0,
        reason=reason,
        raw_state=raw,
        error_code=error_code,
        error_message=error_message,
    )


class _AsyncOpenAIStatus(AsyncStatusClient):
    def __init__(self, settings: AdapterSettings) -> None:
        import openai

        kwargs = _client_kwargs(settings)
        kwargs["max_retries"] = 0  # the trigger's poll policy owns retries
        self._client: openai.AsyncOpenAI = (
            openai.AsyncAzureOpenAI(**kwargs) if "azure_endpoint" in kwargs else openai.AsyncOpenAI(**kwargs)
        )

    async def status(self, ref: BatchRef) -> BatchStatus:
        return _status(await self._client.batches.retrieve(ref.batch_id))

    async def close(self) -> None:
        await self._client.close()


class _AsyncOpenAIRealtime(AsyncRealtimeClient):
    """Every kind on the real-time API, async, for the deadline fallback.

    The SDK's own retries are off: the fallback's limiter and retry policy own them, and read
    ``Retry-After`` and ``x-ratelimit-*`` from the raw response of every call.
    """

    def __init__(self, adapter: OpenAIBatchAdapter) -> None:
        import openai

        self._adapter = adapter
        kwargs = _client_kwargs(adapter.settings)
        kwargs["max_retries"] = 0
        kwargs["timeout"] = float(adapter.settings.extra.get("realtime_timeout", kwargs["timeout"]))
        self._client: openai.AsyncOpenAI = (
            openai.AsyncAzureOpenAI(**kwargs) if "azure_endpoint" in kwargs else openai.AsyncOpenAI(**kwargs)
        )

    async def complete(self, request: CanonicalRequest, custom_id: str) -> RealtimeReply:
        import openai

        # The same body as the batch line, so a fallback answer is the batch answer at full price.
        try:
            body = self._adapter.body(request)
        except ConfigurationError as exc:
            return unsupported_reply(custom_id, exc)
        model = body.pop("model")
        headers = {CUSTOM_ID_HEADER: custom_id}
        try:
            if request.kind == "response":
                raw: Any = await self._client.responses.with_raw_response.create(
                    model=model, input=body.pop("input"), extra_body=body or None, extra_headers=headers
                )
            elif request.kind == "moderation":
                raw = await self._client.moderations.with_raw_response.create(
                    model=model, input=body.pop("input"), extra_headers=headers
                )
            elif request.kind == "embedding":
                raw = await self._client.embeddings.with_raw_response.create(
                    model=model, input=body.pop("input"), extra_body=body or None, extra_headers=headers
                )
            else:
                raw = await self._client.chat.completions.with_raw_response.create(
                    model=model, messages=body.pop("messages"), extra_body=body or None, extra_headers=headers
                )
        except openai.APIStatusError as exc:
            return self._error_reply(custom_id, exc)
        except openai.APIConnectionError as exc:  # includes timeouts
            code = "timeout" if isinstance(exc, openai.APITimeoutError) else "connection_error"
            return RealtimeReply(
                ItemResult(custom_id, "failed_retryable", error_code=code, error_message=str(exc)[:500])
            )
        headers = _rate_headers(raw.headers)
        parsed = raw.parse().model_dump(mode="json")
        line = {
            "response": {"status_code": 200, "body": parsed, "request_id": raw.headers.get("x-request-id")}
        }
        return RealtimeReply(OpenAIBatchAdapter._result(custom_id, line), rate_limit=headers)

    @staticmethod
    def _error_reply(custom_id: str, exc: Any) -> RealtimeReply:
        from airflow_batch_provider.core.ratelimit import parse_retry_after

        status = int(exc.status_code)
        body: Mapping[str, Any] = exc.body if isinstance(exc.body, Mapping) else {}
        inner = body.get("error")
        err: Mapping[str, Any] = inner if isinstance(inner, Mapping) else body
        code = str(err.get("code") or err.get("type") or status)
        outcome = classify_outcome(status, code)
        headers = exc.response.headers
        retry_after = parse_retry_after(headers) if outcome == "failed_retryable" else None
        message = err.get("message") or str(exc)
        return RealtimeReply(
            ItemResult(
                custom_id,
                outcome,
                error_code=code,
                error_message=str(message)[:1000],
                raw={"status_code": status, "request_id": headers.get("x-request-id")},
            ),
            retry_after=retry_after,
            rate_limit=_rate_headers(headers),
        )

    async def close(self) -> None:
        await self._client.close()


def _rate_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(("x-ratelimit-", "retry-after"))}


class OpenAIBatchAdapter(BatchAdapter):
    """OpenAI and OpenAI-compatible batch endpoints.

    Connection extras: ``api_type`` (``openai`` or ``azure``), ``api_version`` (Azure),
    ``organization``, ``project``, ``max_retries`` (reads only; creates are never retried by the
    SDK), ``timeout``, ``find_scan_limit`` (an optional cap on the batches or files a look-up
    inspects; default none), ``find_clock_skew_s``, ``create_attempts``,
    ``create_retry_initial_s``, ``create_retry_max_s``.
    """

    declaration: ClassVar[ProviderDeclaration] = ProviderDeclaration(
        name="openai",
        conn_type="openai_batch",
        limits=Limits(max_requests=50_000, max_bytes=200 * 1024 * 1024),
        retryable_errors=frozenset({"rate_limit_exceeded", "server_error", "timeout", "internal_error"}),
        console_url="https://platform.openai.com/batches/{batch_id}",
        console_hosts=frozenset({"api.openai.com"}),
        compare_model="gpt-4.1-nano",
    )
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat", "embedding", "response", "moderation"})

    def __init__(self, settings: AdapterSettings) -> None:
        super().__init__(settings)
        self._client_obj: openai.OpenAI | None = None

    @property
    def client(self) -> openai.OpenAI:
        """The blocking SDK client, built on first use."""
        if self._client_obj is None:
            import openai

            kwargs = _client_kwargs(self.settings)
            self._client_obj = (
                openai.AzureOpenAI(**kwargs) if "azure_endpoint" in kwargs else openai.OpenAI(**kwargs)
            )
        return self._client_obj

    def probe(self) -> str:
        """List one batch (``GET /batches?limit=1``), SDK retries off."""
        client = self.client.with_options(max_retries=0)
        page = client.batches.list(limit=1)
        return f"{client.base_url} listed {len(page.data)} batch(es) on the first page"

    @property
    def _azure(self) -> bool:
        return self.settings.extra.get("api_type") == "azure"

    def endpoint(self, kind: str) -> str:
        """Return the batch endpoint for a request kind.

        :param kind: ``chat``, ``embedding``, ``response`` or ``moderation``
        """
        path = KIND_PATHS[kind]
        return path if self._azure else "/v1" + path

    def body(self, request: CanonicalRequest) -> dict[str, Any]:
        """Return the request body of a canonical request for its kind's endpoint.

        :param request: the canonical request
        :raises ConfigurationError: the kind is not accepted, or a parameter its endpoint refuses
        """
        self.check_kind(request)
        if request.kind == "embedding":
            return {"model": request.model, "input": request.text, **request.params}
        if request.kind == "response":
            return responses_body(request)
        if request.kind == "moderation":
            return moderation_body(request)
        return chat_body(request)

    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        line = {
            "custom_id": custom_id,
            "method": "POST",
            "url": self.endpoint(request.kind),
            "body": self.body(request),
        }
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @property
    def _create_client(self) -> openai.OpenAI:
        """The client for create-like calls: SDK retries off (see :func:`create_once`)."""
        return self.client.with_options(max_retries=0)

    def _find_file(self, name: str, size: int) -> InputRef | None:
        limit = self.scan_limit()
        for i, existing in enumerate(self.client.files.list(purpose="batch")):
            if limit is not None and i >= limit:
                break
            if existing.filename == name and int(existing.bytes or 0) == size:
                return InputRef("file", existing.id)
        return None

    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        found = self._find_file(name, size)
        if found is not None:
            return found
        started = utcnow()
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
            source: IO[bytes] = chunk
            seekable = getattr(chunk, "seekable", None)
            if not (callable(seekable) and seekable()):  # a second send must start from the beginning
                shutil.copyfileobj(chunk, spool)
                source = spool  # type: ignore[assignment]
            start = source.tell()

            def upload() -> InputRef:
                source.seek(start)
                uploaded = self._create_client.files.create(
                    file=(name, source, "application/jsonl"), purpose="batch"
                )
                return InputRef("file", uploaded.id)

            return create_once(
                key=name,
                what=f"upload of {name}",
                create=upload,
                lookup=lambda: self._find_file(name, size),
                classify=_classify,
                policy=self.create_policy(),
                created_after=started,
            )

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
        started = utcnow()
        meta = {k[:64]: str(v)[:512] for k, v in list(metadata.items())[:15]}
        meta[METADATA_KEY] = key

        def create() -> BatchRef:
            batch = self._create_client.batches.create(
                input_file_id=input_ref.value,
                endpoint=self.endpoint(kind),  # type: ignore[arg-type]
                completion_window="24h",
                metadata=meta,
            )
            return BatchRef(self.name, batch.id, key)

        return create_once(
            key=key,
            what="batch create",
            create=create,
            lookup=lambda: self.find(key, created_after=started),
            classify=_classify,
            policy=self.create_policy(),
            created_after=created_after or started,
        )

    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        not_before = self.find_not_before(created_after)
        limit = self.scan_limit()
        # The SDK's iterator follows has_more/after page by page; the list is newest first.
        for i, batch in enumerate(self.client.batches.list(limit=100)):
            if (limit is not None and i >= limit) or (
                not_before is not None and batch.created_at < not_before
            ):
                break
            if (batch.metadata or {}).get(METADATA_KEY) == key:
                return BatchRef(self.name, batch.id, key)
        return None

    def status(self, ref: BatchRef) -> BatchStatus:
        return _status(self.client.batches.retrieve(ref.batch_id))

    def async_client(self) -> AsyncStatusClient:
        return _AsyncOpenAIStatus(self.settings)

    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        batch = self.client.batches.retrieve(ref.batch_id)
        file_id = batch.output_file_id if kind == "output" else batch.error_file_id
        if not file_id:
            return 0
        written = 0
        with self.client.files.with_streaming_response.content(file_id) as response:
            for piece in response.iter_bytes(chunk_size=1 << 20):
                sink.write(piece)
                written += len(piece)
        return written

    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        return parse_jsonl_results(lines, "custom_id", self._result)

    @staticmethod
    def _result(custom_id: str, line: Mapping[str, Any]) -> ItemResult:
        error = line.get("error")
        response = line.get("response") or {}
        if error:
            code = str(error.get("code") or "error")
            return ItemResult(
                custom_id,
                classify_outcome(None, code),
                error_code=code,
                error_message=error.get("message"),
            )
        status = int(response.get("status_code") or 0)
        body = response.get("body") or {}
        if status != 200:
            err = body.get("error") or {}
            code = str(err.get("code") or err.get("type") or status)
            return ItemResult(
                custom_id,
                classify_outcome(status, code),
                usage=_usage(body),
                error_code=code,
                error_message=err.get("message"),
                raw={"status_code": status, "request_id": response.get("request_id")},
            )
        finish = None
        if body.get("object") == "list":  # embeddings
            output: Any = [d.get("embedding") for d in body.get("data") or []]
            output = output[0] if len(output) == 1 else output
        elif body.get("object") == "response":
            if body.get("status") == "failed":
                err = body.get("error") or {}
                code = str(err.get("code") or "server_error")
                return ItemResult(
                    custom_id,
                    classify_outcome(None, code),
                    usage=_usage(body),
                    error_code=code,
                    error_message=err.get("message"),
                    raw={"request_id": response.get("request_id"), "response_id": body.get("id")},
                )
            output = response_output(body)
            finish = (body.get("incomplete_details") or {}).get("reason") or body.get("status")
        elif "results" in body and "choices" not in body:  # moderations
            results = list(body.get("results") or [])
            output = results[0] if len(results) == 1 else results
        else:
            choice = (body.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            output = message.get("content")
            if output is None and message.get("tool_calls"):
                output = _function_call_output(
                    [
                        ((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
                        for c in message["tool_calls"]
                    ]
                )
            finish = choice.get("finish_reason")
        return ItemResult(
            custom_id,
            "succeeded",
            output=output,
            usage=_usage(body),
            raw={"finish_reason": finish, "request_id": response.get("request_id")},
        )

    def cancel(self, ref: BatchRef) -> None:
        self.client.batches.cancel(ref.batch_id)

    def realtime_client(self) -> AsyncRealtimeClient:
        """Return the async real-time client (every kind of :attr:`kinds`) for the fallback.

        Connection extra ``realtime_timeout``: seconds per real-time call (default ``timeout``).
        """
        return _AsyncOpenAIRealtime(self)
