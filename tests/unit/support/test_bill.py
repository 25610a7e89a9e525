"""The chaos and stateful suites' cost oracle (``tests/support/bill.py``): what the emulator billed, priced as a report must count it.

A wrong oracle would hide a wrong report, so each of its rules is checked on a record written by
hand: batch lines at the batch price, real-time answers at full price, a duplicate priced but no
second answer, a damaged line's usage set apart, and an interrupted real-time send counted at
exactly its resend's price.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.services.fallback import POSSIBLY_PAID_TWICE
from tests.support.bill import expected_bill, item_key_of, usage_minus

MODEL = "gpt-4o-mini"
PRICE = PriceTable.load().price("openai", MODEL)


def tokens(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def sync_attempt(error_code: str | None, input_tokens: int = 50, output_tokens: int = 5) -> dict[str, Any]:
    return {
        "error_code": error_code,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_input_tokens": 0,
        "cache_write_tokens": 0,
    }


def test_the_custom_id_forms_name_their_item() -> None:
    assert item_key_of("k1__a2c0") == "k1"
    assert item_key_of("k1__a12c3") == "k1"
    assert item_key_of("k1__s3") == "k1"
    assert item_key_of("no-attempt-suffix") == "no-attempt-suffix"


def test_batch_lines_are_priced_at_the_batch_price_and_real_time_answers_at_full_price() -> None:
    record = {
        "batches": {"openai": [{"billed": {"k1__a1c0": tokens(1000, 100), "k2__a1c0": tokens(500, 50)}}]},
        "realtime": {"openai": [{"custom_id": "k3__s2", "usage": tokens(1000, 100)}]},
    }
    bill = expected_bill(record, {}, "openai", MODEL)
    batch, sync = Usage(1500, 150), Usage(1000, 100)
    assert bill.usage == batch + sync
    assert bill.paid == cost(batch, PRICE, "batch") + cost(sync, PRICE, "sync")
    assert bill.paid == Decimal("0.0001575") + Decimal("0.00021")
    assert bill.answers == {"k1": 1, "k2": 1, "k3": 1}
    assert bill.readable_usage == bill.usage and bill.unreadable_ids == frozenset()


def test_a_second_answer_of_a_line_is_paid_but_not_a_second_answer_of_its_item() -> None:
    record = {
        "batches": {
            "openai": [
                {"billed": {"k1__a1c0": tokens(1000, 100)}, "billed_again": [["k1__a1c0", tokens(1000, 101)]]}
            ]
        }
    }
    bill = expected_bill(record, {}, "openai", MODEL)
    assert bill.usage == Usage(2000, 201)
    assert bill.paid == cost(Usage(1000, 100), PRICE, "batch") + cost(Usage(1000, 101), PRICE, "batch")
    assert bill.answers == {"k1": 1}


def test_a_damaged_lines_usage_is_set_apart_as_unreadable_and_the_rest_is_exact() -> None:
    record = {
        "batches": {
            "openai": [
                {
                    "billed": {
                        "k1__a1c0": tokens(1000, 100),
                        "k2__a1c0": tokens(500, 50),
                        "k3__a1c0": tokens(10, 1),
                    },
                    "truncated": ["k2__a1c0"],
                }
            ]
        }
    }
    bill = expected_bill(record, {}, "openai", MODEL, damaged=["k3__a1c0"])
    assert bill.unreadable_ids == frozenset({"k2__a1c0", "k3__a1c0"})
    assert bill.unreadable_usage == Usage(510, 51)
    assert bill.readable_usage == Usage(1000, 100) == usage_minus(bill.usage, Usage(510, 51))
    assert bill.readable_paid == cost(Usage(1000, 100), PRICE, "batch")


def test_a_real_time_send_a_kill_interrupted_is_counted_at_exactly_its_resends_price() -> None:
    record = {"realtime": {"openai": [{"custom_id": "k1__s2", "usage": tokens(50, 5)}]}}
    resend = Usage(50, 5)
    interrupted = {"k1": [sync_attempt(POSSIBLY_PAID_TWICE), sync_attempt(None)]}
    bill = expected_bill(record, interrupted, "openai", MODEL)
    assert bill.usage == resend + resend  # the send the provider never completed: the report pays it
    assert bill.paid == 2 * cost(resend, PRICE, "sync")
    completed_both = {"realtime": {"openai": [{"custom_id": "k1__s1", "usage": tokens(50, 5)}] * 2}}
    assert (
        expected_bill(completed_both, interrupted, "openai", MODEL).usage == resend + resend
    )  # nothing added
    failed_not_interrupted = {"k1": [sync_attempt("timeout"), sync_attempt(None)]}
    assert expected_bill(record, failed_not_interrupted, "openai", MODEL).usage == resend  # no upper bound
