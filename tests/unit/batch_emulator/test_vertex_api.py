"""The emulator's Vertex AI routes over HTTP, with a GCS server on loopback."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

pytest.importorskip("gcp_storage_emulator")
pytest.importorskip("gcsfs")

JOBS = "/v1beta1/projects/p/locations/us-central1/batchPredictionJobs"


@pytest.fixture(scope="module")
def gcs() -> Iterator[Any]:
    from tests.support.gcs import start_gcs

    with start_gcs() as server:
        yield server


@pytest.fixture
def api(gcs: Any) -> Iterator[tuple[httpx.Client, str, Any]]:
    from google.auth.credentials import AnonymousCredentials

    from airflow_batch_provider.adapters.gemini import gcs_filesystem

    bucket = "abp-" + uuid.uuid4().hex[:10]
    gcs.create_bucket(bucket)
    with (
        run_emulator(EmulatorConfig(gcs_endpoint=gcs.endpoint_url)) as url,
        httpx.Client(base_url=url) as http,
    ):
        token = http.post("/token", data={"grant_type": "jwt", "assertion": "signed"}).json()["access_token"]
        http.headers["Authorization"] = f"Bearer {token}"
        yield http, bucket, gcs_filesystem(AnonymousCredentials(), None, gcs.endpoint_url)


def _create(http: httpx.Client, uri: str, out: str) -> httpx.Response:
    return http.post(
        JOBS,
        json={
            "displayName": "k",
            "model": "publishers/google/models/gemini-2.5-flash",
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [uri]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": out}},
        },
    )


def test_a_token_needs_a_signed_assertion() -> None:
    with run_emulator() as url:
        assert httpx.post(f"{url}/token", data={"grant_type": "jwt"}).status_code == 400


def test_a_job_over_a_missing_input_object_is_refused_naming_it(api: tuple[httpx.Client, str, Any]) -> None:
    http, bucket, _ = api
    answer = _create(http, f"gs://{bucket}/in/none.jsonl", f"gs://{bucket}/out/")
    assert answer.status_code == 400
    assert f"gs://{bucket}/in/none.jsonl" in answer.json()["error"]["message"]


def test_a_line_without_a_key_fails_the_job_with_the_reason_and_writes_no_predictions(
    api: tuple[httpx.Client, str, Any],
) -> None:
    http, bucket, fs = api
    line = {"request": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}}
    fs.pipe(f"{bucket}/in/a.jsonl", (json.dumps(line) + "\n").encode())
    job = _create(http, f"gs://{bucket}/in/a.jsonl", f"gs://{bucket}/out/").json()
    http.post("/_emulator/clock", json={"advance_s": 60}).raise_for_status()
    done = http.get(f"/v1beta1/{job['name']}").json()
    assert done["state"] == "JOB_STATE_FAILED" and "key" in done["error"]["message"]
    assert not fs.glob(f"{bucket}/out/**/predictions.jsonl")


def test_a_cancel_stops_a_running_job_and_is_refused_once_a_job_has_ended(
    api: tuple[httpx.Client, str, Any],
) -> None:
    http, bucket, fs = api
    line = {"key": "a", "request": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}}
    fs.pipe(f"{bucket}/in/c.jsonl", (json.dumps(line) + "\n").encode())
    running = _create(http, f"gs://{bucket}/in/c.jsonl", f"gs://{bucket}/out/c/").json()
    assert http.post(f"/v1beta1/{running['name']}:cancel").status_code == 200
    http.post("/_emulator/clock", json={"advance_s": 60}).raise_for_status()
    assert http.get(f"/v1beta1/{running['name']}").json()["state"] == "JOB_STATE_CANCELLED"
    finished = _create(http, f"gs://{bucket}/in/c.jsonl", f"gs://{bucket}/out/f/").json()
    http.post("/_emulator/clock", json={"advance_s": 60}).raise_for_status()
    done = http.get(f"/v1beta1/{finished['name']}").json()
    assert done["state"] == "JOB_STATE_SUCCEEDED"
    assert fs.glob(f"{bucket}/out/f/**/predictions.jsonl")
    answer = http.post(f"/v1beta1/{finished['name']}:cancel")
    assert answer.status_code == 400 and answer.json()["error"]["status"] == "FAILED_PRECONDITION"
