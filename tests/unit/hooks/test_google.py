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
