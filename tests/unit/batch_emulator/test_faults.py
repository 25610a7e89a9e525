from __future__ import annotations

import pytest

from batch_emulator.faults import (
    FaultConfig,
    SlidingWindowLimiter,
    retry_after_header,
    roll,
)


def test_rolls_are_deterministic_and_spread_evenly() -> None:
    values = [roll(7, "item", f"id{i}") for i in range(5000)]
    assert values == [roll(7, "item", f"id{i}") for i in range(5000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert 0.45 < sum(values) / len(values) < 0.55
    assert roll(7, "item", "a") != roll(8, "item", "a")


def test_item_faults_follow_their_rates_over_many_items() -> None:
    faults = FaultConfig(
        rate_500=0.1, rate_429=0.1, rate_400=0.05, rate_context_length=0.05, rate_missing=0.1
    )
    decisions = [faults.decide_item(0, f"k{i}__a1c0").fault for i in range(10_000)]
    share = {f: decisions.count(f) / len(decisions) for f in set(decisions)}
    assert share["server_error"] == pytest.approx(0.1, abs=0.015)
    assert share["rate_limited"] == pytest.approx(0.1, abs=0.015)
    assert share["invalid_request"] == pytest.approx(0.05, abs=0.01)
    assert share["context_length"] == pytest.approx(0.05, abs=0.01)
    assert share["missing"] == pytest.approx(0.1, abs=0.015)
    assert share["none"] == pytest.approx(0.6, abs=0.02)


def test_a_resubmitted_item_rolls_again_because_its_custom_id_changes() -> None:
    faults = FaultConfig(rate_500=0.5)
    first = [faults.decide_item(0, f"k{i}__a1c0").failing for i in range(200)]
    second = [faults.decide_item(0, f"k{i}__a2c0").failing for i in range(200)]
    assert first == [faults.decide_item(0, f"k{i}__a1c0").failing for i in range(200)]
    assert first != second
    both = sum(a and b for a, b in zip(first, second, strict=True))
    assert 30 < both < 70, "the second attempt fails independently of the first"


def test_only_successful_items_are_duplicated_or_malformed() -> None:
    faults = FaultConfig(rate_500=0.5, rate_duplicate=1.0, rate_malformed=1.0)
    for i in range(100):
        decision = faults.decide_item(0, f"k{i}")
        assert decision.duplicate == decision.malformed == (decision.fault == "none")


def test_expiring_batches_are_chosen_by_index_or_by_rate() -> None:
    assert FaultConfig(expire_batches=(0, 2)).batch_expires(0, 2)
    assert not FaultConfig(expire_batches=(0, 2)).batch_expires(0, 1)
    assert all(FaultConfig(expire_rate=1.0).batch_expires(0, i) for i in range(10))
    assert not any(FaultConfig().batch_expires(0, i) for i in range(10))


@pytest.mark.parametrize(
    "settings",
    [
        {"rate_500": 1.5},
        {"rate_429": -0.1},
        {"rate_500": 0.6, "rate_400": 0.6},
        {"fail_validation": -1},
        {"rpm_limit": 0},
        {"expire_batches": [-1]},
        {"no_such_fault": 1},
        {"rate_500": True},
    ],
)
def test_invalid_fault_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        FaultConfig.from_mapping(settings)


def test_settings_merge_from_json_values() -> None:
    faults = FaultConfig(rate_500=0.1).merged(
        {"expire_batches": "0,3", "rpm_limit": "null", "tpm_limit": "1000", "rate_429": "0.2"}
    )
    assert faults.rate_500 == 0.1
    assert faults.expire_batches == (0, 3)
    assert faults.rpm_limit is None and faults.tpm_limit == 1000
    assert faults.rate_429 == 0.2
    assert FaultConfig.from_mapping(faults.to_dict()) == faults


def test_the_limiter_admits_up_to_the_request_limit_and_says_when_to_retry() -> None:
    limiter = SlidingWindowLimiter()
    assert limiter.check(0.0, 1, 2, None, 60).allowed
    assert limiter.check(10.0, 1, 2, None, 60).allowed
    refused = limiter.check(20.0, 1, 2, None, 60)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(40.0)
    assert refused.remaining_requests == 0
    assert limiter.check(60.0, 1, 2, None, 60).allowed


def test_the_limiter_counts_tokens_and_admits_one_oversized_request_into_an_empty_window() -> None:
    limiter = SlidingWindowLimiter()
    assert limiter.check(0.0, 500, None, 100, 60).allowed
    refused = limiter.check(1.0, 10, None, 100, 60)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(59.0)
    assert limiter.check(60.5, 90, None, 100, 60).allowed
    assert limiter.check(61.0, 10, None, 100, 60).allowed
    assert not limiter.check(62.0, 1, None, 100, 60).allowed


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert retry_after_header(0.01) == "1"
    assert retry_after_header(1.2) == "2"
    assert retry_after_header(30.0) == "30"
