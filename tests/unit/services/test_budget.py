"""The one budget check: paid so far plus the estimate of what is about to be sent, against the budget."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from airflow_batch_provider.core.options import BudgetOptions
from airflow_batch_provider.exceptions import BudgetExceededError
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.services import budget
from airflow_batch_provider.services.harvest import reconcile_job
from airflow_batch_provider.settings import load_prices
from tests.unit.services.test_harvest import price, submitted
from tests.unit.services.workload import PROMPT, RUN, WORKLOAD, world


def test_a_verdict_is_over_only_when_what_was_paid_plus_the_estimate_passes_the_budget(
    tmp_path: Path,
) -> None:
    with world(tmp_path) as w:
        w.stage(4)
        rows = list(w.ledger.iter_item_rows(WORKLOAD, RUN, states=["staged"], shape=OpenItem))
        estimate = budget.estimate_items(rows, load_prices(None), "batch", "openai")
        assert estimate.items == 4 and estimate.cost > 0
        assert not budget.verdict_of(estimate, None, Decimal(1000)).over  # no budget is never over
        assert not budget.verdict_of(estimate, estimate.cost, Decimal(0)).over  # exactly at the budget
        assert budget.verdict_of(estimate, estimate.cost, Decimal("0.000001")).over
        # a real-time send prices the same items at full price
        assert budget.estimate_items(rows, load_prices(None), "sync", "openai").cost > estimate.cost


def test_prepare_over_the_budget_is_told_before_the_error_and_nothing_moves(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.stage(3)
        told: list[budget.BudgetVerdict] = []
        with pytest.raises(BudgetExceededError, match="exceeds the budget"):
            budget.check_before_submit(
                w.ledger, WORKLOAD, RUN, BudgetOptions(budget_usd="0.0000001"), "openai", told.append
            )
        assert [(v.items, v.spent) for v in told] == [(3, Decimal(0))]
        assert w.ledger.count_states(WORKLOAD, RUN) == {"staged": 3}
        fits = budget.check_before_submit(
            w.ledger, WORKLOAD, RUN, BudgetOptions(budget_usd=100), "openai", told.append
        )
        assert fits is not None and not fits.over and len(told) == 1


def test_a_round_over_the_budget_goes_to_review_naming_what_was_paid_and_what_it_needed(
    tmp_path: Path,
) -> None:
    with world(tmp_path) as w:
        w.config(faults={"rate_500": 1.0})
        (job_id,) = submitted(w, 3)  # every line a retryable 500, each billed a little
        w.wait_terminal(job_id)
        reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        rows = lambda: w.ledger.iter_item_rows(WORKLOAD, RUN, states=["failed_retryable"], shape=OpenItem)  # noqa: E731
        told: list[budget.BudgetVerdict] = []
        roomy = BudgetOptions(budget_usd=100)
        assert budget.round_within_budget(w.ledger, WORKLOAD, RUN, 2, rows(), 3, roomy, "openai", told.append)
        assert told == [] and w.ledger.count_states(WORKLOAD, RUN) == {"failed_retryable": 3}
        tight = BudgetOptions(budget_usd="0.0000001")
        assert not budget.round_within_budget(
            w.ledger, WORKLOAD, RUN, 2, rows(), 3, tight, "openai", told.append
        )
        assert [v.items for v in told] == [3] and told[0].spent == w.ledger.run_cost(WORKLOAD, RUN)
        assert w.ledger.count_states(WORKLOAD, RUN) == {"review": 3}
        (message,) = {
            r["error_message"] for r in w.ledger.iter_items(WORKLOAD, RUN, columns=["error_message"])
        }
        assert message.startswith("round 2 not started:") and "raise BudgetOptions(budget_usd=...)" in message
        codes = {r["error_code"] for r in w.ledger.iter_items(WORKLOAD, RUN, columns=["error_code"])}
        assert codes == {budget.BUDGET_EXCEEDED}
