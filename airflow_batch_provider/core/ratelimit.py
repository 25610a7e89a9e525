"""Client-side rate limiting and the retry policy of the synchronous fallback. Pure: no Airflow, no SDK.

:class:`RateLimiter` holds requests per window (RPM) AND tokens per window (TPM) for every
worker of one event loop:

- before a call, a worker reserves one request and the call's ESTIMATED tokens
  (:func:`~airflow_batch_provider.core.tokens.estimate_request_tokens`: input plus the output
  ceiling, which is what providers count against TPM when the request arrives);
- after the call, :meth:`RateLimiter.settle` replaces the estimate with the tokens actually
  charged and stamps the reservation with the completion time (the provider saw the request
  somewhere between send and answer; the later stamp errs on the safe side);
- a ``Retry-After`` (429/503) or an ``x-ratelimit-remaining-*: 0`` header pauses EVERY worker
  until the reset, not only the one that got it; an ``x-ratelimit-limit-*`` header lower than
  the configured limit lowers the limit.

The window is a sliding log of reservations, as the providers (and the emulator) count. The clock
is injected (:class:`Clock`), so unit tests run in virtual time and are deterministic.

Shared by every task of a connection: given a :class:`RateStore` (the ledger's
:class:`~airflow_batch_provider.ledger.quota.SharedRateStore`), the log lives in the store instead
of this process, and every process that uses the same store key counts against the same window
(reserve, commit and release are atomic there). The decision is the same pure function either way
(:func:`window_wait`); the store's calls run in a thread, off the event loop, and the clock must
then be one every process shares (:class:`WallClock`).

What a reply is charged (:func:`charged_tokens`) depends on how the provider counts output
against TPM: ``ceiling`` (OpenAI: the request's ``max_tokens`` when it arrives, never given back)
or ``actual`` (Anthropic, Bedrock: the ceiling at arrival, then corrected to the output the reply
used). With ``actual``, the reservation made for the worst case is given back down to what the
reply used (or raised, if it used more than the estimate).

:func:`retry_delay` is the one retry rule (openai-python's): only retryable outcomes, exponential
backoff from ``initial_delay`` with up to 25 % jitter, capped at ``max_delay``; a ``Retry-After``
from the provider wins over the backoff; at most ``max_attempts`` tries.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal, Protocol

RETRYABLE_OUTCOMES: Final[frozenset[str]] = frozenset({"failed_retryable"})
#: HTTP statuses that mean "not processed now, send it again later", for every provider (529 is
#: Anthropic's "overloaded").
RETRYABLE_STATUS: Final[frozenset[int]] = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
#: What this package's own clients report for a call that got no answer: retryable for every
#: provider. The providers' own words (``overloaded_error``, ``RESOURCE_EXHAUSTED`` ...) are declared
#: by their adapters and passed in (``words``); core knows no provider.
TRANSPORT_ERRORS: Final[frozenset[str]] = frozenset({"connection_error", "timeout"})
#: How a provider counts a reply's output tokens against its TPM limit (see the module docstring).
OutputCharge = Literal["ceiling", "actual"]
OUTPUT_CHARGES: Final[tuple[OutputCharge, ...]] = ("ceiling", "actual")
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Clock(Protocol):
    """What the limiter needs of time."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``.

        :param seconds: how long
        """


class MonotonicClock:
    """The real clock: :func:`time.monotonic` and :func:`asyncio.sleep`."""

    def now(self) -> float:
        """Seconds on the monotonic clock."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the event loop.

        :param seconds: how long
        """
        await asyncio.sleep(max(0.0, seconds))


class WallClock(MonotonicClock):
    """Epoch seconds (:func:`time.time`): the clock of a window shared between processes."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()


class VirtualClock:
    """A clock for tests: sleeping moves time forward instantly.

    Concurrent sleepers each move time to their own wake-up time, so a worker may wake later in
    virtual time than it asked; the limiter re-checks after every sleep, so this can only make it
    more conservative, never let a request through early.

    :param start: the initial time
    """

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.slept: list[float] = []

    def now(self) -> float:
        """The virtual time."""
        return self.t

    async def sleep(self, seconds: float) -> None:
        """Advance virtual time by ``seconds`` and yield to other tasks.

        :param seconds: how long
        """
        self.slept.append(seconds)
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move time forward.

        :param seconds: how long
        """
        self.t += seconds


@dataclass(frozen=True)
class RateLimits:
    """Limits per window.

    :param rpm: requests per window (``None``: unlimited)
    :param tpm: tokens per window (``None``: unlimited)
    :param window_s: the window, 60 seconds for per-minute limits
    :param headroom: share of each limit actually used (0.9 keeps 10 % spare for other clients,
        such as the real-time application on the same key)
    :param output_charge: how the provider counts a reply's output against TPM (``ceiling`` or
        ``actual``, see :func:`charged_tokens`)
    """

    rpm: int | None = None
    tpm: int | None = None
    window_s: float = 60.0
    headroom: float = 1.0
    output_charge: OutputCharge = "ceiling"

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: give a positive limit, or None for unlimited.")
        if self.window_s <= 0:
            raise ValueError(f"window_s={self.window_s}: give a positive window in seconds.")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom={self.headroom}: give a share in (0, 1].")
        if self.output_charge not in OUTPUT_CHARGES:
            raise ValueError(
                f"output_charge={self.output_charge!r}: give one of {list(OUTPUT_CHARGES)} (how the provider "
                "counts a reply's output tokens against its TPM limit)."
            )

    @property
    def effective_rpm(self) -> int | None:
        """Requests per window after headroom."""
        return None if self.rpm is None else max(1, int(self.rpm * self.headroom))

    @property
    def effective_tpm(self) -> int | None:
        """Tokens per window after headroom."""
        return None if self.tpm is None else max(1, int(self.tpm * self.headroom))


def charged_tokens(prompt: int, output: int, max_output: int, output_charge: OutputCharge) -> int:
    """Tokens a provider counts against TPM for one answered request.

    :param prompt: prompt tokens the reply reports (cached and cache writes included)
    :param output: output tokens the reply reports
    :param max_output: the request's output ceiling
    :param output_charge: ``ceiling``: the provider counted ``max_output`` when the request arrived
        and keeps it (more if the reply used more); ``actual``: it corrected that to ``output``
    """
    return max(0, prompt) + (max(output, max_output) if output_charge == "ceiling" else max(0, output))


def window_wait(
    log: Sequence[tuple[float, int]],
    tokens: int,
    now: float,
    rpm: int | None,
    tpm: int | None,
    window_s: float,
    paused_until: float = 0.0,
) -> float:
    """Seconds until one request of ``tokens`` fits a sliding window, and no pause holds (0: now).

    The one admission rule, for the limiter of one process and for a store shared by many.

    :param log: ``(at, tokens)`` of every reservation still in the window (older ones are ignored;
        one whose answer has not come counts from ``now``)
    :param tokens: the request's token estimate
    :param now: the current time
    :param rpm: most requests per window (``None``: unlimited)
    :param tpm: most tokens per window (``None``: unlimited); a request larger than the whole
        limit is let through alone in an empty window
    :param window_s: the window
    :param paused_until: no request before this time (a provider's Retry-After)
    """
    pause = max(0.0, paused_until - now)
    live = sorted((at, n) for at, n in log if at > now - window_s)
    used_r = len(live)
    used_t = sum(n for _, n in live)
    if window_fits(used_r, used_t, tokens, rpm, tpm):
        return pause
    for at, n in live:
        used_r -= 1
        used_t -= n
        if window_fits(used_r, used_t, tokens, rpm, tpm):
            return max(pause, at + window_s - now)
    return max(pause, window_s)


def window_fits(requests: int, used: int, tokens: int, rpm: int | None, tpm: int | None) -> bool:
    """Whether one more request of ``tokens`` fits a window holding ``requests`` and ``used`` tokens.

    A request larger than the whole TPM fits an empty window (alone), or it could never be sent.

    :param requests: requests in the window
    :param used: tokens in the window
    :param tokens: the request's token estimate
    :param rpm: most requests per window (``None``: unlimited)
    :param tpm: most tokens per window (``None``: unlimited)
    """
    ok_r = rpm is None or requests + 1 <= rpm
    return ok_r and (tpm is None or used + tokens <= tpm or used == 0)


class RateStore(Protocol):
    """A window shared by many processes (the ledger's); every call is atomic in the store."""

    def reserve(
        self,
        tokens: int,
        now: float,
        rpm: int | None,
        tpm: int | None,
        window_s: float,
        paused_until: float = 0.0,
    ) -> tuple[int | None, float]:
        """Reserve one request of ``tokens`` now if it fits (:func:`window_wait`).

        :param tokens: the request's token estimate
        :param now: the current time (epoch seconds)
        :param rpm: most requests per window
        :param tpm: most tokens per window
        :param window_s: the window
        :param paused_until: a pause this process was told of, shared from now on
        :return: ``(reservation id, 0)``, or ``(None, seconds to wait)``
        """

    def commit(self, reservation_id: int, tokens: int, at: float) -> None:
        """Replace a reservation's estimate with its charge, counted from ``at``.

        :param reservation_id: what :meth:`reserve` returned
        :param tokens: the tokens charged
        :param at: when the charge counts from
        """

    def release(self, reservation_id: int) -> None:
        """Give a reservation back whole (the request was never sent).

        :param reservation_id: what :meth:`reserve` returned
        """


@dataclass
class Reservation:
    """One admitted request in the window.

    :param at: when it counts from
    :param tokens: tokens it is charged
    :param store_id: its id in the shared store (``None``: held by this process)
    :param settled: its answer came (until then it counts as if sent now: the provider counts it
        from its arrival, which may be later than ``at``, however late the answer comes)
    """

    at: float
    tokens: int
    store_id: int | None = None
    settled: bool = False


@dataclass
class LimiterStats:
    """What the limiter did.

    :param admitted: requests admitted
    :param waited_s: total time workers spent waiting for the window
    :param pauses: pauses ordered by the provider (Retry-After, remaining 0)
    :param paused_s: longest single provider-ordered pause
    """

    admitted: int = 0
    waited_s: float = 0.0
    pauses: int = 0
    paused_s: float = 0.0
    limits_lowered: list[str] = field(default_factory=list)


class RateLimiter:
    """RPM + TPM limiter shared by the workers of one event loop (see the module docstring).

    :param limits: the limits
    :param clock: the clock (default: the real one; :class:`WallClock` with a ``store``)
    :param store: a window shared with other processes (default: this process's own)
    """

    def __init__(
        self, limits: RateLimits, clock: Clock | None = None, store: RateStore | None = None
    ) -> None:
        self.limits = limits
        self.store = store
        self.clock: Clock = clock or (WallClock() if store is not None else MonotonicClock())
        self._rpm = limits.effective_rpm
        self._tpm = limits.effective_tpm
        self._log: deque[Reservation] = deque()
        self._paused_until = 0.0
        self._lock = asyncio.Lock()
        self.stats = LimiterStats()

    # -- pure part ---------------------------------------------------------------------------
    def _evict(self, now: float) -> None:
        window = self.limits.window_s
        # Reservations may be re-stamped later than newer ones; evict every expired one.
        if self._log and any(r.settled and r.at <= now - window for r in self._log):
            self._log = deque(r for r in self._log if not r.settled or r.at > now - window)

    def wait_time(self, tokens: int, now: float) -> float:
        """Seconds until a request of ``tokens`` fits this process's window and no pause holds (0: now).

        :param tokens: the request's token estimate
        :param now: the current time
        """
        self._evict(now)
        return window_wait(
            [(r.at if r.settled else max(r.at, now), r.tokens) for r in self._log],
            tokens,
            now,
            self._rpm,
            self._tpm,
            self.limits.window_s,
            self._paused_until,
        )

    def try_reserve(self, tokens: int, now: float) -> Reservation | None:
        """Reserve a slot now if one is free (no waiting; this process's window only).

        :param tokens: the request's token estimate
        :param now: the current time
        """
        if self.wait_time(tokens, now) > 0:
            return None
        res = Reservation(now, max(0, tokens))
        self._log.append(res)
        self.stats.admitted += 1
        return res

    # -- async part --------------------------------------------------------------------------
    async def acquire(self, tokens: int) -> Reservation:
        """Wait until a request of ``tokens`` may go, then reserve it.

        :param tokens: the request's token estimate
        """
        while True:
            if self.store is not None:
                now = self.clock.now()
                store_id, wait = await asyncio.to_thread(
                    self.store.reserve,
                    max(0, tokens),
                    now,
                    self._rpm,
                    self._tpm,
                    self.limits.window_s,
                    self._paused_until,
                )
                if store_id is not None:
                    self.stats.admitted += 1
                    return Reservation(now, max(0, tokens), store_id)
            else:
                async with self._lock:
                    now = self.clock.now()
                    res = self.try_reserve(tokens, now)
                    if res is not None:
                        return res
                    wait = self.wait_time(tokens, now)
            self.stats.waited_s += wait
            await self.clock.sleep(wait)

    def settle(self, reservation: Reservation, tokens: int | None = None) -> None:
        """Correct a reservation of this process's window once the call answered (no store).

        :param reservation: what :meth:`acquire` returned
        :param tokens: tokens actually charged (``None``: keep the estimate)
        """
        reservation.at = max(reservation.at, self.clock.now())
        reservation.settled = True
        if tokens is not None:
            reservation.tokens = max(0, tokens)

    async def commit(self, reservation: Reservation, tokens: int | None = None) -> None:
        """Charge a reservation what the answer cost, counted from now; give back the rest.

        The estimate reserved before the call is replaced by ``tokens``: less gives the difference
        back to every worker (in every process, with a store), more takes it. Counting from the
        answer errs on the safe side (the provider saw the request somewhere before it).

        :param reservation: what :meth:`acquire` returned
        :param tokens: tokens actually charged (``None``: keep the estimate)
        """
        self.settle(reservation, tokens)
        if self.store is not None and reservation.store_id is not None:
            await asyncio.to_thread(
                self.store.commit, reservation.store_id, reservation.tokens, reservation.at
            )

    async def release(self, reservation: Reservation) -> None:
        """Give a reservation back whole: its request was never sent.

        :param reservation: what :meth:`acquire` returned
        """
        if self.store is not None and reservation.store_id is not None:
            await asyncio.to_thread(self.store.release, reservation.store_id)
        elif reservation in self._log:
            self._log.remove(reservation)

    def pause(self, seconds: float) -> None:
        """Hold every worker for ``seconds`` from now (Retry-After, a reset).

        With a store, every process from this one's next reservation on.

        :param seconds: how long
        """
        if seconds <= 0:
            return
        until = self.clock.now() + seconds
        if until > self._paused_until:
            self._paused_until = until
            self.stats.pauses += 1
            self.stats.paused_s = max(self.stats.paused_s, seconds)

    def observe(self, headers: Mapping[str, str], retry_after: float | None = None) -> None:
        """Apply what the provider said about its limits.

        :param headers: response headers (any case), ``x-ratelimit-*`` read
        :param retry_after: seconds the provider asked to wait, if already read; else read from
            ``headers`` by :func:`parse_retry_after`
        """
        h = {k.lower(): v for k, v in headers.items()}
        if retry_after is None:
            retry_after = parse_retry_after(h)
        if retry_after is not None:
            self.pause(retry_after)
        for kind, attr in (("requests", "_rpm"), ("tokens", "_tpm")):
            limit = _int(h.get(f"x-ratelimit-limit-{kind}"))
            if limit is not None:
                # the key's whole limit: the headroom is still left to the key's other clients
                limit = max(1, int(limit * self.limits.headroom))
            current = getattr(self, attr)
            if limit is not None and (current is None or limit < current):
                setattr(self, attr, limit)
                self.stats.limits_lowered.append(f"{kind}={limit}")
            if _int(h.get(f"x-ratelimit-remaining-{kind}")) == 0:
                reset = parse_duration(h.get(f"x-ratelimit-reset-{kind}"))
                if reset:
                    self.pause(reset)

    @property
    def in_window(self) -> tuple[int, int]:
        """(requests, tokens) in this process's current window."""
        self._evict(self.clock.now())
        return len(self._log), sum(r.tokens for r in self._log)


def is_retryable(
    status: int | None = None, code: str | None = None, words: frozenset[str] = TRANSPORT_ERRORS
) -> bool:
    """Whether a failed call is worth sending again: the one rule for every adapter and the limiter.

    :param status: the HTTP status, when known
    :param code: the provider's error type or code (``overloaded_error``, ``RESOURCE_EXHAUSTED``,
        ``ThrottlingException`` ...), when known
    :param words: the error words that mean "send it again later" (the adapters pass the registry's
        :func:`~airflow_batch_provider.adapters.registry.retryable_errors`; default: the transport's)
    """
    return (code is not None and code in words) or (status is not None and status in RETRYABLE_STATUS)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def parse_duration(value: str | None) -> float | None:
    """Read an ``x-ratelimit-reset-*`` value (``"1.5s"``, ``"6m0s"``, ``"120ms"``, ``"2"``).

    :param value: the header value
    """
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def parse_retry_after(headers: Mapping[str, Any] | None, now_epoch: float | None = None) -> float | None:
    """Read the wait a provider asked for: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date).

    The one place this package reads it; every adapter and the limiter call it.

    :param headers: response headers (any case; any mapping, an SDK's headers object included)
    :param now_epoch: the current epoch seconds, for an HTTP-date value (default: now)
    """
    if not headers:
        return None
    h = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = h.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    raw = h.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_epoch is None else now_epoch))


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry one synchronous request.

    :param max_attempts: tries in all, the first included
    :param initial_delay: seconds before the first retry
    :param max_delay: cap on the backoff (not on a provider's Retry-After)
    :param jitter: the backoff is multiplied by ``1 - jitter x U[0, 1)``
    :param max_retry_after: a Retry-After above this is cut to it (a provider asking for an hour
        should not hold a deadline run for an hour)
    """

    max_attempts: int = 5
    initial_delay: float = 0.5
    max_delay: float = 8.0
    jitter: float = 0.25
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts}: give 1 or more.")
        if self.initial_delay < 0 or self.max_delay < self.initial_delay:
            raise ValueError(
                f"initial_delay={self.initial_delay}, max_delay={self.max_delay}: need 0 <= initial <= max."
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter={self.jitter}: give a share in [0, 1].")


def retry_delay(
    policy: RetryPolicy,
    attempt: int,
    outcome: str,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Return seconds to wait before the next try, or ``None`` when there is none.

    :param policy: the retry policy
    :param attempt: tries made so far (1 after the first)
    :param outcome: the last try's outcome; only ``failed_retryable`` is retried
    :param retry_after: the provider's Retry-After in seconds, which wins when given
    :param rng: random source for the jitter (seed it for deterministic tests)
    """
    if outcome not in RETRYABLE_OUTCOMES or attempt >= policy.max_attempts:
        return None
    if retry_after is not None:
        return min(max(0.0, retry_after), policy.max_retry_after)
    backoff: float = min(policy.initial_delay * 2.0 ** (attempt - 1), policy.max_delay)
    u = rng.random() if rng is not None else random.random()
    return backoff * (1 - policy.jitter * u)
