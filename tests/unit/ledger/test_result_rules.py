"""The rules that decide a result line (``ledger/result_rules.py``), one line at a time, on SQLite and PostgreSQL.

Each case stages one line the way :meth:`Ledger.apply_results` does, runs only the deciding
statements, reads what they decided (the line's verdict, what its attempt gets, where its item
moves) and rolls back. The whole apply, with reruns, slices and several lines of one item, is
tested through the Ledger in ``test_results.py``.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, select

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import stage
from airflow_batch_provider.ledger.result_rules import (
    OUTCOME_STATE,
    RESULT_LINE_COLUMNS,
    RESULTS_STAGE,
    result_rules,
)
from tests.unit.ledger.store_support import WL, cost_of, fail, ok, prep, submit

RUN = "r1"
COST = 1_000


def decided(ledger: Ledger, job_id: str, custom_id: str, outcome: str, cost: int = COST) -> dict[str, Any]:
    """What the rules decide for one line of ``job_id`` (nothing is applied)."""
    line = (0, job_id, custom_id, outcome, OUTCOME_STATE[outcome], None, None, 10, 2, 0, 0, cost)
    line += (json.dumps("answer") if outcome == "succeeded" else None,)
    rules = result_rules(job_id, WL)
    t = RESULTS_STAGE.c
    with ledger.engine.connect() as conn, conn.begin() as tx:
        stage(conn, RESULTS_STAGE, [line], RESULT_LINE_COLUMNS)
        conn.execute(rules.decide)
        conn.execute(rules.decide_gone)
        row = conn.execute(select(t.verdict, t.att_write, t.state, t.b_from, t.b_key)).mappings().one()
        tx.rollback()
    return dict(row)


def attempt_cost(ledger: Ledger, custom_id: str) -> int:
    """The cost an applied line recorded on its attempt (a rerun's line carries the same)."""
    with ledger.engine.connect() as conn:
        return int(
            conn.execute(
                select(s.attempts.c.cost_nusd).where(s.attempts.c.custom_id == custom_id)
            ).scalar_one()
        )


def first_round(ledger: Ledger, *app_ids: str) -> tuple[str, dict[str, str]]:
    ledger.upsert_items(WL, RUN, [prep(a) for a in app_ids])
    return submit(ledger, RUN, app_ids)


def resubmitted(ledger: Ledger, app_id: str, job1: str, cid1: str) -> tuple[str, str]:
    """The item failed retryably in round 1 and is out again in round 2: (job, custom id) of round 2."""
    ledger.apply_results(job1, [fail(cid1)], cost_of)
    job2, cids = submit(ledger, RUN, [app_id], round_=2)
    return job2, cids[app_id]


def test_a_line_of_the_items_current_attempt_is_applied_and_moves_it_to_its_outcomes_state(
    ledger: Ledger,
) -> None:
    job, cids = first_round(ledger, "a")
    assert decided(ledger, job, cids["a"], "succeeded") == {
        "verdict": "applied",
        "att_write": "full",
        "state": "succeeded",
        "b_from": "submitted",
        "b_key": item_key("a"),
    }
    retry = decided(ledger, job, cids["a"], "failed_retryable")
    assert (retry["verdict"], retry["att_write"], retry["state"]) == ("applied", "full", "failed_retryable")
    invalid = decided(ledger, job, cids["a"], "invalid_output")  # an answer that does not parse: retried
    assert (invalid["verdict"], invalid["state"]) == ("applied", "failed_retryable")


def test_a_rerun_of_an_applied_line_writes_nothing_again(ledger: Ledger) -> None:
    job, cids = first_round(ledger, "a")
    ledger.apply_results(job, [ok(cids["a"], output="answer")], cost_of)
    again = decided(ledger, job, cids["a"], "succeeded", attempt_cost(ledger, cids["a"]))
    assert (again["verdict"], again["att_write"], again["state"]) == ("applied", None, None)


def test_a_late_success_is_taken_while_the_item_has_no_usable_answer_and_paid_for_but_unused_after(
    ledger: Ledger,
) -> None:
    job1, cids = first_round(ledger, "a", "b")
    job2, cid2 = resubmitted(ledger, "a", job1, cids["a"])
    taken = decided(ledger, job1, cids["a"], "succeeded")  # round 1's answer arrives after all
    assert (taken["verdict"], taken["att_write"], taken["state"], taken["b_from"]) == (
        "applied",
        "full",
        "succeeded",
        "submitted",
    )
    ledger.apply_results(job2, [ok(cid2, output="round 2")], cost_of)
    unused = decided(ledger, job1, cids["a"], "succeeded")
    assert (unused["verdict"], unused["att_write"], unused["state"]) == ("discard", "full", None)
    late_failure = decided(ledger, job1, cids["a"], "failed_permanent")
    assert (late_failure["verdict"], late_failure["state"]) == ("late", None)
    ledger.apply_results(job1, [ok(cids["a"], output="round 1")], cost_of)  # recorded: paid, marked unused
    again = decided(ledger, job1, cids["a"], "succeeded", attempt_cost(ledger, cids["a"]))
    assert (again["verdict"], again["att_write"], again["state"]) == ("discard", None, None)  # nothing again


def test_a_line_the_job_never_sent_is_not_decided_and_one_for_a_gone_item_is_late(ledger: Ledger) -> None:
    job, cids = first_round(ledger, "a", "b")
    unknown = decided(ledger, job, "someone-else__a1c0", "succeeded")
    assert unknown["b_key"] is None and unknown["verdict"] is None  # counted as unknown, nothing written
    with ledger.engine.begin() as conn:
        conn.execute(delete(s.items).where(s.items.c.item_key == item_key("b")))
    gone = decided(ledger, job, cids["b"], "succeeded")
    assert (gone["verdict"], gone["att_write"], gone["state"], gone["b_from"]) == ("late", "full", None, None)
    ledger.apply_results(job, [ok(cids["b"], output="answer")], cost_of)  # its attempt keeps the cost
    again = decided(ledger, job, cids["b"], "succeeded", attempt_cost(ledger, cids["b"]))
    assert (again["verdict"], again["att_write"]) == ("late", None)
