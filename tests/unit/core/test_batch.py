"""A batch's shared value types: the failure vocabulary, the chunker's byte budget, the status round trip."""

from __future__ import annotations

import json
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_batch_provider.core.batch import BATCH_ERROR_CODES, BatchStatus, Limits, failure_code
from airflow_batch_provider.core.states import TERMINAL_BATCH_STATES, BatchState

STATES = get_args(BatchState)
TEXT = st.none() | st.text(max_size=20)


@pytest.mark.parametrize(
    ("words", "code"),
    [
        (("token_limit_exceeded", "failed"), "token_limit_exceeded"),
        (("Enqueued token limit reached for gpt-4o-mini",), "token_limit_exceeded"),
        (("RESOURCE_EXHAUSTED", None, "Quota exceeded for project"), "quota_exceeded"),
        (("You exceeded your current quota",), "quota_exceeded"),
        (("invalid_request", "Line 3 is malformed"), "invalid_file"),
        ((None, "500", "Internal error"), "provider_error"),
        ((), "provider_error"),
    ],
)
def test_a_providers_words_on_a_failed_batch_map_to_one_code_of_the_vocabulary(
    words: tuple[object, ...], code: str
) -> None:
    assert failure_code(*words) == code
    assert code in BATCH_ERROR_CODES


@given(st.lists(TEXT, max_size=4))
def test_any_words_at_all_give_a_code_of_the_vocabulary_and_a_token_limit_wins_over_the_rest(
    words: list[str | None],
) -> None:
    assert failure_code(*words) in BATCH_ERROR_CODES
    assert failure_code(*words, "token_limit_exceeded") == "token_limit_exceeded"


def test_the_chunker_fills_a_files_bytes_only_up_to_the_headroom() -> None:
    assert Limits(max_requests=50_000, max_bytes=200 * 1024 * 1024).usable_bytes == int(
        200 * 1024 * 1024 * 0.95
    )
    assert Limits(max_requests=10, max_bytes=1000, headroom=0.5).usable_bytes == 500


@given(
    st.sampled_from(STATES),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    TEXT,
    TEXT,
    st.none() | st.sampled_from(BATCH_ERROR_CODES),
    TEXT,
)
def test_a_status_survives_json_as_a_trigger_event_carries_it_and_is_terminal_exactly_in_the_terminal_states(
    state: BatchState,
    total: int,
    completed: int,
    failed: int,
    reason: str | None,
    raw: str | None,
    code: str | None,
    message: str | None,
) -> None:
    status = BatchStatus(state, total, completed, failed, reason, raw, code, message)  # type: ignore[arg-type]
    assert BatchStatus.from_dict(json.loads(json.dumps(status.to_dict()))) == status
    assert status.terminal == (state in TERMINAL_BATCH_STATES)


def test_a_status_dict_from_an_older_event_with_counts_missing_or_null_reads_as_zero() -> None:
    assert BatchStatus.from_dict({"state": "in_progress", "total": None}) == BatchStatus("in_progress")
