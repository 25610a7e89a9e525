"""The facade: the ledger's rooms behind one class, and what spans them (sticky review)."""

from __future__ import annotations

import inspect
from pathlib import Path

from airflow_batch_provider.ledger import Ledger, store
from airflow_batch_provider.ledger.store import UpsertStats
from tests.unit.ledger.store_support import (
    WL,
    cost_of,
    fail,
    in_review_after_run_one,
    item,
    prep,
    stage,
    submit,
)

# ---------------------------------------------------------------------------------------------- the facade

#: ``Ledger``'s public methods (and property) with their parameters, as ``ledger/store.py`` had them
#: before it was split into rooms: the facade keeps every one, so no caller changes.
PUBLIC_METHODS: dict[str, tuple[str, ...]] = {
    "acquire_workload_lease": ("workload", "run_id", "owner", "dag_id", "takeover"),
    "apply_results": ("job_id", "results", "cost_of"),
    "attempt_totals": ("workload", "run_id"),
    "audit_log": ("workload", "limit"),
    "begin_sync_attempt": ("workload", "run_id", "item_key", "prompt_version", "from_states"),
    "claim_job": ("job_id", "owner", "lease_s"),
    "count_routes": ("workload", "run_id"),
    "count_states": ("workload", "run_id"),
    "ensure_schema": (),
    "finish_run": ("workload", "run_id", "report"),
    "from_url": ("url", "engine_kwargs"),
    "get_job": ("job_id",),
    "get_jobs": ("workload", "run_id", "round_"),
    "infra_costs": ("workload", "run_id"),
    "iter_cost_rows": ("workload", "run_id"),
    "iter_item_rows": ("workload", "run_id", "states", "shape", "job_id", "page"),
    "iter_items": ("workload", "run_id", "states", "columns", "page"),
    "job": ("job_id",),
    "jobs_in_doubt": ("workload",),
    "mark_job_in_doubt": ("job_id", "reason"),
    "mark_missing": ("job_id",),
    "mark_submitted": ("job_id", "batch_id", "input_ref", "submitted_at"),
    "publish": ("workload", "run_id"),
    "record_infra_cost": ("row",),
    "record_job": ("job", "placements"),
    "record_sync_result": ("workload", "run_id", "result", "cost_nusd"),
    "record_upload": ("job_id", "input_kind", "input_ref"),
    "redrive": ("workload", "item_keys", "app_ids", "error_code", "actor", "reason"),
    "reject_items": ("workload", "run_id", "rejected"),
    "release_job_claim": ("job_id", "owner"),
    "release_workload_lease": ("workload", "run_id", "actor", "reason"),
    "resolve_job": ("job_id", "batch_id", "actor", "note", "submitted_at", "input_ref"),
    "resolve_review": ("workload", "item_keys", "app_ids", "error_code", "actor", "note"),
    "retry_candidates": ("workload", "run_id", "max_attempts"),
    "review_items": ("workload", "error_code", "limit", "offset"),
    "run_batch_conn_id": ("workload", "run_id"),
    "run_cost": ("workload", "run_id"),
    "runs": ("workload", "limit"),
    "schema_version": (),
    "skip_review": ("workload", "item_keys", "app_ids", "error_code", "actor", "reason"),
    "start_run": ("workload", "run_id", "provider", "model", "dag_id", "batch_conn_id"),
    "transition": ("workload", "run_id", "target", "from_states", "keys", "attempts_below", "values"),
    "update_job": ("job_id", "values"),
    "upsert_items": ("workload", "run_id", "items"),
    "workload_lease": ("workload",),
}


def test_the_facade_keeps_every_public_method_of_the_ledger_with_its_parameters() -> None:
    public = {name for name in dir(Ledger) if not name.startswith("_")}
    assert public == set(PUBLIC_METHODS)
    for name, params in PUBLIC_METHODS.items():
        member = inspect.getattr_static(Ledger, name)
        if isinstance(member, property):
            continue
        found = tuple(
            p for p in inspect.signature(getattr(Ledger, name)).parameters if p not in ("self", "cls")
        )
        assert found == params, name


def test_every_room_of_the_ledger_stays_well_under_the_module_size_limit() -> None:
    """No room grows back into the 2,600-line store (the house's limit is about 800 lines a module)."""
    folder = Path(store.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in folder.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


# ---------------------------------------------------------------------------------------------- sticky review


def test_an_item_in_review_stays_there_next_night_and_is_not_paid_for_again(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    before = item(ledger, "a")
    assert (before["state"], before["attempts"]) == ("review", 1)

    stats = ledger.upsert_items(WL, "r2", [prep("a")])

    after = item(ledger, "a")
    assert (after["state"], after["attempts"], after["error_code"]) == ("review", 1, "500")
    assert stats == UpsertStats(in_review=1)
    assert ledger.count_states(WL, "r2") == {"review": 1}


def test_a_permanent_failure_left_by_a_dead_run_goes_to_review_not_back_to_pending(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job, cids = submit(ledger, "r1", ["a"])
    ledger.apply_results(job, [fail(cids["a"], "failed_permanent")], cost_of)
    assert ledger.upsert_items(WL, "r2", [prep("a")]) == UpsertStats(in_review=1)
    assert (item(ledger, "a")["state"], item(ledger, "a")["attempts"]) == ("review", 1)


def test_a_review_item_whose_input_changed_is_sent_again(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    assert ledger.upsert_items(WL, "r2", [prep("a", text="fixed input")]) == UpsertStats(changed=1)
    row = item(ledger, "a")
    assert (row["state"], row["attempts"], row["error_code"]) == ("pending", 0, None)


def test_a_review_item_under_a_new_prompt_version_is_a_new_item(ledger: Ledger) -> None:
    in_review_after_run_one(ledger)
    assert ledger.upsert_items(WL, "r2", [prep("a", version="v2")]) == UpsertStats(new=1)
    assert item(ledger, "a")["state"] == "review"


def test_items_another_run_has_sent_stay_with_it_and_unsent_staged_ones_are_taken(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("sent", "claimed", "doubt", "unsent")])
    submit(ledger, "r1", ["sent"], chunk=0)
    claimed, _ = stage(ledger, "r1", ["claimed"], chunk=1)
    ledger.claim_job(claimed, "t", 60)
    doubt, _ = stage(ledger, "r1", ["doubt"], chunk=2)
    ledger.mark_job_in_doubt(doubt, "lost reply")
    stage(ledger, "r1", ["unsent"], chunk=3)

    stats = ledger.upsert_items(
        WL, "r2", [prep(a, text="new") for a in ("sent", "claimed", "doubt", "unsent")]
    )

    assert stats == UpsertStats(changed=1, in_flight_elsewhere=3)
    assert {
        a: (item(ledger, a)["state"], item(ledger, a)["run_id"]) for a in ("sent", "claimed", "doubt")
    } == {
        "sent": ("submitted", "r1"),
        "claimed": ("staged", "r1"),
        "doubt": ("staged", "r1"),
    }
    assert (item(ledger, "unsent")["state"], item(ledger, "unsent")["run_id"]) == ("pending", "r2")
