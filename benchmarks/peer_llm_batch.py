"""The peer: Airflow's own ``LLMBatchOperator`` (apache-airflow-providers-common-ai), run as Airflow runs it.

This module runs in the peer's own virtualenv (built by ``bench_peers.py``), in a stage process of
``e2e.py``; it imports nothing of this package. The operator is deferrable, as a user would run
it: ``execute`` submits and raises ``TaskDeferred``; the trigger (``LLMBatchTrigger.run``) then
polls in this same process, standing in for the triggerer; ``execute_complete`` lands the
results. The worker slot is held during ``execute`` and ``execute_complete`` only.

Its inputs are what a user hands it: the list of every prompt (``requests=[{"prompt": ...}]``),
here read from the same JSONL records as the package's run. Its connection is a ``pydanticai``
connection whose host is the emulator (``AIRFLOW_CONN_BENCH_PEER``), and it writes its results
under ``result_path`` (``file://``).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SYSTEM = "Classify the customer comment as positive, negative or mixed. Answer with one word."


def prepare_imports() -> None:
    """Import the operator, its trigger and the OpenAI adapter (before the resident size is noted)."""
    import airflow.providers.common.ai.batch.openai
    import airflow.providers.common.ai.operators.llm_batch  # noqa: F401


class _TI(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


async def _first_event(trigger: Any) -> Any:
    async for event in trigger.run():
        return event
    raise RuntimeError("the trigger ended without an event")


def stage_run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the operator over every record's text; return its manifest, slot seconds and polls."""
    from airflow.exceptions import TaskDeferred
    from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator

    with open(spec["records"], encoding="utf-8") as fh:
        prompts = [{"prompt": json.loads(line)["text"]} for line in fh]
    op = LLMBatchOperator(
        task_id="llm_batch",
        requests=prompts,
        result_path=f"file://{spec['dir']}/peer-results",
        llm_conn_id="bench_peer",
        model_id="openai:gpt-4o-mini",
        system_prompt=SYSTEM,
        max_tokens=16,
        poll_interval=30,
        deferrable=True,
    )
    ti = _TI(dag_id="bench_peer", task_id="llm_batch", run_id=spec["run_id"], map_index=-1, pushed={})
    context: Any = {"task_instance": ti, "ti": ti, "run_id": spec["run_id"]}
    start = time.perf_counter()
    try:
        manifest = op.execute(context)
        submit_s, trigger_s, complete_s = time.perf_counter() - start, 0.0, 0.0
    except TaskDeferred as deferred:
        submit_s = time.perf_counter() - start
        start = time.perf_counter()
        event = asyncio.run(_first_event(deferred.trigger))
        trigger_s = time.perf_counter() - start
        start = time.perf_counter()
        manifest = getattr(op, deferred.method_name)(context, event.payload)
        complete_s = time.perf_counter() - start
    landed = Path(str(manifest["result_uri"]).removeprefix("file://"))
    usable = 0
    with landed.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("status") in ("succeeded", "success", "ok") or row.get("output") is not None:
                usable += 1
    return {
        "submit_s": submit_s,
        "deferred_s": trigger_s,
        "complete_s": complete_s,
        "counts": manifest.get("counts"),
        "request_count": manifest.get("request_count"),
        "usable": usable,
        "first_row": _first_line(landed),
    }


def _first_line(path: Path) -> str:
    with path.open(encoding="utf-8") as fh:
        return fh.readline()[:400]


STAGES = {"run": stage_run}
