"""Run cost report, pre-submit estimate and budget check: pure functions over plain records.

What a run paid is the sum over every billed attempt of every item, each at the price of its
mode (see :mod:`airflow_batch_provider.core.pricing` for the cost rule):

- ``batch``: an item's first batch attempt, at batch price;
- ``resubmission``: its later batch attempts (retryable failures, expiries), at batch price;
- ``fallback``: synchronous attempts (after the deadline, or after an item exhausted its batch
  attempts: route ``exhausted_sync``), at full price;
- ``discarded``: attempts whose output was paid for and thrown away (``invalid_output``, a
  duplicate result line), at the price of their mode. They are counted, never hidden;
- ``infrastructure``: anything not billed per token, e.g. vLLM GPU hours x ``gpu_hour_usd``.

What the same work would have cost synchronously: the same tokens of every attempt at standard
prices, except duplicate result lines, which a synchronous call cannot produce. Savings are the
difference. Items skipped as ``unchanged`` are not in either figure; what skipping them saved
is reported on its own, priced at standard rates from their last known usage or, failing that,
from a token estimate (input plus the full output ceiling, so an upper bound).

Cost per usable result = paid / usable results of this run, where usable means the item ends the
run in a state that holds a result the workload can publish: ``succeeded`` (this run) or
``unchanged`` (an earlier success whose input has not changed). Unchanged items count because
the run delivers them and skipping them is a decision the run made to spend less; leaving them
out would hide that saving. Failed, review, skipped and pending items count in the cost but not
in the denominator, so waste raises the figure. ``cost_per_new_result`` (paid / succeeded) is
given as well, for comparing runs with different shares of unchanged items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from airflow_batch_provider.core.price_age import price_age_warning
from airflow_batch_provider.core.pricing import (
    ModelPrice,
    PriceMode,
    PriceTable,
    cost,
    decimal_str,
    format_usd,
)
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.core.tokens import TokenEstimate, estimate_request_tokens
from airflow_batch_provider.exceptions import BudgetExceededError, PricingError

Route = Literal["batch", "resubmitted", "fallback", "exhausted_sync", "unchanged"]
ROUTES: Final[tuple[str, ...]] = get_args(Route)
AttemptKind = Literal["batch", "resubmission", "fallback", "discarded"]
ATTEMPT_KINDS: Final[tuple[str, ...]] = get_args(AttemptKind)
#: ``AttemptRecord.reason`` of a duplicate result line: paid, discarded, not in the sync figure.
DUPLICATE: Final = "duplicate"
#: ``AttemptRecord.reason`` of a billed line whose usage could not be read (priced at an estimate).
UNREADABLE: Final = "unreadable"
_ZERO: Final = Decimal(0)


@dataclass(frozen=True)
class AttemptRecord:
    """One billed attempt of one item.

    :param usage: tokens the provider billed for it
    :param mode: ``batch`` or ``sync``
    :param discarded: its output was paid for and not used
    :param reason: why it was discarded: ``invalid_output`` or ``duplicate``
    :param provider: provider of this attempt, when it differs from the item's (fallback)
    :param model: model of this attempt, when it differs from the item's (fallback)
    """

    usage: Usage
    mode: PriceMode = "batch"
    discarded: bool = False
    reason: str | None = None
    provider: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class ItemCostRecord:
    """One item's part in a run.

    :param app_id: the item's application id
    :param state: its final state in the run
    :param route: how it got there: ``batch``, ``resubmitted``, ``fallback`` (the real-time API at
        the deadline), ``exhausted_sync`` (the real-time API after exhausting its batch attempts)
        or ``unchanged``
    :param provider: provider name
    :param model: model name
    :param attempts: its billed attempts in this run, in order
    :param last_usage: for an unchanged item, the usage of the earlier success it reuses
    :param estimate: for an unchanged item without ``last_usage``, its token estimate
    """

    app_id: str
    state: str
    route: Route
    provider: str
    model: str
    attempts: tuple[AttemptRecord, ...] = ()
    last_usage: Usage | None = None
    estimate: TokenEstimate | None = None


def _dec_str(value: Decimal | None) -> str | None:
    return None if value is None else decimal_str(value)


def _usage_dict(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.input_tokens,
        "cached_input_tokens": usage.cached_input_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens,
    }


@dataclass(frozen=True)
class RunCostReport:
    """What a run cost, what it would have cost synchronously, and per usable result.

    All amounts are exact USD :class:`~decimal.Decimal`; :meth:`render_table` rounds for display.

    :param items: items in the run
    :param items_by_state: final state -> items
    :param items_by_route: route -> items
    :param attempts: billed attempts
    :param usage: tokens of every billed attempt, discarded ones included
    :param discarded_usage: tokens of discarded attempts
    :param paid: what the run paid, infrastructure included
    :param paid_by_kind: ``batch``, ``resubmission``, ``fallback``, ``discarded`` -> amount
    :param infrastructure_cost: cost not billed per token (GPU hours)
    :param sync_equivalent: the same work at standard (synchronous) prices
    :param savings: ``sync_equivalent - paid``
    :param usable_results: items ending ``succeeded`` or ``unchanged``
    :param new_results: items ending ``succeeded``
    :param cost_per_usable_result: ``paid / usable_results``, ``None`` when there are none
    :param cost_per_new_result: ``paid / new_results``, ``None`` when there are none
    :param unchanged_items: items skipped because their input had not changed
    :param unchanged_savings: what sending them again would have cost at standard prices
    :param unchanged_estimated: unchanged items priced from an estimate, not a known usage
    :param unchanged_unpriced: unchanged items with neither, counted as 0
    :param prices_as_of: date of the price table used
    :param currency: currency of every amount
    """

    items: int
    items_by_state: Mapping[str, int]
    items_by_route: Mapping[str, int]
    attempts: int
    usage: Usage
    discarded_usage: Usage
    paid: Decimal
    paid_by_kind: Mapping[str, Decimal]
    infrastructure_cost: Decimal
    sync_equivalent: Decimal
    savings: Decimal
    usable_results: int
    new_results: int
    cost_per_usable_result: Decimal | None
    cost_per_new_result: Decimal | None
    unchanged_items: int
    unchanged_savings: Decimal
    unchanged_estimated: int
    unchanged_unpriced: int
    prices_as_of: str
    currency: str = "USD"
    extra_lines: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    unreadable_usage: Usage = field(default_factory=Usage)
    unreadable_paid: Decimal = _ZERO

    @property
    def savings_ratio(self) -> Decimal | None:
        """``savings / sync_equivalent``, ``None`` when nothing would have been paid."""
        if self.sync_equivalent == 0:
            return None
        return self.savings / self.sync_equivalent

    @property
    def total_savings(self) -> Decimal:
        """Savings from batch prices plus savings from skipping unchanged items."""
        return self.savings + self.unchanged_savings

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict; amounts are exact decimal strings."""
        return {
            "currency": self.currency,
            "prices_as_of": self.prices_as_of,
            "items": self.items,
            "items_by_state": dict(self.items_by_state),
            "items_by_route": dict(self.items_by_route),
            "attempts": self.attempts,
            "usage": _usage_dict(self.usage),
            "discarded_usage": _usage_dict(self.discarded_usage),
            "paid": decimal_str(self.paid),
            "paid_by_kind": {k: decimal_str(v) for k, v in self.paid_by_kind.items()},
            "infrastructure_cost": decimal_str(self.infrastructure_cost),
            "sync_equivalent": decimal_str(self.sync_equivalent),
            "savings": decimal_str(self.savings),
            "savings_ratio": _dec_str(self.savings_ratio),
            "usable_results": self.usable_results,
            "new_results": self.new_results,
            "cost_per_usable_result": _dec_str(self.cost_per_usable_result),
            "cost_per_new_result": _dec_str(self.cost_per_new_result),
            "unchanged_items": self.unchanged_items,
            "unchanged_savings": decimal_str(self.unchanged_savings),
            "unchanged_estimated": self.unchanged_estimated,
            "unchanged_unpriced": self.unchanged_unpriced,
            "total_savings": decimal_str(self.total_savings),
            "extra_lines": dict(self.extra_lines),
            "unreadable": {
                "lines": self.extra_lines.get(UNREADABLE, 0),
                "estimated_usage": _usage_dict(self.unreadable_usage),
                "paid": decimal_str(self.unreadable_paid),
            },
        }

    def render_table(self, today: date | None = None) -> str:
        """Return a plain-text table for the task log (amounts rounded for display only).

        :param today: the report's date, against which the price table's age is checked (default: today)
        """

        def counts(mapping: Mapping[str, int]) -> str:
            return ", ".join(f"{k} {v:,}" for k, v in mapping.items() if v) or "none"

        def per_result(value: Decimal | None) -> str:
            return "n/a (no results)" if value is None else format_usd(value, 6)

        ratio = self.savings_ratio
        pct = "" if ratio is None else f" ({(ratio * 100).quantize(Decimal('0.1'))}%)"
        u = self.usage
        rows: list[tuple[str, str]] = [
            ("items", f"{self.items:,}"),
            ("  by final state", counts(self.items_by_state)),
            ("  by route", counts(self.items_by_route)),
            ("billed attempts", f"{self.attempts:,}"),
            (
                "tokens",
                f"input {u.input_tokens:,}, cache read {u.cached_input_tokens:,}, "
                f"cache write {u.cache_write_tokens:,}, output {u.output_tokens:,}",
            ),
            ("paid", format_usd(self.paid)),
            ("  batch", format_usd(self.paid_by_kind["batch"])),
            ("  resubmissions", format_usd(self.paid_by_kind["resubmission"])),
            ("  sync fallback (full price)", format_usd(self.paid_by_kind["fallback"])),
            ("  discarded outputs", format_usd(self.paid_by_kind["discarded"])),
            (
                "    extra billed lines",
                counts(self.extra_lines)
                + (
                    f"; unreadable priced at an estimate {format_usd(self.unreadable_paid)}"
                    if self.unreadable_usage.total_tokens
                    else ""
                ),
            ),
            ("  infrastructure", format_usd(self.infrastructure_cost)),
            ("same work synchronously", format_usd(self.sync_equivalent)),
            ("savings", f"{format_usd(self.savings)}{pct}"),
            (
                "unchanged items skipped",
                f"{self.unchanged_items:,}, saved {format_usd(self.unchanged_savings)}",
            ),
            ("usable results", f"{self.usable_results:,} (succeeded + unchanged)"),
            ("cost per usable result", per_result(self.cost_per_usable_result)),
            ("cost per new result", per_result(self.cost_per_new_result)),
        ]
        width = max(len(label) for label, _ in rows)
        title = f"Run cost ({self.currency}, prices as of {self.prices_as_of})"
        rule = "-" * max(len(title), width + 2 + max(len(v) for _, v in rows))
        lines = [title, rule, *(f"{label.ljust(width)}  {value}" for label, value in rows), rule]
        stale = price_age_warning(self.prices_as_of, today or date.today())
        return "\n".join([*lines, stale] if stale else lines)


def _attempt_kind(attempt: AttemptRecord, batch_index: int) -> AttemptKind:
    if attempt.discarded:
        return "discarded"
    if attempt.mode == "sync":
        return "fallback"
    return "batch" if batch_index == 0 else "resubmission"


def _estimate_usage(estimate: TokenEstimate) -> Usage:
    return Usage(input_tokens=estimate.input, output_tokens=estimate.max_output)


def compute_run_cost(
    rows: Iterable[ItemCostRecord],
    prices: PriceTable,
    infrastructure_cost: Decimal = _ZERO,
    extra_lines: Iterable[AttemptRecord] = (),
) -> RunCostReport:
    """Compute a run's cost report from per-item records (see the module docstring).

    :param rows: one record per item of the run
    :param prices: the price table
    :param infrastructure_cost: cost not billed per token, e.g. vLLM GPU hours x
        ``prices.gpu_hour_usd("vllm")``
    :param extra_lines: billed result lines beyond the items' answers (a second answer, a
        superseded error with usage, an unreadable line at an estimate), each with its
        ``provider``, ``model`` and ``reason``; paid and discarded, counted in the billed usage,
        never in the synchronous figure (the same work synchronously is paid once)
    :raises PricingError: a model has no price
    :raises ValueError: a record names an unknown route
    """
    by_state: Counter[str] = Counter()
    by_route: Counter[str] = Counter()
    paid_by_kind: dict[str, Decimal] = dict.fromkeys(ATTEMPT_KINDS, _ZERO)
    usage = Usage()
    discarded_usage = Usage()
    sync_equivalent = _ZERO
    unchanged_savings = _ZERO
    attempts = items = unchanged = estimated = unpriced = 0
    cache: dict[tuple[str, str], ModelPrice] = {}

    def price_of(provider: str, model: str) -> ModelPrice:
        key = (provider, model)
        if key not in cache:
            cache[key] = prices.price(provider, model)
        return cache[key]

    for row in rows:
        if row.route not in ROUTES:
            raise ValueError(
                f"item {row.app_id!r}: route {row.route!r} is not one of {list(ROUTES)}; fix the record."
            )
        items += 1
        by_state[row.state] += 1
        by_route[row.route] += 1
        batch_index = 0
        for attempt in row.attempts:
            price = price_of(attempt.provider or row.provider, attempt.model or row.model)
            kind = _attempt_kind(attempt, batch_index)
            if attempt.mode == "batch":
                batch_index += 1
            amount = cost(attempt.usage, price, attempt.mode)
            paid_by_kind[kind] += amount
            attempts += 1
            usage += attempt.usage
            if attempt.discarded:
                discarded_usage += attempt.usage
            if attempt.reason != DUPLICATE:
                sync_equivalent += cost(attempt.usage, price, "sync")
        if row.route == "unchanged" or row.state == "unchanged":
            unchanged += 1
            if row.last_usage is not None:
                unchanged_savings += cost(row.last_usage, price_of(row.provider, row.model), "sync")
            elif row.estimate is not None:
                estimated += 1
                unchanged_savings += cost(
                    _estimate_usage(row.estimate), price_of(row.provider, row.model), "sync"
                )
            else:
                unpriced += 1

    extra_counts: Counter[str] = Counter()
    unreadable_usage = Usage()
    unreadable_paid = _ZERO
    for line in extra_lines:
        amount = cost(line.usage, price_of(line.provider or "", line.model or ""), line.mode)
        extra_counts[line.reason or DUPLICATE] += 1
        paid_by_kind["discarded"] += amount
        attempts += 1
        usage += line.usage
        discarded_usage += line.usage
        if line.reason == UNREADABLE:
            unreadable_usage += line.usage
            unreadable_paid += amount

    paid = sum(paid_by_kind.values(), _ZERO) + infrastructure_cost
    usable = sum(n for s, n in by_state.items() if s in USABLE_STATES)
    new = by_state.get("succeeded", 0)
    return RunCostReport(
        items=items,
        items_by_state=MappingProxyType(dict(sorted(by_state.items()))),
        items_by_route=MappingProxyType({r: by_route.get(r, 0) for r in ROUTES}),
        attempts=attempts,
        usage=usage,
        discarded_usage=discarded_usage,
        paid=paid,
        paid_by_kind=MappingProxyType(paid_by_kind),
        infrastructure_cost=infrastructure_cost,
        sync_equivalent=sync_equivalent,
        savings=sync_equivalent - paid,
        usable_results=usable,
        new_results=new,
        cost_per_usable_result=paid / usable if usable else None,
        cost_per_new_result=paid / new if new else None,
        unchanged_items=unchanged,
        unchanged_savings=unchanged_savings,
        unchanged_estimated=estimated,
        unchanged_unpriced=unpriced,
        prices_as_of=prices.as_of,
        currency=prices.currency,
        extra_lines=MappingProxyType(dict(sorted(extra_counts.items()))),
        unreadable_usage=unreadable_usage,
        unreadable_paid=unreadable_paid,
    )


@dataclass(frozen=True)
class CostEstimate:
    """A pre-submit cost estimate: an upper bound unless cache hits are assumed.

    :param provider: provider name
    :param mode: ``batch`` or ``sync``
    :param items: requests estimated
    :param tokens: summed token estimate (input, output ceiling, cacheable prefix)
    :param cost: estimated USD cost
    :param by_model: model -> estimated cost
    :param assume_cache_hits: whether the shared system prompt was priced as cache reads
    :param prices_as_of: date of the price table used
    """

    provider: str
    mode: PriceMode
    items: int
    tokens: TokenEstimate
    cost: Decimal
    by_model: Mapping[str, Decimal] = field(default_factory=dict)
    assume_cache_hits: bool = False
    prices_as_of: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict; amounts are exact decimal strings."""
        return {
            "provider": self.provider,
            "mode": self.mode,
            "items": self.items,
            "input_tokens": self.tokens.input,
            "max_output_tokens": self.tokens.max_output,
            "cacheable_tokens": self.tokens.cacheable,
            "cost": decimal_str(self.cost),
            "by_model": {k: decimal_str(v) for k, v in self.by_model.items()},
            "assume_cache_hits": self.assume_cache_hits,
            "prices_as_of": self.prices_as_of,
        }


def estimate_cost(
    requests: Iterable[CanonicalRequest],
    price_table: PriceTable,
    mode: PriceMode,
    *,
    provider: str,
    assume_cache_hits: bool = False,
) -> CostEstimate:
    """Estimate what sending ``requests`` will cost, before sending them.

    Tokens come from :func:`~airflow_batch_provider.core.tokens.estimate_request_tokens`, and
    every request is assumed to use its whole output ceiling, so the figure is an upper bound.
    With ``assume_cache_hits``, the shared system prompt is priced as one cache write per model
    and cache reads after that (optimistic: providers cache only prefixes above a minimum
    length, and only while the cache is warm).

    :param requests: the canonical requests
    :param price_table: the price table
    :param mode: ``batch`` or ``sync``
    :param provider: the provider the requests go to
    :param assume_cache_hits: price the system prompt as cache reads
    :raises PricingError: a model has no price, or ``mode`` is unknown
    """
    if mode not in ("batch", "sync"):
        raise PricingError(f"price mode {mode!r} is not one of ['batch', 'sync']: pass 'batch' or 'sync'.")
    total = TokenEstimate(0, 0, 0)
    by_model: dict[str, Decimal] = {}
    seen_prefix: set[tuple[str, str | None]] = set()
    cache: dict[str, ModelPrice] = {}
    items = 0
    for request in requests:
        items += 1
        estimate = estimate_request_tokens(request)
        total += estimate
        if request.model not in cache:
            cache[request.model] = price_table.price(provider, request.model)
        if assume_cache_hits and estimate.cacheable:
            key = (request.model, request.system)
            first = key not in seen_prefix
            seen_prefix.add(key)
            usage = Usage(
                input_tokens=estimate.input - estimate.cacheable,
                output_tokens=estimate.max_output,
                cached_input_tokens=0 if first else estimate.cacheable,
                cache_write_tokens=estimate.cacheable if first else 0,
            )
        else:
            usage = Usage(input_tokens=estimate.input, output_tokens=estimate.max_output)
        by_model[request.model] = by_model.get(request.model, _ZERO) + cost(usage, cache[request.model], mode)
    return CostEstimate(
        provider=provider,
        mode=mode,
        items=items,
        tokens=total,
        cost=sum(by_model.values(), _ZERO),
        by_model=MappingProxyType(dict(sorted(by_model.items()))),
        assume_cache_hits=assume_cache_hits,
        prices_as_of=price_table.as_of,
    )


def check_budget(estimate: CostEstimate | Decimal, budget: Decimal | int | str | None) -> None:
    """Raise when the estimate exceeds the budget; ``None`` means no budget.

    :param estimate: a :class:`CostEstimate` or an amount in USD
    :param budget: the run's budget in USD
    :raises BudgetExceededError: the estimate is above the budget; the message gives both, the
        excess and the fix
    """
    if budget is None:
        return
    limit = Decimal(budget) if not isinstance(budget, Decimal) else budget
    amount = estimate.cost if isinstance(estimate, CostEstimate) else estimate
    if amount <= limit:
        return
    what = ""
    if isinstance(estimate, CostEstimate):
        what = (
            f" for {estimate.items:,} {estimate.mode} requests to {estimate.provider} "
            f"({estimate.tokens.input:,} input tokens, up to {estimate.tokens.max_output:,} output tokens; "
            f"prices as of {estimate.prices_as_of})"
        )
    raise BudgetExceededError(
        f"estimated cost {format_usd(amount, 4)}{what} exceeds the budget {format_usd(limit, 4)} "
        f"by {format_usd(amount - limit, 4)}. Raise the budget (budget_usd), lower max_tokens, send "
        "fewer items per run, or use a cheaper model; the estimate is an upper bound (every item is "
        "assumed to use its whole output ceiling)."
    )


@dataclass(frozen=True)
class BatchShift:
    """What moving part of a synchronous bill to batch saves.

    :param sync_cost: the bill, all synchronous
    :param new_cost: the bill with ``share`` of it in batch
    :param savings: ``sync_cost - new_cost``
    """

    sync_cost: Decimal
    new_cost: Decimal
    savings: Decimal


def project_batch_shift(
    sync_cost: Decimal, share: Decimal, batch_discount: Decimal = Decimal("0.5")
) -> BatchShift:
    """Project a bill after moving ``share`` of its synchronous work to batch.

    ``savings = sync_cost x share x (1 - batch_discount)``.

    :param sync_cost: the current, all-synchronous bill
    :param share: the part moved to batch, between 0 and 1
    :param batch_discount: the provider's batch multiplier (0.5 = half price)
    :raises ValueError: ``share`` or ``batch_discount`` is outside 0..1
    """
    if not Decimal(0) <= share <= 1:
        raise ValueError(f"share {share} is outside 0..1; give the fraction of the bill moved to batch.")
    if not Decimal(0) <= batch_discount <= 1:
        raise ValueError(f"batch_discount {batch_discount} is outside 0..1; 0.5 means half price.")
    savings = sync_cost * share * (1 - batch_discount)
    return BatchShift(sync_cost=sync_cost, new_cost=sync_cost - savings, savings=savings)
