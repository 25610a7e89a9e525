"""Fault injection, provider-neutral and deterministic.

Every decision is a pure function of the seed and a stable key, never of wall-clock time or a
random generator's state:

- per-item faults roll on ``(seed, custom_id)``, so the same item in a rerun of the same test
  fails the same way, while a resubmitted item (whose ``custom_id`` carries a new attempt
  number) rolls again;
- batch-level faults (expiry) roll on ``(seed, creation index)``;
- request-level faults (transient 5xx on retrieve, 429/500 on the synchronous endpoints) roll on
  ``(seed, request counter)``;
- create faults (on every create-like call: a file upload, a batch create) come first from the
  ``create_script`` (consumed in order, one entry per matching call), else roll on
  ``(seed, provider, operation, request counter)``. They model the failures that make a create
  ambiguous for the client: refused before acting (``429``, ``500``: nothing was created), or
  acted and the reply lost (``500_after``: the batch or file exists and the answer is a 500;
  ``drop_after``: it exists and the connection drops mid-answer; ``slow_after``: it exists and
  the answer comes after ``create_slow_s`` real seconds, longer than a client's timeout).

When faults apply: item and batch faults are taken from the configuration **at the moment a batch
is created** and kept with the batch, so a change through ``PUT /_emulator/config`` affects only
batches created after it. Request-level faults and the rate limiter read the configuration at the
moment of each request, so they apply at once.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Literal

ItemFault = Literal["none", "server_error", "rate_limited", "invalid_request", "context_length", "missing"]
CreateFault = Literal["none", "429", "500", "500_after", "drop_after", "slow_after"]
CreateOp = Literal["upload", "create"]

#: Create faults that answer before anything is created (the client may safely send again).
CREATE_FAULTS_BEFORE: Final[frozenset[str]] = frozenset({"429", "500"})
#: Create faults that act first and then lose the answer (the object exists).
CREATE_FAULTS_AFTER: Final[frozenset[str]] = frozenset({"500_after", "drop_after", "slow_after"})
_CREATE_OPS: Final = ("upload", "create", "*")

#: Item faults that end as an error line (and count as ``failed``).
FAILING_FAULTS: Final[frozenset[str]] = frozenset(
    {"server_error", "rate_limited", "invalid_request", "context_length"}
)

_RATE_FIELDS: Final = (
    "rate_500",
    "rate_429",
    "rate_400",
    "rate_context_length",
    "rate_missing",
    "rate_duplicate",
    "rate_malformed",
    "rate_duplicate_other",
    "rate_error_before_success",
    "expire_rate",
    "expire_after_fraction",
    "stuck_after_fraction",
    "retrieve_5xx_rate",
    "sync_429_rate",
    "sync_500_rate",
    "create_429_rate",
    "create_500_rate",
    "create_500_after_rate",
    "create_drop_after_rate",
    "create_slow_after_rate",
)
#: Limits that are a positive count or ``None`` (unlimited).
_LIMIT_FIELDS: Final = ("rpm_limit", "tpm_limit", "enqueued_token_limit")
#: create fault -> the rate field that rolls it (in this order; their sum must not exceed 1)
_CREATE_RATES: Final = (
    ("429", "create_429_rate"),
    ("500", "create_500_rate"),
    ("500_after", "create_500_after_rate"),
    ("drop_after", "create_drop_after_rate"),
    ("slow_after", "create_slow_after_rate"),
)


def roll(seed: int, *parts: object) -> float:
    """Return a deterministic number in ``[0, 1)`` for a seed and key parts.

    :param seed: the emulator seed
    :param parts: the key (e.g. a fault name and a ``custom_id``)
    """
    text = "\x1f".join([str(seed), *(str(p) for p in parts)])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class FaultConfig:
    """What goes wrong, and how often. All rates are probabilities in ``[0, 1]``.

    Per-item faults (exclusive, rolled once per ``custom_id``; their sum must not exceed 1):

    :param rate_500: item fails with HTTP 500 ``server_error`` (error file)
    :param rate_429: item fails with HTTP 429 ``rate_limit_exceeded`` (error file)
    :param rate_400: item fails with HTTP 400 ``invalid_request_error`` (error file)
    :param rate_context_length: item fails with HTTP 400 ``context_length_exceeded`` (error file)
    :param rate_missing: item is in neither file, though it counts as completed

    Per-item output damage (independent rolls, successful items only):

    :param rate_duplicate: the item's output line is written twice
    :param rate_malformed: the item's output line is truncated into invalid JSON
    :param rate_duplicate_other: the item's output line is followed by a second copy with another
        answer (other text, one more output token), which the provider bills again (the record's
        ``billed_again``); chat answers on OpenAI, Anthropic and Gemini (not Bedrock yet)
    :param rate_error_before_success: an error line (HTTP 500 ``server_error``) for the item comes
        before its success: in the error file (OpenAI, which keeps errors apart) or just before the
        success line in the one results file (Anthropic, Gemini; not Bedrock yet); it is not billed

    Batch faults:

    :param expire_batches: 0-based creation indices (since start or reset) of batches that expire
    :param expire_rate: chance that any other batch expires (rolled on its creation index)
    :param expire_after_fraction: share of the items an expiring batch finishes first; the rest
        get ``batch_expired`` lines in the error file
    :param fail_validation: the next this-many batches fail validation; counts down as they are
        created
    :param fail_token_limit: the next this-many OpenAI batches fail like an organisation over its
        enqueued-token limit (``failed``, ``errors.data[0].code`` ``token_limit_exceeded``); counts
        down as they are created
    :param stuck_batches: 0-based creation indices of batches that never leave ``in_progress`` (and
        finish no item) until cancelled
    :param stuck_after_fraction: share of a stuck batch's items that finish first, at the usual
        pace, before it stalls (0: none)
    :param unknown_result_lines: result lines with custom ids the caller never sent, added to each
        batch's results (a copy of a real line under a foreign id); sticky at creation
    :param html_downloads: the next this-many downloads of a result file answer an HTML page with
        HTTP 200 (a proxy's or a login page served in place of the file); counts down per download,
        and applies at once (OpenAI file content, Anthropic results, Gemini file download; not
        Bedrock, whose files are S3 objects)

    Create faults (every create-like call: file upload, batch create; see the module docstring):

    :param create_script: faults for the next create-like calls, consumed in order: each entry is
        ``"<op>:<fault>"`` with op ``upload``, ``create`` or ``*`` and fault ``429``, ``500``,
        ``500_after``, ``drop_after`` or ``slow_after``; a call takes the first entry whose op
        matches it
    :param create_429_rate: chance a create-like call is refused with 429 (and ``Retry-After``)
        before acting
    :param create_500_rate: chance it is refused with a 500 before acting
    :param create_500_after_rate: chance it acts and then answers a 500
    :param create_drop_after_rate: chance it acts and then drops the connection mid-answer
    :param create_slow_after_rate: chance it acts and answers only after ``create_slow_s``
    :param create_slow_s: real seconds a ``slow_after`` answer is held back
    :param create_retry_after_s: the ``Retry-After`` of a create 429, in real seconds

    Request faults (apply to each request at once):

    :param retrieve_5xx_rate: chance that a batch retrieve answers a transient HTTP 500
    :param sync_429_rate: chance that a synchronous request answers HTTP 429 with ``Retry-After``,
        ``retry-after-ms`` and ``x-ratelimit-remaining-requests: 0`` (the limit header only when
        ``rpm_limit`` is set)
    :param sync_500_rate: chance that a synchronous request answers HTTP 500
    :param sync_retry_after_s: the ``Retry-After`` of an injected 429, in real seconds
    :param rpm_limit: requests per rate window on the synchronous endpoints (``None``: unlimited)
    :param tpm_limit: tokens per rate window on the synchronous endpoints (``None``: unlimited)
    :param tpm_output: how a synchronous answer's output counts against ``tpm_limit``: ``ceiling``
        (OpenAI: the request's ``max_tokens`` at arrival, kept) or ``actual`` (Anthropic, Bedrock:
        corrected to the output the answer used)

    Provider limits (not faults; they apply at once):

    :param enqueued_token_limit: most input tokens an OpenAI organisation may have in batches that
        have not ended, per model (``None``: unlimited); a create over it fails the batch like
        OpenAI (``failed``, ``token_limit_exceeded``); the most ever enqueued is counted in
        ``openai.enqueued_tokens_peak``
    """

    rate_500: float = 0.0
    rate_429: float = 0.0
    rate_400: float = 0.0
    rate_context_length: float = 0.0
    rate_missing: float = 0.0
    rate_duplicate: float = 0.0
    rate_malformed: float = 0.0
    rate_duplicate_other: float = 0.0
    rate_error_before_success: float = 0.0
    expire_batches: tuple[int, ...] = ()
    expire_rate: float = 0.0
    expire_after_fraction: float = 0.5
    fail_validation: int = 0
    fail_token_limit: int = 0
    stuck_batches: tuple[int, ...] = ()
    stuck_after_fraction: float = 0.0
    unknown_result_lines: int = 0
    html_downloads: int = 0
    create_script: tuple[str, ...] = ()
    create_429_rate: float = 0.0
    create_500_rate: float = 0.0
    create_500_after_rate: float = 0.0
    create_drop_after_rate: float = 0.0
    create_slow_after_rate: float = 0.0
    create_slow_s: float = 3.0
    create_retry_after_s: float = 1.0
    retrieve_5xx_rate: float = 0.0
    sync_429_rate: float = 0.0
    sync_500_rate: float = 0.0
    sync_retry_after_s: float = 1.0
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    tpm_output: str = "ceiling"
    enqueued_token_limit: int | None = None

    def __post_init__(self) -> None:
        for name in _RATE_FIELDS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault {name}={value} is outside [0, 1]; give a probability.")
        exclusive = (
            self.rate_500 + self.rate_429 + self.rate_400 + self.rate_context_length + self.rate_missing
        )
        if exclusive > 1.0 + 1e-9:
            raise ValueError(
                f"rate_500 + rate_429 + rate_400 + rate_context_length + rate_missing = {exclusive:.3f} "
                "exceeds 1; each item gets at most one of these faults."
            )
        for name in ("fail_validation", "fail_token_limit", "unknown_result_lines", "html_downloads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more (a count of batches or lines).")
        create_sum = sum(getattr(self, rate) for _, rate in _CREATE_RATES)
        if create_sum > 1.0 + 1e-9:
            raise ValueError(
                f"the create_*_rate settings add up to {create_sum:.3f}; each create-like call gets at most "
                "one fault, so their sum must not exceed 1."
            )
        for entry in self.create_script:
            op, _, fault = entry.partition(":")
            if op not in _CREATE_OPS or fault not in CREATE_FAULTS_BEFORE | CREATE_FAULTS_AFTER:
                raise ValueError(
                    f"create_script entry {entry!r} is not '<op>:<fault>' with op in {list(_CREATE_OPS)} and "
                    f"fault in {sorted(CREATE_FAULTS_BEFORE | CREATE_FAULTS_AFTER)}."
                )
        if self.create_slow_s < 0 or self.create_retry_after_s < 0:
            raise ValueError("create_slow_s and create_retry_after_s must be 0 or more seconds.")
        if self.sync_retry_after_s < 0:
            raise ValueError("sync_retry_after_s must be 0 or more seconds.")
        for name in _LIMIT_FIELDS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: give a positive limit, or null for unlimited.")
        if self.tpm_output not in ("ceiling", "actual"):
            raise ValueError(f"tpm_output={self.tpm_output!r}: give 'ceiling' or 'actual'.")
        if any(i < 0 for i in (*self.expire_batches, *self.stuck_batches)):
            raise ValueError(
                "expire_batches and stuck_batches hold 0-based creation indices; negative values are invalid."
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> FaultConfig:
        """Build from a JSON object (missing keys keep their defaults).

        :param data: the fault settings
        :raises ValueError: unknown keys or invalid values
        """
        return cls().merged(data)

    def merged(self, patch: Mapping[str, Any]) -> FaultConfig:
        """Return a copy with some settings changed.

        :param patch: the settings to change
        :raises ValueError: unknown keys or invalid values
        """
        types = {f.name: f.type for f in fields(self)}
        unknown = sorted(set(patch) - set(types))
        if unknown:
            raise ValueError(f"unknown fault settings {unknown}; known settings are {sorted(types)}.")
        changes: dict[str, Any] = {}
        for name, value in patch.items():
            changes[name] = _coerce(name, value)
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("expire_batches", "stuck_batches", "create_script"):
            out[name] = list(getattr(self, name))
        return out

    def script_index(self, op: CreateOp) -> int | None:
        """Return the index of the first ``create_script`` entry that applies to ``op``, if any.

        :param op: ``upload`` or ``create``
        """
        for i, entry in enumerate(self.create_script):
            if entry.partition(":")[0] in (op, "*"):
                return i
        return None

    def decide_create(self, seed: int, provider: str, op: CreateOp, counter: int) -> CreateFault:
        """Roll the rate-driven fault of one create-like call (the script is handled by the caller).

        :param seed: the emulator seed
        :param provider: the router (``openai`` ...)
        :param op: ``upload`` or ``create``
        :param counter: 0-based number of the call among the provider's calls of this op
        """
        u = roll(seed, "create", provider, op, counter)
        edge = 0.0
        for fault, rate in _CREATE_RATES:
            edge += getattr(self, rate)
            if u < edge:
                return fault  # type: ignore[return-value]
        return "none"

    def batch_stuck(self, creation_index: int) -> bool:
        """Return True when the batch never leaves ``in_progress`` until cancelled.

        :param creation_index: 0-based index of the batch among those created since start or reset
        """
        return creation_index in self.stuck_batches

    def decide_item(self, seed: int, custom_id: str) -> ItemDecision:
        """Decide what happens to one item, from the seed and its ``custom_id`` only.

        :param seed: the emulator seed
        :param custom_id: the item's id in the batch
        """
        u = roll(seed, "item", custom_id)
        fault: ItemFault = "none"
        edge = 0.0
        for name, candidate in (
            ("rate_500", "server_error"),
            ("rate_429", "rate_limited"),
            ("rate_400", "invalid_request"),
            ("rate_context_length", "context_length"),
            ("rate_missing", "missing"),
        ):
            edge += getattr(self, name)
            if u < edge:
                fault = candidate  # type: ignore[assignment]
                break
        ok = fault == "none"
        return ItemDecision(
            fault=fault,
            duplicate=ok and roll(seed, "duplicate", custom_id) < self.rate_duplicate,
            malformed=ok and roll(seed, "malformed", custom_id) < self.rate_malformed,
            other_answer=ok and roll(seed, "other_answer", custom_id) < self.rate_duplicate_other,
            error_first=ok and roll(seed, "error_first", custom_id) < self.rate_error_before_success,
        )

    def batch_expires(self, seed: int, creation_index: int) -> bool:
        """Decide whether a batch expires before finishing.

        :param seed: the emulator seed
        :param creation_index: 0-based index of the batch among those created since start or reset
        """
        if creation_index in self.expire_batches:
            return True
        return roll(seed, "expire", creation_index) < self.expire_rate

    def request_fails(self, seed: int, kind: str, counter: int, rate: float) -> bool:
        """Decide whether one request gets an injected error.

        :param seed: the emulator seed
        :param kind: what the counter counts (``retrieve``, ``sync429`` ...)
        :param counter: 0-based number of the request among those of its kind
        :param rate: the probability
        """
        return rate > 0 and roll(seed, kind, counter) < rate


@dataclass(frozen=True)
class ItemDecision:
    """The fault decided for one item.

    :param fault: which error (``none`` for success)
    :param duplicate: write the output line twice
    :param malformed: write the output line as broken JSON
    :param other_answer: write a second copy of the output line with another answer, billed again
    :param error_first: write an error line for the item before its success
    """

    fault: ItemFault = "none"
    duplicate: bool = False
    malformed: bool = False
    other_answer: bool = False
    error_first: bool = False

    @property
    def failing(self) -> bool:
        """True when the item ends as an error line."""
        return self.fault in FAILING_FAULTS


def _coerce(name: str, value: Any) -> Any:
    if name in ("expire_batches", "stuck_batches"):
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list of 0-based batch creation indices.")
        return tuple(int(v) for v in value)
    if name == "create_script":
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise ValueError("create_script must be a list of '<op>:<fault>' entries.")
        return tuple(str(v) for v in value)
    if name == "tpm_output":
        return str(value)
    if name in _LIMIT_FIELDS:
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            return None
        return int(value)
    if name in ("fail_validation", "fail_token_limit", "unknown_result_lines", "html_downloads"):
        return int(value)
    if isinstance(value, bool):
        raise ValueError(f"fault {name} takes a number, not a boolean.")
    return float(value)


@dataclass(frozen=True)
class RateDecision:
    """The limiter's answer to one request.

    :param allowed: the request may proceed
    :param retry_after_s: when refused, seconds until it would be accepted
    :param limit_requests: the request limit (``None``: unlimited)
    :param remaining_requests: requests left in the window
    :param reset_requests_s: seconds until a request slot frees
    :param limit_tokens: the token limit (``None``: unlimited)
    :param remaining_tokens: tokens left in the window
    :param reset_tokens_s: seconds until the oldest tokens leave the window
    """

    allowed: bool
    retry_after_s: float = 0.0
    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float = 0.0
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float = 0.0


class SlidingWindowLimiter:
    """Requests-per-window and tokens-per-window limiter with an injected clock value.

    Not thread-safe by itself: callers hold the emulator lock.
    """

    def __init__(self) -> None:
        self._events: deque[tuple[float, int]] = deque()

    def reset(self) -> None:
        """Forget every recorded request."""
        self._events.clear()

    def recharge(self, at: float, tokens: int, charged: int) -> None:
        """Correct the tokens of the request admitted at ``at`` for ``tokens`` (``tpm_output: actual``).

        :param at: when it was admitted
        :param tokens: what it was charged then
        :param charged: what it is charged now
        """
        for i, event in enumerate(self._events):
            if event == (at, tokens):
                self._events[i] = (at, charged)
                return

    def check(
        self, now: float, tokens: int, rpm_limit: int | None, tpm_limit: int | None, window_s: float
    ) -> RateDecision:
        """Admit or refuse one request, recording it when admitted.

        :param now: the current time in seconds
        :param tokens: tokens the request is charged
        :param rpm_limit: most requests per window (``None``: unlimited)
        :param tpm_limit: most tokens per window (``None``: unlimited)
        :param window_s: window length in seconds
        """
        while self._events and self._events[0][0] <= now - window_s:
            self._events.popleft()
        used_requests = len(self._events)
        used_tokens = sum(t for _, t in self._events)
        oldest = self._events[0][0] if self._events else now
        reset_s = max(0.0, oldest + window_s - now)
        refuse_requests = rpm_limit is not None and used_requests + 1 > rpm_limit
        refuse_tokens = tpm_limit is not None and used_tokens + tokens > tpm_limit and used_tokens > 0
        if refuse_requests or refuse_tokens:
            wait = self._wait_for(now, window_s, rpm_limit, tpm_limit, tokens)
            return RateDecision(
                allowed=False,
                retry_after_s=wait,
                limit_requests=rpm_limit,
                remaining_requests=max(0, (rpm_limit or 0) - used_requests) if rpm_limit else None,
                reset_requests_s=reset_s,
                limit_tokens=tpm_limit,
                remaining_tokens=max(0, (tpm_limit or 0) - used_tokens) if tpm_limit else None,
                reset_tokens_s=reset_s,
            )
        self._events.append((now, tokens))
        return RateDecision(
            allowed=True,
            limit_requests=rpm_limit,
            remaining_requests=rpm_limit - used_requests - 1 if rpm_limit else None,
            reset_requests_s=reset_s if self._events[0][0] != now else window_s,
            limit_tokens=tpm_limit,
            remaining_tokens=max(0, tpm_limit - used_tokens - tokens) if tpm_limit else None,
            reset_tokens_s=reset_s if self._events[0][0] != now else window_s,
        )

    def _wait_for(
        self, now: float, window_s: float, rpm_limit: int | None, tpm_limit: int | None, tokens: int
    ) -> float:
        """Seconds until enough old requests leave the window for this one to fit."""
        requests = len(self._events)
        used = sum(t for _, t in self._events)
        for at, spent in self._events:
            requests -= 1
            used -= spent
            fits_r = rpm_limit is None or requests + 1 <= rpm_limit
            fits_t = tpm_limit is None or used + tokens <= tpm_limit or used == 0
            if fits_r and fits_t:
                return max(0.0, at + window_s - now)
        return window_s


def foreign_lines(lines: Sequence[bytes], id_field: str, count: int, salt: str) -> list[bytes]:
    """Return ``count`` copies of a result line under custom ids nobody sent (``unknown_result_lines``).

    The ids are ``unknown-<hex>``, deterministic in ``salt`` (the job id) and the copy's number.

    :param lines: the job's rendered result lines
    :param id_field: the key that holds the custom id (``custom_id``, ``key``, ``recordId``)
    :param count: how many
    :param salt: the job id
    """
    if count <= 0:
        return []
    for raw in lines:
        try:
            template = json.loads(raw)
        except ValueError:
            continue
        if isinstance(template, dict) and id_field in template:
            break
    else:
        return []
    out = []
    for n in range(count):
        digest = hashlib.blake2b(f"{salt}:{n}".encode(), digest_size=6).hexdigest()
        out.append(
            json.dumps({**template, id_field: f"unknown-{digest}"}, separators=(",", ":")).encode() + b"\n"
        )
    return out


#: The page a proxy or a login wall serves with HTTP 200 in place of a result file (``html_downloads``).
HTML_PAGE: Final = (
    b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n"
    b"<body><p>Your session has expired. Please sign in again.</p></body></html>\n"
)


def retry_after_header(seconds: float) -> str:
    """Format seconds as an HTTP ``Retry-After`` value (whole seconds, at least 1).

    :param seconds: the wait
    """
    return str(max(1, math.ceil(seconds)))
