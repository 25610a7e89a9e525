"""`airflow dags test nightly_eval_vllm` with the real engine in the pod: chat on a tiny random model.

The eval DAG's 40 prompts run in one pod (one engine start) on the tiny Llama the test builds
(``tiny_chat_model.py``: random weights under a fixed seed, a byte-level tokenizer), served under
the prompt's model name. The prompt asks for OpenAI's ``json_schema`` ``response_format``, which
the engine enforces with its structured outputs (``--structured-outputs-config
{"backend": "xgrammar", "disable_any_whitespace": true}``: a random model would otherwise spend its
60 tokens on whitespace; without the backend named the engine refuses the option at argparse,
exit 2). Every prompt is reconciled to a final state; an answer the engine finished is JSON of
the schema, one cut at ``max_tokens`` is refused by the lane's output check (to review, not
retried); the cost is priced from the engine's own ``usage``; the report's GPU time is the pod's
measured time; ``score`` grades what came back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_engine.conftest import Engine, assert_the_stand_in_answers_in_the_engine_s_shape
from tests.vllm_engine.pods import run_engine_dag

# one engine start takes minutes on a busy 2-core machine: the e2e timeout is not a speed check here
pytestmark = [pytest.mark.airflow_e2e, pytest.mark.timeout(2400)]

DAG_ID = "nightly_eval_vllm"
ITEMS = 40
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the prompt's model: the pod serves the tiny one under it
#: The engine's structured outputs without free whitespace (the option needs the backend named).
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
LABELS = {"positive", "negative", "neutral"}
TOPICS = {"billing", "delivery", "product_quality", "support", "app_experience", "other"}


@pytest.fixture(scope="module")
def finished(
    airflow_home: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    engine: Engine,
    tiny_chat_model: Any,
) -> dict[str, Any]:
    variables = {"nightly_eval_vllm_chunk": str(ITEMS)}  # one pod: one engine start
    extra_args = [
        "--model", str(tiny_chat_model), "--served-model-name", MODEL, "--enforce-eager",
        "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
    ]  # fmt: skip
    return run_engine_dag(
        airflow_home, tmp_path_factory.mktemp("eval-engine"), engine, DAG_ID, variables, extra_args, 512
    )


def test_every_prompt_is_answered_by_the_engine_and_settled(finished: dict[str, Any]) -> None:
    results = finished["results"]
    assert len(results) == ITEMS
    states = {r["state"] for r in results}
    assert states <= {"succeeded", "review"}, states
    answered = [r["output"] for r in results if r["state"] == "succeeded"]
    assert answered, "the engine's structured outputs gave no answer of the schema"
    for label in answered:
        assert label["sentiment"] in LABELS and label["topic"] in TOPICS
    score = json.loads((finished["staging"] / "eval_score.json").read_text())
    assert score["items"] == ITEMS and score["answered"] == len(answered)


def test_one_pod_ran_the_prompts_and_was_deleted(finished: dict[str, Any]) -> None:
    assert len(finished["created"]) == 1 and finished["live"] == []
    command = finished["created"][0]["spec"]["containers"][0]["command"]
    assert command[:2] == ["vllm", "run-batch"] and MODEL in command


def test_the_cost_is_priced_from_the_engine_s_usage_and_the_gpu_time_is_the_pod_s(
    finished: dict[str, Any],
) -> None:
    exchange = finished["exchange"]
    [engine_out] = exchange.glob("*.output.jsonl")
    lines = [json.loads(x) for x in engine_out.read_text().splitlines()]
    assert {line["response"]["status_code"] for line in lines} == {200}
    usage = [line["response"]["body"]["usage"] for line in lines]
    report = finished["report"]
    assert report["usage"]["input_tokens"] == sum(u["prompt_tokens"] for u in usage)
    assert report["usage"]["output_tokens"] == sum(u["completion_tokens"] for u in usage)
    [job] = report["self_hosted"]["jobs"]
    assert job["outcome"] == "completed" and job["gpu_seconds"] >= 1
    assert "self-hosted GPU time" in finished["proc"].stdout + finished["proc"].stderr


def test_the_stand_in_answers_the_same_chat_file_in_the_engine_s_shape(
    finished: dict[str, Any], tmp_path: Path
) -> None:
    [engine_out] = finished["exchange"].glob("*.output.jsonl")
    assert_the_stand_in_answers_in_the_engine_s_shape(engine_out, MODEL, tmp_path)
