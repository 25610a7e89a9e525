"""Anthropic Message Batches (``/v1/messages/batches``) through the official ``anthropic`` SDK.

Requests are posted inline: a staged chunk is a JSONL file whose every line IS one Message Batch
request, ``{"custom_id": ..., "params": {model, max_tokens, system, messages, ...}}``
(:meth:`AnthropicBatchAdapter.format_line`); :meth:`~AnthropicBatchAdapter.stage` checks and
spools it locally and :meth:`~AnthropicBatchAdapter.submit` posts its lines as
``client.messages.batches.create(requests=[...])``. Results are one JSONL stream
(``results_url``) holding succeeded, errored, canceled and expired lines alike, so
:meth:`~AnthropicBatchAdapter.download` writes it as the ``output`` file and reports no
``errors`` file. The SDK is imported inside methods only, so importing this module is free.

Mapping of canonical requests: the Messages body is built by
:func:`~airflow_batch_provider.adapters.claude.claude_body`, the same builder Bedrock uses for
Claude (system block with the ``prompt_caching`` cache marker, ``default_max_tokens``,
``json_output`` = ``instruct`` or ``output_config``, ``stop``, tools; see that module).

Errored results: ``overloaded_error``, ``rate_limit_error``, ``api_error`` and
``timeout_error`` are ``failed_retryable``; ``invalid_request_error`` (including "prompt is too
long") and anything else are ``failed_permanent``; ``canceled`` and ``expired`` results are
``cancelled`` and ``expired``.

Idempotency (what it can and cannot guarantee): Anthropic batches carry no metadata, no client
token and no name, and a batch's requests cannot be read back; only ``created_at`` and
``request_counts`` are visible, and the ``custom_id`` values only once the batch has ended (in
its results). So:

- the ledger's job row (the intent) exists before :meth:`submit`; the create call is sent once,
  with the SDK's automatic retries off, under
  :func:`~airflow_batch_provider.adapters.base.create_once`: 429 and 529 (overloaded) prove that
  nothing was created and are sent again after ``retry-after``; any other failure that may have
  acted (timeout, dropped connection, other 5xx) raises
  :class:`~airflow_batch_provider.exceptions.BatchInDoubtError` at once, because a running batch
  cannot be recognised: nothing more is created for the job until the doubt is settled;
- :meth:`find` returns a batch created by this adapter object for the key; then, for a key whose
  chunk was staged by this object (so that its request count and ``custom_id`` set are known), it
  lists batches created since the staged chunk was written (or since ``created_after``; minus
  ``find_clock_skew_s``, default 300 s; when neither is known, the last ``find_window_s``,
  default 26 h) with the same request count, and matches an **ended** one whose results' first
  ``find_verify_lines`` (default 20) ``custom_id`` values all belong to the chunk;
- :meth:`resolve_in_doubt` settles a job in doubt from the batch list: no batch created after the
  intent with the chunk's request count means none exists (``None``, safe to create); an ended
  one whose results carry the chunk's custom ids is the job's batch; a candidate still running,
  or an ended one when the custom ids are not known, keeps the job in doubt (it raises
  :class:`~airflow_batch_provider.exceptions.BatchInDoubtError` again). Pass the job's custom ids
  (the ledger's items of the job) when the chunk was not staged by this adapter object.
  ``custom_id`` values name the item, the attempt and the chunk index, so the match is exact
  within a run. It cannot see batches created with another API key or workspace.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
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
    http_failure,
    parse_jsonl_results,
    unsupported_reply,
)
from airflow_batch_provider.adapters.claude import claude_body, claude_result
from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.ratelimit import parse_retry_after
from airflow_batch_provider.core.requests import CanonicalRequest, RequestKind
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Outcome
from airflow_batch_provider.exceptions import BatchInDoubtError, ConfigurationError

if TYPE_CHECKING:
    import anthropic

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS: Final = 1024
CUSTOM_ID_PATTERN: Final = r"^[a-zA-Z0-9_-]{1,64}$"
_CUSTOM_ID: Final = re.compile(CUSTOM_ID_PATTERN)


def _base_url(settings: AdapterSettings) -> str | None:
    # The SDK adds /v1/... itself; accept a connection host written with a trailing /v1.
    url = settings.base_url
    if url:
        url = url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
    return url or None


def _client_kwargs(settings: AdapterSettings, max_retries: int | None = None) -> dict[str, Any]:
    extra = settings.extra
    kwargs: dict[str, Any] = {
        "api_key": settings.api_key,
        "max_retries": int(extra.get("max_retries", 3)) if max_retries is None else max_retries,
        "timeout": float(extra.get("timeout", 600.0)),
    }
    base = _base_url(settings)
    if base:
        kwargs["base_url"] = base
    return kwargs


def succeeded_result(custom_id: str, message: Mapping[str, Any]) -> ItemResult:
    """Return the neutral result of a ``Message`` (see :func:`~.claude.claude_result`).

    :param custom_id: the item's custom id
    :param message: the ``Message`` object as a dict
    """
    return claude_result(custom_id, message)


def error_outcome(error_type: str | None, status: int | None = None) -> Outcome:
    """Classify an Anthropic error type (and HTTP status) by the one retryable table.

    :param error_type: ``overloaded_error``, ``invalid_request_error`` ...
    :param status: the HTTP status, when known
    """
    return classify_outcome(status, error_type)


def _error_object(body: Any) -> Mapping[str, Any]:
    """The ``{"type", "message"}`` object of an ``ErrorResponse`` body (or the body itself)."""
    if not isinstance(body, Mapping):
        return {}
    inner = body.get("error")
    return inner if isinstance(inner, Mapping) else body


def _status(batch: Any) -> BatchStatus:
    """Map a ``MessageBatch`` to the neutral status.

    ``in_progress`` -> ``in_progress``; ``canceling`` -> ``cancelling``; ``ended`` ->
    ``cancelled`` when a cancel was initiated or every request was canceled, ``expired`` when any
    request expired (the 24-hour window ran out: what finished is kept, like an expired OpenAI
    batch), otherwise ``completed``.
    """
    counts = batch.request_counts
    succeeded, errored = int(counts.succeeded), int(counts.errored)
    canceled, expired = int(counts.canceled), int(counts.expired)
    total = int(counts.processing) + succeeded + errored + canceled + expired
    raw = str(batch.processing_status)
    reason = None
    if raw == "in_progress":
        state = "in_progress"
    elif raw == "canceling":
        state = "cancelling"
    elif raw == "ended":
        if batch.cancel_initiated_at is not None or (total and canceled == total):
            state = "cancelled"
            reason = f"cancelled: {canceled} of {total} requests were not processed"
        elif expired:
            state = "expired"
            reason = f"expired: {expired} of {total} requests were not processed within 24 hours"
        else:
            state = "completed"
    else:
        state = "in_progress"
    return BatchStatus(
        state=state,  # type: ignore[arg-type]
        total=total,
        completed=succeeded,
        failed=errored + canceled + expired,
        reason=reason,
        raw_state=raw,
    )


@dataclass(frozen=True)
class _Intent:
    """What is known about a staged chunk: enough to recognise its batch once that has ended."""

    path: str
    count: int
    custom_ids: frozenset[str] = field(repr=False)
    not_before: float


def _rate_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    return {
        k.lower(): v
        for k, v in headers.items()
        if k.lower().startswith(("anthropic-ratelimit-", "x-ratelimit-", "retry-after"))
    }


def _mtime(chunk: IO[bytes]) -> float | None:
    """The staged chunk's modification time from its store, when the stream can tell."""
    try:
        return os.fstat(chunk.fileno()).st_mtime
    except (AttributeError, OSError, ValueError):
        pass
    fs, path = getattr(chunk, "fs", None), getattr(chunk, "path", None)
    if fs is None or path is None:
        return None
    try:
        info = fs.info(path)
    except Exception:  # any store error just means "unknown"
        return None
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _classify(exc: Exception) -> CreateFailure | None:
    """Read a failed create: 429 and 529 refused, other 5xx/timeout/connection ambiguous."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        return http_failure(exc.status_code, exc.response.headers, refused=(429, 529))
    if isinstance(exc, anthropic.APIConnectionError):  # includes APITimeoutError
        return http_failure(None)
    return None


class _AsyncAnthropicStatus(AsyncStatusClient):
    def __init__(self, settings: AdapterSettings) -> None:
        import anthropic

        # The trigger's poll policy owns retries.
        self._client = anthropic.AsyncAnthropic(**_client_kwargs(settings, max_retries=0))

    async def status(self, ref: BatchRef) -> BatchStatus:
        return _status(await self._client.messages.batches.retrieve(ref.batch_id))

    async def close(self) -> None:
        await self._client.close()


class _AsyncAnthropicRealtime(AsyncRealtimeClient):
    """``POST /v1/messages`` for the synchronous fallback; never raises for one item's failure."""

    def __init__(self, adapter: AnthropicBatchAdapter) -> None:
        import anthropic

        self._adapter = adapter
        # The fallback's limiter owns retries and honours retry-after itself.
        self._client = anthropic.AsyncAnthropic(**_client_kwargs(adapter.settings, max_retries=0))

    async def complete(self, request: CanonicalRequest, custom_id: str) -> RealtimeReply:
        import anthropic

        try:
            params = self._adapter.params(request)
        except ConfigurationError as exc:
            return unsupported_reply(custom_id, exc)
        try:
            raw = await self._client.messages.with_raw_response.create(
                **params, extra_headers={CUSTOM_ID_HEADER: custom_id}
            )
        except anthropic.APIStatusError as exc:
            inner = _error_object(exc.body)
            error_type = str(inner.get("type")) if inner.get("type") else None
            return RealtimeReply(
                ItemResult(
                    custom_id,
                    error_outcome(error_type, exc.status_code),
                    error_code=error_type or str(exc.status_code),
                    error_message=str(inner.get("message") or exc.message),
                    raw={"status_code": exc.status_code, "request_id": exc.request_id},
                ),
                retry_after=parse_retry_after(exc.response.headers),
                rate_limit=_rate_headers(exc.response.headers),
            )
        except (anthropic.APITimeoutError, anthropic.APIConnectionError) as exc:
            return RealtimeReply(
                ItemResult(
                    custom_id,
                    "failed_retryable",
                    error_code="timeout"
                    if isinstance(exc, anthropic.APITimeoutError)
                    else "connection_error",
                    error_message=str(exc),
                )
            )
        message = await raw.parse()
        return RealtimeReply(
            succeeded_result(custom_id, message.model_dump(mode="json")),
            rate_limit=_rate_headers(raw.headers),
        )

    async def close(self) -> None:
        await self._client.close()


class AnthropicBatchAdapter(BatchAdapter):
    """Anthropic Message Batches.

    Connection: host = API base URL (optional; ``https://api.anthropic.com``, a trailing ``/v1``
    is accepted), password = API key. Extras: ``max_retries``, ``timeout``,
    ``default_max_tokens`` (1024), ``prompt_caching`` (true), ``json_output`` (``instruct`` or
    ``output_config``), ``spool_dir`` (where staged chunks wait for submit; default the system
    temp dir), ``find_scan_limit`` (optional cap on a look-up; default none), ``find_window_s`` (93600),
    ``find_clock_skew_s`` (300), ``find_verify_lines`` (20), ``create_attempts`` (3: tries of a
    create refused with 429/529/503, which creates nothing).
    """

    declaration: ClassVar[ProviderDeclaration] = ProviderDeclaration(
        name="anthropic",
        conn_type="anthropic_batch",
        limits=Limits(max_requests=100_000, max_bytes=256 * 1024 * 1024, custom_id_pattern=CUSTOM_ID_PATTERN),
        retryable_errors=frozenset({"overloaded_error", "rate_limit_error", "api_error", "timeout_error"}),
        compare_model="claude-haiku-4-5",
    )
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat"})

    def __init__(self, settings: AdapterSettings) -> None:
        super().__init__(settings)
        self._client_obj: anthropic.Anthropic | None = None
        self._intents: dict[str, _Intent] = {}
        self._created: dict[str, str] = {}

    @property
    def client(self) -> anthropic.Anthropic:
        """The blocking SDK client, built on first use."""
        if self._client_obj is None:
            import anthropic

            self._client_obj = anthropic.Anthropic(**_client_kwargs(self.settings))
        return self._client_obj

    def probe(self) -> str:
        """List one message batch (``GET /v1/messages/batches?limit=1``), SDK retries off."""
        client = self.client.with_options(max_retries=0)
        page = client.messages.batches.list(limit=1)
        return f"{client.base_url} listed {len(page.data)} message batch(es) on the first page"

    # -- formatting ------------------------------------------------------------------------

    def params(self, request: CanonicalRequest) -> dict[str, Any]:
        """Return the Messages API params of a canonical request (:func:`~.claude.claude_body`).

        :param request: the canonical request
        :raises ConfigurationError: the request is not a chat request
        """
        self.check_kind(request)
        return claude_body(request, self.settings.extra, "anthropic")

    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        if not _CUSTOM_ID.match(custom_id):
            raise ValueError(
                f"custom_id {custom_id!r} (item {request.app_id!r}) does not match {CUSTOM_ID_PATTERN}; "
                "build custom ids with core.custom_ids.make_custom_id."
            )
        line = {"custom_id": custom_id, "params": self.params(request)}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    # -- staging and submit ----------------------------------------------------------------

    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        """Check the chunk's lines and spool them locally; the batch is posted inline by :meth:`submit`.

        :param chunk: the staged JSONL chunk (one request object per line)
        :param name: ``<idempotency key>.jsonl``
        :param size: the chunk's size in bytes
        :raises ConfigurationError: the chunk breaks a Message Batches limit
        """
        if size > self.limits.max_bytes:
            raise ConfigurationError(
                f"chunk {name} is {size:,} bytes; a Message Batch takes at most {self.limits.max_bytes:,}. "
                "Lower the group's ChunkOptions(max_bytes=...)."
            )
        key = name.removesuffix(".jsonl")
        spool_dir = Path(self.settings.extra.get("spool_dir") or tempfile.gettempdir()) / "abp-anthropic"
        spool_dir.mkdir(parents=True, exist_ok=True)
        staged_at = _mtime(chunk)
        ids: set[str] = set()
        fd, spool = tempfile.mkstemp(prefix=f"{key[:80]}-", suffix=".jsonl", dir=spool_dir)
        try:
            with open(fd, "wb") as out:
                for number, raw in enumerate(chunk, start=1):
                    line = raw.strip()
                    if not line:
                        continue
                    custom_id = self._check_line(name, number, line)
                    if custom_id in ids:
                        raise ConfigurationError(
                            f"chunk {name} line {number}: custom_id {custom_id!r} appears twice; custom ids "
                            "must be unique in a batch. Re-run prepare to rebuild the chunk."
                        )
                    ids.add(custom_id)
                    out.write(line + b"\n")
        except BaseException:
            Path(spool).unlink(missing_ok=True)
            raise
        if not ids or len(ids) > self.limits.max_requests:
            Path(spool).unlink(missing_ok=True)
            raise ConfigurationError(
                f"chunk {name} holds {len(ids):,} requests; a Message Batch takes 1 to "
                f"{self.limits.max_requests:,}. Lower the group's ChunkOptions(max_requests=...)."
            )
        window = float(self.settings.extra.get("find_window_s", 93_600))
        skew = float(self.settings.extra.get("find_clock_skew_s", 300))
        not_before = staged_at - skew if staged_at is not None else time.time() - window
        self._intents[key] = _Intent(spool, len(ids), frozenset(ids), not_before)
        return InputRef("inline", spool)

    @staticmethod
    def _check_line(name: str, number: int, line: bytes) -> str:
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigurationError(
                f"chunk {name} line {number} is not JSON ({exc}); re-run prepare to rebuild the chunk."
            ) from exc
        custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            raise ConfigurationError(
                f"chunk {name} line {number}: custom_id {custom_id!r} does not match {CUSTOM_ID_PATTERN}; "
                "the chunk was not written by this adapter's format_line."
            )
        if not isinstance(obj.get("params"), dict):
            raise ConfigurationError(
                f"chunk {name} line {number} ({custom_id}) has no 'params' object; the chunk was not "
                "written by this adapter's format_line."
            )
        return custom_id

    def submit(
        self,
        input_ref: InputRef,
        key: str,
        metadata: Mapping[str, str],
        kind: RequestKind = "chat",
        *,
        created_after: datetime | None = None,
    ) -> BatchRef:
        """Post the staged requests as one Message Batch; see the module docstring on idempotency.

        :param input_ref: the inline reference from :meth:`stage`
        :param key: the idempotency key
        :param metadata: ignored (Anthropic batches take no metadata)
        :param kind: must be ``chat``
        :param created_after: when the job's intent was recorded
        :raises BatchInDoubtError: the create failed ambiguously (see the module docstring)
        """
        if kind != "chat":
            raise ConfigurationError(
                f"Anthropic has no {kind!r} batch endpoint; point this workload at an OpenAI or Gemini "
                "connection."
            )
        if input_ref.kind != "inline":
            raise ConfigurationError(
                f"the Anthropic adapter posts requests inline; got a {input_ref.kind!r} input {input_ref.value!r}."
            )
        path = Path(input_ref.value)
        found = self.find(key, created_after=created_after)
        if found is not None:
            path.unlink(missing_ok=True)
            return found
        if not path.is_file():
            raise ConfigurationError(
                f"the spooled chunk {path} is gone; stage() the chunk again (in the same process) before submit."
            )
        with path.open("rb") as fh:
            requests = [json.loads(line) for line in fh if line.strip()]
        client = self.client.with_options(max_retries=0)
        started = utcnow()
        batch = create_once(
            key=key,
            what="batch create",
            create=lambda: client.messages.batches.create(requests=requests),
            lookup=None,  # a running batch cannot be recognised: an ambiguous failure is in doubt
            classify=_classify,
            policy=self.create_policy(),
            created_after=created_after or started,
            request_count=len(requests),
        )
        self._created[key] = batch.id
        path.unlink(missing_ok=True)
        return BatchRef(self.name, batch.id, key)

    def _candidates(self, not_before: float, count: int) -> Iterator[Any]:
        """Batches created at or after ``not_before`` with ``count`` requests, newest first, all pages."""
        limit = self.scan_limit()
        for i, batch in enumerate(self.client.messages.batches.list(limit=100)):
            if (limit is not None and i >= limit) or batch.created_at.timestamp() < not_before:
                break
            counts = batch.request_counts
            total = sum(
                int(getattr(counts, n)) for n in ("processing", "succeeded", "errored", "canceled", "expired")
            )
            if total == count:
                yield batch

    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        """Return the batch created earlier for ``key``, when it can be recognised.

        Exact for a batch this object created, and for an ended batch whose results carry the
        staged chunk's custom ids; blind to batches still in progress (see the module docstring).

        :param key: the idempotency key
        :param created_after: when the job's intent was recorded
        """
        if key in self._created:
            return BatchRef(self.name, self._created[key], key)
        intent = self._intents.get(key)
        if intent is None:
            return None
        not_before = self.find_not_before(created_after)
        verify = max(1, int(self.settings.extra.get("find_verify_lines", 20)))
        unverifiable = 0
        for batch in self._candidates(intent.not_before if not_before is None else not_before, intent.count):
            if batch.processing_status != "ended" or not batch.results_url:
                unverifiable += 1
                continue
            if self._results_match(batch.id, intent.custom_ids, verify):
                self._created[key] = batch.id
                return BatchRef(self.name, batch.id, key)
        if unverifiable:
            log.info(
                "%d batch(es) created since chunk %s was staged have its request count (%d) but are still "
                "running; Anthropic shows no custom ids before a batch ends, so they cannot be matched to it.",
                unverifiable,
                key,
                intent.count,
            )
        return None

    def resolve_in_doubt(
        self,
        key: str,
        created_after: datetime,
        request_count: int,
        *,
        custom_ids: Collection[str] | None = None,
    ) -> BatchRef | None:
        """Settle a job in doubt from the batch list (see the module docstring).

        :param key: the idempotency key
        :param created_after: when the create was attempted
        :param request_count: requests in the chunk
        :param custom_ids: the chunk's custom ids; default: those of the chunk staged by this object
        :raises BatchInDoubtError: a candidate still runs, or an ended one cannot be checked
        """
        if key in self._created:
            return BatchRef(self.name, self._created[key], key)
        intent = self._intents.get(key)
        ids = frozenset(custom_ids) if custom_ids is not None else intent.custom_ids if intent else None
        not_before = self.find_not_before(created_after)
        assert not_before is not None
        verify = max(1, int(self.settings.extra.get("find_verify_lines", 20)))
        running: list[str] = []
        unchecked: list[str] = []
        for batch in self._candidates(not_before, request_count):
            if batch.processing_status != "ended" or not batch.results_url:
                running.append(batch.id)
            elif ids is None:
                unchecked.append(batch.id)
            elif self._results_match(batch.id, ids, verify):
                self._created[key] = batch.id
                return BatchRef(self.name, batch.id, key)
        if running or unchecked:
            reasons = []
            if running:
                reasons.append(
                    f"{len(running)} batch(es) with {request_count} requests still run ({', '.join(running[:5])})"
                )
            if unchecked:
                reasons.append(
                    f"{len(unchecked)} ended batch(es) ({', '.join(unchecked[:5])}) cannot be checked without the "
                    "job's custom ids; pass custom_ids"
                )
            raise BatchInDoubtError(
                key,
                created_after,
                request_count,
                "; ".join(reasons) + "; Anthropic shows a batch's custom ids only once it has ended",
            )
        return None

    def _results_match(self, batch_id: str, custom_ids: frozenset[str], lines: int) -> bool:
        seen = 0
        with self.client.messages.batches.with_streaming_response.results(batch_id) as response:
            for raw in response.iter_lines():
                if not raw.strip():
                    continue
                try:
                    custom_id = json.loads(raw).get("custom_id")
                except ValueError:
                    continue
                if custom_id not in custom_ids:
                    return False
                seen += 1
                if seen >= lines:
                    break
        return seen > 0

    # -- status, results, cancel -----------------------------------------------------------

    def status(self, ref: BatchRef) -> BatchStatus:
        return _status(self.client.messages.batches.retrieve(ref.batch_id))

    def async_client(self) -> AsyncStatusClient:
        return _AsyncAnthropicStatus(self.settings)

    def realtime_client(self) -> AsyncRealtimeClient:
        return _AsyncAnthropicRealtime(self)

    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        """Stream the batch's results (every result type, one file) into ``sink`` as ``output``.

        :param ref: the batch
        :param kind: ``output`` writes the results; ``errors`` writes nothing (they are in the output)
        :param sink: writable binary stream
        """
        if kind != "output":
            return 0
        batch = self.client.messages.batches.retrieve(ref.batch_id)
        if not batch.results_url:
            return 0
        written = 0
        with self.client.messages.batches.with_streaming_response.results(ref.batch_id) as response:
            for piece in response.iter_bytes(chunk_size=1 << 20):
                sink.write(piece)
                written += len(piece)
        return written

    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        return parse_jsonl_results(
            lines, "custom_id", lambda custom_id, line: self._result(custom_id, line["result"])
        )

    @staticmethod
    def _result(custom_id: str, result: Mapping[str, Any]) -> ItemResult:
        kind = result["type"]
        if kind == "succeeded":
            message = result["message"]
            if not isinstance(message, Mapping):
                raise TypeError("succeeded result without a message object")
            return succeeded_result(custom_id, message)
        if kind == "errored":
            response = result.get("error")
            error = _error_object(response)
            error_type = str(error.get("type") or "error")
            return ItemResult(
                custom_id,
                error_outcome(error_type),
                error_code=error_type,
                error_message=error.get("message"),
                raw={"request_id": response.get("request_id") if isinstance(response, Mapping) else None},
            )
        if kind == "canceled":
            return ItemResult(
                custom_id,
                "cancelled",
                error_code="canceled",
                error_message="not processed: the batch was cancelled",
            )
        if kind == "expired":
            return ItemResult(
                custom_id,
                "expired",
                error_code="expired",
                error_message="not processed: the batch reached its 24-hour window",
            )
        raise ValueError(f"unknown result type {kind!r}")

    def cancel(self, ref: BatchRef) -> None:
        self.client.messages.batches.cancel(ref.batch_id)
