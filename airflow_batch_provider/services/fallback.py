"""``SyncFallbackOperator``: send what the deadline left open to the provider's real-time API.

Runs in a worker (not the triggerer): one event loop in :meth:`SyncFallbackOperator.execute`
sends the items with ``asyncio.gather`` under a semaphore (the concurrency) and a shared
:class:`~airflow_batch_provider.core.ratelimit.RateLimiter` (RPM and TPM, token estimates before
each call, actual usage after, ``Retry-After`` and ``x-ratelimit-*`` honoured). Retryable
failures (429, 5xx, timeouts) are retried by :func:`~airflow_batch_provider.core.ratelimit.retry_delay`;
anything else is final.

Idempotent through the ledger: an item is moved to ``fallback`` and its attempt recorded (mode
``sync``) before it is sent; an item that already has a usable result (a late batch line) is not
sent; a rerun of the task resends only items whose answer was never recorded. Each attempt's
cost is priced at STANDARD (synchronous) rates from the usage the provider reports. Items end
``succeeded`` (route ``fallback``) or ``review`` with the provider's error.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.core.pricing import ModelPrice, PriceTable, cost
from airflow_batch_provider.core.ratelimit import RateLimiter, RateLimits, RetryPolicy, retry_delay
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.core.results import ItemResult
from airflow_batch_provider.core.tokens import estimate_request_tokens
from airflow_batch_provider.core.validation import check_output
from airflow_batch_provider.ledger.store import from_nusd, to_nusd
from airflow_batch_provider.operators.batch import BatchBaseOperator
from airflow_batch_provider.settings import get_setting, load_prices

if TYPE_CHECKING:
    from airflow.sdk import Context
    from sqlalchemy.engine import RowMapping

    from airflow_batch_provider.adapters.base import AsyncRealtimeClient, RealtimeReply
    from airflow_batch_provider.ledger import Ledger

#: States an item may be sent to the fallback from (``fallback``: an interrupted earlier try).
FALLBACK_FROM: tuple[str, ...] = (
    "pending",
    "staged",
    "submitted",
    "failed_retryable",
    "expired",
    "cancelled",
    "fallback",
)


@dataclass(frozen=True)
class FallbackSettings:
    """How hard the fallback may push the real-time API.

    :param rpm: requests per minute
    :param tpm: tokens per minute
    :param concurrency: requests in flight at once
    :param window_s: the rate window (60 s for per-minute limits)
    :param headroom: share of the limits used (keep some for other clients of the same key)
    :param retry: the retry policy of one item
    """

    rpm: int | None
    tpm: int | None
    concurrency: int
    window_s: float = 60.0
    headroom: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)


class SyncFallbackOperator(BatchBaseOperator):
    """Send the run's items still open at the deadline through the real-time API, at full price.

    :param prompt: the workload's prompt (for output validation)
    :param rpm: requests per minute (default ``[batch_provider] fallback_rpm``, 500)
    :param tpm: tokens per minute (default ``[batch_provider] fallback_tpm``, 200000)
    :param concurrency: requests in flight (default ``[batch_provider] fallback_concurrency``, 16)
    :param window_s: the rate window in seconds (60 for per-minute limits)
    :param headroom: share of ``rpm``/``tpm`` used, 0 to 1
    :param retry: retry policy per item (default :class:`RetryPolicy`)
    :param pricing_override: a pricing file path or dict merged over the shipped prices
    """

    ui_color = "#f6d5c1"

    def __init__(
        self,
        *,
        prompt: PromptTemplate | str,
        rpm: int | None = None,
        tpm: int | None = None,
        concurrency: int | None = None,
        window_s: float = 60.0,
        headroom: float = 1.0,
        retry: RetryPolicy | None = None,
        pricing_override: str | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.prompt = prompt
        self.rpm = rpm
        self.tpm = tpm
        self.concurrency = concurrency
        self.window_s = window_s
        self.headroom = headroom
        self.retry = retry or RetryPolicy()
        self.pricing_override = pricing_override

    def settings(self) -> FallbackSettings:
        """The limits, from the arguments or the ``[batch_provider]`` config."""
        return fallback_settings(
            self.rpm, self.tpm, self.concurrency, self.window_s, self.headroom, self.retry
        )

    def execute(self, context: Context) -> dict[str, Any]:
        run_id = context["run_id"]
        template = PromptTemplate.load(self.prompt)
        rows = list(
            self.ledger.iter_items(
                self.workload, run_id, states=FALLBACK_FROM, columns=["app_id", "request_json", "state"]
            )
        )
        if not rows:
            self.log.info("no open items: nothing to send synchronously")
            return {"items": 0}
        settings = self.settings()
        self.log.info(
            "sending %d items through the real-time API of %s (full price): %s rpm, %s tpm, %d in flight",
            len(rows),
            self.adapter.name,
            settings.rpm,
            settings.tpm,
            settings.concurrency,
        )
        summary = asyncio.run(
            run_fallback(
                ledger=self.ledger,
                workload=self.workload,
                run_id=run_id,
                provider=self.adapter.name,
                client=self.adapter.realtime_client(),
                rows=rows,
                template=template,
                settings=settings,
                prices=load_prices(self.pricing_override),
            )
        )
        self.log.info("fallback done: %s", summary)
        return summary


def fallback_settings(
    rpm: int | None = None,
    tpm: int | None = None,
    concurrency: int | None = None,
    window_s: float = 60.0,
    headroom: float = 1.0,
    retry: RetryPolicy | None = None,
) -> FallbackSettings:
    """Fallback limits from the arguments, else from the ``[batch_provider]`` config.

    Options ``fallback_rpm``, ``fallback_tpm`` and ``fallback_concurrency`` (500, 200000, 16).

    :param rpm: requests per minute
    :param tpm: tokens per minute
    :param concurrency: requests in flight
    :param window_s: the rate window in seconds
    :param headroom: share of the limits used
    :param retry: retry policy per item
    """
    return FallbackSettings(
        rpm=rpm if rpm is not None else int(get_setting("fallback_rpm", "500")),
        tpm=tpm if tpm is not None else int(get_setting("fallback_tpm", "200000")),
        concurrency=concurrency or int(get_setting("fallback_concurrency", "16")),
        window_s=window_s,
        headroom=headroom,
        retry=retry or RetryPolicy(),
    )


async def run_fallback(
    *,
    ledger: Ledger,
    workload: str,
    run_id: str,
    provider: str,
    client: AsyncRealtimeClient,
    rows: Sequence[RowMapping],
    template: PromptTemplate,
    settings: FallbackSettings,
    prices: PriceTable,
    limiter: RateLimiter | None = None,
) -> dict[str, Any]:
    """Send ``rows`` concurrently under the limiter; record each attempt; return a small summary.

    The client is closed at the end.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param provider: the adapter name (for prices)
    :param client: the real-time client
    :param rows: ledger rows (``item_key``, ``prompt_version``, ``request_json``)
    :param template: the prompt, for output validation
    :param settings: limits and concurrency
    :param prices: the price table
    :param limiter: a limiter to use (default: a new one from ``settings``)
    """
    limiter = limiter or RateLimiter(
        RateLimits(settings.rpm, settings.tpm, settings.window_s, settings.headroom)
    )
    semaphore = asyncio.Semaphore(settings.concurrency)
    counts: Counter[str] = Counter()
    paid_nusd = 0
    price_cache: dict[str, ModelPrice] = {}
    rng = random.Random()

    def price_of(model: str) -> ModelPrice:
        if model not in price_cache:
            price_cache[model] = prices.price(provider, model)
        return price_cache[model]

    async def one(row: RowMapping) -> None:
        nonlocal paid_nusd
        async with semaphore:
            custom_id = ledger.begin_sync_attempt(
                workload, run_id, row["item_key"], row["prompt_version"], FALLBACK_FROM
            )
            if custom_id is None:
                counts["already_done"] += 1
                return
            request = CanonicalRequest.from_dict(json.loads(row["request_json"]))
            estimate = estimate_request_tokens(request)
            tries = 0
            while True:
                tries += 1
                reservation = await limiter.acquire(estimate.input + estimate.max_output)
                reply: RealtimeReply = await client.complete(request, custom_id)
                result = reply.result
                if result.outcome == "failed_retryable":
                    counts[
                        "http_429" if result.error_code == "rate_limit_exceeded" else "retryable_errors"
                    ] += 1
                    limiter.settle(reservation, 0)
                else:
                    used = result.usage
                    prompt = used.input_tokens + used.cached_input_tokens + used.cache_write_tokens
                    # Providers count the output ceiling against TPM when the request arrives.
                    limiter.settle(reservation, prompt + max(used.output_tokens, estimate.max_output))
                limiter.observe(reply.rate_limit, reply.retry_after)
                delay = retry_delay(settings.retry, tries, result.outcome, reply.retry_after, rng)
                if delay is None:
                    break
                counts["retries"] += 1
                await limiter.clock.sleep(delay)
            final: ItemResult = check_output(result, template.output_format, template.output_schema)
            amount = to_nusd(cost(final.usage, price_of(request.model), "sync"))
            paid_nusd += amount
            state = ledger.record_sync_result(workload, run_id, final, amount)
            counts["sent"] += 1
            counts[state] += 1

    try:
        await asyncio.gather(*(one(row) for row in rows))
    finally:
        await client.close()
    return {
        "items": len(rows),
        **dict(counts),
        "paid_usd": str(from_nusd(paid_nusd)),
        "limiter_waited_s": round(limiter.stats.waited_s, 3),
        "provider_pauses": limiter.stats.pauses,
    }
