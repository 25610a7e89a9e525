"""The invoice extraction workload end to end: real Airflow (`airflow dags test`, deferrable sensors),
the real `anthropic` SDK over HTTP to the emulator's Message Batches routes with faults injected,
and the ledger checked against what the generator wrote and the emulator decided.

Expected outcome per item: a clean invoice is extracted exactly (its fields equal the generator's
truth); an invoice the stand-in model extracts in a shape the schema refuses (a non-ISO date, no
vendor line) is ``invalid_output`` in both attempts and ends in ``review``; an item hit by an
injected fault follows the fault (retryable -> second attempt, permanent -> review).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from airflow_batch_provider.core.states import FINAL_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import anthropic_connection, batch_env, run_airflow, tail
from tests.support.invoices import generated_invoices

pytestmark = pytest.mark.airflow_e2e

DAG_ID = "invoice_entity_extraction"
WORKLOAD = "invoice_extraction"
ITEMS = 600
SEED = 5
FAULTS = FaultConfig(
    rate_500=0.02,
    rate_429=0.02,
    rate_400=0.01,
    rate_context_length=0.01,
    rate_missing=0.01,
    rate_duplicate=0.02,
    rate_malformed=0.01,
    retrieve_5xx_rate=0.1,
)
# The emulator's fault for a line -> the outcome the ledger must record.
FAULT_OUTCOME = {
    "server_error": "failed_retryable",  # errored, overloaded_error
    "rate_limited": "failed_retryable",  # errored, rate_limit_error
    "invalid_request": "failed_permanent",  # errored, invalid_request_error
    "context_length": "failed_permanent",  # errored, invalid_request_error "prompt is too long"
    "missing": "missing",
}


def truth() -> dict[str, dict[str, Any]]:
    return {rec["id"]: rec for rec in generated_invoices(ITEMS)}


class Run:
    def __init__(self, base_url: str, ledger: Ledger, run_id: str) -> None:
        self.base_url = base_url
        self.ledger = ledger
        self.run_id = run_id

    def items(self) -> dict[str, Any]:
        with self.ledger.engine.connect() as conn:
            rows = conn.execute(select(s.items).where(s.items.c.run_id == self.run_id)).mappings()
            return {r["app_id"]: r for r in rows}

    def attempts(self) -> dict[str, list[dict[str, Any]]]:
        per_item: dict[str, list[dict[str, Any]]] = {}
        with self.ledger.engine.connect() as conn:
            q = select(s.attempts).where(s.attempts.c.run_id == self.run_id).order_by(s.attempts.c.attempt)
            for att in conn.execute(q).mappings():
                per_item.setdefault(att["item_key"], []).append(dict(att))
        return per_item


@pytest.fixture(scope="module")
def run(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("invoices")
    config = EmulatorConfig(seed=SEED, time_scale=0.05, faults=FAULTS)
    with run_emulator(config) as base_url:
        env = batch_env(
            airflow_home,
            tmp,
            {"anthropic_batch_default": anthropic_connection(base_url)},
        )
        proc = run_airflow(env, "dags", "test", DAG_ID)
        assert proc.returncode == 0, tail(proc)
        ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
        (latest,) = ledger.runs(WORKLOAD, limit=1)
        yield Run(base_url, ledger, latest["run_id"])


def test_every_invoice_ends_in_exactly_one_final_state(run: Run) -> None:
    states = run.ledger.count_states(WORKLOAD, run.run_id)
    assert sum(states.values()) == ITEMS
    assert set(states) <= FINAL_STATES, states
    assert set(states) == {"succeeded", "review"}, states


def test_each_attempt_has_the_outcome_the_document_and_the_fault_decide(run: Run) -> None:
    records = truth()
    items = run.items()
    checked = 0
    per_item = run.attempts()
    for app_id, item in items.items():
        valid = records[app_id]["_variant"] == "clean"
        for att in per_item[item["item_key"]]:
            decision = FAULTS.decide_item(SEED, att["custom_id"])
            if decision.fault != "none":
                expected = FAULT_OUTCOME[decision.fault]
            elif decision.malformed:
                expected = "missing"
            else:
                expected = "succeeded" if valid else "invalid_output"
            assert att["outcome"] == expected, (app_id, att["custom_id"], att["outcome"], decision)
            assert att["discarded"] == (att["outcome"] == "invalid_output")
            checked += 1
    assert checked > ITEMS


def test_final_states_follow_the_attempts_retried_once_then_review(run: Run) -> None:
    records = truth()
    per_item = run.attempts()
    review = 0
    for app_id, item in run.items().items():
        outcomes = [a["outcome"] for a in per_item[item["item_key"]]]
        assert [a["attempt"] for a in per_item[item["item_key"]]] == list(range(1, len(outcomes) + 1))
        assert len(outcomes) <= 2  # max_attempts=2: retried once at most
        if "succeeded" in outcomes:
            assert item["state"] == "succeeded", (app_id, outcomes)
            assert item["route"] == ("batch" if outcomes[0] == "succeeded" else "resubmitted")
            got = json.loads(item["output_json"])
            expected = records[app_id]["_truth"]
            assert {k: got[k] for k in expected} == expected, app_id
        else:
            review += 1
            assert item["state"] == "review", (app_id, outcomes)
            assert outcomes[-1] == "failed_permanent" or len(outcomes) == 2, (app_id, outcomes)
        if records[app_id]["_variant"] != "clean":
            assert item["state"] == "review", app_id
    invalid_variants = sum(1 for r in records.values() if r["_variant"] != "clean")
    assert review >= invalid_variants > 0


def test_the_shared_prompt_was_cached_and_usage_recorded(run: Run) -> None:
    with run.ledger.engine.connect() as conn:
        rows = list(
            conn.execute(
                select(
                    s.attempts.c.input_tokens,
                    s.attempts.c.cached_input_tokens,
                    s.attempts.c.cache_write_tokens,
                    s.attempts.c.output_tokens,
                    s.attempts.c.cost_nusd,
                ).where(s.attempts.c.run_id == run.run_id, s.attempts.c.outcome == "succeeded")
            )
        )
    assert rows
    assert sum(1 for r in rows if r.cached_input_tokens > 1000) > len(rows) * 0.9
    assert any(r.cache_write_tokens > 1000 for r in rows)
    assert all(r.output_tokens > 0 and r.input_tokens > 0 and r.cost_nusd > 0 for r in rows)


def test_the_emulator_saw_message_batches_and_no_duplicate_batch(run: Run) -> None:
    stats = httpx.get(f"{run.base_url}/_emulator/stats").json()
    created = stats["counters"]["anthropic.batches_created"]
    with run.ledger.engine.connect() as conn:
        jobs = list(conn.execute(select(s.jobs.c.batch_id).where(s.jobs.c.run_id == run.run_id)))
    assert created == len(jobs) == len({j.batch_id for j in jobs})
    assert all(j.batch_id.startswith("msgbatch_") for j in jobs)
