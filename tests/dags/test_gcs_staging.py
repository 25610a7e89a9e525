"""A whole DAG on Google Cloud: staging in ``gs://`` (ObjectStoragePath on a google_cloud_platform
connection) and the batch on Vertex AI (the emulator's batchPredictionJobs reading the input from and
writing the predictions to a GCS server on loopback), with the credentials of a service-account key
held in that connection, in the worker and in the triggerer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.ledger import Ledger
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator
from tests.dags.test_bedrock_provider_switch import write_records
from tests.support.airflow_run import batch_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e
pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")

REPO_ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "provider_switch_feedback"
WORKLOAD = "provider_switch"
ITEMS = 300
MODEL = "gemini-2.5-flash"


@pytest.fixture(scope="module")
def run(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from tests.support.gcs import start_gcs, vertex_connections

    records = write_records(tmp_path_factory.mktemp("records") / "comments.jsonl")
    bucket = "abp-" + uuid.uuid4().hex[:10]
    with start_gcs() as gcs:
        gcs.create_bucket(bucket)
        with run_emulator(EmulatorConfig(time_scale=0.05, gcs_endpoint=gcs.endpoint_url)) as base_url:
            gcp, vertex = vertex_connections(base_url, gcs.endpoint_url, f"gs://{bucket}/vertex")
            tmp = tmp_path_factory.mktemp("gcs")
            env = batch_env(
                airflow_home,
                tmp,
                {"llm_batch": vertex, "abp_gcp": gcp},
                staging_root=f"gs://{bucket}/staging",
                staging_conn_id="abp_gcp",
            )
            env.update(
                {
                    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "tests" / "dags" / "dags"),
                    "ABP_SWITCH_RECORDS": records,
                    "ABP_SWITCH_MODEL": MODEL,
                    "ABP_SWITCH_CHUNK": "150",
                }
            )
            proc = run_airflow(env, "dags", "test", DAG_ID)
            assert proc.returncode == 0, tail(proc)
            ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
            (latest,) = ledger.runs(WORKLOAD, limit=1)
            yield {
                "ledger": ledger,
                "run_id": latest["run_id"],
                "objects": _names(gcs.endpoint_url, bucket),
                "stats": httpx.get(f"{base_url}/_emulator/stats").json(),
            }


def _names(endpoint: str, bucket: str) -> list[str]:
    from google.auth.credentials import AnonymousCredentials

    from airflow_batch_provider.adapters.gemini import gcs_filesystem

    fs = gcs_filesystem(AnonymousCredentials(), None, endpoint)
    return sorted(p.split("/", 1)[1] for p in fs.find(bucket))


def test_every_item_is_labelled_through_vertex(run: dict[str, Any]) -> None:
    assert run["ledger"].count_states(WORKLOAD, run["run_id"]) == {"succeeded": ITEMS}
    jobs = run["ledger"].get_jobs(WORKLOAD, run["run_id"])
    assert len(jobs) == 2 and {j.provider for j in jobs} == {"gemini"}
    assert all("/batchPredictionJobs/" in j.batch_id for j in jobs)
    counters = run["stats"]["counters"]
    assert counters["vertex.batches_created"] == 2 and counters["vertex.outputs_written"] == 2
    assert counters["vertex.tokens_issued"] >= 1  # the service-account key of the connection was used


def test_staging_chunks_vertex_inputs_predictions_and_results_all_live_in_gcs(run: dict[str, Any]) -> None:
    names = run["objects"]
    staged = [n for n in names if n.startswith("staging/") and "/chunk-" in n]
    inputs = [n for n in names if n.startswith("vertex/input/")]
    predictions = [n for n in names if n.startswith("vertex/output/") and n.endswith("predictions.jsonl")]
    assert len(staged) == len(inputs) == len(predictions) == 2, names
    assert any(n.startswith("staging/") and n.endswith("results.jsonl") for n in names), names
