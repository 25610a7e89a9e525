"""The fallback's RPM + TPM limiter and retry rule, in virtual time."""

from __future__ import annotations

import asyncio
import random

import pytest

from airflow_batch_provider.core.ratelimit import (
    RateLimiter,
    RateLimits,
    RetryPolicy,
    VirtualClock,
    charged_tokens,
    parse_duration,
    parse_retry_after,
    retry_delay,
)


def _max_in_any_window(stamps: list[tuple[float, int]], window: float) -> tuple[int, int]:
    """Most requests and most tokens admitted within any window starting at an admission."""
    most_r = most_t = 0
    for start, _ in stamps:
        inside = [(t, n) for t, n in stamps if start <= t < start + window]
        most_r = max(most_r, len(inside))
        most_t = max(most_t, sum(n for _, n in inside))
    return most_r, most_t


async def _run(
    limiter: RateLimiter, clock: VirtualClock, sizes: list[int], workers: int
) -> list[tuple[float, int]]:
    stamps: list[tuple[float, int]] = []
    queue = list(sizes)

    async def worker() -> None:
        while queue:
            tokens = queue.pop(0)
            res = await limiter.acquire(tokens)
            stamps.append((clock.now(), tokens))
            limiter.settle(res)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return stamps


async def test_the_limiter_holds_the_requests_per_minute() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(rpm=10), clock)
    stamps = await _run(limiter, clock, [1] * 35, workers=8)
    assert len(stamps) == 35
    assert _max_in_any_window(stamps, 60.0)[0] == 10
    # 35 requests at 10 a minute need three full windows of waiting, not more.
    assert 180.0 <= clock.now() < 181.0


async def test_the_limiter_holds_the_tokens_per_minute() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(rpm=1000, tpm=1000), clock)
    stamps = await _run(limiter, clock, [300] * 10, workers=4)
    _, most_tokens = _max_in_any_window(stamps, 60.0)
    assert most_tokens <= 1000
    assert most_tokens == 900  # three 300-token requests fit, a fourth does not


async def test_actual_usage_corrects_the_estimate() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(tpm=1000), clock)
    first = await limiter.acquire(900)
    assert limiter.wait_time(500, clock.now()) == pytest.approx(60.0)
    limiter.settle(first, tokens=200)  # the answer used far fewer tokens than estimated
    assert limiter.wait_time(500, clock.now()) == 0.0
    assert limiter.in_window == (1, 200)


async def test_a_retry_after_pauses_every_worker_until_it_passes() -> None:
    clock = VirtualClock(100.0)
    limiter = RateLimiter(RateLimits(rpm=100), clock)
    limiter.observe({"Retry-After": "7"}, retry_after=7.0)
    stamps = await _run(limiter, clock, [1] * 3, workers=3)
    assert all(t >= 107.0 for t, _ in stamps)
    assert limiter.stats.pauses == 1


async def test_a_remaining_count_of_zero_pauses_until_the_reset() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(rpm=100, tpm=10_000), clock)
    limiter.observe({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m2.5s"})
    assert limiter.wait_time(1, clock.now()) == pytest.approx(62.5)
    limiter.observe({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "120ms"})
    assert limiter.wait_time(1, clock.now()) == pytest.approx(62.5)  # the longer pause holds


async def test_a_provider_limit_below_the_configured_one_lowers_it() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(rpm=100), clock)
    limiter.observe({"x-ratelimit-limit-requests": "2", "x-ratelimit-limit-tokens": "5000"})
    await limiter.acquire(1)
    await limiter.acquire(1)
    assert limiter.wait_time(1, clock.now()) == pytest.approx(60.0)
    assert limiter.stats.limits_lowered == ["requests=2", "tokens=5000"]


async def test_a_request_larger_than_the_whole_tpm_goes_alone() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(tpm=100), clock)
    await limiter.acquire(500)
    assert limiter.wait_time(1, clock.now()) == pytest.approx(60.0)


async def test_a_provider_limit_header_keeps_the_headroom_spare() -> None:
    limiter = RateLimiter(RateLimits(rpm=100, headroom=0.5), VirtualClock())
    limiter.observe({"x-ratelimit-limit-requests": "40"})
    assert limiter.stats.limits_lowered == ["requests=20"]


def test_a_reply_is_charged_the_ceiling_or_what_it_used_as_the_provider_counts() -> None:
    assert charged_tokens(30, 5, 40, "ceiling") == 70  # OpenAI: max_tokens counted at arrival, kept
    assert charged_tokens(30, 5, 40, "actual") == 35  # Anthropic, Bedrock: corrected to the output used
    assert charged_tokens(30, 50, 40, "ceiling") == 80  # used more than the ceiling: charged more


async def test_a_commit_gives_the_unused_reservation_back_and_a_release_all_of_it() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(tpm=1000), clock)
    first = await limiter.acquire(900)
    await limiter.commit(first, charged_tokens(100, 10, 800, "actual"))
    second = await limiter.acquire(800)
    assert clock.now() == 0.0 and limiter.in_window == (2, 910)
    await limiter.release(second)
    assert limiter.in_window == (1, 110)


async def test_a_request_still_waiting_for_its_answer_keeps_its_place_in_the_window() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(rpm=1), clock)
    slow = await limiter.acquire(1)
    clock.advance(90.0)  # the answer takes longer than the window: the provider counts it from arrival
    assert limiter.wait_time(1, clock.now()) == pytest.approx(60.0)
    await limiter.commit(slow, 1)
    clock.advance(60.5)
    assert limiter.wait_time(1, clock.now()) == 0.0


async def test_giving_back_what_replies_did_not_use_admits_more_in_a_window() -> None:
    async def admitted_in_one_window(charge: str) -> int:
        clock = VirtualClock()
        limiter = RateLimiter(RateLimits(rpm=1000, tpm=1000, output_charge=charge), clock)  # type: ignore[arg-type]
        count = 0
        while clock.now() < 60.0:
            res = await limiter.acquire(100)  # 20 prompt + a ceiling of 80
            if clock.now() >= 60.0:
                break
            count += 1
            await limiter.commit(res, charged_tokens(20, 5, 80, limiter.limits.output_charge))
        return count

    assert await admitted_in_one_window("ceiling") == 10
    assert await admitted_in_one_window("actual") == 37  # 36 x 25 + a reservation of 100 fit 1000


def test_headroom_keeps_part_of_each_limit_spare() -> None:
    limits = RateLimits(rpm=100, tpm=1000, headroom=0.9)
    assert (limits.effective_rpm, limits.effective_tpm) == (90, 900)


@pytest.mark.parametrize("bad", [{"rpm": 0}, {"tpm": -1}, {"window_s": 0}, {"headroom": 1.5}])
def test_impossible_limits_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RateLimits(**bad)  # type: ignore[arg-type]


def test_retry_after_wins_over_the_backoff() -> None:
    policy = RetryPolicy(max_attempts=5, initial_delay=0.5, max_delay=8.0)
    assert retry_delay(policy, 1, "failed_retryable", retry_after=3.0) == 3.0
    assert retry_delay(policy, 1, "failed_retryable", retry_after=3600.0) == policy.max_retry_after


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    policy = RetryPolicy(max_attempts=10, initial_delay=0.5, max_delay=4.0, jitter=0.25)
    rng = random.Random(7)
    delays = [retry_delay(policy, n, "failed_retryable", rng=rng) for n in range(1, 7)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert delay is not None and 0.75 * ceiling <= delay <= ceiling
    rng2 = random.Random(7)
    assert delays == [retry_delay(policy, n, "failed_retryable", rng=rng2) for n in range(1, 7)]


def test_only_retryable_outcomes_are_retried_and_only_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert retry_delay(policy, 1, "failed_permanent") is None
    assert retry_delay(policy, 1, "succeeded") is None
    assert retry_delay(policy, 1, "invalid_output") is None
    assert retry_delay(policy, 3, "failed_retryable", retry_after=1.0) is None
    assert retry_delay(policy, 2, "failed_retryable") is not None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1.5s", 1.5),
        ("6m0s", 360.0),
        ("120ms", 0.12),
        ("2", 2.0),
        ("1h2m", 3720.0),
        ("soon", None),
        (None, None),
    ],
)
def test_rate_limit_reset_durations_are_read(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_retry_after_is_read_from_milliseconds_seconds_or_a_date() -> None:
    assert parse_retry_after({"Retry-After-Ms": "1500", "Retry-After": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "4"}) == 4.0
    assert parse_retry_after({"retry-after": "Thu, 01 Jan 2026 00:00:10 GMT"}, now_epoch=1767225600.0) == 10.0
    assert parse_retry_after({}) is None


def test_a_retry_after_in_the_headers_alone_pauses_every_worker() -> None:
    clock = VirtualClock()
    limiter = RateLimiter(RateLimits(rpm=100), clock)
    limiter.observe({"Retry-After": "7"})
    assert limiter.wait_time(1, clock.now()) == 7.0
    limiter.observe({"retry-after-ms": "9500"})
    assert limiter.wait_time(1, clock.now()) == 9.5


def test_retry_after_reads_any_headers_object_and_ignores_garbage() -> None:
    import httpx

    assert parse_retry_after(httpx.Headers({"Retry-After": "3"})) == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after-ms": "x", "retry-after": "2"}) == 2.0


def test_the_one_retryable_table_knows_every_providers_words() -> None:
    from airflow_batch_provider.adapters.registry import retryable_errors, retryable_errors_by_provider
    from airflow_batch_provider.core.ratelimit import is_retryable

    # the table is the adapters' declared words, passed in: core names no provider
    RETRYABLE_ERRORS_BY_PROVIDER = retryable_errors_by_provider()
    assert set(RETRYABLE_ERRORS_BY_PROVIDER) >= {"openai", "anthropic", "gemini", "bedrock"}
    for words in RETRYABLE_ERRORS_BY_PROVIDER.values():
        assert all(is_retryable(None, w, retryable_errors()) for w in words)
    assert is_retryable(529) and is_retryable(503) and not is_retryable(400)
    assert not is_retryable(400, "invalid_request_error") and not is_retryable()
