"""A job whose whole file the engine refused for one named line (``ledger/refused_lines.py``), on SQLite and PostgreSQL.

The pod lane that finds the named line (``vllm run-batch`` exits with no output) is tested in
``tests/unit/services/test_vllm_refused_line.py``; here, what the ledger does with it.
"""

from __future__ import annotations

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.refused_lines import (
    NOT_RUN,
    REFUSED_CODE,
    SPARED_CODE,
    RefusedLine,
    settle_refused_line,
)
from tests.unit.ledger.store_support import WL, attempts_of, cost_of, item, ok, prep, snapshot, submit

IDS = ("a", "b", "c", "d")
ENGINE_SAYS = "Invalid request on line 2: 'max_tokens' must be at least 1"


def test_the_named_item_goes_to_review_with_the_engines_words_and_the_rest_get_their_attempt_back(
    ledger: Ledger,
) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in IDS])
    job_id, cids = submit(ledger, "r1", IDS)

    assert settle_refused_line(ledger, job_id, cids["b"], ENGINE_SAYS) == RefusedLine(rejected=1, spared=3)

    refused = item(ledger, "b")
    assert (refused["state"], refused["error_code"], refused["error_message"]) == (
        "review",
        REFUSED_CODE,
        ENGINE_SAYS,
    )
    assert refused["attempts"] == 1  # its line was the fault: the attempt counts
    for app_id in ("a", "c", "d"):
        spared = item(ledger, app_id)
        assert (spared["state"], spared["attempts"], spared["error_code"]) == (
            "failed_retryable",
            0,
            SPARED_CODE,
        )
        assert job_id in spared["error_message"] and "given back" in spared["error_message"]
        [attempt] = attempts_of(ledger, app_id)
        assert (attempt["outcome"], attempt["error_code"]) == (NOT_RUN, SPARED_CODE)
        assert not attempt["cost_nusd"]  # nothing ran: nothing is paid
    [attempt] = attempts_of(ledger, "b")
    assert (attempt["outcome"], attempt["error_code"]) == ("failed_permanent", REFUSED_CODE)
    [audit] = [row for row in ledger.audit_log(WL) if row.action == "refused_line"]
    assert (audit.actor, audit.item_count, audit.reason) == ("engine", 4, ENGINE_SAYS)
    assert cids["b"] in audit.target


def test_settling_the_same_refusal_again_changes_nothing(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in IDS])
    job_id, cids = submit(ledger, "r1", IDS)
    settle_refused_line(ledger, job_id, cids["b"], ENGINE_SAYS)
    before = snapshot(ledger)

    assert settle_refused_line(ledger, job_id, cids["b"], ENGINE_SAYS) == RefusedLine(rejected=0, spared=0)
    assert snapshot(ledger) == before  # no second audit row either


def test_an_item_of_the_job_already_answered_is_left_as_it_is(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in IDS])
    job_id, cids = submit(ledger, "r1", IDS)
    ledger.apply_results(job_id, [ok(cids["d"], output="done")], cost_of)

    assert settle_refused_line(ledger, job_id, cids["b"], ENGINE_SAYS) == RefusedLine(rejected=1, spared=2)
    answered = item(ledger, "d")
    assert (answered["state"], answered["attempts"]) == ("succeeded", 1)
    [attempt] = attempts_of(ledger, "d")
    assert attempt["outcome"] == "succeeded"
