"""Nightly evaluation on a self-hosted model: a fixed prompt set, run by vLLM on your GPUs, scored.

Every night the evaluation set (``include/vllm/eval_set.jsonl``: comments with the expected
sentiment and topic) goes through ``batch_inference_group`` with a ``vllm_kubernetes`` connection:
each chunk runs as ``vllm run-batch`` in a Kubernetes pod (KubernetesPodOperator, deferrable),
and the results come back through the same ledger, reconcile, resubmit and publish path as a
provider batch. The cost report carries the pods' GPU time beside what the same tokens would cost
at each provider's batch price. After publish, ``score`` compares each answer with the expected
one and writes ``eval_score.json`` next to ``results.jsonl``.

Variables (optional), read when the run's tasks start, never when this file is parsed (a change
takes effect with the next run, without a re-parse): ``nightly_eval_vllm_conn_id`` (default
``vllm_kubernetes_default``; it must be a ``vllm_kubernetes`` connection: another type is refused
by ``prepare`` before anything is staged), ``nightly_eval_vllm_chunk`` (requests per pod, default
20; read by ``prepare`` and each ``resubmit``), ``nightly_eval_vllm_deadline`` (an offset from the
run's start such as ``PT2H``, a time of day such as ``06:30 Europe/Berlin``, or an ISO datetime;
empty or unset: no deadline that run; read by the ``deadline`` task). What the pods did not finish
by the deadline goes to the real-time endpoint at the connection's host (e.g. a ``vllm serve`` of
the same model): the policy ``sync_fallback`` is set in this file (``DEADLINE_POLICY``), since it
decides which policy task the DAG has. A pod still running at the deadline is stopped by
Kubernetes there, and the lines it finished are kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_batch_provider.core.deadline import DeadlinePolicy
from airflow_batch_provider.core.options import ChunkOptions, DeadlineOptions
from airflow_batch_provider.pipeline import batch_inference_group

INCLUDE = Path(__file__).resolve().parents[1] / "include" / "vllm"
EVAL_SET = INCLUDE / "eval_set.jsonl"
WORKLOAD = "nightly_eval_vllm"
# Templates, rendered by the tasks when they run (through the Task SDK): parsing this file reads no
# Variable and no connection.
CONN_ID = "{{ var.value.get('nightly_eval_vllm_conn_id', 'vllm_kubernetes_default') }}"
CHUNK = "{{ var.value.get('nightly_eval_vllm_chunk', '20') }}"
DEADLINE = "{{ var.value.get('nightly_eval_vllm_deadline', '') }}"
# What happens to prompts the pods did not answer by the deadline. It decides which policy task the
# DAG has (the graph), so it is chosen here, not per run: 'sync_fallback', 'publish_pending' or 'skip'.
DEADLINE_POLICY: DeadlinePolicy = "sync_fallback"


def load_eval_set(context: Any) -> Iterator[dict[str, Any]]:
    """Yield the evaluation prompts (the expected answers stay out of the request)."""
    with EVAL_SET.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                yield {"id": row["id"], "text": row["text"]}


def score_results(results_path: Any, eval_set: Path) -> dict[str, Any]:
    """Score published results against the expected answers.

    An item that did not succeed, or whose answer is not valid JSON, counts as wrong.

    :param results_path: the run's ``results.jsonl`` (a path or an ``ObjectStoragePath``)
    :param eval_set: the evaluation set with ``expected``
    """
    expected = {}
    with eval_set.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                expected[row["id"]] = row["expected"]
    answers: dict[str, Any] = {}
    with results_path.open("r", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                answers[row["id"]] = row["output"] if row["state"] == "succeeded" else None
    fields = ("sentiment", "topic")
    correct = {f: 0 for f in fields}
    exact = 0
    wrong: list[str] = []
    for app_id, want in sorted(expected.items()):
        got = answers.get(app_id)
        got = got if isinstance(got, dict) else {}
        hits = [got.get(f) == want[f] for f in fields]
        for f, hit in zip(fields, hits, strict=True):
            correct[f] += hit
        exact += all(hits)
        if not all(hits):
            wrong.append(app_id)
    total = len(expected)
    return {
        "items": total,
        "answered": sum(1 for k in expected if isinstance(answers.get(k), dict)),
        "exact_match": exact / total if total else 0.0,
        "accuracy": {f: correct[f] / total if total else 0.0 for f in fields},
        "wrong": wrong,
    }


with DAG(
    dag_id="nightly_eval_vllm",
    schedule="30 1 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "vllm", "kubernetes", "eval"],
    doc_md=__doc__,
):
    group = batch_inference_group(
        workload=WORKLOAD,
        records=load_eval_set,
        prompt=str(INCLUDE / "eval_prompt.yaml"),
        batch_conn_id=CONN_ID,
        lane="pod",  # the connection id is a template: the lane is not read from the connection
        max_attempts=2,
        chunking=ChunkOptions(max_requests=CHUNK),
        deadline=DeadlineOptions(DEADLINE, DEADLINE_POLICY),
    )

    @task
    def score(**context: Any) -> dict[str, Any]:
        """Score the published answers; write ``eval_score.json`` beside ``results.jsonl``."""
        from airflow_batch_provider.staging import Staging

        published = context["ti"].xcom_pull(task_ids=f"{WORKLOAD}.publish")
        folder = Staging().at(str(published["report"])).parent
        result = score_results(folder / "results.jsonl", EVAL_SET)
        with (folder / "eval_score.json").open("w", encoding="utf-8") as fh:
            fh.write(json.dumps(result, indent=2))
        print(f"eval: exact match {result['exact_match']:.1%} over {result['items']} prompts")
        return result

    group >> score()
