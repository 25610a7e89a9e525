from __future__ import annotations

import json
import re
from datetime import date, timedelta
from decimal import Decimal

import pytest

from airflow_batch_provider.core.cost import (
    UNREADABLE,
    AttemptRecord,
    ItemCostRecord,
    check_budget,
    compute_run_cost,
    estimate_cost,
    project_batch_shift,
)
from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.core.tokens import TokenEstimate, estimate_request_tokens
from airflow_batch_provider.exceptions import BudgetExceededError, PricingError

SONNET = ("anthropic", "claude-sonnet-4")  # $3 input, $15 output, $0.30 cache read per million


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load()


def item(
    state: str = "succeeded",
    route: str = "batch",
    *attempts: AttemptRecord,
    last_usage: Usage | None = None,
    estimate: TokenEstimate | None = None,
) -> ItemCostRecord:
    return ItemCostRecord(
        app_id="x",
        state=state,
        route=route,  # type: ignore[arg-type]
        provider=SONNET[0],
        model=SONNET[1],
        attempts=attempts,
        last_usage=last_usage,
        estimate=estimate,
    )


# Worked figure (a): 50,000 items sharing a 4,000-token prompt at $3 per million input tokens.


def test_50000_items_with_a_4000_token_prompt_cost_600_at_list_price(table: PriceTable) -> None:
    prompt_tokens = 50_000 * 4_000
    assert cost(Usage(input_tokens=prompt_tokens), table.price(*SONNET), "sync") == Decimal(600)


def test_the_same_prompt_costs_30_with_batch_and_cache_reads(table: PriceTable) -> None:
    price = table.price(*SONNET)
    assert price.batch_discount * price.cached_input / price.input == Decimal("0.05")
    assert cost(Usage(cached_input_tokens=50_000 * 4_000), price, "batch") == Decimal(30)


def test_the_run_report_of_50000_cached_batch_items_pays_30(table: PriceTable) -> None:
    row = item("succeeded", "batch", AttemptRecord(Usage(cached_input_tokens=4_000), "batch"))
    report = compute_run_cost([row] * 50_000, table)
    assert report.paid == Decimal(30)
    assert report.paid_by_kind["batch"] == Decimal(30)
    assert report.cost_per_usable_result == Decimal("0.0006")
    list_price = compute_run_cost(
        [item("succeeded", "fallback", AttemptRecord(Usage(input_tokens=4_000), "sync"))] * 50_000, table
    )
    assert list_price.paid == Decimal(600)


# Worked figure (b): 500,000 tasks at $0.012 each.


def test_500000_tasks_at_0012_cost_6000_synchronously_and_3000_in_batch(table: PriceTable) -> None:
    price = table.price(*SONNET)
    task = Usage(input_tokens=1_000, output_tokens=600)
    assert cost(task, price, "sync") == Decimal("0.012")
    row = item("succeeded", "batch", AttemptRecord(task, "batch"))
    report = compute_run_cost([row] * 500_000, table)
    assert report.to_dict()["sync_equivalent"] == "6000"
    assert report.sync_equivalent == Decimal(6_000)
    assert report.paid == Decimal(3_000)
    assert report.savings == Decimal(3_000)
    assert report.savings_ratio == Decimal("0.5")


# Worked figure (c): a quarter of a $648 monthly extraction bill moved to batch.


def test_moving_a_quarter_of_a_648_bill_to_batch_saves_81_leaving_567() -> None:
    shift = project_batch_shift(Decimal(648), Decimal("0.25"), Decimal("0.5"))
    assert shift.savings == Decimal(81)
    assert shift.new_cost == Decimal(567)


def test_the_same_quarter_shift_reproduced_from_tokens_in_a_run_report(table: PriceTable) -> None:
    monthly_tokens = 216_000_000  # x $3 per million = $648
    batch_part = item("succeeded", "batch", AttemptRecord(Usage(input_tokens=monthly_tokens // 4), "batch"))
    sync_part = item(
        "succeeded", "fallback", AttemptRecord(Usage(input_tokens=monthly_tokens * 3 // 4), "sync")
    )
    report = compute_run_cost([batch_part, sync_part], table)
    assert report.sync_equivalent == Decimal(648)
    assert report.paid == Decimal(567)
    assert report.savings == Decimal(81)


def test_a_batch_shift_outside_0_and_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"share 1\.5"):
        project_batch_shift(Decimal(1), Decimal("1.5"))


# Run report rules.


def test_every_kind_of_billed_attempt_is_counted_at_its_mode_price(table: PriceTable) -> None:
    million = Usage(input_tokens=1_000_000)
    rows = [
        item("succeeded", "batch", AttemptRecord(million, "batch")),
        item(
            "succeeded",
            "resubmitted",
            AttemptRecord(Usage(), "batch"),  # expired: nothing billed
            AttemptRecord(million, "batch"),
        ),
        item("succeeded", "fallback", AttemptRecord(Usage(), "batch"), AttemptRecord(million, "sync")),
        item(
            "review",
            "resubmitted",
            AttemptRecord(million, "batch", discarded=True, reason="invalid_output"),
            AttemptRecord(million, "batch", discarded=True, reason="invalid_output"),
        ),
    ]
    report = compute_run_cost(rows, table)
    assert dict(report.paid_by_kind) == {
        "batch": Decimal("1.5"),
        "resubmission": Decimal("1.5"),
        "fallback": Decimal(3),
        "discarded": Decimal(3),
    }
    assert report.paid == Decimal(9)
    assert report.sync_equivalent == Decimal(15)
    assert report.savings == Decimal(6)
    assert report.attempts == 7
    assert report.discarded_usage == Usage(input_tokens=2_000_000)
    assert report.usage.input_tokens == 5_000_000
    assert dict(report.items_by_route) == {
        "batch": 1,
        "resubmitted": 2,
        "fallback": 1,
        "exhausted_sync": 0,
        "unchanged": 0,
    }
    assert dict(report.items_by_state) == {"review": 1, "succeeded": 3}


def test_a_duplicate_result_line_is_paid_but_not_in_the_sync_equivalent(table: PriceTable) -> None:
    million = Usage(output_tokens=1_000_000)
    row = item(
        "succeeded",
        "batch",
        AttemptRecord(million, "batch"),
        AttemptRecord(million, "batch", discarded=True, reason="duplicate"),
    )
    report = compute_run_cost([row], table)
    assert report.paid == Decimal(15)
    assert report.paid_by_kind["discarded"] == Decimal("7.5")
    assert report.sync_equivalent == Decimal(15)
    assert report.savings == 0


def test_extra_billed_lines_are_paid_discarded_and_billed_with_the_unreadable_ones_reported_apart(
    table: PriceTable,
) -> None:
    million = Usage(output_tokens=1_000_000)
    row = item("succeeded", "batch", AttemptRecord(million, "batch"))
    extras = [
        AttemptRecord(million, "batch", True, "duplicate", *SONNET),
        AttemptRecord(Usage(input_tokens=2_000_000), "batch", True, UNREADABLE, *SONNET),
    ]
    report = compute_run_cost([row], table, extra_lines=extras)
    assert report.usage == Usage(input_tokens=2_000_000, output_tokens=2_000_000)
    assert report.discarded_usage == Usage(input_tokens=2_000_000, output_tokens=1_000_000)
    assert report.paid_by_kind["discarded"] == Decimal("7.5") + Decimal(3)  # $3 x 2M x half
    assert report.sync_equivalent == Decimal(15)  # the same work synchronously is paid once
    assert report.attempts == 3
    out = report.to_dict()
    assert out["extra_lines"] == {"duplicate": 1, "unreadable": 1}
    assert out["unreadable"] == {
        "lines": 1,
        "estimated_usage": {
            "input_tokens": 2_000_000,
            "cached_input_tokens": 0,
            "cache_write_tokens": 0,
            "output_tokens": 0,
        },
        "paid": "3",
    }
    assert "unreadable priced at an estimate $3.00" in report.render_table()


def test_cost_per_usable_result_divides_paid_by_succeeded_plus_unchanged(table: PriceTable) -> None:
    paid_row = item("succeeded", "batch", AttemptRecord(Usage(input_tokens=1_000_000), "batch"))
    failed = item("failed_permanent", "batch", AttemptRecord(Usage(input_tokens=1_000_000), "batch"))
    unchanged = item("unchanged", "unchanged", last_usage=Usage(input_tokens=1_000_000))
    report = compute_run_cost([paid_row, failed, unchanged, unchanged], table)
    assert report.paid == Decimal(3)
    assert report.usable_results == 3
    assert report.new_results == 1
    assert report.cost_per_usable_result == Decimal(1)
    assert report.cost_per_new_result == Decimal(3)


def test_skipping_unchanged_items_saves_their_last_cost_or_estimate_at_sync_price(table: PriceTable) -> None:
    rows = [
        item("unchanged", "unchanged", last_usage=Usage(input_tokens=1_000_000)),
        item("unchanged", "unchanged", estimate=TokenEstimate(input=1_000_000, max_output=100_000)),
        item("unchanged", "unchanged"),
    ]
    report = compute_run_cost(rows, table)
    assert report.unchanged_items == 3
    assert report.unchanged_savings == Decimal(3) + Decimal(3) + Decimal("1.5")
    assert report.unchanged_estimated == 1
    assert report.unchanged_unpriced == 1
    assert report.paid == 0
    assert report.total_savings == Decimal("7.5")


def test_an_empty_run_has_no_cost_per_result() -> None:
    report = compute_run_cost([], PriceTable.load())
    assert report.items == 0
    assert report.cost_per_usable_result is None
    assert report.savings_ratio is None
    assert "n/a" in report.render_table()


def test_a_fallback_attempt_on_another_model_is_priced_at_that_model(table: PriceTable) -> None:
    row = item(
        "succeeded",
        "fallback",
        AttemptRecord(Usage(input_tokens=1_000_000), "sync", provider="openai", model="gpt-4o-mini"),
    )
    assert compute_run_cost([row], table).paid == Decimal("0.15")


def test_infrastructure_cost_such_as_gpu_hours_is_added_to_paid(table: PriceTable) -> None:
    gpu = PriceTable.load({"providers": {"vllm": {"gpu_hour_usd": "2.50"}}})
    rate = gpu.gpu_hour_usd("vllm")
    assert rate is not None
    row = ItemCostRecord("x", "succeeded", "batch", "vllm", "llama", (AttemptRecord(Usage(10**6, 10**6)),))
    report = compute_run_cost([row], gpu, infrastructure_cost=rate * Decimal("1.5"))
    assert report.paid == Decimal("3.750")
    assert report.cost_per_usable_result == Decimal("3.75")


def test_an_unknown_route_or_model_is_refused(table: PriceTable) -> None:
    with pytest.raises(ValueError, match="'express'"):
        compute_run_cost([item("succeeded", "express")], table)
    unknown = ItemCostRecord("x", "succeeded", "batch", "openai", "gpt-9", (AttemptRecord(Usage(1)),))
    with pytest.raises(PricingError, match="gpt-9"):
        compute_run_cost([unknown], table)


def test_the_report_dict_is_json_safe_with_exact_decimal_strings(table: PriceTable) -> None:
    row = item("succeeded", "batch", AttemptRecord(Usage(input_tokens=1, output_tokens=1), "batch"))
    data = compute_run_cost([row], table).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["paid"] == "0.000009"
    assert Decimal(data["paid"]) == cost(Usage(1, 1), table.price(*SONNET), "batch")
    assert data["usage"] == {
        "input_tokens": 1,
        "cached_input_tokens": 0,
        "cache_write_tokens": 0,
        "output_tokens": 1,
    }
    assert data["prices_as_of"] == table.as_of


def test_the_log_table_shows_rounded_figures_and_every_line(table: PriceTable) -> None:
    row = item("succeeded", "batch", AttemptRecord(Usage(cached_input_tokens=4_000), "batch"))
    text = compute_run_cost([row] * 50_000, table).render_table()
    assert f"prices as of {table.as_of}" in text
    for label in (
        "paid",
        "same work synchronously",
        "savings",
        "cost per usable result",
        "discarded outputs",
    ):
        assert label in text
    assert "$30.00" in text
    assert "$60.00" in text
    assert "$0.000600" in text
    assert "50.0%" in text


# Pre-submit estimate and budget.


def request(n: int, system: str = "s" * 4000, model: str = "claude-sonnet-4") -> CanonicalRequest:
    return CanonicalRequest(
        app_id=f"r{n}",
        prompt_version="v1",
        model=model,
        system=system,
        messages=({"role": "user", "content": "u" * 400},),
        params={"max_tokens": 100},
    )


def test_the_estimate_prices_estimated_input_and_the_whole_output_ceiling(table: PriceTable) -> None:
    requests = [request(i) for i in range(10)]
    one = estimate_request_tokens(requests[0])
    estimate = estimate_cost(requests, table, "sync", provider="anthropic")
    expected = 10 * (one.input * Decimal(3) + one.max_output * Decimal(15)) / Decimal(1_000_000)
    assert estimate.cost == expected
    assert estimate.items == 10
    assert estimate.tokens.input == 10 * one.input
    assert estimate_cost(requests, table, "batch", provider="anthropic").cost == expected / 2
    assert Decimal(json.loads(json.dumps(estimate.to_dict()))["cost"]) == expected


def test_assuming_cache_hits_prices_one_write_then_reads_of_the_system_prompt(table: PriceTable) -> None:
    requests = [request(i) for i in range(10)]
    one = estimate_request_tokens(requests[0])
    cached = estimate_cost(requests, table, "sync", provider="anthropic", assume_cache_hits=True)
    rest = 10 * ((one.input - one.cacheable) * Decimal(3) + one.max_output * Decimal(15))
    prefix = one.cacheable * Decimal("3.75") + 9 * one.cacheable * Decimal("0.30")
    assert cached.cost == (rest + prefix) / Decimal(1_000_000)
    assert cached.cost < estimate_cost(requests, table, "sync", provider="anthropic").cost


def test_the_estimate_groups_by_model_and_refuses_unknown_models(table: PriceTable) -> None:
    mixed = [request(1), request(2, model="claude-haiku-4-5")]
    estimate = estimate_cost(mixed, table, "batch", provider="anthropic")
    assert set(estimate.by_model) == {"claude-sonnet-4", "claude-haiku-4-5"}
    assert sum(estimate.by_model.values()) == estimate.cost
    with pytest.raises(PricingError, match="claude-9"):
        estimate_cost([request(1, model="claude-9")], table, "batch", provider="anthropic")
    with pytest.raises(PricingError, match="'flex'"):
        estimate_cost(mixed, table, "flex", provider="anthropic")  # type: ignore[arg-type]


def test_a_budget_at_or_above_the_estimate_passes_and_none_means_no_budget(table: PriceTable) -> None:
    estimate = estimate_cost([request(1)], table, "batch", provider="anthropic")
    check_budget(estimate, estimate.cost)
    check_budget(estimate, None)
    check_budget(Decimal("9.99"), "10")


def test_an_estimate_over_budget_raises_with_estimate_budget_and_fix(table: PriceTable) -> None:
    requests = [request(i) for i in range(1000)]
    estimate = estimate_cost(requests, table, "batch", provider="anthropic")
    with pytest.raises(BudgetExceededError) as info:
        check_budget(estimate, Decimal("1"))
    message = str(info.value)
    assert f"estimated cost ${estimate.cost:,.4f}" in message
    assert "budget $1.0000" in message
    assert "1,000 batch requests to anthropic" in message
    assert "budget_usd" in message
    assert "max_tokens" in message


def test_a_report_priced_from_a_table_older_than_ninety_days_says_so(table: PriceTable) -> None:
    report = compute_run_cost([item("succeeded", "batch", AttemptRecord(Usage(1, 1), "batch"))], table)
    read = date.fromisoformat(table.as_of)
    assert "warning" not in report.render_table(today=read + timedelta(days=90))
    stale = report.render_table(today=read + timedelta(days=91))
    assert f"warning: prices as of {table.as_of} are 91 days old" in stale
    assert "pricing_override" in stale


def test_a_small_run_s_report_shows_its_cost_under_a_cent(table: PriceTable) -> None:
    row = item("succeeded", "batch", AttemptRecord(Usage(1_000, 100), "batch"))
    text = compute_run_cost([row] * 3, table).render_table()
    paid = next(line for line in text.splitlines() if line.startswith("paid"))
    assert re.fullmatch(r"\$0\.00\d\d+", paid.split()[-1]), paid
