"""The one real-time send: its budget check, and the DAG's cap on an item's tries, against the emulator.

No mocks: the OpenAI SDK's async client talks HTTP to the emulator on 127.0.0.1; the ledger is
SQLite in the test's folder.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from airflow_batch_provider.core.options import BudgetOptions, FallbackLimits
from airflow_batch_provider.core.pricing import PriceTable
from airflow_batch_provider.core.ratelimit import RetryPolicy
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.realtime import OVER_BUDGET, send_realtime
from tests.unit.services.test_fallback import (
    PROMPT,
    RUN,
    WORKLOAD,
    _adapter,
    _counter,
    _open_rows,
    _put_faults,
    _seed,
    _sync_requests,
    emulator,
    ledger,
)

__all__ = ["emulator", "ledger"]  # the fixtures, shared with the fallback's tests

ITEMS = 3
FAST = RetryPolicy(max_attempts=9, initial_delay=0.01, max_delay=0.02)


def _send(
    ledger: Ledger, url: str, limits: FallbackLimits, budget: BudgetOptions, **kw: str
) -> dict[str, Any]:
    return send_realtime(
        ledger=ledger,
        adapter=_adapter(url),
        quota_key=None,
        workload=WORKLOAD,
        run_id=RUN,
        rows=_open_rows(ledger),
        template=PROMPT,
        limits=limits,
        budget=budget,
        prices=PriceTable.load(),
        refused_state="review",
        retry=FAST,
        **kw,
    )


def test_each_item_is_tried_as_often_as_the_dags_fallback_limits_say_and_then_goes_to_review(
    ledger: Ledger, emulator: str
) -> None:
    _put_faults(emulator, {"sync_500_rate": 1.0})
    _seed(ledger, {f"c{i}": f"comment {i}" for i in range(ITEMS)})
    summary = _send(ledger, emulator, FallbackLimits(attempts=2), BudgetOptions())
    assert _counter(emulator, "sync_500") == 2 * ITEMS, summary  # the policy said 9; the DAG's cap wins
    assert ledger.count_states(WORKLOAD, RUN) == {"review": ITEMS}
    rows = list(ledger.iter_items(WORKLOAD, RUN, states=["review"], columns=["error_code"]))
    assert {r["error_code"] for r in rows} == {"server_error"}


def test_over_the_budget_nothing_is_sent_and_the_items_wait_in_review_saying_why(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {f"c{i}": f"comment {i}" for i in range(ITEMS)})
    summary = _send(ledger, emulator, FallbackLimits(), BudgetOptions(budget_usd=Decimal("0.0000001")))
    assert summary["items"] == 0 and summary["refused"] == ITEMS
    assert _sync_requests(emulator) == 0
    rows = list(ledger.iter_items(WORKLOAD, RUN, states=["review"], columns=["error_code", "error_message"]))
    assert len(rows) == ITEMS and {r["error_code"] for r in rows} == {OVER_BUDGET}
    assert all("BudgetOptions(budget_usd=...)" in r["error_message"] for r in rows)


def test_when_the_deadline_wins_the_items_are_sent_over_the_budget_and_the_overrun_is_shown(
    ledger: Ledger, emulator: str
) -> None:
    _seed(ledger, {f"c{i}": f"comment {i}" for i in range(ITEMS)})
    summary = _send(
        ledger, emulator, FallbackLimits(), BudgetOptions(budget_usd=Decimal("0.0000001")), over_budget="send"
    )
    assert summary["succeeded"] == ITEMS
    assert Decimal(summary["over_budget_by"]) > 0
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": ITEMS}
