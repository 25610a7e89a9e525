from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_batch_provider.adapters.base import BatchStatus
from airflow_batch_provider.core.policy import PollPolicy, PollState, decide, start

T0 = 1_700_000_000.0
RUNNING = BatchStatus("in_progress", total=10, completed=3, failed=1)


def test_a_terminal_status_ends_polling_even_past_the_deadline_and_the_timeout() -> None:
    policy = PollPolicy(timeout=10, deadline=T0 + 5)
    for state in ("completed", "failed", "expired", "cancelled"):
        decision = decide(policy, start(policy, T0), T0 + 100, BatchStatus(state))  # type: ignore[arg-type]
        assert decision.action == "done"
        assert decision.delay == 0
        assert state in decision.reason
        assert decision.state.polls == 1


@pytest.mark.parametrize("state", ["validating", "in_progress", "finalizing", "cancelling"])
def test_a_running_status_waits(state: str) -> None:
    policy = PollPolicy()
    decision = decide(policy, start(policy, T0), T0 + 1, BatchStatus(state))  # type: ignore[arg-type]
    assert decision.action == "wait"


def test_the_deadline_ends_polling_at_its_margin_before_the_timeout_is_checked() -> None:
    policy = PollPolicy(timeout=10_000, deadline=T0 + 1000, deadline_margin=300)
    assert policy.stop_at == T0 + 700
    state = start(policy, T0)
    assert decide(policy, state, T0 + 699, RUNNING).action == "wait"
    decision = decide(policy, state, T0 + 700, RUNNING)
    assert decision.action == "deadline"
    assert decision.reason == "deadline reached"
    assert decide(policy, state, T0 + 700, None, "boom").action == "deadline"
    both_passed = PollPolicy(timeout=100, deadline=T0 + 1000, deadline_margin=300)
    assert decide(both_passed, state, T0 + 800, RUNNING).action == "deadline"


def test_the_timeout_gives_up_waiting_and_says_how_to_fix_it() -> None:
    policy = PollPolicy(timeout=3600)
    state = start(policy, T0)
    assert decide(policy, state, T0 + 3599, RUNNING).action == "wait"
    decision = decide(policy, state, T0 + 3600, RUNNING)
    assert decision.action == "timeout"
    assert "3600s after submission (timeout 3600s)" in decision.reason
    assert "raise the timeout" in decision.reason


def test_a_policy_without_a_deadline_has_no_stop_time() -> None:
    assert PollPolicy().stop_at is None


def test_the_first_delay_is_the_initial_interval() -> None:
    policy = PollPolicy(initial_interval=7, factor=2, max_interval=100)
    assert decide(policy, start(policy, T0), T0, RUNNING).delay == 7


def test_the_delay_grows_by_the_factor_and_stops_at_the_cap() -> None:
    policy = PollPolicy(initial_interval=10, factor=2, max_interval=75)
    state, now, delays = start(policy, T0), T0, []
    for _ in range(7):
        decision = decide(policy, state, now, RUNNING)
        assert decision.action == "wait"
        delays.append(decision.delay)
        state, now = decision.state, now + decision.delay
    assert delays == [10, 20, 40, 75, 75, 75, 75]
    assert state.polls == 7


def test_a_day_long_batch_costs_a_few_hundred_polls_not_thousands() -> None:
    policy = PollPolicy()  # the defaults
    state, now, polls = start(policy, T0), T0, 0
    while now < T0 + 24 * 3600:
        decision = decide(policy, state, now, RUNNING)
        state, now, polls = decision.state, now + decision.delay, polls + 1
    assert 100 < polls < 300


def test_a_factor_of_one_polls_at_a_constant_interval() -> None:
    policy = PollPolicy(initial_interval=5, factor=1, max_interval=5)
    state = start(policy, T0)
    for _ in range(3):
        decision = decide(policy, state, T0, RUNNING)
        assert decision.delay == 5
        state = decision.state


@given(
    initial=st.floats(0.1, 100),
    factor=st.floats(1, 3),
    extra=st.floats(0, 1000),
    deadline_in=st.floats(0.01, 5000),
    margin=st.floats(0, 100),
    steps=st.integers(1, 30),
)
def test_the_delay_never_passes_the_deadline_stop_time(
    initial: float, factor: float, extra: float, deadline_in: float, margin: float, steps: int
) -> None:
    policy = PollPolicy(
        initial_interval=initial,
        factor=factor,
        max_interval=initial + extra,
        deadline=T0 + deadline_in + margin,
        deadline_margin=margin,
    )
    assert policy.stop_at is not None
    state, now = start(policy, T0), T0
    for _ in range(steps):
        decision = decide(policy, state, now, RUNNING)
        if now >= policy.stop_at:
            assert decision.action == "deadline"
            break
        assert decision.action == "wait"
        assert 0 < decision.delay <= policy.max_interval
        assert now + decision.delay <= policy.stop_at + 1e-6
        state, now = decision.state, now + decision.delay


def test_transient_errors_are_counted_and_the_poller_gives_up_past_the_limit() -> None:
    policy = PollPolicy(initial_interval=1, factor=1.5, max_interval=10, max_consecutive_errors=2)
    state = start(policy, T0)
    first = decide(policy, state, T0, None, "502")
    assert (first.action, first.state.consecutive_errors) == ("wait", 1)
    second = decide(policy, first.state, T0, None, "502")
    assert (second.action, second.state.consecutive_errors) == ("wait", 2)
    third = decide(policy, second.state, T0, None, "connection reset")
    assert third.action == "give_up"
    assert "3 status errors in a row (limit 2)" in third.reason
    assert "connection reset" in third.reason


def test_a_good_poll_resets_the_error_count_and_records_progress() -> None:
    policy = PollPolicy(max_consecutive_errors=1)
    state = decide(policy, start(policy, T0), T0, None, "502").state
    assert state.consecutive_errors == 1
    ok = decide(policy, state, T0, RUNNING)
    assert ok.state.consecutive_errors == 0
    assert ok.state.last_progress == 4
    # the reset means one more error is tolerated again
    assert decide(policy, ok.state, T0, None, "502").action == "wait"


def test_errors_back_off_like_polls() -> None:
    policy = PollPolicy(initial_interval=2, factor=3, max_interval=100, max_consecutive_errors=5)
    first = decide(policy, start(policy, T0), T0, None, "x")
    second = decide(policy, first.state, T0, None, "x")
    assert (first.delay, second.delay) == (2, 6)


def test_the_policy_round_trips_through_json_primitives_for_the_trigger() -> None:
    policy = PollPolicy(
        initial_interval=3,
        factor=1.2,
        max_interval=30,
        max_consecutive_errors=9,
        timeout=99,
        deadline=T0 + 5,
        deadline_margin=2,
    )
    data = json.loads(json.dumps(policy.to_dict()))
    assert PollPolicy.from_dict(data) == policy
    assert PollPolicy.from_dict(PollPolicy().to_dict()) == PollPolicy()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"initial_interval": 0}, "initial_interval=0"),
        ({"initial_interval": -1}, "initial_interval=-1"),
        ({"factor": 0.5}, "factor=0.5"),
        ({"initial_interval": 10, "max_interval": 5}, "max_interval=5"),
    ],
)
def test_an_invalid_policy_is_refused_naming_the_values_and_the_rule(
    kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match="need initial > 0, factor >= 1 and max >= initial") as caught:
        PollPolicy(**kwargs)
    assert named in str(caught.value)


def test_start_begins_at_the_initial_interval_with_nothing_counted() -> None:
    assert start(PollPolicy(initial_interval=4), T0) == PollState(started_at=T0, interval=4)
