"""The nightly workload end to end: real Airflow (`airflow dags test`, deferrable sensors in the
triggerer loop), the real `openai` SDK over HTTP to the emulator with faults injected, and the
ledger checked against the emulator's own deterministic fault decisions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from airflow_batch_provider.core.states import FINAL_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e

DAG_ID = "nightly_feedback_classification"
WORKLOAD = "feedback_classification"
SEED = 11
FAULTS = FaultConfig(
    rate_500=0.03,
    rate_429=0.03,
    rate_400=0.01,
    rate_context_length=0.01,
    rate_missing=0.02,
    rate_duplicate=0.02,
    rate_malformed=0.01,
    expire_batches=(1,),
    expire_after_fraction=0.6,
    retrieve_5xx_rate=0.1,
)
# What the emulator's fault decides -> the outcome the ledger must record for that line.
EXPECTED_OUTCOME = {
    "server_error": "failed_retryable",
    "rate_limited": "failed_retryable",
    "invalid_request": "failed_permanent",
    "context_length": "failed_permanent",
    "missing": "missing",
}


class Run:
    """One finished DAG run and the handles to inspect it."""

    def __init__(self, env: dict[str, str], base_url: str, ledger: Ledger, run_id: str, output: str) -> None:
        self.env = env
        self.base_url = base_url
        self.ledger = ledger
        self.run_id = run_id
        self.output = output

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.base_url}/_emulator/stats").json())

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        tables = {"items": s.items, "jobs": s.jobs, "attempts": s.attempts, "results": s.published}
        with self.ledger.engine.connect() as conn:
            return {
                name: sorted(tuple(row) for row in conn.execute(select(table)))
                for name, table in tables.items()
            }


@pytest.fixture(scope="module")
def run(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("nightly")
    config = EmulatorConfig(seed=SEED, time_scale=0.05, faults=FAULTS)
    with openai_dag_env(airflow_home, tmp, config, password="sk-test") as (base_url, env):
        proc = run_airflow(env, "dags", "test", DAG_ID)
        assert proc.returncode == 0, tail(proc)
        ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
        (latest,) = ledger.runs(WORKLOAD, limit=1)
        yield Run(env, base_url, ledger, latest["run_id"], proc.stdout + proc.stderr)


def test_every_item_ends_in_exactly_one_final_state(run: Run) -> None:
    states = run.ledger.count_states(WORKLOAD, run.run_id)
    assert sum(states.values()) == 3000
    assert set(states) <= FINAL_STATES, states
    assert states["succeeded"] > 2800


def test_every_result_line_matches_what_the_emulator_decided_for_it(run: Run) -> None:
    with run.ledger.engine.connect() as conn:
        attempts = list(conn.execute(select(s.attempts).where(s.attempts.c.run_id == run.run_id)).mappings())
        expired_jobs = {
            r.job_id for r in conn.execute(select(s.jobs.c.job_id).where(s.jobs.c.batch_state == "expired"))
        }
    assert attempts and expired_jobs, "the fault plan expires the second batch"
    checked = 0
    for att in attempts:
        decision = FAULTS.decide_item(SEED, att["custom_id"])
        if decision.fault != "none":
            expected = EXPECTED_OUTCOME[decision.fault]
        elif decision.malformed:
            expected = "missing"
        else:
            expected = "succeeded"
        allowed = {expected}
        if att["job_id"] in expired_jobs:
            allowed.add("expired")  # unfinished lines of an expired batch
        assert att["outcome"] in allowed, (att["custom_id"], att["outcome"], decision)
        checked += 1
    assert checked == len(attempts)


def test_final_states_follow_from_the_attempts(run: Run) -> None:
    per_item: dict[str, list[dict[str, Any]]] = {}
    with run.ledger.engine.connect() as conn:
        for att in conn.execute(
            select(s.attempts).where(s.attempts.c.run_id == run.run_id).order_by(s.attempts.c.attempt)
        ).mappings():
            per_item.setdefault(att["item_key"], []).append(dict(att))
        items = {r.item_key: r for r in conn.execute(select(s.items).where(s.items.c.run_id == run.run_id))}
    for key, item in items.items():
        outcomes = [a["outcome"] for a in per_item[key]]
        if "succeeded" in outcomes:
            assert item.state == "succeeded", (key, outcomes)
            assert item.route == ("batch" if outcomes[0] == "succeeded" else "resubmitted")
            assert json.loads(item.output_json)["sentiment"] in {"positive", "negative", "neutral"}
        else:
            assert item.state == "review", (key, outcomes)
            assert outcomes[-1] == "failed_permanent" or len(outcomes) == 3, (key, outcomes)


def test_retryable_items_were_resubmitted_with_their_item_key_and_a_new_attempt(run: Run) -> None:
    with run.ledger.engine.connect() as conn:
        rounds = sorted(
            {r.round for r in conn.execute(select(s.jobs.c.round).where(s.jobs.c.run_id == run.run_id))}
        )
        second = list(
            conn.execute(
                select(s.attempts.c.custom_id, s.attempts.c.item_key).where(s.attempts.c.attempt == 2)
            )
        )
    assert rounds[:2] == [1, 2]
    assert second and all(cid.startswith(key + "__a2c") for cid, key in second)


def test_one_provider_batch_per_job_was_created(run: Run) -> None:
    jobs = run.ledger.get_jobs(WORKLOAD, run.run_id)
    assert run.stats()["batches_created"] == len(jobs)
    assert len({j.batch_id for j in jobs}) == len(jobs)


def test_duplicates_and_malformed_lines_are_counted_on_their_jobs(run: Run) -> None:
    jobs = run.ledger.get_jobs(WORKLOAD, run.run_id)
    assert sum(j.duplicate_lines for j in jobs) > 0
    assert sum(j.malformed_lines for j in jobs) > 0
    assert sum(j.missing for j in jobs) > 0


def test_the_run_publishes_results_and_a_cost_report(run: Run) -> None:
    staging = Path(run.env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
    (folder,) = (staging / WORKLOAD).iterdir()
    report = json.loads((folder / "report.json").read_text())
    lines = (folder / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3000
    assert report["items"] == 3000
    assert float(report["paid"]) > 0
    assert float(report["sync_equivalent"]) > float(report["paid"])
    assert "cost per usable result" in run.output
    manifest = json.loads((folder / "round-1" / "manifest.json").read_text())
    jobs = run.ledger.get_jobs(WORKLOAD, run.run_id, 1)
    assert [c["sha256"] for c in manifest["chunks"]] == [j.input_sha256 for j in jobs]
    for chunk in manifest["chunks"]:
        data = (folder / "round-1" / chunk["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == chunk["sha256"]
        assert data.count(b"\n") == chunk["lines"] and len(data) == chunk["bytes"]


def test_clearing_submit_download_and_reconcile_changes_nothing(run: Run) -> None:
    before, batches = run.snapshot(), run.stats()["batches_created"]
    for task in ("submit", "download", "reconcile", "submit_2", "reconcile_2", "prepare", "publish"):
        args = ["tasks", "test", DAG_ID, f"{WORKLOAD}.{task}", run.run_id]
        if task not in ("prepare", "publish"):
            args += ["--map-index", "0"]
        proc = run_airflow(run.env, *args)
        assert proc.returncode == 0, tail(proc)
    after = run.snapshot()
    for table in before:
        if table == "results":  # publish rewrites published_at; the rows are the same
            assert [r[:-1] for r in after[table]] == [r[:-1] for r in before[table]]
        else:
            assert after[table] == before[table], table
    assert run.stats()["batches_created"] == batches


def test_a_submit_whose_reply_was_lost_re_attaches_instead_of_paying_twice(run: Run) -> None:
    job = run.ledger.get_jobs(WORKLOAD, run.run_id, 1)[0]
    batches = run.stats()["batches_created"]
    with run.ledger.engine.begin() as conn:  # as if the worker died right after the create call
        conn.execute(
            update(s.jobs).where(s.jobs.c.job_id == job.job_id).values(batch_id=None, state="staged")
        )
    proc = run_airflow(run.env, "tasks", "test", DAG_ID, f"{WORKLOAD}.submit", run.run_id, "--map-index", "0")
    assert proc.returncode == 0, tail(proc)
    assert "re-attaching" in proc.stdout + proc.stderr
    assert run.ledger.get_job(job.job_id).batch_id == job.batch_id
    assert run.stats()["batches_created"] == batches


def test_a_second_run_skips_every_unchanged_item_and_keeps_review_items_in_review(run: Run) -> None:
    before = run.ledger.count_states(WORKLOAD, run.run_id)
    batches = run.stats()["batches_created"]
    proc = run_airflow(run.env, "dags", "test", DAG_ID)
    assert proc.returncode == 0, tail(proc)
    latest = run.ledger.runs(WORKLOAD, limit=1)[0]["run_id"]
    assert latest != run.run_id
    states = run.ledger.count_states(WORKLOAD, latest)
    # Earlier successes are skipped; items in review stay there (they are not paid for again
    # night after night) until their input changes or a person re-drives them.
    assert states["unchanged"] == before["succeeded"]
    assert states["review"] == before["review"] > 0
    assert sum(states.values()) == 3000
    assert run.ledger.get_jobs(WORKLOAD, latest) == []
    assert run.stats()["batches_created"] == batches
    assert run.ledger.workload_lease(WORKLOAD) is None  # each run's publish gave the workload back
