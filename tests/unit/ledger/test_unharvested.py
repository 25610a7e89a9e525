"""The send guard (ledger/unharvested.py): no path sends an item whose job holds an unharvested batch.

On SQLite and PostgreSQL (the ``ledger_url`` fixture). Every path that makes an item sendable
again goes through it: a re-drive (the CLI's and the review page's :meth:`Ledger.redrive`), a new
run's prepare (:meth:`Ledger.upsert_items`), and :meth:`Ledger.resolve_job`.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.exceptions import BatchNotHarvestedError
from airflow_batch_provider.ledger import Ledger
from tests.unit.ledger.test_store import WL, cost_of, item, ok, prep, stage

IDS = ("a", "b", "c")


def in_doubt_at_the_deadline(ledger: Ledger, run_id: str = "r1") -> tuple[str, dict[str, str]]:
    """A job whose create reply was lost, its items sent to review at the deadline (as settle_in_doubt does)."""
    ledger.upsert_items(WL, run_id, [prep(a) for a in IDS])
    job_id, cids = stage(ledger, run_id, IDS)
    ledger.mark_job_in_doubt(job_id, "500 after create; Anthropic cannot be asked by key")
    keys = [(item_key(a), "v1") for a in IDS]
    moved = ledger.transition(
        WL, run_id, "review", ["staged"], keys=keys, error_code="in_doubt", error_message="in doubt"
    )
    assert moved == len(IDS)
    return job_id, cids


def redrives(ledger: Ledger) -> list[Any]:
    return [r for r in ledger.audit_log(WL) if r.action == "redrive"]


ADDRESSES: dict[str, dict[str, Any]] = {
    "the review queue": {},
    "an error code": {"error_code": "in_doubt"},
    "item keys": {"item_keys": [item_key("a")]},
    "application ids": {"app_ids": ["b"]},
}


@pytest.mark.parametrize("address", list(ADDRESSES), ids=list(ADDRESSES))
def test_redriving_items_of_a_job_in_doubt_is_refused_naming_the_job_and_the_remedy(
    ledger: Ledger, address: str
) -> None:
    job_id, _ = in_doubt_at_the_deadline(ledger)
    with pytest.raises(BatchNotHarvestedError) as caught:
        ledger.redrive(WL, **ADDRESSES[address], actor="ops", reason="try again")
    message = str(caught.value)
    assert job_id in message and "airflow-batch jobs resolve" in message and "twice" in message
    assert caught.value.jobs[0][:2] == (job_id, "in_doubt")
    assert {item(ledger, a)["state"] for a in IDS} == {"review"}
    assert {item(ledger, a)["job_id"] for a in IDS} == {job_id}
    assert not redrives(ledger)


def test_redriving_items_whose_job_holds_a_batch_not_yet_harvested_is_refused_until_it_is(
    ledger: Ledger,
) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in IDS])
    job_id, _ = stage(ledger, "r1", IDS)
    ledger.mark_submitted(job_id, "batch_live", "file-1")
    keys = [(item_key(a), "v1") for a in IDS]
    ledger.transition(WL, "r1", "review", ["submitted"], keys=keys, error_code="deadline")
    with pytest.raises(BatchNotHarvestedError, match="batch_live"):
        ledger.redrive(WL, error_code="deadline", actor="ops", reason="again")
    assert {item(ledger, a)["state"] for a in IDS} == {"review"}
    # harvested: its answers are in the ledger, nothing it billed can be paid again
    ledger.update_job(job_id, state="reconciled")
    assert ledger.redrive(WL, error_code="deadline", actor="ops", reason="again") == len(IDS)
    assert {item(ledger, a)["state"] for a in IDS} == {"pending"}


def test_a_redrive_moves_nothing_when_one_addressed_job_is_guarded(ledger: Ledger) -> None:
    job_id, _ = in_doubt_at_the_deadline(ledger)
    ledger.upsert_items(WL, "r1", [prep("z")])
    ledger.transition(WL, "r1", "review", ["pending"], keys=[(item_key("z"), "v1")], error_code="too_long")
    with pytest.raises(BatchNotHarvestedError, match=job_id):
        ledger.redrive(WL, actor="ops", reason="all of them")
    assert item(ledger, "z")["state"] == "review"
    # the unguarded item alone may go
    assert ledger.redrive(WL, app_ids=["z"], actor="ops", reason="prompt fixed") == 1


def test_resolving_a_job_to_its_batch_takes_its_in_doubt_review_items_back_for_harvest(
    ledger: Ledger,
) -> None:
    job_id, cids = in_doubt_at_the_deadline(ledger)
    ledger.resolve_review(WL, app_ids=["c"], actor="ops", note="answered by hand")
    job = ledger.resolve_job(job_id, "msgbatch_found", "ops", "found in the console")
    assert job.state == "submitted" and job.batch_id == "msgbatch_found"
    assert [item(ledger, a)["state"] for a in IDS] == ["submitted", "submitted", "review"]
    assert item(ledger, "a")["error_code"] is None
    # still not re-drivable while the batch is not harvested; its answers land on the items
    with pytest.raises(BatchNotHarvestedError):
        ledger.redrive(WL, app_ids=["c"], actor="ops", reason="again")
    stats = ledger.apply_results(job_id, [ok(cids["a"]), ok(cids["b"])], cost_of)
    assert stats.outcomes == {"succeeded": 2}
    assert [item(ledger, a)["state"] for a in ("a", "b")] == ["succeeded", "succeeded"]


def test_a_job_proven_absent_lets_its_review_items_be_redriven(ledger: Ledger) -> None:
    job_id, _ = in_doubt_at_the_deadline(ledger)
    assert ledger.resolve_job(job_id, None, "ops", "no batch in the console").state == "staged"
    assert ledger.redrive(WL, error_code="in_doubt", actor="ops", reason="never sent") == len(IDS)


def test_a_new_run_leaves_the_items_of_a_job_in_doubt_with_their_run_even_when_changed(
    ledger: Ledger,
) -> None:
    job_id, _ = in_doubt_at_the_deadline(ledger, "r1")
    stats = ledger.upsert_items(WL, "r2", [prep(a, text="changed") for a in IDS])
    assert stats.in_flight_elsewhere == len(IDS) and stats.changed == 0
    assert {(item(ledger, a)["state"], item(ledger, a)["run_id"]) for a in IDS} == {("review", "r1")}
    # once the job is settled the next run takes them
    ledger.resolve_job(job_id, None, "ops", "no batch in the console")
    assert ledger.upsert_items(WL, "r3", [prep(a, text="changed") for a in IDS]).changed == len(IDS)
