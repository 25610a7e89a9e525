"""The rounds room: what goes to review after a round and what may be sent again."""

from __future__ import annotations

from airflow_batch_provider.ledger import Ledger
from tests.unit.ledger.store_support import (
    WL,
    cost_of,
    fail,
    item,
    ok,
    prep,
    submit,
)

# ---------------------------------------------------------------------------------------------- rounds


def test_retry_candidates_sends_exhausted_and_permanent_failures_to_review(ledger: Ledger) -> None:
    ids = ["retry", "exhausted", "expired", "permanent", "done"]
    ledger.upsert_items(WL, "r1", [prep(a) for a in ids])
    job, cids = submit(ledger, "r1", ids, round_=1)
    ledger.apply_results(
        job,
        [
            fail(cids["retry"]),
            fail(cids["exhausted"]),
            fail(cids["expired"], "expired"),
            fail(cids["permanent"], "failed_permanent"),
            ok(cids["done"]),
        ],
        cost_of,
    )
    for round_ in (2, 3):  # "exhausted" fails twice more and reaches the cap of 3
        job, cids = submit(ledger, "r1", ["exhausted"], round_=round_)
        ledger.apply_results(job, [fail(cids["exhausted"])], cost_of)
    assert item(ledger, "exhausted")["attempts"] == 3

    assert ledger.retry_candidates(WL, "r1", max_attempts=3) == (2, 2)
    states = {a: item(ledger, a)["state"] for a in ids}
    assert states == {
        "retry": "failed_retryable",
        "exhausted": "review",
        "expired": "expired",
        "permanent": "review",
        "done": "succeeded",
    }
    assert ledger.retry_candidates(WL, "r1", max_attempts=3) == (2, 0)
    assert ledger.retry_candidates(WL, "r1", max_attempts=1) == (0, 2)
    assert ledger.count_states(WL, "r1") == {"review": 4, "succeeded": 1}


def test_retry_candidates_only_touch_their_own_run(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job, cids = submit(ledger, "r1", ["a"])
    ledger.apply_results(job, [fail(cids["a"], "failed_permanent")], cost_of)
    assert ledger.retry_candidates(WL, "other-run", max_attempts=1) == (0, 0)
    assert item(ledger, "a")["state"] == "failed_permanent"
