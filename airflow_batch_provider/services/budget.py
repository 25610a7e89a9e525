"""The one budget check: what the run has paid plus what the next send is estimated at, against its budget.

Three moments ask it, each with the estimate of what it is about to send:

- **prepare**, before round 1 is submitted: the staged items at batch prices (nothing is paid yet);
  over the budget the task fails (:class:`~airflow_batch_provider.exceptions.BudgetExceededError`);
- **resubmit**, before a round starts: its items at batch prices plus what the run has paid; over
  the budget the round is not started and its items go to ``review`` (``budget_exceeded``);
- **a real-time send** (:mod:`~airflow_batch_provider.services.realtime`): the items at full
  price plus what the run has paid; over the budget nothing is sent.

Every estimate is an upper bound (each item at its output ceiling, see
:func:`~airflow_batch_provider.core.cost.estimate_cost`). What a refusal tells a person (an alert)
is the caller's: these functions return the verdict and never need Airflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from airflow_batch_provider.core.cost import CostEstimate, check_budget, estimate_cost
from airflow_batch_provider.core.options import BudgetOptions
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.states import RETRYABLE_STATES
from airflow_batch_provider.exceptions import PricingError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.notifications import BatchEvent
from airflow_batch_provider.settings import load_prices

if TYPE_CHECKING:
    from airflow_batch_provider.core.pricing import PriceMode, PriceTable

log = logging.getLogger(__name__)

#: error code of the items of a resubmit round the budget refused
BUDGET_EXCEEDED: Final = "budget_exceeded"


@dataclass(frozen=True)
class BudgetVerdict:
    """What the one budget check found.

    :param budget: the run's budget (``None``: none)
    :param spent: what the run has paid so far (``0`` before its first submit)
    :param needed: the estimate of what is about to be sent
    :param items: how many items that estimate holds
    """

    budget: Decimal | None
    spent: Decimal
    needed: Decimal
    items: int = 0

    @property
    def over(self) -> bool:
        """Whether sending would take the run past its budget."""
        return self.budget is not None and self.spent + self.needed > self.budget

    def describe(self, items: int) -> str:
        """A sentence for the log and the items' error message of a refused real-time send.

        :param items: how many items the send holds
        """
        return (
            f"sending {items} items through the real-time API (about ${self.needed.quantize(Decimal('0.000001'))}) "
            f"would take the run past its budget of ${self.budget} (${self.spent} paid)"
        )


def estimate_items(
    rows: Iterable[OpenItem], prices: PriceTable, mode: PriceMode, provider: str
) -> CostEstimate:
    """The cost estimate of sending ``rows`` (streamed: no list of them is held).

    :param rows: the items (their canonical requests)
    :param prices: the price table
    :param mode: ``batch`` or ``sync`` (real-time, full price)
    :param provider: the adapter name
    """
    requests = (CanonicalRequest.from_dict(json.loads(r.request_json)) for r in rows)
    return estimate_cost(requests, prices, mode, provider=provider)


def verdict_of(estimate: CostEstimate, budget: Decimal | None, spent: Decimal) -> BudgetVerdict:
    """The one comparison: ``spent + estimate`` against ``budget``.

    :param estimate: what is about to be sent
    :param budget: the run's budget (``None``: none; never over)
    :param spent: what the run has paid so far
    """
    return BudgetVerdict(budget, spent, estimate.cost, estimate.items)


def check_before_submit(
    ledger: Ledger,
    workload: str,
    run_id: str,
    budget: BudgetOptions,
    provider: str,
    on_refused: Callable[[BudgetVerdict], None],
) -> BudgetVerdict | None:
    """Log the estimate of the items staged and not yet submitted; raise over the budget.

    Returns ``None`` when there is no budget and the items cannot be priced (logged).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param budget: the run's budget and prices
    :param provider: the adapter name
    :param on_refused: called with the verdict before the error is raised (the alert)
    :raises BudgetExceededError: the estimate exceeds the budget (nothing was submitted)
    """
    rows = ledger.iter_item_rows(workload, run_id, states=["staged"], shape=OpenItem)
    try:
        estimate = estimate_items(rows, load_prices(budget.pricing_override), "batch", provider)
    except PricingError as exc:
        if budget.budget is not None:
            raise
        log.warning("no cost estimate: %s", exc)
        return None
    shown = "none" if budget.budget is None else f"${budget.budget}"
    log.info(
        "cost estimate before submit: $%s for %d items (%d input tokens, up to %d output tokens, "
        "batch prices as of %s); budget %s",
        estimate.cost.quantize(Decimal("0.000001")),
        estimate.items,
        estimate.tokens.input,
        estimate.tokens.max_output,
        estimate.prices_as_of,
        shown,
    )
    verdict = verdict_of(estimate, budget.budget, Decimal(0))
    if verdict.over:
        on_refused(verdict)
    check_budget(estimate, budget.budget)
    return verdict


def refused_before_submit(
    workload: str, run_id: str, verdict: BudgetVerdict, dag_id: str | None
) -> BatchEvent:
    """The ``budget_refused`` alert of a run whose first round the budget refused (nothing was paid).

    :param workload: workload name
    :param run_id: the run
    :param verdict: the refusing verdict
    :param dag_id: the DAG
    """
    needed = verdict.needed.quantize(Decimal("0.000001"))
    return BatchEvent(
        "budget_refused",
        workload,
        run_id,
        f"{workload}: the run was not submitted: its {verdict.items:,} items are estimated at up to "
        f"${needed}, over the ${verdict.budget} budget. Nothing was paid; "
        "raise BudgetOptions(budget_usd=...), send fewer items, or use a cheaper model.",
        "error",
        {"budget": str(verdict.budget), "spent": "0", "needed": str(verdict.needed), "items": verdict.items},
        dag_id,
    )


def round_within_budget(
    ledger: Ledger,
    workload: str,
    run_id: str,
    round_number: int,
    rows: Iterable[OpenItem],
    max_attempts: int,
    budget: BudgetOptions,
    provider: str,
    on_refused: Callable[[BudgetVerdict], None],
) -> bool:
    """Say whether a resubmit round fits the budget; if not, send its items to review.

    The estimate streams ``rows``; the move to review addresses the same items in one statement
    (retryable, under the attempts cap), with error code ``budget_exceeded``.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param round_number: the round about to start
    :param rows: the round's items (streamed)
    :param max_attempts: the attempts cap
    :param budget: the run's budget (set) and prices
    :param provider: the adapter name
    :param on_refused: called with the verdict of a refused round (the alert)
    """
    estimate = estimate_items(rows, load_prices(budget.pricing_override), "batch", provider)
    verdict = verdict_of(estimate, budget.budget, ledger.run_cost(workload, run_id))
    if not verdict.over:
        log.info(
            "round %d estimate $%s; paid so far $%s; budget $%s",
            round_number,
            verdict.needed,
            verdict.spent,
            verdict.budget,
        )
        return True
    message = (
        f"round {round_number} not started: ${verdict.spent:.6f} already paid plus ${verdict.needed:.6f} "
        f"estimated for {verdict.items} items exceeds the run's budget of ${verdict.budget}; raise "
        "BudgetOptions(budget_usd=...) to resubmit them."
    )
    log.error("%s They go to review (error code %s).", message, BUDGET_EXCEEDED)
    on_refused(verdict)
    ledger.transition(
        workload,
        run_id,
        "review",
        sorted(RETRYABLE_STATES),
        attempts_below=max_attempts,
        error_code=BUDGET_EXCEEDED,
        error_message=message,
    )
    return False
