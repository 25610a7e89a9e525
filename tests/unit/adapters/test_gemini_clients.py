"""Gemini's clients (``adapters.gemini_clients``): the SDK's options for the Developer API and Vertex AI, and a Vertex job's arguments.

A Vertex batch run end to end through GCS is in ``test_gemini.py``.
"""

from __future__ import annotations

import io

import pytest

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.gemini import GeminiBatchAdapter
from airflow_batch_provider.adapters.gemini_clients import client_kwargs, vertex_create_args
from airflow_batch_provider.exceptions import ConfigurationError

MODEL = "gemini-2.5-flash"

pytest.importorskip("google.genai")


def test_a_connection_without_an_api_key_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="password"):
        client_kwargs(AdapterSettings(api_key=None))


def test_a_vertex_connection_builds_a_gcs_batch_prediction_request() -> None:
    settings = AdapterSettings(
        extra={"vertexai": True, "project": "p1", "location": "us-central1", "gcs_prefix": "gs://b/llm"}
    )
    kwargs = client_kwargs(settings)
    assert (kwargs["vertexai"], kwargs["project"], kwargs["location"]) == (True, "p1", "us-central1")
    assert "api_key" not in kwargs and "api_version" not in kwargs["http_options"]
    args = vertex_create_args(
        "models/gemini-2.5-flash", "gs://b/llm/input/abp-k.jsonl", "abp-k", "gs://b/llm/"
    )
    assert args == {
        "model": "gemini-2.5-flash",
        "src": "gs://b/llm/input/abp-k.jsonl",
        "config": {"display_name": "abp-k", "dest": "gs://b/llm/output/abp-k/"},
    }
    from google import genai
    from google.genai import _transformers, batches, types

    # The body the SDK would POST to .../batchPredictionJobs (the private converter is the SDK's own)
    client = genai.Client(**kwargs)
    src = _transformers.t_batch_job_source(client._api_client, args["src"])
    params = types._CreateBatchJobParameters(model=args["model"], src=src, config=args["config"])
    body = batches._CreateBatchJobParameters_to_vertex(client._api_client, params)
    assert body == {
        "model": "publishers/google/models/gemini-2.5-flash",
        "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": ["gs://b/llm/input/abp-k.jsonl"]}},
        "displayName": "abp-k",
        "outputConfig": {
            "predictionsFormat": "jsonl",
            "gcsDestination": {"outputUriPrefix": "gs://b/llm/output/abp-k/"},
        },
    }
    with pytest.raises(ConfigurationError, match="project"):
        client_kwargs(AdapterSettings(extra={"vertexai": True}))
    with pytest.raises(ConfigurationError, match="gs://"):
        vertex_create_args(MODEL, "files/x", "k", "gs://b")
    adapter = GeminiBatchAdapter(AdapterSettings(extra={"vertexai": True, "project": "p", "location": "l"}))
    with pytest.raises(ConfigurationError, match="gcs_prefix"):
        adapter.stage(io.BytesIO(b"{}\n"), "x.jsonl", 3)
