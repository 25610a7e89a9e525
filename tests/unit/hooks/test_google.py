from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.google import credentials_from_extras

pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")


def test_two_credential_sources_in_one_connection_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"\['keyfile_dict', 'key_path'\]"):
        credentials_from_extras({"keyfile_dict": "{}", "key_path": "/k.json"})


def test_a_key_that_is_not_json_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigurationError, match="not JSON") as caught:
        credentials_from_extras({"keyfile_dict": "-----BEGIN PRIVATE KEY----- secret"})
    assert "secret" not in str(caught.value)


def test_anonymous_and_the_legacy_prefixed_extras_are_read() -> None:
    from google.auth.credentials import AnonymousCredentials

    credentials, project = credentials_from_extras(
        {"extra__google_cloud_platform__is_anonymous": True, "extra__google_cloud_platform__project": "p9"}
    )
    assert isinstance(credentials, AnonymousCredentials) and project == "p9"


@pytest.fixture(scope="module")
def gcs() -> Iterator[Any]:
    from tests.support.gcs import start_gcs

    with start_gcs() as server:
        yield server


def test_staging_writes_and_verifies_a_gs_chunk_through_object_storage_path(
    gcs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gs:// through Airflow's ObjectStoragePath: the filesystem this provider registers (no Google
    provider installed), on the credentials and endpoint of a google_cloud_platform connection."""
    from airflow_batch_provider.staging import Staging

    bucket = "abp-" + uuid.uuid4().hex[:10]
    gcs.create_bucket(bucket)
    gcp = {
        "conn_type": "google_cloud_platform",
        "extra": {"is_anonymous": True, "gcs.endpoint": gcs.endpoint_url},
    }
    monkeypatch.setenv("AIRFLOW_CONN_ABP_GCS", json.dumps(gcp))
    staging = Staging(f"gs://{bucket}/llm-batch", conn_id="abp_gcs")
    chunk = staging.run_dir("w", "manual__2026-11-30T10:00:00+00:00") / "round-1" / "chunk-00000.jsonl"
    with staging.writer(chunk) as fh:
        fh.write(b'{"a":1}\n' * 1000)
    digest = Staging.sha256(chunk)
    again = staging.at(str(chunk))
    staging.verify(again, digest)
    assert again.protocol == "gs" and again.path.startswith(f"{bucket}/llm-batch/w/")
    assert gcs.server._storage.get_file_obj(bucket, again.path.split("/", 1)[1])  # really in GCS
    with staging.writer(again) as fh:
        fh.write(b"changed\n")
    from airflow_batch_provider.exceptions import StagingError

    with pytest.raises(StagingError, match="changed since it was staged"):
        staging.verify(staging.at(str(chunk)), digest)


def test_an_impersonation_chain_on_anonymous_credentials_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"anonymous and asks to impersonate b@p2\.iam"):
        credentials_from_extras({"is_anonymous": True, "impersonation_chain": "a@p1.iam.x, b@p2.iam.x"})


@pytest.mark.parametrize(
    ("value", "chain"),
    [
        (None, []),
        ("", []),
        ("one@p.iam.gserviceaccount.com", ["one@p.iam.gserviceaccount.com"]),
        (" a@p.iam.x , b@q.iam.x ,", ["a@p.iam.x", "b@q.iam.x"]),
        (["a@p.iam.x", "b@q.iam.x"], ["a@p.iam.x", "b@q.iam.x"]),
    ],
)
def test_an_impersonation_chain_is_read_as_the_google_provider_reads_it(value: Any, chain: list[str]) -> None:
    from airflow_batch_provider.hooks.google import impersonation_chain

    assert impersonation_chain(value) == chain


RELAY = "relay@abp-project.iam.gserviceaccount.com"
TARGET = "batch-runner@vertex-runs.iam.gserviceaccount.com"


@pytest.fixture
def impersonating(gcs: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The emulator, and connections abp_gcp (a service-account key and a chain) and abp_vertex."""
    from batch_emulator.config import EmulatorConfig
    from batch_emulator.testing import run_emulator
    from tests.support.gcs import vertex_connections
    from tests.unit.adapters.test_gemini import Emu

    bucket = "abp-" + uuid.uuid4().hex[:10]
    gcs.create_bucket(bucket)
    with run_emulator(EmulatorConfig(seed=5, gcs_endpoint=gcs.endpoint_url)) as base_url:
        gcp, gemini = vertex_connections(base_url, gcs.endpoint_url, f"gs://{bucket}/llm-batch")
        gcp["extra"].update({"impersonation_chain": f"{RELAY},{TARGET}", "iamcredentials.endpoint": base_url})
        gemini["extra"]["max_retries"] = 0
        monkeypatch.setenv("AIRFLOW_CONN_ABP_GCP", json.dumps(gcp))
        monkeypatch.setenv("AIRFLOW_CONN_ABP_VERTEX", json.dumps(gemini))
        yield Emu(base_url)


def test_a_vertex_batch_runs_end_to_end_on_credentials_impersonated_through_the_connections_chain(
    impersonating: Any,
) -> None:
    """The gcp connection holds a service-account key and a chain: the key's token buys the last
    account's token through the first (IAM Credentials at the emulator), and that token creates,
    polls and reads back a Vertex batch prediction job whose input and output live in GCS."""
    from airflow_batch_provider.adapters.gemini import GeminiBatchAdapter
    from airflow_batch_provider.hooks.batch import BatchHook
    from tests.unit.adapters.test_gemini import FINISH_S, by_id, chat, results, submit

    emu = impersonating
    adapter = BatchHook("abp_vertex").get_adapter()
    assert isinstance(adapter, GeminiBatchAdapter)
    assert adapter.settings.extra["project"] == "vertex-runs"  # the impersonated account's project
    ref = submit(adapter, [chat(i) for i in range(2)], key="abp-impersonated-1")
    assert ref.batch_id.startswith("projects/vertex-runs/locations/us-central1/batchPredictionJobs/")
    emu.advance(FINISH_S)
    status = adapter.status(ref)
    assert (status.state, status.completed) == ("completed", 2)
    got = by_id(results(adapter, ref))
    assert set(got) == {"id-c0", "id-c1"} and all(r.outcome == "succeeded" for r in got.values())
    counters = emu.stats()["counters"]
    assert counters["vertex.tokens_issued"] >= 1  # the key's own token, spent on the IAM call
    assert counters[f"vertex.impersonated.{RELAY}>{TARGET}"] >= 1
    assert counters["vertex.outputs_written"] == 1


async def test_the_triggerer_polls_vertex_on_the_impersonated_credentials_too(impersonating: Any) -> None:
    from airflow_batch_provider.hooks.batch import BatchHook
    from tests.unit.adapters.test_gemini import chat, submit

    ref = submit(BatchHook("abp_vertex").get_adapter(), [chat(1)], key="abp-impersonated-async")  # type: ignore[arg-type]
    before = impersonating.stats()["counters"][f"vertex.impersonated.{RELAY}>{TARGET}"]
    adapter = await BatchHook.aget_adapter("abp_vertex")
    client = adapter.async_client()
    try:
        status = await client.status(ref)
    finally:
        await client.close()
    assert status.state in ("validating", "in_progress")
    assert impersonating.stats()["counters"][f"vertex.impersonated.{RELAY}>{TARGET}"] > before


def test_a_quota_project_rides_on_the_credentials_built_from_a_key() -> None:
    """``quota_project_id`` (a field of the Google provider's form) bills the calls to that project
    on either branch; here the key is never used (no token is bought)."""
    from tests.support.gcs import service_account_key

    key = service_account_key("http://127.0.0.1:9/token")
    credentials, project = credentials_from_extras(
        {"keyfile_dict": json.dumps(key), "quota_project_id": "billing-proj"}
    )
    assert credentials.quota_project_id == "billing-proj" and project == "abp-project"


def test_a_quota_project_on_anonymous_credentials_is_ignored_as_the_google_provider_ignores_it() -> None:
    credentials, _ = credentials_from_extras({"is_anonymous": True, "quota_project_id": "billing-proj"})
    assert getattr(credentials, "quota_project_id", None) is None


# The Google provider's branch: `make test-google` runs this module in an environment that holds
# apache-airflow-providers-google (constraints-google.txt); `make test` runs it in one without.
def _google_provider_or_skip() -> None:
    pytest.importorskip("airflow.providers.google.common.hooks.base_google")


def test_with_the_google_provider_installed_its_base_hook_builds_the_connections_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key and an impersonation chain, no IAM override: GoogleBaseHook builds the impersonated
    credentials (its own class, the public IAM endpoint), the project is the target's, and the
    quota project is applied; gs:// is left to the provider's filesystem."""
    _google_provider_or_skip()
    from google.auth import impersonated_credentials

    from airflow_batch_provider.hooks import google
    from tests.support.gcs import service_account_key

    key = service_account_key("http://127.0.0.1:9/token")
    extra = {"keyfile_dict": json.dumps(key), "impersonation_chain": f"{RELAY}, {TARGET}"}
    extra["quota_project_id"] = "billing-proj"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ABP_GCP_PROVIDER", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    credentials, project, endpoint = google.google_credentials("abp_gcp_provider")
    assert isinstance(credentials, impersonated_credentials.Credentials)
    assert credentials.service_account_email == TARGET and project == "vertex-runs" and endpoint is None
    assert credentials.quota_project_id == "billing-proj"
    assert google.schemes == []  # the Google provider registers gs:// itself


def test_with_the_google_provider_installed_an_iam_override_keeps_the_connection_on_this_packages_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GoogleBaseHook has no IAM endpoint option: the override must not be dropped silently (the
    token would be bought at the public endpoint), so such a connection is read here."""
    _google_provider_or_skip()
    from airflow_batch_provider.hooks import google
    from tests.support.gcs import service_account_key

    key = service_account_key("http://127.0.0.1:9/token")
    extra = {
        "keyfile_dict": json.dumps(key),
        "impersonation_chain": TARGET,
        "iamcredentials.endpoint": "http://127.0.0.1:9",
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_ABP_GCP_OVERRIDE", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    credentials, _, _ = google.google_credentials("abp_gcp_override")
    assert credentials._iam_endpoint_override == (
        f"http://127.0.0.1:9/v1/projects/-/serviceAccounts/{TARGET}:generateAccessToken"
    )
