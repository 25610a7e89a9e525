"""The one way items are sent through a provider's real-time API: one budget check, one limits resolution.

Three tasks send items in real time, at full price: the deadline's ``sync_fallback``, publish with
``exhausted="sync"``, and submit for a chunk below the provider's minimum batch size. They all call
:func:`send_realtime`, so none of them can drift from the others again:

- **limits**: the task's :class:`~airflow_batch_provider.core.options.FallbackLimits`, then the
  connection's extras (``rpm_limit``, ``tpm_limit``, ``rate_headroom``, ...), then the
  ``[batch_provider]`` config, with the ledger's shared rate window of the connection, so every
  real-time sender on one API key stays inside the key's limits together;
- **budget**: the real-time cost estimate of the items (full price, every item at its output
  ceiling) plus what the run has paid is checked against ``BudgetOptions(budget_usd=...)``. Over the
  budget nothing is sent: the items go to ``refused_state`` with error code ``over_budget`` and a
  message naming the budget, the paid amount and the estimate (the report counts them by state and
  error), unless the DAG said the deadline wins (``DeadlineOptions(over_budget="send")``): then
  they are sent and the summary and the log show the overrun;
- **sending**: :func:`~airflow_batch_provider.services.fallback.run_fallback` (resumable, each
  attempt priced at the provider's standard rates).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider.core.options import BudgetOptions, FallbackLimits
from airflow_batch_provider.core.ratelimit import RetryPolicy
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.services.budget import BudgetVerdict, estimate_items, verdict_of
from airflow_batch_provider.services.fallback import FallbackSettings, fallback_settings, run_fallback

if TYPE_CHECKING:
    from airflow_batch_provider.adapters.base import BatchAdapter
    from airflow_batch_provider.core.pricing import PriceTable

log = logging.getLogger(__name__)

#: error code of an item not sent in real time because the budget would not cover it
OVER_BUDGET: Final = "over_budget"


def realtime_limits(
    limits: FallbackLimits,
    *,
    extras: Mapping[str, Any] | None,
    quota_key: str | None,
    window_s: float = 60.0,
    retry: RetryPolicy | None = None,
) -> FallbackSettings:
    """The limits of a real-time send: the task's, then the connection's extras, then the config.

    :param limits: the task's fallback limits
    :param extras: the provider connection's extras
    :param quota_key: the key of the ledger's shared rate window (the connection id)
    :param window_s: the rate window in seconds
    :param retry: retry policy per item (its ``max_attempts`` replaced by ``limits.attempts`` when set)
    """
    if limits.attempts is not None:
        retry = replace(retry or RetryPolicy(), max_attempts=limits.attempts)
    return fallback_settings(
        limits.rpm,
        limits.tpm,
        limits.concurrency,
        window_s,
        limits.headroom,
        retry,
        extras=extras,
        quota_key=quota_key,
    )


def check_realtime_budget(
    ledger: Ledger,
    workload: str,
    run_id: str,
    rows: Sequence[OpenItem],
    budget: Decimal | None,
    prices: PriceTable,
    provider: str,
) -> BudgetVerdict:
    """Estimate the rows at real-time prices and compare with the run's budget (:mod:`.budget`'s check).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param rows: the items to send
    :param budget: the run's budget (``None``: none; nothing is estimated)
    :param prices: the price table
    :param provider: the adapter name
    """
    if budget is None:
        return BudgetVerdict(None, Decimal(0), Decimal(0))
    estimate = estimate_items(rows, prices, "sync", provider)
    return verdict_of(estimate, budget, ledger.run_cost(workload, run_id))


def send_realtime(
    *,
    ledger: Ledger,
    adapter: BatchAdapter,
    quota_key: str | None,
    workload: str,
    run_id: str,
    rows: Sequence[OpenItem],
    template: PromptTemplate,
    limits: FallbackLimits,
    budget: BudgetOptions,
    prices: PriceTable,
    refused_state: str,
    over_budget: str = "refuse",
    window_s: float = 60.0,
    retry: RetryPolicy | None = None,
) -> dict[str, Any]:
    """Send ``rows`` through the adapter's real-time API within the budget; return the summary.

    :param ledger: the ledger
    :param adapter: the provider adapter (its connection's extras give the limits)
    :param quota_key: the key of the ledger's shared rate window (the connection id)
    :param workload: workload name
    :param run_id: the run
    :param rows: the items to send
    :param template: the workload's prompt (output validation)
    :param limits: the task's fallback limits
    :param budget: the run's budget and prices
    :param prices: the price table (from ``budget.pricing_override``)
    :param refused_state: where items go when the budget refuses them (``review``, ``skipped``)
    :param over_budget: ``refuse`` (default: a budget is a budget) or ``send`` (the DAG lets the
        send pass the budget; the overrun is in the summary and the log)
    :param window_s: the rate window in seconds
    :param retry: retry policy per item
    """
    if not rows:
        return {"items": 0}
    verdict = check_realtime_budget(ledger, workload, run_id, rows, budget.budget, prices, adapter.name)
    overrun: dict[str, str] = {}
    if verdict.over:
        sentence = verdict.describe(len(rows))
        if over_budget != "send":
            sources = sorted({r.state for r in rows} - {"fallback"})
            keys = [(r.item_key, r.prompt_version) for r in rows]
            moved = ledger.transition(
                workload,
                run_id,
                refused_state,
                sources,
                keys,
                error_code=OVER_BUDGET,
                error_message=(
                    f"not sent: {sentence}; raise BudgetOptions(budget_usd=...), or let the deadline win with "
                    "DeadlineOptions(over_budget='send')"
                ),
            )
            log.error("%s: %d items -> %s (error %s)", sentence, moved, refused_state, OVER_BUDGET)
            return {
                "items": 0,
                "refused": len(rows),
                "budget": str(verdict.budget),
                "spent": str(verdict.spent),
                "needed": str(verdict.needed),
            }
        log.warning(
            "%s; sending anyway: the DAG lets the deadline win over the budget (over_budget='send')", sentence
        )
        overrun = {"over_budget_by": str(verdict.spent + verdict.needed - (verdict.budget or 0))}
    settings = realtime_limits(
        limits, extras=adapter.settings.extra, quota_key=quota_key, window_s=window_s, retry=retry
    )
    log.info(
        "sending %d items through the real-time API of %s (full price): %s rpm, %s tpm x %.2f headroom, "
        "shared under %r, %d in flight",
        len(rows),
        adapter.name,
        settings.rpm,
        settings.tpm,
        settings.headroom,
        settings.quota_key,
        settings.concurrency,
    )
    summary = asyncio.run(
        run_fallback(
            ledger=ledger,
            workload=workload,
            run_id=run_id,
            provider=adapter.name,
            client=adapter.realtime_client(),
            rows=rows,
            template=template,
            settings=settings,
            prices=prices,
        )
    )
    return {**summary, **overrun}


def job_to_realtime(ledger: Ledger, workload: str, run_id: str, job_id: str) -> list[OpenItem]:
    """Mark a below-minimum job as sent in real time (``sync``) and return its items still to send.

    The items are those staged for it, and those a crash left mid-send (``fallback``), which the
    send resumes.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param job_id: the job
    """
    ledger.update_job(job_id, state="sync")
    return list(
        ledger.iter_item_rows(workload, run_id, states=["staged", "fallback"], shape=OpenItem, job_id=job_id)
    )
