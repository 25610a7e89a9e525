from __future__ import annotations

import hashlib
import json

from hypothesis import given
from hypothesis import strategies as st

from airflow_batch_provider.core.hashing import canonical_json, sha256_hex, short_hash

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def test_canonical_json_sorts_keys_drops_spaces_and_keeps_unicode() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": "é", "c": None}]}) == '{"a":[1,{"c":null,"d":"é"}],"b":1}'


def test_canonical_json_is_the_same_whatever_order_the_keys_were_inserted_in() -> None:
    assert canonical_json({"x": 1, "y": {"p": 1, "q": 2}}) == canonical_json({"y": {"q": 2, "p": 1}, "x": 1})


@given(JSON)
def test_canonical_json_parses_back_to_the_same_value(value: object) -> None:
    assert json.loads(canonical_json(value)) == value


def test_sha256_hex_hashes_text_as_utf8_and_bytes_as_they_are() -> None:
    assert sha256_hex("é") == hashlib.sha256("é".encode()).hexdigest()
    assert sha256_hex("é") == sha256_hex("é".encode())
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_short_hash_keeps_the_requested_number_of_hex_characters() -> None:
    assert len(short_hash("a", "b")) == 16
    assert len(short_hash("a", "b", length=32)) == 32
    assert short_hash("a", "b", length=64) == sha256_hex("a\x1fb")


def test_short_hash_joins_its_parts_unambiguously() -> None:
    assert short_hash("ab", "c") != short_hash("a", "bc")
    assert short_hash("a", "") != short_hash("a")
    assert short_hash("a", "b") == short_hash("a", "b")
