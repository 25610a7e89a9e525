"""What a dead run harvested and never reported, priced once by the run that took its workload over.

On SQLite and PostgreSQL (the ``ledger_url`` fixture), against the emulator: a run reconciles one
of its two batches and dies before it publishes; another run takes the lease over, adopts the
batch still in flight (ledger/adoption.py) and inherits the answers already harvested
(ledger/inheritance.py).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger.adoption import adopt_in_flight_jobs
from airflow_batch_provider.ledger.inheritance import INHERITED, inherit_harvested_lines, inherited
from airflow_batch_provider.services import report
from airflow_batch_provider.services.harvest import reconcile_job
from airflow_batch_provider.services.submit import submit_job
from tests.unit.services.workload import RUN, WORKLOAD, World, world

NEXT = "manual__2026-12-01T00:00:00+00:00"
THIRD = "manual__2026-12-02T00:00:00+00:00"


def created(w: World, job_id: str) -> str:
    w.upload(job_id)
    assert submit_job(
        ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1"
    ).batch_id
    return job_id


def reconciled(w: World, job_id: str) -> None:
    w.wait_terminal(job_id)
    pricer = report.batch_pricer("openai", w.prompt.model, None)
    assert reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, pricer)["outcomes"]


def killed_after_one_reconcile(w: World) -> tuple[str, str]:
    """RUN holds the lease, reconciles its first batch, creates the second and dies: (reconciled, created)."""
    w.ledger.acquire_workload_lease(WORKLOAD, RUN, "lease-try1", dag_id="d")
    first, second = (str(m["job_id"]) for m in w.stage(6, max_requests=3))
    reconciled(w, created(w, first))
    return first, created(w, second)


def take_over(w: World, run_id: str) -> None:
    w.ledger.start_run(WORKLOAD, run_id, w.adapter.name, w.prompt.model)
    w.ledger.acquire_workload_lease(WORKLOAD, run_id, "lease-next", dag_id="d", takeover=True)
    adopt_in_flight_jobs(w.ledger, WORKLOAD, run_id, "prepare")


def billed(w: World) -> tuple[int, int]:
    record = httpx.get(f"{w.url}/_emulator/record").json()
    usage = sum(
        (Usage(**u) for bs in record["batches"].values() for b in bs for u in (b["billed"] or {}).values()),
        Usage(),
    )
    return usage.input_tokens, usage.output_tokens


def priced(w: World, *runs: str) -> tuple[int, int]:
    got = [report.build_report(w.ledger, WORKLOAD, run, "openai", None)["usage"] for run in runs]
    return sum(u["input_tokens"] for u in got), sum(u["output_tokens"] for u in got)


def test_the_run_that_took_the_workload_over_prices_what_the_dead_run_had_reconciled_once(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        first, second = killed_after_one_reconcile(w)
        take_over(w, NEXT)
        (moved,) = inherit_harvested_lines(w.ledger, WORKLOAD, NEXT, "prepare")
        assert (moved["from_run"], moved["jobs"], moved["attempts"], moved["items"]) == (RUN, [first], 3, 3)
        assert inherit_harvested_lines(w.ledger, WORKLOAD, NEXT, "prepare") == []  # a cleared prepare
        # the answered items are the new run's as they are: succeeded, not "unchanged"
        states = sorted(r["state"] for r in w.ledger.iter_items(WORKLOAD, NEXT, columns=["state"]))
        assert states == ["submitted"] * 3 + ["succeeded"] * 3
        assert list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])) == []
        reconciled(w, second)
        assert priced(w, NEXT) == billed(w)
        # the dead run, cleared and published later, prices none of it a second time
        assert priced(w, NEXT, RUN) == billed(w)
        got = report.build_report(w.ledger, WORKLOAD, NEXT, "openai", None)
        assert [(j["from_run"], j["attempts"]) for j in got["inherited"]] == [(RUN, 3)]
        assert "inherited" in got["table"]
        assert [r.action for r in w.ledger.audit_log(WORKLOAD)].count(INHERITED) == 1


def test_a_second_takeover_hands_on_what_the_first_inherited_and_what_it_reconciled_itself(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        _, second = killed_after_one_reconcile(w)
        take_over(w, NEXT)
        inherit_harvested_lines(w.ledger, WORKLOAD, NEXT, "prepare")
        reconciled(w, second)  # NEXT reconciled the adopted batch, then died before its publish
        take_over(w, THIRD)
        moved = inherit_harvested_lines(w.ledger, WORKLOAD, THIRD, "prepare")
        assert [(m["from_run"], m["attempts"], m["items"]) for m in moved] == [(NEXT, 6, 6)]
        assert priced(w, THIRD) == billed(w)
        assert priced(w, RUN, NEXT) == (0, 0)
        assert [j["from_run"] for j in inherited(w.ledger, WORKLOAD, THIRD)] == [NEXT]


def test_nothing_is_inherited_by_a_run_that_does_not_hold_the_lease_it_took_over(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        killed_after_one_reconcile(w)
        w.ledger.start_run(WORKLOAD, NEXT, w.adapter.name, w.prompt.model)
        assert inherit_harvested_lines(w.ledger, WORKLOAD, NEXT, "prepare") == []
        take_over(w, NEXT)
        take_over(w, THIRD)  # a third run took the lease from the second before it prepared
        assert inherit_harvested_lines(w.ledger, WORKLOAD, NEXT, "prepare") == []
        assert priced(w, NEXT) == (0, 0)
