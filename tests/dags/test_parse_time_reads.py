"""No DAG file in dags/ reads an Airflow Variable or a connection when it is parsed.

The dag-processor parses every file every 30 seconds: a Variable or connection read at the top
level of a DAG file costs a lookup per parse and freezes the value into the serialized DAG until
the next parse. Here each file is parsed the way the dag-processor does (``BundleDagBag``) with
the Task SDK's only ways to a Variable or a connection (and Airflow's legacy models) replaced by
a recorder that refuses: any parse-time read shows up, by file, with what it asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

CODE = """
import json, traceback
from pathlib import Path

reads = []


def refuse(kind):
    def read(key, *args, **kwargs):
        where = [f for f in traceback.extract_stack() if "/dags/" in f.filename]
        reads.append({"kind": kind, "key": str(key), "file": Path(where[-1].filename).name if where else "?"})
        raise RuntimeError(f"{kind} {key!r} read while the DAG file is parsed")
    return read


async def refuse_async(key, *args, **kwargs):
    return refuse("connection")(key)


from airflow.sdk.execution_time import context
context._get_variable = refuse("variable")
context._get_connection = refuse("connection")
context._async_get_connection = refuse_async
from airflow.models.variable import Variable as LegacyVariable
from airflow.models.connection import Connection as LegacyConnection
LegacyVariable.get = classmethod(lambda cls, key, *a, **k: refuse("variable")(key))
LegacyConnection.get_connection_from_secrets = classmethod(lambda cls, key, *a, **k: refuse("connection")(key))

from airflow.configuration import conf
from airflow.dag_processing.dagbag import BundleDagBag
folder = Path(conf.get("core", "dags_folder"))
bag = BundleDagBag(dag_folder=folder, bundle_path=folder)
eval_dag = bag.dags.get("nightly_eval_vllm")
templates = {}
if eval_dag is not None:
    prepare = eval_dag.get_task("nightly_eval_vllm.prepare")
    templates = {
        "batch_conn_id": prepare.batch_conn_id,
        "max_requests": prepare.chunking.max_requests,
        "deadline": eval_dag.get_task("nightly_eval_vllm.deadline").when,
        "pod_conn_id": eval_dag.get_task("nightly_eval_vllm.run").partial_kwargs["batch_conn_id"],
    }
print(json.dumps({
    "reads": reads,
    "errors": {Path(k).name: v[-1500:] for k, v in bag.import_errors.items()},
    "dags": sorted(bag.dags),
    "templates": templates,
}))
"""


@pytest.fixture(scope="module")
def parsed(airflow_home: dict[str, str]) -> dict[str, Any]:
    # No Variable and no connection is reachable from the environment either.
    env = {k: v for k, v in airflow_home.items() if not k.startswith(("AIRFLOW_VAR_", "AIRFLOW_CONN_"))}
    proc = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_no_dag_file_reads_a_variable_or_a_connection_when_it_is_parsed(parsed: dict[str, Any]) -> None:
    assert parsed["reads"] == []
    assert parsed["errors"] == {}
    expected = {"nightly_eval_vllm", "embeddings_backfill", "nightly_feedback_classification"}
    assert expected <= set(parsed["dags"])


def test_the_eval_dag_keeps_its_connection_chunk_and_deadline_as_templates_for_the_run_to_resolve(
    parsed: dict[str, Any],
) -> None:
    templates = parsed["templates"]
    for field, variable in (
        ("batch_conn_id", "nightly_eval_vllm_conn_id"),
        ("pod_conn_id", "nightly_eval_vllm_conn_id"),
        ("max_requests", "nightly_eval_vllm_chunk"),
        ("deadline", "nightly_eval_vllm_deadline"),
    ):
        assert "{{" in str(templates[field]) and variable in str(templates[field]), (field, templates)
