"""The adapter contract. This module never imports a provider SDK.

An adapter turns canonical requests into a provider's batch format and drives that provider's
batch lifecycle. Airflow never appears here: hooks build :class:`AdapterSettings` from a
connection and hand it to the adapter.
"""

from __future__ import annotations

import json
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, ClassVar, Final, Literal, TypeVar

from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.entries import providers_accepting
from airflow_batch_provider.core.batch import BATCH_ERROR_CODES as BATCH_ERROR_CODES
from airflow_batch_provider.core.batch import BatchErrorCode as BatchErrorCode
from airflow_batch_provider.core.batch import BatchStatus as BatchStatus
from airflow_batch_provider.core.batch import Limits as Limits
from airflow_batch_provider.core.batch import failure_code as failure_code
from airflow_batch_provider.core.ratelimit import RetryPolicy, parse_retry_after, retry_delay
from airflow_batch_provider.core.requests import CanonicalRequest, RequestKind
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.core.states import BATCH_STATES as BATCH_STATES
from airflow_batch_provider.core.states import TERMINAL_BATCH_STATES as TERMINAL_BATCH_STATES
from airflow_batch_provider.core.states import BatchState as BatchState
from airflow_batch_provider.exceptions import BatchInDoubtError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Header naming the item of a real-time call: providers ignore it, the emulator records it.
CUSTOM_ID_HEADER: Final = "x-abp-custom-id"


@dataclass(frozen=True)
class AdapterSettings:
    """What an adapter needs from a connection; built by a hook, never logged.

    :param api_key: secret key or token (``None`` where the SDK finds its own credentials)
    :param base_url: API base URL override (emulator, Azure, compatible servers)
    :param extra: connection extras (organization, project, api_version, region, bucket ...)
    :param credentials: cloud credentials the hook resolved from another connection (Bedrock: an
        object with ``get_session(region_name, deferrable)``, e.g. the Amazon provider's
        ``AwsBaseHook``; Vertex AI: ``google.auth`` credentials); ``None``: keys from this
        connection or the SDK's default chain
    """

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    credentials: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class InputRef:
    """Where a staged chunk lives at the provider.

    :param kind: ``file`` (uploaded file id), ``uri`` (s3:// or gs://) or ``inline``
    :param value: file id or URI; for inline, the path of the staged chunk
    """

    kind: Literal["file", "uri", "inline"]
    value: str


@dataclass(frozen=True)
class BatchRef:
    """A provider batch job.

    :param provider: adapter name
    :param batch_id: the provider's id for the job
    :param idempotency_key: the key the job was created with
    """

    provider: str
    batch_id: str
    idempotency_key: str

    def to_dict(self) -> dict[str, str]:
        """Return an XCom-safe dict."""
        return {"provider": self.provider, "batch_id": self.batch_id, "idempotency_key": self.idempotency_key}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchRef:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(str(data["provider"]), str(data["batch_id"]), str(data["idempotency_key"]))


class AsyncStatusClient(ABC):
    """The async side of an adapter, used by the trigger: status only, native async I/O."""

    @abstractmethod
    async def status(self, ref: BatchRef) -> BatchStatus:
        """Return the job's normalised status without blocking the event loop.

        :param ref: the job
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


@dataclass(frozen=True)
class RealtimeReply:
    """One synchronous (real-time API) answer, for the deadline fallback.

    :param result: the neutral result (usage priced at standard rates by the caller)
    :param retry_after: seconds the provider asked to wait before the next call (429/503)
    :param rate_limit: the provider's rate-limit headers, lower-cased (``x-ratelimit-*``)
    """

    result: ItemResult
    retry_after: float | None = None
    rate_limit: Mapping[str, str] = field(default_factory=dict)


def unsupported_reply(custom_id: str, exc: Exception) -> RealtimeReply:
    """The real-time answer to a request this adapter cannot send (its kind, a refused parameter).

    :param custom_id: the item's custom id
    :param exc: the :class:`~airflow_batch_provider.exceptions.ConfigurationError` that says why
    """
    return RealtimeReply(
        ItemResult(custom_id, "failed_permanent", error_code="unsupported", error_message=str(exc))
    )


class AsyncRealtimeClient(ABC):
    """The provider's real-time API, async, for the synchronous fallback at full price."""

    @abstractmethod
    async def complete(self, request: CanonicalRequest, custom_id: str) -> RealtimeReply:
        """Send one request now; never raise for a per-item failure, report it in the result.

        :param request: the canonical request
        :param custom_id: the id to put on the result
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class BatchAdapter(ABC):
    """One provider's batch API behind the shared contract.

    A subclass declares its provider once, in :attr:`declaration`; :attr:`name`,
    :attr:`conn_type`, :attr:`limits` and :attr:`runs_in_pod` are read from it.

    :param settings: credentials and endpoint, built by a hook from an Airflow connection
    """

    #: The provider's facts (connection type, limits, retryable words, console page, planner model).
    declaration: ClassVar[ProviderDeclaration]
    name: ClassVar[str]
    conn_type: ClassVar[str]
    limits: ClassVar[Limits]
    #: The adapter's batches run in pods of the self-hosted lane (``declaration.lane == "pod"``).
    runs_in_pod: ClassVar[bool] = False
    #: The request kinds this adapter formats and submits; prepare refuses any other kind before
    #: anything is staged or paid, and :meth:`check_kind` refuses it again at formatting.
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat"})
    #: The key of a result line that holds the custom id (``custom_id``, ``key``, ``recordId``).
    result_id_field: ClassVar[str] = "custom_id"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("declaration")
        if isinstance(declared, ProviderDeclaration):
            cls.name = declared.name
            cls.conn_type = declared.conn_type
            cls.limits = declared.limits
            cls.runs_in_pod = declared.lane == "pod"

    def __init__(self, settings: AdapterSettings) -> None:
        self.settings = settings

    def probe(self) -> str:
        """Make one cheap authenticated read against the API and describe what answered.

        What a connection's "Test" button runs; it never creates, uploads or pays for anything.

        :raises NotImplementedError: the adapter has no probe
        :raises Exception: whatever the SDK raises when the API is unreachable or refuses the key
        """
        raise NotImplementedError(
            f"the {self.name!r} adapter has no probe; implement {type(self).__name__}.probe() with one "
            "read-only call (list one batch) to let the connection be tested."
        )

    @classmethod
    def kind_refusal(cls, kind: str, workload: str | None = None) -> str | None:
        """Why this adapter refuses requests of ``kind`` (naming the alternatives), or ``None``.

        :param kind: the request kind
        :param workload: the workload, named in the message
        """
        if kind in cls.kinds:
            return None
        others = providers_accepting(kind)
        where = f"workload {workload!r} asks" if workload else "the request asks"
        return (
            f"{where} for {kind!r} requests, but provider {cls.name!r} accepts only {sorted(cls.kinds)}. "
            + (
                f"Providers that accept {kind!r}: {', '.join(others)}; point the workload at one of their "
                "connections, or change the prompt's kind."
                if others
                else f"No installed provider accepts {kind!r}; change the prompt's kind."
            )
        )

    def check_kind(self, request: CanonicalRequest) -> None:
        """Refuse a request whose kind this adapter does not accept.

        :param request: the canonical request
        :raises ConfigurationError: the kind is not in :attr:`kinds`
        """
        refusal = self.kind_refusal(request.kind)
        if refusal is not None:
            from airflow_batch_provider.exceptions import ConfigurationError

            raise ConfigurationError(f"item {request.app_id!r}: {refusal}")

    @abstractmethod
    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        """Return one JSONL line (without the newline) in the provider's batch format.

        :param request: the canonical request
        :param custom_id: the line's custom id
        """

    @abstractmethod
    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        """Put a staged chunk where the provider reads it (upload, object store or inline).

        :param chunk: readable binary stream of the JSONL chunk
        :param name: a file name that includes the idempotency key, so a lost upload can be found
        :param size: the chunk's size in bytes
        """

    @abstractmethod
    def submit(
        self,
        input_ref: InputRef,
        key: str,
        metadata: Mapping[str, str],
        kind: RequestKind = "chat",
        *,
        created_after: datetime | None = None,
    ) -> BatchRef:
        """Create the job; never creates two batches inside one call (see :func:`create_once`).

        :param input_ref: where the input is
        :param key: the idempotency key
        :param metadata: small labels to attach (workload, run, chunk)
        :param kind: the request kind of every line (decides the endpoint)
        :param created_after: when the job's intent was recorded; :meth:`find` stops at batches
            older than this (``None``: the whole list is searched)
        :raises BatchInDoubtError: a create failed ambiguously and the batch's existence cannot be
            established now; nothing more may be created for ``key`` until
            :meth:`resolve_in_doubt` (or a person) settles it
        """

    @abstractmethod
    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        """Find a job created earlier with ``key`` (a submit whose reply was lost).

        Pages through the provider's whole list; where the provider lists newest first, it stops at
        the first batch created before ``created_after`` (minus ``find_clock_skew_s``, default 300).

        :param key: the idempotency key
        :param created_after: when the job's intent was recorded (``None``: search everything)
        """

    def resolve_in_doubt(
        self,
        key: str,
        created_after: datetime,
        request_count: int,
        *,
        custom_ids: Collection[str] | None = None,
    ) -> BatchRef | None:
        """Settle a job in doubt: return its batch, or ``None`` when it provably does not exist.

        The default is exact for providers that keep the key with the batch (metadata, display
        name, job name): it is :meth:`find`. Providers without such a key override it.

        :param key: the idempotency key
        :param created_after: when the create was attempted (from the job's intent)
        :param request_count: requests in the chunk
        :param custom_ids: the chunk's custom ids (the ledger's items of the job), where the
            provider shows custom ids only in results
        :raises BatchInDoubtError: it cannot be decided yet (e.g. a matching batch still runs)
        """
        del request_count, custom_ids
        return self.find(key, created_after=created_after)

    def create_policy(self) -> RetryPolicy:
        """The retry policy of create-like calls, from the connection extras.

        ``create_attempts`` (default 3), ``create_retry_initial_s`` (1.0) and
        ``create_retry_max_s`` (30.0); ``Retry-After`` is honoured up to 60 seconds.
        """
        extra = self.settings.extra
        initial = float(extra.get("create_retry_initial_s", 1.0))
        return RetryPolicy(
            max_attempts=max(1, int(extra.get("create_attempts", 3))),
            initial_delay=initial,
            max_delay=max(initial, float(extra.get("create_retry_max_s", 30.0))),
        )

    def scan_limit(self) -> int | None:
        """The most listed objects one look-up reads (extra ``find_scan_limit``; default: all)."""
        value = self.settings.extra.get("find_scan_limit")
        return int(value) if value is not None else None

    def find_not_before(self, created_after: datetime | None) -> float | None:
        """Epoch seconds before which a listed batch cannot be the job's (clock skew allowed).

        :param created_after: when the job's intent was recorded
        """
        if created_after is None:
            return None
        return created_after.timestamp() - float(self.settings.extra.get("find_clock_skew_s", 300))

    @abstractmethod
    def status(self, ref: BatchRef) -> BatchStatus:
        """Return the job's normalised status (blocking; for workers).

        :param ref: the job
        """

    @abstractmethod
    def async_client(self) -> AsyncStatusClient:
        """Return the async status client for the triggerer."""

    @abstractmethod
    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        """Stream the job's output or error file into ``sink``; return bytes written (0 if none).

        :param ref: the job
        :param kind: which file
        :param sink: writable binary stream
        """

    @abstractmethod
    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        """Parse a downloaded output or error file, streaming, into neutral results.

        A line that cannot be parsed yields a :class:`MalformedLine` (counted and logged by the
        caller, with its custom id when that is still readable); it never stops the stream, its
        item ends up ``missing``, hence retried, and the line is priced at an estimate as
        ``unreadable``. Whether the file is a result file at all is :meth:`result_file_problem`.

        :param lines: readable binary stream of JSONL
        """

    @classmethod
    def is_result_line(cls, line: Mapping[str, Any]) -> bool:
        """Say whether a parsed JSON object of a downloaded file is a result line (not a manifest).

        :param line: the parsed line
        """
        del line
        return True

    def result_file_problem(self, lines: IO[bytes]) -> str | None:
        """Say why a downloaded output or error file is not a result file of this provider, or ``None``.

        A valid result file is empty, or every non-blank line is meant as a JSON object (it starts
        with ``{``), and every line that parses is a result line carrying the custom id in
        :attr:`result_id_field` (or one :meth:`is_result_line` sets apart, such as Bedrock's
        manifest). A truncated line (it starts with ``{`` and does not parse) is a damaged line of a
        valid file, read as :class:`MalformedLine`. Anything else, such as an HTML page or an API
        error document served with HTTP 200 in place of the file, is not a result file: the caller
        fetches it again and never reads it as "every item missing".

        :param lines: readable binary stream of the downloaded file
        """
        return result_file_problem(lines, self.result_id_field, self.is_result_line)

    @abstractmethod
    def cancel(self, ref: BatchRef) -> None:
        """Ask the provider to cancel the job (completed work stays downloadable).

        :param ref: the job
        """

    def realtime_client(self) -> AsyncRealtimeClient:
        """Return the async real-time client used by the synchronous fallback.

        :raises ConfigurationError: the provider has no real-time path in this adapter
        """
        from airflow_batch_provider.exceptions import ConfigurationError

        raise ConfigurationError(
            f"the {self.name!r} adapter has no real-time API; choose the 'publish_pending' or 'skip' "
            "deadline policy for this workload."
        )

    def iter_results(self, ref: BatchRef) -> Iterator[ItemResult | MalformedLine]:
        """Stream every result of a job straight from the provider (output and error files).

        :param ref: the job
        """
        import tempfile

        for kind in ("output", "errors"):
            with tempfile.TemporaryFile() as buf:
                if self.download(ref, kind, buf):  # type: ignore[arg-type]
                    buf.seek(0)
                    yield from self.parse_results(buf)


@dataclass(frozen=True)
class CreateFailure:
    """How a failed create-like call is to be read.

    :param kind: ``refused``: the provider proved nothing was created (429 before acting), send
        again after ``retry_after``; ``ambiguous``: it may have acted (timeout, connection error,
        5xx), look before sending again
    :param retry_after: seconds the provider asked to wait
    """

    kind: Literal["refused", "ambiguous"]
    retry_after: float | None = None


class AmbiguousReply(Exception):
    """A create-like call was answered, but the answer is unreadable (a truncated or empty body).

    :func:`create_once` treats it as an ambiguous failure: the provider may have acted.
    """


def http_failure(
    status: int | None, headers: Mapping[str, str] | None = None, refused: Collection[int] = (429,)
) -> CreateFailure | None:
    """Read a failed create-like call from its HTTP status.

    No status (timeout, dropped connection), 408 and 5xx are ambiguous; ``refused`` statuses
    (429, and a provider's own "overloaded, not processed" status) prove nothing was created;
    anything else (400, 401, 403, 404, 409, 422 ...) is for the caller to raise.

    :param status: the HTTP status, ``None`` when no answer came
    :param headers: the answer's headers (``Retry-After``)
    :param refused: statuses that prove the call did nothing
    """
    if status is None:
        return CreateFailure("ambiguous")
    if status in refused:
        return CreateFailure("refused", parse_retry_after(headers or {}))
    if status >= 500 or status == 408:
        return CreateFailure("ambiguous")
    return None


def create_once(
    *,
    key: str,
    what: str,
    create: Callable[[], T],
    lookup: Callable[[], T | None] | None,
    classify: Callable[[Exception], CreateFailure | None],
    policy: RetryPolicy,
    created_after: datetime,
    request_count: int = 0,
    lookup_rounds: int = 2,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run a create-like call (file upload, batch create) so that it never creates twice.

    The SDK must not retry ``create`` itself. A failure that ``classify`` calls ``refused`` is
    retried after the provider's ``Retry-After`` or the policy's backoff; one it calls
    ``ambiguous`` is followed by ``lookup`` (the object by its idempotency key), up to
    ``lookup_rounds`` times with backoff, before anything is sent again; only when every look
    finds nothing is ``create`` sent again. Where the provider cannot be asked (``lookup`` is
    ``None``), an ambiguous failure raises :class:`BatchInDoubtError` at once. ``create`` raises
    :class:`AmbiguousReply` for an answer it cannot read (ambiguous too). Any other error
    (``classify`` returns ``None``: 400, 401, 403, 404, 422 ...) is raised unchanged.
    Every wait comes from :func:`~airflow_batch_provider.core.ratelimit.retry_delay`.

    :param key: the idempotency key (named in logs and errors)
    :param what: what is created, for logs (``batch create``, ``upload of <name>``)
    :param create: sends the create once
    :param lookup: finds what an earlier ``create`` of this key made, or ``None`` if nothing
    :param classify: reads a failure of ``create``
    :param policy: tries and backoff
    :param created_after: when the call began (carried by :class:`BatchInDoubtError`)
    :param request_count: requests in the chunk, for :class:`BatchInDoubtError` (0: unknown)
    :param lookup_rounds: looks after one ambiguous failure before sending again
    :param sleep: the wait (tests pass a no-op)
    :raises BatchInDoubtError: ambiguous and undecidable, or ambiguous on the last try
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return create()
        except Exception as exc:
            failure = CreateFailure("ambiguous") if isinstance(exc, AmbiguousReply) else classify(exc)
            if failure is None:
                raise
            last = f"{type(exc).__name__}: {str(exc)[:300]}"
            if failure.kind == "refused":
                delay = retry_delay(policy, attempt, "failed_retryable", failure.retry_after)
                if delay is None:
                    raise
                log.warning("%s for job %s refused (%s); sending again in %.1fs", what, key, last, delay)
                sleep(delay)
                continue
            if lookup is None:
                raise BatchInDoubtError(
                    key,
                    created_after,
                    request_count,
                    f"the {what} failed ambiguously ({last}) and this provider cannot be asked by key "
                    "whether it acted",
                ) from exc
            log.warning("%s for job %s failed ambiguously (%s); looking it up by its key", what, key, last)
            for look in range(1, lookup_rounds + 1):
                sleep(retry_delay(policy, look, "failed_retryable") or policy.initial_delay)
                try:
                    found = lookup()
                except Exception as lookup_exc:
                    raise BatchInDoubtError(
                        key,
                        created_after,
                        request_count,
                        f"the {what} failed ambiguously ({last}) and the look-up by key failed too "
                        f"({type(lookup_exc).__name__}: {str(lookup_exc)[:200]})",
                    ) from exc
                if found is not None:
                    log.warning("%s for job %s had acted; its result was found by key", what, key)
                    return found
            delay = retry_delay(policy, attempt, "failed_retryable")
            if delay is None:
                raise BatchInDoubtError(
                    key,
                    created_after,
                    request_count,
                    f"the {what} failed ambiguously on each of {attempt} tries (last: {last}); the look-up by "
                    "key found nothing, but the provider may still show it later",
                ) from exc
            log.warning(
                "%s for job %s: nothing found by key after %d looks; sending again", what, key, lookup_rounds
            )
            sleep(delay)


def result_file_problem(
    lines: IO[bytes], id_field: str, is_result_line: Callable[[Mapping[str, Any]], bool]
) -> str | None:
    """Say why a downloaded file is not a JSONL result file, or ``None`` (see :meth:`BatchAdapter.result_file_problem`).

    :param lines: readable binary stream of the downloaded file
    :param id_field: the key that holds the custom id
    :param is_result_line: tells result lines from lines that are not results (a manifest)
    """
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        excerpt = text[:80].decode("utf-8", "replace")
        if not text.startswith(b"{"):
            return f"line {number} is not a JSON object ({excerpt!r}): not a result file"
        try:
            line = json.loads(text)
        except ValueError:
            continue  # a damaged (truncated) line of a result file
        if not isinstance(line, Mapping):
            return f"line {number} is not a JSON object ({excerpt!r}): not a result file"
        if is_result_line(line) and not isinstance(line.get(id_field), str):
            return f"line {number} has no {id_field!r} ({excerpt!r}): not a result line of this provider"
    return None


def custom_id_of_damaged(text: bytes, id_field: str) -> str | None:
    """Read the custom id of a line that does not parse (a truncated line), when it is still whole.

    :param text: the raw line
    :param id_field: the key that holds the custom id
    """
    found = re.search(rb'"' + re.escape(id_field.encode()) + rb'"\s*:\s*"([^"\\]{1,200})"', text)
    return found.group(1).decode("utf-8", "replace") if found else None


def parse_jsonl_results(
    lines: IO[bytes],
    id_field: str,
    to_result: Callable[[str, Mapping[str, Any]], ItemResult],
    skip: Callable[[Mapping[str, Any]], bool] | None = None,
) -> Iterator[ItemResult | MalformedLine]:
    """Stream a provider's JSONL result file into results, one line at a time.

    A line that is not a JSON object, has no string id, or that ``to_result`` cannot read
    (``ValueError``, ``KeyError``, ``TypeError``, ``AttributeError``) becomes a
    :class:`MalformedLine` with its number, the reason, an excerpt and the id when it was readable.

    :param lines: readable binary stream of JSONL
    :param id_field: the key that holds the custom id (``custom_id``, ``key``, ``recordId``)
    :param to_result: turns one parsed line into a result
    :param skip: says which lines are not results (e.g. a manifest read through the same stream)
    """
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        custom_id: str | None = None
        try:
            line = json.loads(text)
            if not isinstance(line, Mapping):
                raise TypeError("line is not a JSON object")
            if skip is not None and skip(line):
                continue
            found = line[id_field]
            if not isinstance(found, str):
                raise TypeError(f"{id_field} is not a string")
            custom_id = found
            result = to_result(custom_id, line)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            excerpt = text[:200].decode("utf-8", "replace")
            if custom_id is None:
                custom_id = custom_id_of_damaged(text, id_field)
            yield MalformedLine(number, f"{type(exc).__name__}: {exc}", excerpt, custom_id)
            continue
        yield result
