"""Items a dead run left in ``fallback``: re-driven or resolved by a person, audited, never while the run lives."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import LedgerError, WorkloadLeasedError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import sync_job_id
from airflow_batch_provider.services.fallback import ANSWER_LOST
from airflow_batch_provider.services.stranded import settle_stranded_fallback, stranded_fallback
from tests.unit.ledger.test_reads import prep

WL = "feedback"
DEAD = "scheduled__2026-11-29T02:00:00+00:00"


def killed_mid_fallback(ledger: Ledger, sent: Sequence[str], answered: Sequence[str] = ()) -> None:
    """A run that held the workload, began a real-time attempt for ``sent`` and died; ``answered`` got theirs."""
    ledger.start_run(WL, DEAD, "openai", "gpt-4o-mini", dag_id="nightly")
    ledger.upsert_items(WL, DEAD, [prep(a) for a in [*sent, *answered, "untouched"]])
    ledger.acquire_workload_lease(WL, DEAD, owner="worker-1", dag_id="nightly")
    for app_id in [*sent, *answered]:
        cid = ledger.begin_sync_attempt(WL, DEAD, item_key(app_id), "v1", ["pending"])
        assert cid is not None
        if app_id in answered:
            ledger.record_sync_result(
                WL, DEAD, ItemResult(cid, "succeeded", output="ok", usage=Usage(5, 1)), 9
            )


def states(ledger: Ledger) -> dict[str, str]:
    return {
        str(r["app_id"]): str(r["state"]) for r in ledger.iter_items(WL, DEAD, columns=["app_id", "state"])
    }


def state_of(ledger: Ledger, app_id: str, version: str = "v1") -> str:
    from sqlalchemy import select

    from airflow_batch_provider.ledger import schema as s

    c = s.items.c
    where = (c.workload == WL, c.item_key == item_key(app_id), c.prompt_version == version)
    with ledger.engine.connect() as conn:
        return str(conn.execute(select(c.state).where(*where)).scalar_one())


def open_sync_attempts(ledger: Ledger) -> int:
    from sqlalchemy import func, select

    from airflow_batch_provider.ledger import schema as s

    with ledger.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    s.attempts.c.job_id == sync_job_id(WL, DEAD), s.attempts.c.outcome.is_(None)
                )
            ).scalar_one()
        )


def test_nothing_moves_while_the_run_still_holds_the_workload(ledger: Ledger) -> None:
    killed_mid_fallback(ledger, ["a", "b"])
    (listed,) = stranded_fallback(ledger, WL)
    assert (listed.run_id, listed.items, listed.holds_lease) == (DEAD, 2, True)
    with pytest.raises(WorkloadLeasedError, match="lease release"):
        settle_stranded_fallback(ledger, WL, DEAD, "redrive", actor="ann", reason="run killed")
    assert states(ledger) == {"a": "fallback", "b": "fallback", "untouched": "pending"}
    assert open_sync_attempts(ledger) == 2 and ledger.audit_log(WL) == []


def test_a_redrive_sends_only_the_stranded_items_back_to_pending_and_is_audited(ledger: Ledger) -> None:
    killed_mid_fallback(ledger, ["a", "b"], answered=["c"])
    assert ledger.release_workload_lease(WL, DEAD, actor="ann", reason="worker lost")
    moved = settle_stranded_fallback(ledger, WL, DEAD, "redrive", actor="ann", reason="run killed at 02:14")
    assert moved == 2
    assert states(ledger) == {"a": "pending", "b": "pending", "c": "succeeded", "untouched": "pending"}
    rows = {r["app_id"]: r for r in ledger.iter_items(WL, DEAD, columns=["app_id", "attempts", "error_code"])}
    assert rows["a"]["attempts"] == 0 and rows["a"]["error_code"] is None
    # the lost real-time attempts are closed at cost 0 as answer_lost, not left open
    assert open_sync_attempts(ledger) == 0
    lost = [
        a
        for row in ledger.iter_cost_rows(WL, DEAD)
        for a in row["attempts"]
        if a["error_code"] == ANSWER_LOST
    ]
    assert len(lost) == 2
    entry = ledger.audit_log(WL)[0]
    assert (entry.actor, entry.action, entry.item_count) == ("ann", "redrive", 2)
    assert "run killed at 02:14" in entry.reason and DEAD in entry.reason
    assert sorted(json.loads(entry.target)["item_keys"]) == sorted([item_key("a"), item_key("b")])
    assert stranded_fallback(ledger, WL) == []


def test_a_resolve_takes_the_stranded_items_out_of_every_run(ledger: Ledger) -> None:
    killed_mid_fallback(ledger, ["a"])
    ledger.release_workload_lease(WL, DEAD)
    assert settle_stranded_fallback(ledger, WL, DEAD, "resolve", actor="bob", reason="answered by hand") == 1
    assert states(ledger)["a"] == "review"
    assert ledger.review_items(WL) == []  # resolved: out of the open queue
    assert ledger.audit_log(WL)[0].action == "resolve_review"
    # the next run does not send it again
    ledger.start_run(WL, "next", "openai", "gpt-4o-mini")
    ledger.upsert_items(WL, "next", [prep("a")])
    assert state_of(ledger, "a") == "review"


def test_a_second_call_and_a_call_after_a_crash_half_way_finish_the_same_items(ledger: Ledger) -> None:
    killed_mid_fallback(ledger, ["a", "b"])
    ledger.release_workload_lease(WL, DEAD)
    # a crash after closing the attempts and queueing the items, before the re-drive
    from airflow_batch_provider.services import stranded

    stranded._settle_keys(ledger, WL, DEAD)
    assert states(ledger) == {"a": "review", "b": "review", "untouched": "pending"}
    assert settle_stranded_fallback(ledger, WL, DEAD, "redrive", actor="ann", reason="again") == 2
    assert settle_stranded_fallback(ledger, WL, DEAD, "redrive", actor="ann", reason="again") == 0
    assert states(ledger) == {"a": "pending", "b": "pending", "untouched": "pending"}


def test_the_same_items_other_prompt_version_in_review_and_a_live_newer_run_are_left_alone(
    ledger: Ledger,
) -> None:
    # an older prompt version of item "a" waits in the review queue with its own error
    ledger.upsert_items(WL, "older", [prep("a", version="v0")])
    ledger.transition(WL, "older", "review", ["pending"], error_code="context_length_exceeded")
    killed_mid_fallback(ledger, ["a"])
    ledger.release_workload_lease(WL, DEAD)
    ledger.acquire_workload_lease(WL, "newer", owner="worker-2")  # a newer run is alive
    assert settle_stranded_fallback(ledger, WL, DEAD, "redrive", actor="ann", reason="killed") == 1
    assert [(r.app_id, r.prompt_version) for r in ledger.review_items(WL)] == [("a", "v0")]
    assert states(ledger)["a"] == "pending"


def test_an_action_needs_an_actor_a_reason_and_a_known_verb(ledger: Ledger) -> None:
    killed_mid_fallback(ledger, ["a"])
    ledger.release_workload_lease(WL, DEAD)
    with pytest.raises(LedgerError, match="reason"):
        settle_stranded_fallback(ledger, WL, DEAD, "redrive", actor="ann", reason="")
    with pytest.raises(LedgerError, match="redrive, resolve"):
        settle_stranded_fallback(ledger, WL, DEAD, "skip", actor="ann", reason="x")  # type: ignore[arg-type]
    assert states(ledger)["a"] == "fallback"
