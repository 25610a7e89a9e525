"""The package's tasks as benchmark stages: the operators ``batch_inference_group`` builds, each
``execute``d (the sensor ``poke``d) as the DAG's task would, in a process of its own (see ``e2e.py``).

A stage's spec carries the workload, the run id, the connection ids and the manifests its
upstream task returned; the ledger URL, the staging root and the connections come from the
environment (``AIRFLOW__BATCH_PROVIDER__LEDGER_URL``, ``AIRFLOW__BATCH_PROVIDER__STAGING_ROOT``,
``AIRFLOW_CONN_<ID>``), as in a worker. A mapped task (submit, wait, download, reconcile: one
instance per chunk) runs its instances one after another in its stage's process, so the peak
resident size reported is the largest instance's, plus anything one instance left behind.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.operators.batch import BatchPrepareOperator

WORKLOAD = "bench.e2e"


def prepare_imports() -> None:
    """Import what every stage uses (before the resident size after imports is noted)."""
    import airflow_batch_provider.operators.batch
    import airflow_batch_provider.sensors.batch  # noqa: F401


def prompt() -> Any:
    """The workload's prompt: a short system message, the record's ~1 KB text as the user message."""
    from airflow_batch_provider.core.requests import PromptTemplate

    return PromptTemplate(
        version="v1",
        model="gpt-4o-mini",
        system="Classify the customer comment as positive, negative or mixed. Answer with one word.",
        user="{{ text }}",
        params={"max_tokens": 16},
    )


def common(spec: dict[str, Any]) -> dict[str, Any]:
    """The operator arguments every task of the group shares."""
    return {"workload": WORKLOAD, "batch_conn_id": spec["conn_id"]}


def context(spec: dict[str, Any]) -> dict[str, Any]:
    """The task context the operators read (the run id; no task instance: no XCom, no links)."""
    return {"run_id": spec["run_id"]}


class TimedPrepare(BatchPrepareOperator):
    """``BatchPrepareOperator`` with the time of its chunking step (``stage_round``) noted apart."""

    chunk_s = 0.0

    def stage_round(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        start = time.perf_counter()
        try:
            return super().stage_round(*args, **kw)
        finally:
            self.chunk_s += time.perf_counter() - start


def stage_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """prepare: read the JSONL records, render, upsert the ledger, stage round 1's chunk files."""
    op = TimedPrepare(
        task_id="prepare",
        records=spec["records"],
        prompt=prompt(),
        chunking=ChunkOptions(max_requests=spec.get("chunk")),
        **common(spec),
    )
    start = time.perf_counter()
    manifests = op.execute(context(spec))
    total = time.perf_counter() - start
    return {"manifests": manifests, "chunk_s": op.chunk_s, "prepare_s": total - op.chunk_s}


def mapped(
    spec: dict[str, Any], task: str, operator: Any, arg: str, inputs: list[Any], **kw: Any
) -> list[Any]:
    """Run a mapped task's instances one after another, as ``task_<i>``, each on one input.

    :param spec: the stage's spec
    :param task: the task id's stem
    :param operator: the operator class
    :param arg: the argument each instance takes its input in (``job``, ``batch``)
    :param inputs: the upstream task's outputs, one per instance
    :param kw: further arguments for every instance
    """
    return [
        operator(task_id=f"{task}_{i}", **{arg: value}, **kw, **common(spec)).execute(context(spec))
        for i, value in enumerate(inputs)
    ]


def stage_upload(spec: dict[str, Any]) -> dict[str, Any]:
    """upload (mapped): stage each chunk's file at the provider and record it, exactly once."""
    from airflow_batch_provider.operators.batch import BatchUploadOperator

    return {"manifests": mapped(spec, "upload", BatchUploadOperator, "job", spec["manifests"])}


def stage_submit(spec: dict[str, Any]) -> dict[str, Any]:
    """submit (mapped): create each uploaded chunk's batch, exactly once."""
    from airflow_batch_provider.operators.batch import BatchSubmitOperator

    return {"batches": mapped(spec, "submit", BatchSubmitOperator, "job", spec["manifests"], prompt=prompt())}


def stage_wait(spec: dict[str, Any]) -> dict[str, Any]:
    """wait (mapped): poke each batch's sensor until it ends (deferred in production: no slot held)."""
    from airflow_batch_provider.core.policy import PollPolicy
    from airflow_batch_provider.sensors.batch import BatchStatusSensor

    policy = PollPolicy(initial_interval=0.5, factor=1.0, max_interval=0.5)
    out, pokes = [], 0
    for i, batch in enumerate(spec["batches"]):
        sensor = BatchStatusSensor(
            task_id=f"wait_{i}", batch=batch, batch_conn_id=spec["conn_id"], poll=policy, deferrable=False
        )
        while True:
            pokes += 1
            got = sensor.poke(context(spec))  # type: ignore[arg-type]
            if got:
                out.append(got.xcom_value)  # type: ignore[union-attr]
                break
            time.sleep(policy.initial_interval)
    return {"batches": out, "pokes": pokes}


def stage_download(spec: dict[str, Any]) -> dict[str, Any]:
    """download (mapped): stream each batch's output and error files into staging."""
    from airflow_batch_provider.operators.batch import BatchDownloadOperator

    return {"batches": mapped(spec, "download", BatchDownloadOperator, "batch", spec["batches"])}


def stage_reconcile(spec: dict[str, Any]) -> dict[str, Any]:
    """reconcile (mapped): apply each job's results to the ledger by custom id."""
    from airflow_batch_provider.operators.batch import BatchReconcileOperator

    return {
        "results": mapped(
            spec, "reconcile", BatchReconcileOperator, "batch", spec["batches"], prompt=prompt()
        )
    }


def stage_resubmit(spec: dict[str, Any]) -> dict[str, Any]:
    """resubmit: stage the retryable items as the next round's chunks."""
    from airflow_batch_provider.operators.batch import BatchResubmitOperator

    op = BatchResubmitOperator(
        task_id=f"resubmit_{spec['round']}",
        round_number=spec["round"],
        max_attempts=spec["max_attempts"],
        chunking=ChunkOptions(max_requests=spec.get("chunk")),
        **common(spec),
    )
    return {"manifests": op.execute(context(spec))}  # type: ignore[arg-type]


def stage_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """publish: settle what is unfinished, write results.jsonl and the report, close the run."""
    from airflow_batch_provider.operators.batch import BatchPublishOperator

    op = BatchPublishOperator(
        task_id="publish", max_attempts=spec["max_attempts"], prompt=prompt(), **common(spec)
    )
    return dict(op.execute(context(spec)))  # type: ignore[arg-type]


STAGES = {
    "prepare": stage_prepare,
    "upload": stage_upload,
    "submit": stage_submit,
    "wait": stage_wait,
    "download": stage_download,
    "reconcile": stage_reconcile,
    "resubmit": stage_resubmit,
    "publish": stage_publish,
}
