from __future__ import annotations

import ast
from pathlib import Path

import pytest

from airflow_batch_provider.core.states import (
    FINAL_STATES,
    IN_FLIGHT_STATES,
    ITEM_STATES,
    JOB_STATES,
    OPEN_STATES,
    REDRIVABLE_STATES,
    RETRYABLE_STATES,
    USABLE_STATES,
    can_transition,
    sources_of,
)

PACKAGE = Path(__file__).resolve().parents[3] / "airflow_batch_provider"

# Every move DESIGN.md ("Item states") describes, besides staying put and going back to pending.
ALLOWED = [
    # the normal path
    ("pending", "staged"),
    ("staged", "submitted"),
    ("submitted", "succeeded"),
    ("submitted", "failed_retryable"),
    ("submitted", "failed_permanent"),
    ("submitted", "expired"),
    ("submitted", "cancelled"),
    # skip unchanged
    ("pending", "unchanged"),
    # retryable and expired go back to staged in a new job, then to review when exhausted
    ("failed_retryable", "staged"),
    ("expired", "staged"),
    ("failed_retryable", "review"),
    ("expired", "review"),
    ("failed_permanent", "review"),
    # a record that cannot be sent goes to review before it is staged
    ("pending", "review"),
    # at the deadline open items go to fallback, then succeed or fail
    ("pending", "fallback"),
    ("staged", "fallback"),
    ("submitted", "fallback"),
    ("failed_retryable", "fallback"),
    ("expired", "fallback"),
    ("fallback", "succeeded"),
    ("fallback", "failed_permanent"),
    ("fallback", "failed_retryable"),
    ("fallback", "review"),
    # or are skipped by the DAG's policy
    ("pending", "skipped"),
    ("staged", "skipped"),
    ("submitted", "skipped"),
    ("failed_retryable", "skipped"),
    ("expired", "skipped"),
    # a late success for an older attempt is still taken while nothing usable exists
    ("failed_retryable", "succeeded"),
    ("expired", "succeeded"),
    ("cancelled", "succeeded"),
    # a batch cancelled at the deadline leaves its items to the same choices as an expired one
    ("cancelled", "staged"),
    ("cancelled", "fallback"),
    ("cancelled", "skipped"),
    ("cancelled", "review"),
    # a person skips an item in review
    ("review", "skipped"),
    # an item sent to review while its job was in doubt goes back with the job resolved to its batch
    ("review", "submitted"),
]

FORBIDDEN = [
    # nothing skips a step on the way out
    ("pending", "submitted"),
    ("pending", "succeeded"),
    ("staged", "succeeded"),
    ("staged", "failed_retryable"),
    # settled states stay settled (only a changed input in a new run reopens them)
    ("succeeded", "staged"),
    ("succeeded", "failed_retryable"),
    ("succeeded", "review"),
    ("succeeded", "unchanged"),
    ("unchanged", "staged"),
    ("unchanged", "succeeded"),
    ("review", "staged"),
    ("review", "succeeded"),
    ("skipped", "staged"),
    ("skipped", "succeeded"),
    # a permanent failure is never sent again
    ("failed_permanent", "staged"),
    ("failed_permanent", "fallback"),
    ("failed_permanent", "succeeded"),
    # unchanged is only decided before sending
    ("submitted", "unchanged"),
    ("staged", "unchanged"),
    ("fallback", "unchanged"),
    # a fallback item is not put back into a batch
    ("fallback", "staged"),
    ("fallback", "submitted"),
]


@pytest.mark.parametrize(("current", "target"), ALLOWED)
def test_every_move_the_design_describes_is_allowed(current: str, target: str) -> None:
    assert can_transition(current, target)


@pytest.mark.parametrize(("current", "target"), FORBIDDEN)
def test_moves_the_design_does_not_describe_are_refused(current: str, target: str) -> None:
    assert not can_transition(current, target)


@pytest.mark.parametrize("state", ITEM_STATES)
def test_every_state_may_stay_where_it_is_so_reruns_are_idempotent(state: str) -> None:
    assert can_transition(state, state)


@pytest.mark.parametrize("state", ITEM_STATES)
def test_every_state_may_go_back_to_pending_when_a_new_run_changes_the_input(state: str) -> None:
    assert can_transition(state, "pending")


@pytest.mark.parametrize(("current", "target"), [("pending", "bogus"), ("bogus", "pending"), ("x", "x")])
def test_an_unknown_state_connects_to_nothing(current: str, target: str) -> None:
    assert not can_transition(current, target)


def test_the_listed_states_are_exactly_those_of_the_design() -> None:
    assert set(ITEM_STATES) == {
        "pending",
        "staged",
        "submitted",
        "succeeded",
        "failed_retryable",
        "failed_permanent",
        "expired",
        "cancelled",
        "review",
        "fallback",
        "skipped",
        "unchanged",
    }
    assert len(ITEM_STATES) == len(set(ITEM_STATES))


def test_sources_of_staged_are_the_states_that_may_be_sent_in_a_new_job() -> None:
    assert sources_of("staged") == {"pending", "staged", "failed_retryable", "expired", "cancelled"}


def test_sources_of_review_include_every_failure_but_no_success() -> None:
    review = sources_of("review")
    assert {"failed_retryable", "expired", "failed_permanent", "pending", "staged", "submitted"} <= review
    assert not review & {"succeeded", "unchanged", "skipped"}


def test_sources_of_pending_are_every_state() -> None:
    assert sources_of("pending") == set(ITEM_STATES)


def test_sources_of_agrees_with_can_transition_for_every_pair() -> None:
    for target in ITEM_STATES:
        assert sources_of(target) == {s for s in ITEM_STATES if can_transition(s, target)}


def test_sources_of_an_unknown_state_is_empty() -> None:
    assert sources_of("bogus") == frozenset()


def test_usable_states_are_the_two_that_hold_an_output() -> None:
    assert {"succeeded", "unchanged"} == USABLE_STATES


def test_retryable_states_are_retryable_failures_and_expiry_and_may_go_back_to_staged() -> None:
    assert {"failed_retryable", "expired"} == RETRYABLE_STATES
    assert all(can_transition(s, "staged") for s in RETRYABLE_STATES)
    assert not can_transition("failed_permanent", "staged")


def test_final_states_include_every_usable_state_and_leave_no_open_one() -> None:
    assert USABLE_STATES <= FINAL_STATES
    assert {"review", "skipped"} <= FINAL_STATES
    assert not FINAL_STATES & RETRYABLE_STATES
    assert not FINAL_STATES & {"staged", "submitted", "fallback", "failed_permanent"}


def test_settled_final_states_have_no_way_out_but_a_new_input() -> None:
    for state in ("succeeded", "unchanged", "skipped"):
        assert {t for t in ITEM_STATES if can_transition(state, t)} == {state, "pending"}


def test_a_review_item_leaves_review_only_by_a_new_input_a_redrive_a_persons_skip_or_its_jobs_batch() -> None:
    assert {t for t in ITEM_STATES if can_transition("review", t)} == {
        "review",
        "pending",
        "skipped",
        "submitted",
    }


def test_a_new_runs_reopen_reaches_every_decision_of_prepare_from_any_state() -> None:
    assert sources_of("unchanged", reopen=True) == set(ITEM_STATES)
    assert sources_of("review", reopen=True) == set(ITEM_STATES)
    assert sources_of("submitted", reopen=True) == sources_of("submitted")
    assert "succeeded" not in sources_of("unchanged")


def test_in_flight_and_redrivable_states_are_disjoint_and_never_usable() -> None:
    assert {"staged", "submitted", "fallback"} == IN_FLIGHT_STATES
    assert not IN_FLIGHT_STATES & REDRIVABLE_STATES
    assert not REDRIVABLE_STATES & USABLE_STATES
    assert all(can_transition(state, "pending") for state in REDRIVABLE_STATES)


def test_open_states_are_work_in_flight_and_never_final_except_reported_pending() -> None:
    assert {"pending", "staged", "submitted", "fallback"} == OPEN_STATES
    assert {"pending"} == OPEN_STATES & FINAL_STATES
    assert all(state in ITEM_STATES for state in FINAL_STATES | RETRYABLE_STATES | OPEN_STATES)


def spelled_state_sets(path: Path, vocabularies: tuple[frozenset[str], ...]) -> list[str]:
    """Return ``file:line`` of each module-level constant that spells a set of states itself.

    A set is a tuple, list or set literal of two or more names, all of one vocabulary and fewer
    than all of it (a display order of every state is an order, not a set with a meaning).
    Choices checked inside a function (``unfinished in ("review", "pending", "skipped")``) are an
    option's own vocabulary and stay where they are.

    :param path: a module
    :param vocabularies: the item states, the job states
    """
    found = []
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            continue
        for node in ast.walk(stmt.value):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
                words = {
                    e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
                if len(words) == len(node.elts) and any(words < v for v in vocabularies):
                    found.append(f"{path.name}:{node.lineno} {sorted(words)}")
    return found


VOCABULARIES = (frozenset(ITEM_STATES), frozenset(JOB_STATES))


def test_sets_of_states_are_spelled_once_in_the_states_module() -> None:
    # the emulator speaks each provider's own words; everything else names the sets defined here
    modules = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "core" / "states.py" and "emulator" not in p.relative_to(PACKAGE).parts
    ]
    assert [hit for p in modules for hit in spelled_state_sets(p, VOCABULARIES)] == []


def test_the_spelling_check_sees_a_set_of_states_and_not_an_option_check(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        'OPEN: Final = ("pending", "staged")\n'
        'DONE = frozenset({"downloaded", "reconciled"})\n'
        'ROUTES = ("review", "sync")\n'
        "def f(x):\n"
        '    return x in ("pending", "skipped")\n',
        encoding="utf-8",
    )
    assert spelled_state_sets(module, VOCABULARIES) == [
        "probe.py:1 ['pending', 'staged']",
        "probe.py:2 ['downloaded', 'reconciled']",
    ]
