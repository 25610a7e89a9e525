"""The lease room: one run at a time holds a workload."""

from __future__ import annotations

import pytest

from airflow_batch_provider.exceptions import (
    WorkloadLeasedError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import UpsertStats
from tests.unit.ledger import race_worker
from tests.unit.ledger.store_support import (
    WL,
    item,
    prep,
    race_in_processes,
    race_in_threads,
    submit,
)

# ---------------------------------------------------------------------------------------------- workload lease


def test_one_run_holds_a_workload_and_another_is_told_who_since_when_and_what_to_do(ledger: Ledger) -> None:
    ledger.start_run(WL, "scheduled__1", "openai", "gpt-4o-mini")
    lease = ledger.acquire_workload_lease(WL, "scheduled__1", "prepare-try1", dag_id="nightly")
    assert (lease.run_id, lease.dag_id, lease.owner) == ("scheduled__1", "nightly", "prepare-try1")
    assert ledger.runs(WL)[0]["dag_id"] == "nightly"
    with pytest.raises(WorkloadLeasedError) as caught:
        ledger.acquire_workload_lease(WL, "manual__2", "prepare-try1", dag_id="nightly")
    message = str(caught.value)
    assert "'feedback'" in message and "'nightly'" in message and "'scheduled__1'" in message
    assert lease.acquired_at.isoformat() in message
    assert "max_active_runs=1" in message and "airflow-batch lease release" in message
    assert (caught.value.run_id, caught.value.dag_id) == ("scheduled__1", "nightly")


def test_the_holding_run_acquires_again_keeping_its_since(ledger: Ledger) -> None:
    first = ledger.acquire_workload_lease(WL, "r1", "prepare-try1")
    again = ledger.acquire_workload_lease(WL, "r1", "prepare-try2", dag_id="nightly")
    assert (again.owner, again.dag_id, again.acquired_at) == ("prepare-try2", "nightly", first.acquired_at)
    assert ledger.workload_lease(WL) == again


def test_a_takeover_moves_the_lease_is_audited_and_leaves_in_flight_items_with_their_run(
    ledger: Ledger,
) -> None:
    ledger.acquire_workload_lease(WL, "r1", "t1")
    ledger.upsert_items(WL, "r1", [prep("a")])
    submit(ledger, "r1", ["a"])
    taken = ledger.acquire_workload_lease(WL, "r2", "t2", takeover=True)
    assert (taken.run_id, taken.taken_over_from) == ("r2", "r1")
    assert ledger.audit_log(WL)[0].action == "takeover_lease"
    assert ledger.upsert_items(WL, "r2", [prep("a")]) == UpsertStats(in_flight_elsewhere=1)
    assert item(ledger, "a")["run_id"] == "r1"
    with pytest.raises(WorkloadLeasedError):
        ledger.acquire_workload_lease(WL, "r1", "t1-retry")


def test_a_released_lease_lets_another_run_in_and_only_its_holder_releases_it(ledger: Ledger) -> None:
    ledger.acquire_workload_lease(WL, "r1", "t1")
    assert not ledger.release_workload_lease(WL, "r2")
    assert ledger.release_workload_lease(WL, "r1", actor="bob", reason="run r1 was killed")
    assert ledger.audit_log(WL)[0].action == "release_lease"
    assert ledger.workload_lease(WL) is None
    assert ledger.acquire_workload_lease(WL, "r2", "t2").run_id == "r2"


def test_leases_of_two_workloads_are_independent(ledger: Ledger) -> None:
    ledger.acquire_workload_lease("a", "r1", "t1")
    assert ledger.acquire_workload_lease("b", "r2", "t2").run_id == "r2"


def test_two_runs_racing_for_a_workload_never_both_win(ledger: Ledger, ledger_url: str) -> None:
    workloads = [f"wl{n}" for n in range(20)]
    winners = race_in_processes(race_worker.lease_each, ledger_url, workloads, ["run-a", "run-b"])
    assert all(len(w) == 1 for w in winners.values()), winners
    for wl in workloads:
        lease = ledger.workload_lease(wl)
        assert lease is not None and [lease.run_id] == winners[wl]


def test_two_threads_racing_for_a_workload_never_both_win(ledger_url: str) -> None:
    workloads = [f"wl{n}" for n in range(50)]
    outcomes = race_in_threads(
        ledger_url, workloads, lambda led, wl, who: led.acquire_workload_lease(wl, f"run-{who}", f"t{who}")
    )
    assert all(a != b for a, b in outcomes)
