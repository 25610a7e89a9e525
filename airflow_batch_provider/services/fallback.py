"""The real-time path: send items through a provider's synchronous API, resumably, at full price.

Used by the deadline fallback (:class:`~airflow_batch_provider.operators.fallback.BatchSyncFallbackOperator`)
and by a chunk below the provider's minimum batch size (``BatchSubmitOperator``). No Airflow import.

One event loop sends the items with ``asyncio.gather`` under a semaphore (the concurrency) and a
:class:`~airflow_batch_provider.core.ratelimit.RateLimiter` (RPM and TPM, token estimates
before each call, the charge the answer reports after, with the unused part given back,
``Retry-After`` and ``x-ratelimit-*`` honoured). With a quota key (the operators pass the
connection's), the limiter's window is the ledger's
(:class:`~airflow_batch_provider.ledger.quota.SharedRateStore`): every task and process sending on
that connection counts against one limit, times the headroom left for the key's other clients. Retryable
failures (429, 5xx, timeouts) are retried by :func:`~airflow_batch_provider.core.ratelimit.retry_delay`;
anything else is final.

Resumable through the ledger:

- before its call an item is marked sent: it moves to ``fallback`` and gets a synchronous
  attempt row (mode ``sync``) without an outcome;
- the answer is recorded with its usage and cost (STANDARD prices) in one transaction that
  also settles the item (``succeeded``, route ``fallback``, or ``review``);
- a crash in between (fail point ``fallback.after_send``) leaves the item in ``fallback`` with an
  open attempt. The next call of :func:`run_fallback` for the run resumes every such item,
  whether or not the caller listed it: the open attempt is closed with error code
  ``possibly_paid_twice`` (the provider may have answered and billed it; its usage is unknown,
  so its cost is recorded as 0) and the item is sent again under a new attempt. The count is
  returned and stays in the ledger (:func:`possibly_paid_twice`), never hidden;
- an item that already has a usable result (a late batch line) is not sent.

At most one task of a run sends synchronously at a time (the deadline fallback runs after every
round; a round has at most one chunk below the minimum; the workload is leased to one run), so
an open attempt at the start of a call is an interrupted one, never one in flight elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.core.money import from_nusd, to_nusd
from airflow_batch_provider.core.pricing import ModelPrice, PriceTable, cost
from airflow_batch_provider.core.ratelimit import (
    OUTPUT_CHARGES,
    OutputCharge,
    RateLimiter,
    RateLimits,
    RetryPolicy,
    charged_tokens,
    retry_delay,
)
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.core.results import ItemResult
from airflow_batch_provider.core.states import UNSETTLED_STATES
from airflow_batch_provider.core.tokens import estimate_request_tokens
from airflow_batch_provider.core.validation import check_output
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger.records import OpenItem, sync_job_id

if TYPE_CHECKING:
    from airflow_batch_provider.adapters.base import AsyncRealtimeClient, RealtimeReply
    from airflow_batch_provider.ledger import Ledger

#: Error code of a synchronous attempt that was sent, never recorded, and sent again.
POSSIBLY_PAID_TWICE: Final = "possibly_paid_twice"
#: Error code of a synchronous attempt that was sent and never recorded, closed without a resend.
ANSWER_LOST: Final = "answer_lost"

#: States an item may be sent to the fallback from: every unsettled one.
FALLBACK_FROM: Final = UNSETTLED_STATES


@dataclass(frozen=True)
class FallbackSettings:
    """How hard the fallback may push the real-time API.

    :param rpm: requests per minute
    :param tpm: tokens per minute
    :param concurrency: requests in flight at once
    :param window_s: the rate window (60 s for per-minute limits)
    :param headroom: share of the limits used (keep some for other clients of the same key)
    :param retry: the retry policy of one item
    :param output_charge: how the provider counts an answer's output against TPM (``ceiling``:
        the request's ``max_tokens``, kept; ``actual``: what the answer used)
    :param quota_key: share the window with every task of this key, through the ledger
        (``None``: this task's own window)
    """

    rpm: int | None
    tpm: int | None
    concurrency: int
    window_s: float = 60.0
    headroom: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    output_charge: OutputCharge = "ceiling"
    quota_key: str | None = None

    def limits(self) -> RateLimits:
        """The limiter's limits."""
        return RateLimits(self.rpm, self.tpm, self.window_s, self.headroom, self.output_charge)


#: Connection extras that state the key's real-time limits (they win over the config options).
RATE_EXTRAS: Final = ("rpm_limit", "tpm_limit", "rate_headroom", "tpm_output", "quota_key")


def fallback_settings(
    rpm: int | None = None,
    tpm: int | None = None,
    concurrency: int | None = None,
    window_s: float = 60.0,
    headroom: float | None = None,
    retry: RetryPolicy | None = None,
    *,
    extras: Mapping[str, Any] | None = None,
    quota_key: str | None = None,
) -> FallbackSettings:
    """Fallback limits from the arguments, else the connection's extras, else the ``[batch_provider]`` config.

    Extras (:data:`RATE_EXTRAS`): ``rpm_limit``, ``tpm_limit``, ``rate_headroom`` (the share of
    the key's limits batch traffic may use; the rest is left to the real-time application),
    ``tpm_output`` (``ceiling`` or ``actual``) and ``quota_key`` (connections naming the same key
    share one window). Options ``fallback_rpm``, ``fallback_tpm``, ``fallback_concurrency`` and
    ``fallback_headroom`` (500, 200000, 16, 1.0).

    :param rpm: requests per minute
    :param tpm: tokens per minute
    :param concurrency: requests in flight
    :param window_s: the rate window in seconds
    :param headroom: share of the limits used
    :param retry: retry policy per item
    :param extras: the provider connection's extras
    :param quota_key: the key the window is shared under (the operators pass the connection id);
        the extra ``quota_key`` wins over it
    """
    from airflow_batch_provider.settings import get_setting

    extra = dict(extras or {})

    def pick(given: Any, name: str, option: str, default: str) -> str:
        if given is not None:
            return str(given)
        if extra.get(name) not in (None, ""):
            return str(extra[name])
        return get_setting(option, default)

    output = str(extra.get("tpm_output") or "ceiling")
    if output not in OUTPUT_CHARGES:
        raise ConfigurationError(
            f"connection extra tpm_output={output!r}: give one of {list(OUTPUT_CHARGES)} (how the provider counts "
            "an answer's output tokens against its TPM limit: OpenAI 'ceiling', Anthropic and Bedrock 'actual')."
        )
    try:
        return FallbackSettings(
            rpm=int(pick(rpm, "rpm_limit", "fallback_rpm", "500")),
            tpm=int(pick(tpm, "tpm_limit", "fallback_tpm", "200000")),
            concurrency=concurrency or int(get_setting("fallback_concurrency", "16")),
            window_s=window_s,
            headroom=float(pick(headroom, "rate_headroom", "fallback_headroom", "1.0")),
            retry=retry or RetryPolicy(),
            output_charge=output,  # type: ignore[arg-type]  # checked above
            quota_key=str(extra.get("quota_key") or quota_key or "") or None,
        )
    except ValueError as exc:
        raise ConfigurationError(
            f"the synchronous fallback's limits are not numbers ({exc}): set rpm_limit and tpm_limit as integers "
            "and rate_headroom as a share in (0, 1] (connection extras, or [batch_provider] fallback_*)."
        ) from exc


async def run_fallback(
    *,
    ledger: Ledger,
    workload: str,
    run_id: str,
    provider: str,
    client: AsyncRealtimeClient,
    rows: Sequence[OpenItem],
    template: PromptTemplate,
    settings: FallbackSettings,
    prices: PriceTable,
    limiter: RateLimiter | None = None,
) -> dict[str, Any]:
    """Send ``rows`` concurrently under the limiter; record each attempt; return a small summary.

    Resumes first: every item of the run left in ``fallback`` by an interrupted call is closed as
    ``possibly_paid_twice`` (:func:`close_interrupted_sends`) and sent again with ``rows``,
    whether or not ``rows`` lists it. The client is closed at the end.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param provider: the adapter name (for prices)
    :param client: the real-time client
    :param rows: the items to send (``Ledger.iter_item_rows(..., shape=OpenItem)``); may be stale
    :param template: the prompt, for output validation
    :param settings: limits and concurrency
    :param prices: the price table
    :param limiter: a limiter to use (default: a new one from ``settings``, sharing the ledger's
        window of ``settings.quota_key`` when it names one)
    """
    if limiter is None:
        from airflow_batch_provider.ledger.quota import SharedRateStore

        store = SharedRateStore(ledger.engine, settings.quota_key) if settings.quota_key else None
        limiter = RateLimiter(settings.limits(), store=store)
    semaphore = asyncio.Semaphore(settings.concurrency)
    counts: Counter[str] = Counter()
    resumed = close_interrupted_sends(ledger, workload, run_id)
    if resumed:
        counts[POSSIBLY_PAID_TWICE] = len(resumed)
        listed = {(r.item_key, r.prompt_version) for r in rows}
        rows = [*rows, *(r for r in resumed if (r.item_key, r.prompt_version) not in listed)]
    paid_nusd = 0
    price_cache: dict[str, ModelPrice] = {}
    rng = random.Random()

    def price_of(model: str) -> ModelPrice:
        if model not in price_cache:
            price_cache[model] = prices.price(provider, model)
        return price_cache[model]

    async def one(row: OpenItem) -> None:
        nonlocal paid_nusd
        async with semaphore:
            custom_id = ledger.begin_sync_attempt(
                workload, run_id, row.item_key, row.prompt_version, FALLBACK_FROM
            )
            if custom_id is None:
                counts["already_done"] += 1
                return
            request = CanonicalRequest.from_dict(json.loads(row.request_json))
            estimate = estimate_request_tokens(request)
            tries = 0
            while True:
                tries += 1
                reservation = await limiter.acquire(estimate.input + estimate.max_output)
                reply: RealtimeReply = await client.complete(request, custom_id)
                result = reply.result
                if result.outcome == "failed_retryable":
                    await limiter.commit(reservation, 0)
                    counts[
                        "http_429" if result.error_code == "rate_limit_exceeded" else "retryable_errors"
                    ] += 1
                else:
                    used = result.usage
                    prompt = used.input_tokens + used.cached_input_tokens + used.cache_write_tokens
                    charge = charged_tokens(
                        prompt, used.output_tokens, estimate.max_output, settings.output_charge
                    )
                    await limiter.commit(reservation, charge)
                count_request(result.error_code, workload, provider)
                limiter.observe(reply.rate_limit, reply.retry_after)
                delay = retry_delay(settings.retry, tries, result.outcome, reply.retry_after, rng)
                if delay is None:
                    break
                counts["retries"] += 1
                await limiter.clock.sleep(delay)
            # The provider answered (and may have billed); the ledger does not know it yet.
            failpoint("fallback.after_send")
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


def count_request(error_code: str | None, workload: str, provider: str) -> None:
    """Count one real-time request (``batch_provider.fallback.requests``, and ``rate_limited`` on a 429).

    :param error_code: the answer's error code (``rate_limit_exceeded`` is a 429)
    :param workload: the workload (a tag)
    :param provider: the provider (a tag)
    """
    from airflow_batch_provider import metrics

    try:
        metrics.record_fallback_request(
            429 if error_code == "rate_limit_exceeded" else None, workload=workload, provider=provider
        )
    except Exception:  # a metric never fails a send
        return


def close_interrupted_sends(
    ledger: Ledger, workload: str, run_id: str, error_code: str = POSSIBLY_PAID_TWICE
) -> list[OpenItem]:
    """Close the run's synchronous attempts that were sent and never recorded; return their items.

    Such an item is in ``fallback`` with an open attempt (a crash between the call and the
    record). Its attempt is recorded as ``failed_retryable`` with ``error_code`` and cost 0 (the
    provider may have billed it; the usage is unknown), and the item moves to
    ``failed_retryable``, from where it may be sent again (:func:`run_fallback` does) or settled
    (publish, with ``error_code=ANSWER_LOST``). Safe to repeat: a crash half-way is finished by
    the next call.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param error_code: ``possibly_paid_twice`` (it will be sent again) or ``answer_lost``
    """
    job_id = sync_job_id(workload, run_id)
    interrupted = [
        row
        for row in ledger.iter_item_rows(
            workload, run_id, states=["fallback", "failed_retryable"], shape=OpenItem, job_id=job_id
        )
        if row.custom_id and (row.state == "fallback" or row.error_code in (POSSIBLY_PAID_TWICE, ANSWER_LOST))
    ]
    message = (
        "sent through the real-time API before a crash; the answer was never recorded, so the provider "
        "may have billed it" + ("; sent again" if error_code == POSSIBLY_PAID_TWICE else "")
    )
    for row in interrupted:
        # Item first: recording the attempt while the item is in fallback would settle the item.
        ledger.transition(
            workload,
            run_id,
            "failed_retryable",
            ["fallback"],
            keys=[(row.item_key, row.prompt_version)],
            error_code=error_code,
            error_message=message,
        )
        closed = ItemResult(
            str(row.custom_id),  # not None: filtered above
            "failed_retryable",
            error_code=error_code,
            error_message=message,
        )
        ledger.record_sync_result(workload, run_id, closed, 0)
    return interrupted


def possibly_paid_twice(ledger: Ledger, workload: str, run_id: str) -> int:
    """Count the run's synchronous attempts that were sent, lost and sent again (for the report).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    return sum(
        1
        for row in ledger.iter_cost_rows(workload, run_id)
        for attempt in row["attempts"]
        if attempt["mode"] == "sync" and attempt["error_code"] == POSSIBLY_PAID_TWICE
    )
