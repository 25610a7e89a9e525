"""One item sent synchronously (the fallback): its attempt and its answer (``ledger/sync_attempts.py``), on SQLite and PostgreSQL.

The fallback task that sends them (deadline ``sync_fallback``, publish ``exhausted="sync"``) is
tested in ``tests/unit/operators/test_fallback.py`` and ``tests/unit/services/``; here, what the
ledger records of each send, whatever order a rerun or a late batch line brings.
"""

from __future__ import annotations

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import LedgerError
from airflow_batch_provider.ledger import Ledger
from tests.unit.ledger.store_support import WL, attempts_of, cost_of, item, ok, prep, submit

RUN = "r1"
OPEN = ("submitted", "failed_retryable", "expired")


def sent_in_a_batch(ledger: Ledger, *app_ids: str) -> dict[str, str]:
    ledger.upsert_items(WL, RUN, [prep(a) for a in app_ids])
    _, cids = submit(ledger, RUN, app_ids)
    return cids


def begin(ledger: Ledger, app_id: str, from_states: tuple[str, ...] = OPEN) -> str | None:
    return ledger.begin_sync_attempt(WL, RUN, item_key(app_id), "v1", from_states)


def test_an_open_item_moves_to_fallback_with_its_next_attempt_and_a_sync_attempt_row(ledger: Ledger) -> None:
    sent_in_a_batch(ledger, "a")
    custom_id = begin(ledger, "a")
    assert custom_id == f"{item_key('a')}__s2"
    row = item(ledger, "a")
    assert (row["state"], row["route"], row["attempts"], row["custom_id"]) == (
        "fallback",
        "fallback",
        2,
        custom_id,
    )
    batch, sync = attempts_of(ledger, "a")
    assert (batch["mode"], sync["mode"], sync["attempt"], sync["custom_id"]) == (
        "batch",
        "sync",
        2,
        custom_id,
    )


def test_a_rerun_after_an_interrupted_send_gets_the_same_attempt_back_not_a_second(ledger: Ledger) -> None:
    sent_in_a_batch(ledger, "a")
    first = begin(ledger, "a")
    assert begin(ledger, "a") == first
    assert [a["mode"] for a in attempts_of(ledger, "a")] == ["batch", "sync"]


def test_an_item_no_longer_open_is_not_sent(ledger: Ledger) -> None:
    cids = sent_in_a_batch(ledger, "a", "b")
    ledger.apply_results(f"{WL}:{RUN}:r1:c00000", [ok(cids["a"], output="late batch answer")], cost_of)
    assert begin(ledger, "a") is None  # a usable batch answer came first
    assert begin(ledger, "b", from_states=("failed_retryable",)) is None  # not in the states asked for
    assert begin(ledger, "nobody") is None
    assert [a["mode"] for a in attempts_of(ledger, "b")] == ["batch"]


def test_a_synchronous_answer_settles_its_item_and_keeps_its_usage_and_cost(ledger: Ledger) -> None:
    sent_in_a_batch(ledger, "a", "b")
    a_id, b_id = begin(ledger, "a"), begin(ledger, "b")
    assert a_id is not None and b_id is not None
    answer = ItemResult(a_id, "succeeded", output={"label": "ok"}, usage=Usage(120, 8))
    assert ledger.record_sync_result(WL, RUN, answer, cost_nusd=2_500) == "succeeded"
    refused = ItemResult(b_id, "failed_permanent", error_code="400", error_message="bad request")
    assert ledger.record_sync_result(WL, RUN, refused, cost_nusd=0) == "review"

    a, b = item(ledger, "a"), item(ledger, "b")
    assert (a["state"], a["route"], a["output_json"]) == ("succeeded", "fallback", '{"label": "ok"}')
    assert (b["state"], b["error_code"], b["error_message"]) == ("review", "400", "bad request")
    sync = attempts_of(ledger, "a")[-1]
    assert (sync["outcome"], sync["input_tokens"], sync["output_tokens"], sync["cost_nusd"]) == (
        "succeeded",
        120,
        8,
        2_500,
    )
    assert not sync["discarded"]


def test_an_answer_for_an_item_settled_meanwhile_is_kept_as_discarded_cost_never_a_second_answer(
    ledger: Ledger,
) -> None:
    cids = sent_in_a_batch(ledger, "a")
    sync_id = begin(ledger, "a")
    assert sync_id is not None
    ledger.apply_results(
        f"{WL}:{RUN}:r1:c00000", [ok(cids["a"], output="batch")], cost_of
    )  # a late batch line
    state = ledger.record_sync_result(
        WL, RUN, ItemResult(sync_id, "succeeded", output="sync", usage=Usage(9, 1)), 900
    )

    row = item(ledger, "a")
    assert (state, row["state"], row["output_json"]) == (
        "succeeded",
        "succeeded",
        '"batch"',
    )  # the batch's answer
    batch, sync = attempts_of(ledger, "a")
    assert (batch["outcome"], bool(batch["discarded"])) == ("succeeded", False)
    assert (sync["outcome"], sync["cost_nusd"], bool(sync["discarded"])) == (
        "succeeded",
        900,
        True,
    )  # paid, unused


def test_an_answer_without_its_begun_attempt_is_refused_naming_it_and_the_remedy(ledger: Ledger) -> None:
    sent_in_a_batch(ledger, "a")
    with pytest.raises(
        LedgerError, match=r"no synchronous attempt 'x__s9' in run 'r1'; call begin_sync_attempt"
    ):
        ledger.record_sync_result(WL, RUN, ItemResult("x__s9", "succeeded", output="?"), 0)
