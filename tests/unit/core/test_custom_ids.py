from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_batch_provider.core.custom_ids import (
    CUSTOM_ID_PATTERN,
    MAX_ATTEMPT,
    MAX_CHUNK,
    MAX_KEY_LENGTH,
    ParsedCustomId,
    item_key,
    make_custom_id,
    parse_custom_id,
)
from airflow_batch_provider.core.hashing import sha256_hex

STRICTEST = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
HASHED = re.compile(r"^x-[0-9a-f]{40}$")


@pytest.mark.parametrize("app_id", ["a", "fb-000123", "ORDER_42", "a__b", "-", "_x-", "x" * MAX_KEY_LENGTH])
def test_a_safe_application_id_is_its_own_key(app_id: str) -> None:
    assert item_key(app_id) == app_id


@pytest.mark.parametrize(
    "app_id",
    [
        "with space",
        "slash/id",
        "dot.id",
        "émoji🙂",
        "",
        "x" * (MAX_KEY_LENGTH + 1),
        "x-looks-hashed",
        "x-" + "0" * 40,
        "tab\tid",
        "id\n",
    ],
)
def test_an_unsafe_long_or_x_prefixed_id_is_replaced_by_its_sha256(app_id: str) -> None:
    key = item_key(app_id)
    assert HASHED.match(key)
    assert key == "x-" + sha256_hex(app_id)[:40]


def test_a_hashed_key_never_equals_a_safe_id_so_the_two_kinds_cannot_collide() -> None:
    hashed = item_key("x-" + "a" * 40)
    assert hashed != "x-" + "a" * 40
    assert item_key(hashed) != hashed


def test_keys_are_deterministic_and_distinct_for_distinct_ids() -> None:
    assert item_key("a b") == item_key("a b")
    assert item_key("a b") != item_key("a  b")
    assert item_key("X" * 49) != item_key("X" * 50)


def test_a_custom_id_is_key_attempt_and_chunk() -> None:
    assert make_custom_id("fb-1", 1, 0) == "fb-1__a1c0"
    assert make_custom_id("fb-1", 12, 345) == "fb-1__a12c345"


def test_the_longest_possible_custom_id_fits_the_strictest_provider() -> None:
    cid = make_custom_id("k" * MAX_KEY_LENGTH, MAX_ATTEMPT, MAX_CHUNK)
    assert STRICTEST.match(cid)
    assert len(cid) <= 64
    assert CUSTOM_ID_PATTERN.pattern == STRICTEST.pattern


def test_an_application_id_that_contains_the_separator_parses_back_from_the_right() -> None:
    key = item_key("order__a1c2")
    assert key == "order__a1c2"
    cid = make_custom_id(key, 3, 4)
    assert parse_custom_id(cid) == ParsedCustomId("order__a1c2", 3, 4)


def test_a_key_ending_in_an_underscore_keeps_it() -> None:
    assert parse_custom_id(make_custom_id("k_", 2, 7)) == ParsedCustomId("k_", 2, 7)
    assert parse_custom_id(make_custom_id("k__", 2, 7)) == ParsedCustomId("k__", 2, 7)


@given(
    app_id=st.text(min_size=1, max_size=80)
    | st.from_regex(r"[A-Za-z0-9_-]{1,60}", fullmatch=True)
    | st.builds(
        lambda a, b: f"{a}__a{b}", st.from_regex(r"[a-z_]{0,10}", fullmatch=True), st.integers(0, 99)
    ),
    attempt=st.integers(1, MAX_ATTEMPT),
    chunk=st.integers(0, MAX_CHUNK),
)
def test_every_custom_id_fits_the_charset_and_parses_back_to_its_parts(
    app_id: str, attempt: int, chunk: int
) -> None:
    key = item_key(app_id)
    cid = make_custom_id(key, attempt, chunk)
    assert STRICTEST.match(cid), cid
    assert parse_custom_id(cid) == ParsedCustomId(key, attempt, chunk)


@pytest.mark.parametrize(("attempt", "limit"), [(0, "1..99"), (MAX_ATTEMPT + 1, "1..99"), (-1, "1..99")])
def test_an_attempt_out_of_bounds_is_refused_naming_the_limit(attempt: int, limit: str) -> None:
    with pytest.raises(ValueError, match=rf"attempt {attempt} is outside {re.escape(limit)}.*max_attempts"):
        make_custom_id("k", attempt, 0)


@pytest.mark.parametrize("chunk", [-1, MAX_CHUNK + 1])
def test_a_chunk_out_of_bounds_is_refused_naming_the_limit(chunk: int) -> None:
    with pytest.raises(ValueError, match=rf"chunk {chunk} is outside 0\.\.99999.*chunk size"):
        make_custom_id("k", 1, chunk)


@pytest.mark.parametrize("key", ["", "a b", "k" * (MAX_KEY_LENGTH + 1), "é", "k\n"])
def test_a_key_outside_the_charset_is_refused_and_points_to_item_key(key: str) -> None:
    with pytest.raises(
        ValueError, match=r"item key .* is not \[A-Za-z0-9_-\]\{1,48\}; build it with item_key"
    ):
        make_custom_id(key, 1, 0)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "plain",
        "k__a1",
        "k__ac1",
        "k__a100c1",
        "k__a1c123456",
        "__a1c1",
        "k__a1c1 ",
        "k a__a1c1",
        "k__A1c1",
        "k__a1c1\n",
    ],
)
def test_a_custom_id_this_module_did_not_make_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match=rf"custom_id {re.escape(repr(value))} is not of the form"):
        parse_custom_id(value)
