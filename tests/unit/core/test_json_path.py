"""The answers' small JSON path: what it accepts, what it refuses with the fix, what a missing step reads."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_batch_provider.core.json_path import MissingStep, follow_path, parse_path, read_path, spell_path
from airflow_batch_provider.exceptions import ConfigurationError

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-]{0,6}", fullmatch=True)
STEPS = st.lists(st.one_of(NAMES, st.integers(min_value=0, max_value=20)), max_size=5)


def _spell(steps: list[str | int]) -> str:
    return "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)


def _nest(steps: list[str | int], leaf: object) -> object:
    value = leaf
    for step in reversed(steps):
        value = [None] * step + [value] if isinstance(step, int) else {step: value}
    return value


@given(STEPS)
def test_a_spelled_path_parses_back_to_its_steps_and_reads_the_value_at_their_end(
    steps: list[str | int],
) -> None:
    parsed = parse_path(_spell(steps))
    assert parsed == tuple(steps)
    assert read_path(_nest(steps, "leaf"), parsed) == "leaf"


def test_a_step_that_is_not_there_reads_none_not_an_error() -> None:
    answer = {"label": "positive", "scores": [0.9]}
    assert read_path(answer, parse_path("$.missing")) is None
    assert read_path(answer, parse_path("$.scores[3]")) is None
    assert read_path(answer, parse_path("$.label[0]")) is None  # an index into a string
    assert read_path(answer, parse_path("$.scores.x")) is None  # a field of a list
    assert read_path(answer, parse_path("$")) == answer


@given(STEPS)
def test_a_path_is_spelled_back_as_it_parses(steps: list[str | int]) -> None:
    assert spell_path(tuple(steps)) == _spell(steps)


@pytest.mark.parametrize(
    ("path", "reached", "found"),
    [
        ("$.missing", "$", "the keys ['label', 'none', 'scores']"),
        ("$.scores[3]", "$.scores", "a list of 1"),
        ("$.label[0]", "$.label", "a str"),
        ("$.none.x", "$.none", "null"),
    ],
)
def test_following_a_step_that_is_not_there_says_how_far_the_path_went_and_what_is_there(
    path: str, reached: str, found: str
) -> None:
    answer = {"label": "positive", "scores": [0.9], "none": None}
    with pytest.raises(MissingStep) as raised:
        follow_path(answer, parse_path(path))
    assert (raised.value.reached, raised.value.found) == (reached, found)
    assert str(raised.value) == f"{reached} holds {found}"
    assert follow_path(answer, parse_path("$.none")) is None  # a null that is there is a value


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("label", "must start with '$'"),
        ("$label", "at position 1"),
        ("$.scores[-1]", "at position 8"),
        ("$..label", "at position 1"),
    ],
)
def test_a_malformed_path_is_refused_naming_it_the_place_and_the_accepted_form(path: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape("e.g. '$.label'")) as raised:
        parse_path(path)
    assert path in str(raised.value) and says in str(raised.value)
