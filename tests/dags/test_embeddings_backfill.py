"""One DAG, two providers: the embeddings backfill under `airflow dags test` against the emulator,
once through a Gemini connection and once through an OpenAI connection. Only the connection (and
the model that goes with it) changes; every item must end succeeded with a vector of the asked
dimension, in the ledger, in ``results.jsonl`` and in ``vectors.jsonl``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.ledger import Ledger
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import batch_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e

DAG_ID = "embeddings_backfill"
WORKLOAD = "embeddings_backfill"
ITEMS = 300
DIMENSIONS = 64
SEED = 22  # with these rates, every item succeeds within the three attempts (deterministic)
# A few retryable failures, so that the resubmission rounds run on both providers too.
FAULTS = FaultConfig(rate_500=0.02, rate_429=0.02, rate_missing=0.01, rate_malformed=0.01)

PROVIDERS: dict[str, dict[str, Any]] = {
    "gemini": {
        "conn_id": "gemini_batch_default",
        "model": "gemini-embedding-001",
        "conn": lambda url: {"conn_type": "gemini_batch", "host": url, "password": "gemini-test-key"},
    },
    "openai": {
        "conn_id": "openai_batch_default",
        "model": "text-embedding-3-small",
        "conn": lambda url: {"conn_type": "openai_batch", "host": f"{url}/v1", "password": "sk-test"},
    },
}


@pytest.fixture(scope="module", params=sorted(PROVIDERS))
def finished(
    request: pytest.FixtureRequest, airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    provider = PROVIDERS[request.param]
    tmp = tmp_path_factory.mktemp(f"embeddings-{request.param}")
    with run_emulator(EmulatorConfig(seed=SEED, time_scale=0.05, faults=FAULTS)) as base_url:
        env = batch_env(airflow_home, tmp, {provider["conn_id"]: provider["conn"](base_url)})
        env["AIRFLOW_VAR_EMBEDDINGS_BACKFILL_CONN_ID"] = provider["conn_id"]
        env["AIRFLOW_VAR_EMBEDDINGS_BACKFILL_MODEL"] = provider["model"]
        env["AIRFLOW_VAR_EMBEDDINGS_BACKFILL_DIMENSIONS"] = str(DIMENSIONS)
        env["AIRFLOW_VAR_EMBEDDINGS_BACKFILL_LIMIT"] = str(ITEMS)
        proc = run_airflow(env, "dags", "test", DAG_ID)
        stats = httpx.get(f"{base_url}/_emulator/stats").json()
    assert proc.returncode == 0, tail(proc)
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    (latest,) = ledger.runs(WORKLOAD, limit=1)
    staging = Path(env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
    return {
        "name": request.param,
        "ledger": ledger,
        "run_id": latest["run_id"],
        "run": latest,
        "stats": stats,
        "staging": staging,
        "output": proc.stdout + proc.stderr,
    }


def test_every_item_ends_succeeded_with_a_unit_vector_of_the_asked_dimension(
    finished: dict[str, Any],
) -> None:
    ledger: Ledger = finished["ledger"]
    states = ledger.count_states(WORKLOAD, finished["run_id"])
    assert states == {"succeeded": ITEMS}, states
    rows = list(ledger.iter_items(WORKLOAD, finished["run_id"], columns=["app_id", "state", "output_json"]))
    assert len(rows) == ITEMS
    for row in rows:
        vector = json.loads(row["output_json"])
        assert len(vector) == DIMENSIONS, row["app_id"]
        assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-6)


def test_the_batches_ran_on_the_provider_the_connection_names(finished: dict[str, Any]) -> None:
    counters = finished["stats"]["counters"]
    name = finished["name"]
    other = "openai" if name == "gemini" else "gemini"
    assert counters[f"{name}.batches_created"] >= 2  # the first round, and a resubmission of the failures
    assert counters.get(f"{other}.batches_created", 0) == 0
    assert counters.get("sync_requests", 0) == 0  # everything went through the batch API
    assert finished["run"]["provider"] == name


def test_vectors_are_published_to_results_jsonl_and_vectors_jsonl_in_staging(
    finished: dict[str, Any],
) -> None:
    (results,) = finished["staging"].glob(f"{WORKLOAD}/*/results.jsonl")
    published = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(published) == ITEMS and {p["state"] for p in published} == {"succeeded"}
    vectors = [json.loads(line) for line in (results.parent / "vectors.jsonl").read_text().splitlines()]
    assert sorted(v["id"] for v in vectors) == sorted(p["id"] for p in published)
    by_id = {p["id"]: p["output"] for p in published}
    assert all(v["vector"] == by_id[v["id"]] and len(v["vector"]) == DIMENSIONS for v in vectors)
