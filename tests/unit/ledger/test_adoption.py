"""A dead run's jobs in flight, adopted by the run that took its workload over (ledger/adoption.py).

On SQLite and PostgreSQL (the ``ledger_url`` fixture), against the emulator: a run stages two
chunks, creates one batch and dies; another run takes the lease over and adopts both jobs.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.exceptions import WorkloadLeasedError
from airflow_batch_provider.ledger.adoption import (
    ADOPTED,
    adopt_in_flight_jobs,
    adopted_jobs,
    dead_runs_taken_over,
)
from airflow_batch_provider.services import report
from airflow_batch_provider.services.harvest import reconcile_job
from airflow_batch_provider.services.submit import submit_job
from tests.unit.services.workload import RUN, WORKLOAD, World, world

NEXT = "manual__2026-12-01T00:00:00+00:00"
THIRD = "manual__2026-12-02T00:00:00+00:00"


def killed_with_a_batch_out(w: World) -> tuple[str, str]:
    """RUN holds the lease, stages two chunks, creates the first one's batch and dies: (created, staged)."""
    w.ledger.acquire_workload_lease(WORKLOAD, RUN, "lease-try1", dag_id="d")
    first, second = (str(m["job_id"]) for m in w.stage(6, max_requests=3))
    w.upload(first)
    assert submit_job(
        ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=first, owner="t1"
    ).batch_id
    return first, second


def take_over(w: World, run_id: str = NEXT) -> None:
    w.ledger.start_run(WORKLOAD, run_id, w.adapter.name, w.prompt.model)
    w.ledger.acquire_workload_lease(WORKLOAD, run_id, "lease-next", dag_id="d", takeover=True)


def test_the_run_that_took_the_workload_over_adopts_the_dead_runs_jobs_into_its_first_round_once(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        created, staged = killed_with_a_batch_out(w)
        take_over(w)
        assert dead_runs_taken_over(w.ledger, WORKLOAD, NEXT) == [RUN]
        moved = adopt_in_flight_jobs(w.ledger, WORKLOAD, NEXT, "prepare")
        assert [(m["job_id"], m["state"], m["items"]) for m in moved] == [
            (created, "submitted", 3),
            (staged, "staged", 3),
        ]
        assert adopt_in_flight_jobs(w.ledger, WORKLOAD, NEXT, "prepare") == []  # a cleared prepare
        # both jobs are the new run's round 1, in their order, with their items; nothing is left behind
        jobs = w.ledger.get_jobs(WORKLOAD, NEXT, 1)
        assert [(j.job_id, j.chunk_index) for j in jobs] == [(created, 0), (staged, 1)]
        assert w.ledger.get_jobs(WORKLOAD, RUN) == []
        assert list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])) == []
        states = sorted(r["state"] for r in w.ledger.iter_items(WORKLOAD, NEXT, columns=["state"]))
        assert states == ["staged"] * 3 + ["submitted"] * 3
        assert [r.action for r in w.ledger.audit_log(WORKLOAD)].count(ADOPTED) == 2
        assert [j["from_run"] for j in adopted_jobs(w.ledger, WORKLOAD, NEXT)] == [RUN, RUN]


def test_the_adopted_batch_is_harvested_once_and_priced_in_the_adopting_runs_report(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        created, _ = killed_with_a_batch_out(w)
        take_over(w)
        adopt_in_flight_jobs(w.ledger, WORKLOAD, NEXT, "prepare")
        w.wait_terminal(created)
        pricer = report.batch_pricer("openai", w.prompt.model, None)
        assert reconcile_job(w.ledger, w.adapter, w.staging, created, w.prompt, pricer)["outcomes"]
        assert w.batches_created() == 1  # harvested, not bought again
        got = report.build_report(w.ledger, WORKLOAD, NEXT, "openai", None)
        ((batch,),) = httpx.get(f"{w.url}/_emulator/record").json()["batches"].values()
        billed = sum((Usage(**u) for u in batch["billed"].values()), Usage())
        assert (got["usage"]["input_tokens"], got["usage"]["output_tokens"]) == (
            billed.input_tokens,
            billed.output_tokens,
        )
        assert Decimal(got["paid"]) > 0
        assert [j["job_id"] for j in got["adopted"]] == [created, w.ledger.get_jobs(WORKLOAD, NEXT)[1].job_id]
        assert "adopted" in got["table"]


def test_nothing_is_adopted_from_a_run_whose_lease_was_not_taken_over_or_by_a_run_without_the_lease(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        killed_with_a_batch_out(w)
        w.ledger.start_run(WORKLOAD, NEXT, w.adapter.name, w.prompt.model)
        with pytest.raises(WorkloadLeasedError):  # the holder is alive: no takeover, no adoption
            w.ledger.acquire_workload_lease(WORKLOAD, NEXT, "lease-next", dag_id="d")
        assert adopt_in_flight_jobs(w.ledger, WORKLOAD, NEXT, "prepare") == []
        take_over(w)
        take_over(w, THIRD)  # a third run took the lease from the second before it prepared
        assert adopt_in_flight_jobs(w.ledger, WORKLOAD, NEXT, "prepare") == []
        assert len(w.ledger.get_jobs(WORKLOAD, RUN)) == 2


def test_a_dead_run_taken_over_by_a_run_that_died_too_is_adopted_through_it(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        killed_with_a_batch_out(w)
        take_over(w)  # NEXT took RUN's workload and died before its prepare
        take_over(w, THIRD)
        assert dead_runs_taken_over(w.ledger, WORKLOAD, THIRD) == [NEXT, RUN]
        assert len(adopt_in_flight_jobs(w.ledger, WORKLOAD, THIRD, "prepare")) == 2
        assert len(w.ledger.get_jobs(WORKLOAD, THIRD, 1)) == 2
