"""Does the synchronous fallback's limiter hold the configured RPM and TPM against the emulator?

Runs the real fallback path (:func:`airflow_batch_provider.services.fallback.run_fallback`: the
OpenAI SDK's async client over HTTP, the ledger in a temporary SQLite file) against the
emulator's ``/v1/chat/completions``, whose sliding-window limiter answers 429 with
``Retry-After`` past its RPM/TPM. The emulator runs at time scale 0.1, so its "minute" is 6 s;
the fallback is configured with the same window.

For each scenario it prints: achieved requests and tokens per window as a ratio of the
configured limit (1.00 = exactly at the limit), the most requests/tokens the emulator could have
seen in any one window, and the 429s the emulator sent. The baseline is the same workload with
no client-side limiter: as many requests in flight as the concurrency allows, each worker
retrying its own 429 after the provider's Retry-After.

Two more scenarios put the emulator in ``tpm_output: actual`` (a provider that corrects the output
ceiling it counted at arrival to the output the answer used, as Anthropic and Bedrock do): the
limiter charging every answer its ceiling (``ceiling``, what it did before) against the same
limiter giving the unused part of the reservation back (``actual``).

Usage: ``python benchmarks/bench_fallback_limiter.py [--items 240] [--concurrency 16]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import result, row  # first: it puts this tree's package ahead of any other copy

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.pricing import PriceTable
from airflow_batch_provider.core.ratelimit import RateLimiter, RateLimits, RetryPolicy, retry_delay
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.services.fallback import FALLBACK_FROM, FallbackSettings, run_fallback
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

TIME_SCALE = 0.1
WINDOW_S = 60.0 * TIME_SCALE
PROMPT = PromptTemplate(
    version="bench",
    model="gpt-4o-mini",
    system="Label the customer comment as positive, negative or neutral.",
    user="{{ text }}",
    params={"max_tokens": 40},
)


@dataclass(frozen=True)
class Scenario:
    """One run of the benchmark."""

    name: str
    rpm: int
    tpm: int
    limiter: bool
    #: how the emulator counts output against TPM, and how the limiter charges it
    tpm_output: str = "ceiling"
    charge: str = "ceiling"


@dataclass
class Outcome:
    """What one scenario measured."""

    scenario: Scenario
    items: int
    elapsed_s: float
    stamps: list[tuple[float, int]]
    http_429: int
    succeeded: int

    def per_window(self) -> tuple[float, float]:
        """Mean requests and tokens in a window, over windows placed evenly across the run.

        A sliding-window limiter admits in bursts a window apart, so the mean over windows at
        every position (not only those starting at an admission, nor a count over a span that
        cuts a burst) is the rate it sustains. Never above :meth:`peak`.
        """
        if len(self.stamps) < 2 or self.stamps[-1][0] - self.stamps[0][0] <= WINDOW_S:
            return float(len(self.stamps)), float(sum(n for _, n in self.stamps))
        first, room = self.stamps[0][0], self.stamps[-1][0] - WINDOW_S - self.stamps[0][0]
        samples = 200
        requests = tokens = 0
        for i in range(samples):
            start = first + room * i / (samples - 1)
            inside = [n for t, n in self.stamps if start <= t < start + WINDOW_S]
            requests += len(inside)
            tokens += sum(inside)
        return requests / samples, tokens / samples

    def peak(self) -> tuple[int, int]:
        """Most admitted requests and tokens inside any window starting at an admission."""
        best_r = best_t = 0
        for start, _ in self.stamps:
            inside = [n for t, n in self.stamps if start <= t < start + WINDOW_S]
            best_r = max(best_r, len(inside))
            best_t = max(best_t, sum(inside))
        return best_r, best_t


def _put(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        f"{url}/_emulator/config",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def _count_429(url: str) -> int:
    with urllib.request.urlopen(f"{url}/_emulator/stats", timeout=10) as resp:
        stats = json.loads(resp.read())
    return sum(int(v) for k, v in stats.get("counters", {}).items() if k.endswith("sync_429"))


def _texts(n: int) -> dict[str, str]:
    rng = random.Random(3)
    words = ["parcel", "late", "great", "refund", "app", "crash", "support", "friendly", "box", "broken"]
    return {f"i{i:04d}": " ".join(rng.choice(words) for _ in range(8 + i % 5)) for i in range(n)}


class _Recording:
    """Wraps the real-time client to record when each admitted request answered, and its charge."""

    def __init__(self, inner: Any, tpm_output: str = "ceiling") -> None:
        self.inner = inner
        self.tpm_output = tpm_output
        self.stamps: list[tuple[float, int]] = []
        self.t0 = time.monotonic()

    async def complete(self, request: Any, custom_id: str) -> Any:
        reply = await self.inner.complete(request, custom_id)
        if reply.result.outcome == "succeeded":
            usage = reply.result.usage
            prompt = usage.input_tokens + usage.cached_input_tokens
            # What the emulator charges: prompt tokens plus the output ceiling (max_tokens), or
            # plus the output used when it counts actual output.
            out = int(PROMPT.params["max_tokens"]) if self.tpm_output == "ceiling" else usage.output_tokens
            self.stamps.append((time.monotonic() - self.t0, prompt + out))
        return reply

    async def close(self) -> None:
        await self.inner.close()


async def _with_limiter(url: str, sc: Scenario, items: int, concurrency: int, folder: Path) -> Outcome:
    ledger = Ledger.from_url(f"sqlite:///{folder / f'{sc.name}.sqlite'}")
    ledger.start_run("bench", sc.name, "openai", PROMPT.model)
    ledger.upsert_items(
        "bench",
        sc.name,
        (PreparedItem(k, PROMPT.render({"id": k, "text": t})) for k, t in _texts(items).items()),
    )
    rows = list(ledger.iter_items("bench", sc.name, states=FALLBACK_FROM, columns=["request_json"]))
    adapter = OpenAIBatchAdapter(AdapterSettings(api_key="sk-bench", base_url=f"{url}/v1"))
    client = _Recording(adapter.realtime_client(), sc.tpm_output)
    limiter = RateLimiter(RateLimits(sc.rpm, sc.tpm, WINDOW_S, output_charge=sc.charge))  # type: ignore[arg-type]
    before = _count_429(url)
    started = time.monotonic()
    summary = await run_fallback(
        ledger=ledger,
        workload="bench",
        run_id=sc.name,
        provider="openai",
        client=client,  # type: ignore[arg-type]
        rows=rows,
        template=PROMPT,
        settings=FallbackSettings(sc.rpm, sc.tpm, concurrency, WINDOW_S, output_charge=sc.charge),  # type: ignore[arg-type]
        prices=PriceTable.load(),
        limiter=limiter,
    )
    elapsed = time.monotonic() - started
    return Outcome(
        sc, items, elapsed, client.stamps, _count_429(url) - before, int(summary.get("succeeded", 0))
    )


async def _naive(url: str, sc: Scenario, items: int, concurrency: int) -> Outcome:
    adapter = OpenAIBatchAdapter(AdapterSettings(api_key="sk-bench", base_url=f"{url}/v1"))
    client = _Recording(adapter.realtime_client())
    requests = [PROMPT.render({"id": k, "text": t}) for k, t in _texts(items).items()]
    semaphore = asyncio.Semaphore(concurrency)
    policy = RetryPolicy(max_attempts=50)
    succeeded = 0

    async def one(i: int) -> None:
        nonlocal succeeded
        async with semaphore:
            tries = 0
            while True:
                tries += 1
                reply = await client.complete(requests[i], f"n{i}")
                delay = retry_delay(policy, tries, reply.result.outcome, reply.retry_after)
                if delay is None:
                    succeeded += reply.result.outcome == "succeeded"
                    return
                await asyncio.sleep(delay)

    before = _count_429(url)
    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(items)))
    elapsed = time.monotonic() - started
    await client.close()
    return Outcome(sc, items, elapsed, client.stamps, _count_429(url) - before, succeeded)


def _print(outcomes: Sequence[Outcome]) -> None:
    header = (
        f"{'scenario':<28}{'items':>6}{'ok':>6}{'secs':>7}{'req/win':>9}{'ratio':>7}"
        f"{'tok/win':>9}{'ratio':>7}{'peak req':>9}{'peak tok':>9}{'429s':>6}"
    )
    print(f"window {WINDOW_S:g} s (emulator time scale {TIME_SCALE}); limits are per window")
    print(header)
    print("-" * len(header))
    for o in outcomes:
        r, t = o.per_window()
        pr, pt = o.peak()
        sc = o.scenario
        print(
            f"{sc.name:<28}{o.items:>6}{o.succeeded:>6}{o.elapsed_s:>7.1f}{r:>9.1f}{r / sc.rpm:>7.2f}"
            f"{t:>9.0f}{t / sc.tpm:>7.2f}{pr:>9}{pt:>9}{o.http_429:>6}"
        )


async def main(items: int, concurrency: int) -> list[Outcome]:
    """Run every scenario and return what they measured.

    :param items: requests per scenario
    :param concurrency: requests in flight
    """
    scenarios = [
        Scenario("rpm-bound, limiter", rpm=60, tpm=100_000, limiter=True),
        Scenario("rpm-bound, no limiter", rpm=60, tpm=100_000, limiter=False),
        Scenario("tpm-bound, limiter", rpm=1000, tpm=3000, limiter=True),
        Scenario("tpm-bound, no limiter", rpm=1000, tpm=3000, limiter=False),
        Scenario("tpm actual, ceiling charged", rpm=1000, tpm=3000, limiter=True, tpm_output="actual"),
        Scenario("tpm actual, unused given back", 1000, 3000, True, tpm_output="actual", charge="actual"),
    ]
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp, run_emulator(EmulatorConfig(time_scale=TIME_SCALE)) as url:
        for sc in scenarios:
            _put(url, {"faults": {"rpm_limit": sc.rpm, "tpm_limit": sc.tpm, "tpm_output": sc.tpm_output}})
            await asyncio.sleep(WINDOW_S)  # let the emulator's window empty between scenarios
            if sc.limiter:
                outcomes.append(await _with_limiter(url, sc, items, concurrency, Path(tmp)))
            else:
                outcomes.append(await _naive(url, sc, items, concurrency))
    return outcomes


#: requests per scenario by size; ``tiny`` is skipped: the scenarios wait out the emulator's
#: rate windows (about half a minute in all), too long for the smoke test
SIZES = {"small": 60, "default": 240}


def run(size: str) -> dict[str, Any]:
    """Run the four scenarios (``run_all.py`` entry point) and return their figures.

    Subject: requests admitted per window with the limiter; baseline: the same scenario without
    it. The ratios that matter are achieved/limit (near 1, never above) and the 429 count.

    :param size: ``tiny`` (skipped), ``small`` or ``default``
    """
    if size not in SIZES:
        return result(
            "fallback_limiter",
            size,
            {},
            [],
            skipped=[
                {
                    "case": "all",
                    "reason": "waits out the emulator's rate windows; use --size small or default",
                }
            ],
        )
    items = SIZES[size]
    outcomes = asyncio.run(main(items, 16))
    by_name = {o.scenario.name: o for o in outcomes}
    rows: list[dict[str, Any]] = []
    for bound in ("rpm", "tpm"):
        limited, naive = by_name[f"{bound}-bound, limiter"], by_name[f"{bound}-bound, no limiter"]
        limit = limited.scenario.rpm if bound == "rpm" else limited.scenario.tpm
        achieved = limited.per_window()[0 if bound == "rpm" else 1]
        peak = limited.peak()[0 if bound == "rpm" else 1]
        rows.append(
            row(
                f"{bound}-bound: admitted per window / limit",
                f"{bound} ratio",
                achieved / limit,
                1.0,
                subject="limiter",
                baseline_name="the configured limit",
            )
        )
        rows.append(
            row(
                f"{bound}-bound: peak in any window / limit",
                f"{bound} ratio",
                peak / limit,
                1.0,
                subject="limiter",
                baseline_name="the configured limit",
            )
        )
        rows.append(
            row(
                f"{bound}-bound: HTTP 429 answers",
                "count",
                float(limited.http_429),
                float(naive.http_429),
                subject="limiter",
                baseline_name="no limiter",
            )
        )
    before, after = by_name["tpm actual, ceiling charged"], by_name["tpm actual, unused given back"]
    tpm = after.scenario.tpm
    rows.append(
        row(
            "tpm-bound, provider counts actual output: admitted per window / limit",
            "tpm ratio",
            after.per_window()[1] / tpm,
            before.per_window()[1] / tpm,
            subject="unused reservation given back",
            baseline_name="every answer charged its output ceiling (before)",
        )
    )
    rows.append(
        row(
            "tpm-bound, provider counts actual output: peak in any window / limit",
            "tpm ratio",
            after.peak()[1] / tpm,
            before.peak()[1] / tpm,
            subject="unused reservation given back",
            baseline_name="every answer charged its output ceiling (before)",
        )
    )
    rows.append(
        row(
            "tpm-bound, provider counts actual output: HTTP 429 answers",
            "count",
            float(after.http_429),
            float(before.http_429),
            subject="unused reservation given back",
            baseline_name="every answer charged its output ceiling (before)",
        )
    )
    return result("fallback_limiter", size, {"items": items, "concurrency": 16, "window_s": WINDOW_S}, rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    _print(asyncio.run(main(args.items, args.concurrency)))
