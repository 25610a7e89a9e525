"""The chaos suite's workload: a small classification run with small chunks (a test DAG).

Everything that varies between cases comes from the environment, so one DAG file serves every
case and the DAG code never names a provider:

- ``ABP_CHAOS_RECORDS``: the JSONL file of records (``id``, ``text``)
- ``ABP_CHAOS_MODEL``: the model (the connection ``chaos_batch`` picks the provider)
- ``ABP_CHAOS_CHUNK``: requests per job (default 10, so a few dozen items make several jobs)
- ``ABP_CHAOS_ATTEMPTS``: rounds (default 2)
- ``ABP_CHAOS_DEADLINE``: an ISO 8601 duration after which the ``sync_fallback`` policy takes over
  (unset: no deadline)
- ``ABP_CHAOS_KILL_AFTER``: ``<task id>[:<map index>]``; the task's process kills itself with
  ``SIGKILL`` right after that task's ``execute`` returned and before Airflow records it: a kill at
  a step boundary, the worst one (the work is done, Airflow will run the task again)
- ``ABP_CHAOS_SINK``: when set, a ``deliver_results`` task writes each answer into the table
  ``results`` (``item_id``, ``answer``) of the connection ``chaos_sink``, 10 rows per batch
- ``ABP_CHAOS_CONSUMER``: a file; when set, a ``deliver_actions`` consumer acts on each answer but
  every third record's (a ``where`` filter), appending ``<id> <idempotency key>`` to it, synced
  to disk, as an external system records each request it gets
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import ChunkOptions, DeadlineOptions
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.sinks import Consumer, HandOff, SqlUpsertSink

KILL_ENV = "ABP_CHAOS_KILL_AFTER"


def kill_at_step_boundary(context: Any, result: Any = None) -> None:
    """``post_execute`` of every task: SIGKILL this process after the task named by ``ABP_CHAOS_KILL_AFTER``."""
    target = os.environ.get(KILL_ENV)
    if not target:
        return
    task_id, _, index = target.partition(":")
    ti = context["ti"]
    if ti.task_id == task_id and (not index or int(index) == ti.map_index):
        os.kill(os.getpid(), signal.SIGKILL)


def records(context: Any) -> Iterator[dict[str, Any]]:
    """The records of ``ABP_CHAOS_RECORDS``."""
    with Path(os.environ["ABP_CHAOS_RECORDS"]).open(encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def act(handoff: HandOff) -> None:
    """The external call: one line per request, on disk before it returns."""
    with Path(os.environ["ABP_CHAOS_CONSUMER"]).open("a", encoding="utf-8") as fh:
        fh.write(f"{handoff.app_id} {handoff.key}\n")
        fh.flush()
        os.fsync(fh.fileno())


def acted_on(handoff: HandOff) -> bool:
    """Every record but every third one (``r0000``, ``r0003`` ... are left out)."""
    return int(handoff.app_id[1:]) % 3 != 0


deadline = os.environ.get("ABP_CHAOS_DEADLINE") or None
sinks: list[Any] = []
if os.environ.get("ABP_CHAOS_SINK"):
    sinks.append(
        SqlUpsertSink(
            conn_id="chaos_sink",
            table="results",
            key_columns=["item_id"],
            columns={"answer": "$"},
            batch_size=10,
        )
    )
if os.environ.get("ABP_CHAOS_CONSUMER"):
    sinks.append(Consumer("actions", act, where=acted_on, page_size=7))

with DAG(
    dag_id="chaos_workload",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test", "chaos"],
    default_args={"post_execute": kill_at_step_boundary},
):
    batch_inference_group(
        workload=os.environ.get("ABP_CHAOS_WORKLOAD", "chaos"),
        records=records,
        prompt=PromptTemplate(
            version="v1",
            model=os.environ.get("ABP_CHAOS_MODEL", "gpt-4o-mini"),
            system="Label the sentiment of the comment: positive, negative or neutral.",
            user="Comment {{ id }}: {{ text }}",
            params={"max_tokens": 16},
            name="chaos",
        ),
        batch_conn_id="chaos_batch",
        max_attempts=int(os.environ.get("ABP_CHAOS_ATTEMPTS", "2")),
        chunking=ChunkOptions(max_requests=int(os.environ.get("ABP_CHAOS_CHUNK", "10"))),
        deadline=DeadlineOptions(
            deadline,
            "sync_fallback",
            harvest_timeout_s=float(os.environ.get("ABP_CHAOS_HARVEST_TIMEOUT", "300")),
        )
        if deadline
        else None,
        sinks=sinks,
    )
