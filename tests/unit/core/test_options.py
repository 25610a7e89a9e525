"""The grouped options: checked when built, frozen, and JSON round trips."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from airflow_batch_provider.core.deadline import DeadlineSpec
from airflow_batch_provider.core.options import (
    HARVEST_TIMEOUT_S,
    BudgetOptions,
    ChunkOptions,
    DeadlineOptions,
    FallbackLimits,
    check_lane,
    refuse_moved,
)
from airflow_batch_provider.exceptions import ConfigurationError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ChunkOptions(max_requests=0),
            r"ChunkOptions\(max_requests=0\): give a whole number of 1 or more",
        ),
        (lambda: ChunkOptions(max_bytes=-5), r"ChunkOptions\(max_bytes=-5\)"),
        (
            lambda: ChunkOptions(max_requests="20"),
            r"ChunkOptions\(max_requests='20'\)",
        ),  # a string, no template
        (
            lambda: ChunkOptions(max_requests=True),
            r"ChunkOptions\(max_requests=True\)",
        ),  # hostile: a bool is an int
        (lambda: ChunkOptions(max_reject_ratio=1.5), r"max_reject_ratio=1.5\): give a share from 0 to 1"),
        (lambda: ChunkOptions(max_reject_ratio=float("nan")), r"max_reject_ratio=nan"),
        (lambda: FallbackLimits(rpm=0), r"FallbackLimits\(rpm=0\)"),
        (lambda: FallbackLimits(concurrency=2.5), r"FallbackLimits\(concurrency=2.5\)"),  # type: ignore[arg-type]
        (lambda: FallbackLimits(headroom=0), r"headroom=0\): give a share from above 0 to 1"),
        (
            lambda: DeadlineOptions("PT1H", "skip", margin_s=-1),
            r"DeadlineOptions\(margin_s=-1\): give 0 or more seconds",
        ),
        (
            lambda: DeadlineOptions("PT1H", "skip", harvest_timeout_s=0),
            r"harvest_timeout_s=0\): give more than 0",
        ),
        (lambda: DeadlineOptions("tomorrow", "skip"), r"deadline 'tomorrow' cannot be read"),
        (lambda: DeadlineOptions("06:30 Mars/Olympus", "skip"), r"unknown timezone 'Mars/Olympus'"),
        (lambda: DeadlineOptions("", "skip"), r"DeadlineOptions\(when=''\)"),
        (
            lambda: BudgetOptions(budget_usd=-1),
            r"BudgetOptions\(budget_usd=-1\): give an amount in USD of 0 or more",
        ),
        (lambda: BudgetOptions(budget_usd="five"), r"budget_usd='five'"),
        (lambda: BudgetOptions(budget_usd=float("inf")), r"budget_usd=inf"),
        (lambda: BudgetOptions(pricing_override={"x": object()}), r"is not JSON-safe"),
        (
            lambda: BudgetOptions(pricing_override=42),
            r"pricing_override=int\): give a pricing file path or a dict",
        ),  # type: ignore[arg-type]
    ],
)
def test_a_bad_option_is_refused_when_it_is_built_naming_the_option_the_value_and_the_fix(
    build: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build()


def test_the_options_are_frozen_and_a_pricing_dict_is_copied_so_nobody_can_change_it_later() -> None:
    prices: dict[str, Any] = {"openai": {"gpt-4o-mini": {"input": "0.15"}}}
    budget = BudgetOptions(budget_usd=5, pricing_override=prices)
    prices["openai"]["gpt-4o-mini"]["input"] = "999"
    assert budget.pricing_override == {"openai": {"gpt-4o-mini": {"input": "0.15"}}}
    with pytest.raises(FrozenInstanceError):
        budget.budget_usd = 6  # type: ignore[misc]
    assert budget.budget == Decimal("5") and isinstance(budget.budget_usd, Decimal)
    assert BudgetOptions(budget_usd="0.1").budget == Decimal(
        "0.1"
    )  # a float would be 0.1000000000000000055...


@pytest.mark.parametrize(
    "option",
    [
        ChunkOptions(),
        ChunkOptions(max_requests=10, max_bytes=1000, max_reject_ratio=0.5),
        FallbackLimits(rpm=500, tpm=200_000, concurrency=16, headroom=0.8),
        BudgetOptions(budget_usd="12.50", pricing_override={"openai": {}}),
        BudgetOptions(pricing_override="prices.yaml"),
        DeadlineOptions("06:30 Europe/Berlin", "sync_fallback", margin_s=600, harvest_timeout_s=30),
        DeadlineOptions(timedelta(hours=4), "skip"),
        DeadlineOptions(DeadlineSpec.parse("PT2H", "publish_pending"), "publish_pending"),
        DeadlineOptions(datetime(2026, 1, 1, 6, 30, tzinfo=timezone.utc), "skip"),
        DeadlineOptions("{{ var.value.deadline }}", "skip"),
    ],
)
def test_every_option_goes_through_json_and_comes_back_equal(option: Any) -> None:
    data = json.loads(json.dumps(option.to_dict()))
    back = type(option).from_dict(data)
    assert back.to_dict() == option.to_dict()
    if not isinstance(option, DeadlineOptions) or not isinstance(option.when, datetime):
        assert back == option


def test_a_deadline_rule_is_resolved_per_run_and_a_moment_is_read_as_it_is() -> None:
    rule = DeadlineOptions("PT4H", "skip", margin_s=60)
    assert rule.spec is not None and not rule.is_absolute
    assert rule.harvest_timeout_s == HARVEST_TIMEOUT_S
    with pytest.raises(ConfigurationError, match="is a rule, not a moment"):
        rule.at()
    resolved = rule.resolved_by("g.deadline")
    assert resolved.at() == "{{ ti.xcom_pull(task_ids='g.deadline')['deadline'] }}"
    assert (resolved.policy, resolved.margin_s, resolved.spec) == ("skip", 60, None)
    moment = DeadlineOptions(datetime(2026, 1, 1, tzinfo=timezone.utc), "skip")
    assert moment.spec is None and moment.at() == "2026-01-01T00:00:00+00:00"
    with pytest.raises(ConfigurationError, match="spec says policy 'skip'"):
        DeadlineOptions(DeadlineSpec.parse("PT1H", "skip"), "sync_fallback")


def test_nothing_moved_is_no_error_and_an_unknown_keyword_is_named() -> None:
    refuse_moved("g", {})
    with pytest.raises(ConfigurationError, match="unknown keyword\\(s\\): colour"):
        refuse_moved("g", {"colour": "blue"})


CHUNK = "{{ var.value.get('chunk', '20') }}"


def test_a_templated_chunk_size_is_kept_until_the_task_renders_it_and_then_checked() -> None:
    options = ChunkOptions(max_requests=CHUNK, max_bytes=1000)
    assert ChunkOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    with pytest.raises(ConfigurationError, match="is a template: the task renders it when it runs"):
        _ = options.request_limit
    assert options.rendered("7") == ChunkOptions(max_requests=7, max_bytes=1000)
    assert options.rendered(" 7\n").request_limit == 7
    assert options.rendered("").request_limit is None  # nothing: the provider's limit


@pytest.mark.parametrize("rendered", ["0", "-3", "twenty", "2.5", "None", True])
def test_a_chunk_size_template_that_renders_to_no_whole_number_is_refused_naming_both(
    rendered: object,
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"max_requests=.\{\{ var.value.get.*rendered to .* whole number"
    ):
        ChunkOptions(max_requests=CHUNK).rendered(rendered)


def test_only_the_three_lanes_are_accepted() -> None:
    assert [check_lane(x) for x in ("auto", "provider", "pod")] == ["auto", "provider", "pod"]
    with pytest.raises(ConfigurationError, match=r"lane='kubernetes' is not one of"):
        check_lane("kubernetes")
