"""The adapter contract. This module never imports a provider SDK.

An adapter turns canonical requests into a provider's batch format and drives that provider's
batch lifecycle. Airflow never appears here: hooks build :class:`AdapterSettings` from a
connection and hand it to the adapter.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, Final, Literal, get_args

from airflow_batch_provider.core.requests import CanonicalRequest, RequestKind
from airflow_batch_provider.core.results import ItemResult, MalformedLine

BatchState = Literal[
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"
]
BATCH_STATES: Final[tuple[str, ...]] = get_args(BatchState)
TERMINAL_BATCH_STATES: Final[frozenset[str]] = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class Limits:
    """What one provider job accepts.

    :param max_requests: most request lines in one job
    :param max_bytes: most bytes in one input file (or request body)
    :param custom_id_pattern: the regular expression a custom id must match
    :param min_requests: fewest request lines a job accepts (Bedrock has a floor)
    :param headroom: fraction of ``max_bytes`` actually filled, to leave room for envelopes
    """

    max_requests: int
    max_bytes: int
    custom_id_pattern: str = r"^[A-Za-z0-9_-]{1,64}$"
    min_requests: int = 1
    headroom: float = 0.95

    @property
    def usable_bytes(self) -> int:
        """Bytes the chunker fills at most."""
        return int(self.max_bytes * self.headroom)


@dataclass(frozen=True)
class AdapterSettings:
    """What an adapter needs from a connection; built by a hook, never logged.

    :param api_key: secret key or token (``None`` where the SDK finds its own credentials)
    :param base_url: API base URL override (emulator, Azure, compatible servers)
    :param extra: connection extras (organization, project, api_version, region, bucket ...)
    """

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


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


@dataclass(frozen=True)
class BatchStatus:
    """A provider's batch state, normalised.

    :param state: one of :data:`BATCH_STATES`
    :param total: requests in the job (0 while unknown)
    :param completed: requests that succeeded so far
    :param failed: requests that failed so far
    :param reason: provider's words on why it failed or expired, if any
    :param raw_state: the provider's own state string, for logs
    """

    state: BatchState
    total: int = 0
    completed: int = 0
    failed: int = 0
    reason: str | None = None
    raw_state: str | None = None

    @property
    def terminal(self) -> bool:
        """True when the provider will do nothing more with the job."""
        return self.state in TERMINAL_BATCH_STATES

    def to_dict(self) -> dict[str, Any]:
        """Return an XCom- and trigger-event-safe dict."""
        return {
            "state": self.state,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "reason": self.reason,
            "raw_state": self.raw_state,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchStatus:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(
            state=data["state"],
            total=int(data.get("total") or 0),
            completed=int(data.get("completed") or 0),
            failed=int(data.get("failed") or 0),
            reason=data.get("reason"),
            raw_state=data.get("raw_state"),
        )


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

    :param settings: credentials and endpoint, built by a hook from an Airflow connection
    """

    name: ClassVar[str]
    conn_type: ClassVar[str]
    limits: ClassVar[Limits]

    def __init__(self, settings: AdapterSettings) -> None:
        self.settings = settings

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
        self, input_ref: InputRef, key: str, metadata: Mapping[str, str], kind: RequestKind = "chat"
    ) -> BatchRef:
        """Create the job; idempotent on ``key`` as far as the provider allows.

        :param input_ref: where the input is
        :param key: the idempotency key
        :param metadata: small labels to attach (workload, run, chunk)
        :param kind: the request kind of every line (decides the endpoint)
        """

    @abstractmethod
    def find(self, key: str) -> BatchRef | None:
        """Find a job created earlier with ``key`` (a submit whose reply was lost).

        :param key: the idempotency key
        """

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
        caller); it never stops the stream, and its item ends up ``missing``, hence retried.

        :param lines: readable binary stream of JSONL
        """

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
            yield MalformedLine(number, f"{type(exc).__name__}: {exc}", excerpt, custom_id)
            continue
        yield result
