"""`airflow dags test` of a pod-lane DAG whose pods run the real engine (the loopback Kubernetes API)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import batch_env, run_airflow, tail
from tests.support.kube_api import run_kube_api
from tests.vllm_engine.conftest import ENGINE_ENV, ROOT, Engine

RATE = 4.0  # $ per GPU-hour, for the report's GPU-time line


#: What vLLM's ``run_batch`` logs once the engine is up, before it reads the first line.
ENGINE_UP = "Reading batch from"


def _epoch(stamp: str | None) -> float | None:
    return (
        None
        if stamp is None
        else datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    )


def pod_times(
    started_at: str | None, finished_at: str | None, log: list[tuple[float, str]]
) -> dict[str, Any]:
    """A pod's life in seconds: its container's whole run and its engine start.

    The engine start runs from the container's start to the first log line with :data:`ENGINE_UP`
    (imports, model load, KV cache); ``None`` where the engine never got there.

    :param started_at: the container's start (Kubernetes' second-resolution stamp)
    :param finished_at: its finish
    :param log: the pod's log lines with the time each was read
    """
    start, finish = _epoch(started_at), _epoch(finished_at)
    up = next((at for at, line in log if ENGINE_UP in line), None)
    return {
        "run_s": None if start is None or finish is None else finish - start,
        "engine_start_s": None if start is None or up is None else max(0.0, up - start),
    }


def run_engine_dag(
    airflow_home: dict[str, str],
    tmp: Path,
    engine: Engine,
    dag_id: str,
    variables: dict[str, str],
    extra_args: list[str],
    max_model_len: int,
) -> dict[str, Any]:
    """Run ``dag_id`` to the end with the engine in the pods; return what it left behind.

    :param engine: the real engine
    :param variables: Airflow Variables for the run
    :param extra_args: the connection's ``extra_args`` (``--model`` of a local folder, the served name)
    :param max_model_len: ``--max-model-len``; the engine refuses more than the model's own
    """
    exchange = tmp / "exchange"
    exchange.mkdir()
    pod_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))},
        **ENGINE_ENV,
        "PATH": f"{ROOT / 'tests' / 'support' / 'real_vllm' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "ABP_ENGINE_PYTHON": str(engine.python),
        "PYTHONWARNINGS": "ignore",
    }
    with run_kube_api(tmp / "kube", pod_env) as api:
        kubeconfig = tmp / "kubeconfig.json"
        kubeconfig.write_text(json.dumps(api.kubeconfig()))
        conn = {
            "conn_type": "vllm_kubernetes",
            "extra": {
                "namespace": "llm",
                "gpu_count": 1,
                "gpu_type": "L4",
                "usd_per_gpu_hour": RATE,
                "exchange_path": str(exchange),
                "kube_config_path": str(kubeconfig),
                "max_model_len": max_model_len,
                "extra_args": extra_args,
            },
        }
        env = batch_env(airflow_home, tmp, {"vllm_kubernetes_default": conn})
        env.update({f"AIRFLOW_VAR_{k.upper()}": v for k, v in variables.items()})
        env["AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT"] = "600"  # parsing is not what is measured here
        # only the DAG's own file is parsed (`-f`): the whole dags folder took 48 s at load 24
        dag_file = ROOT / "dags" / f"{dag_id}.py"
        proc = run_airflow(env, "dags", "test", dag_id, "-f", str(dag_file), timeout=1500)
        created = list(api.created)
        live = api.live_pods()
        pods = [pod_times(pod.started_at, pod.finished_at, pod.log) for pod in api.pods.values()]
    (tmp / "dags-test.log").write_text(proc.stdout + proc.stderr)  # kept for a failure's reader
    errors = [x for x in (proc.stdout + proc.stderr).splitlines() if "ERROR" in x or "Error" in x]
    assert proc.returncode == 0, "\n".join(errors[-20:]) + "\n" + tail(proc)
    staging = next((tmp / "staging" / dag_id).iterdir())
    return {
        "proc": proc,
        "ledger": Ledger.from_url(f"sqlite:///{tmp / 'ledger.sqlite'}"),
        "created": created,
        "pods": pods,
        "live": live,
        "exchange": exchange,
        "staging": staging,
        "report": json.loads((staging / "report.json").read_text()),
        "results": [json.loads(x) for x in (staging / "results.jsonl").read_text().splitlines()],
    }
