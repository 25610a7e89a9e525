"""The vLLM pod lane's own overhead on the real engine (CPU build): the lane against a bare ``run_batch``.

For each chunk size ``C`` (requests per pod), ``airflow dags test nightly_eval_vllm`` runs its 40
prompts through the pod lane (the loopback Kubernetes API of ``tests/support/kube_api.py``, whose
pods run vLLM's own ``run_batch`` module on the tiny random Llama of
``tests/vllm_engine/tiny_chat_model.py``), ``ceil(40 / C)`` pods. In the same run, one bare
``python -m vllm.entrypoints.openai.run_batch`` reads the first pod's own input file (the same
``C`` lines) with the same flags and environment. Figures, per chunk size:

- the lane's wall time (the whole ``airflow dags test``) against the bare run's, per pod (ratio);
- a pod's container time and its engine start (container start to vLLM's ``Reading batch from``)
  against the bare run's (ratio);
- the engine start's share of a pod's life, beside the share the GPU planner assumes
  (``core/gpu_planner.plan``: ``load_s`` of its ``run_s`` for the same items and tokens on one L4
  with an 8B model in BF16).

The engine comes from ``.venv-vllm`` (``make venv-vllm``) or ``ABP_ENGINE_PYTHON``; without it the
benchmark skips with the reason. Each point costs engine starts of minutes on a busy 2-core
machine, so there is no ``tiny`` size (``run_all --size tiny`` skips it) and the benchmark is not
part of ``make test``.

Usage::

    python benchmarks/bench_vllm_overhead.py [--size small|default]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT, check_size, cli, row

NAME: Final = "vllm_overhead"
ITEMS: Final = 40  # the eval DAG's prompts
#: Requests per pod at each size (``ceil(40 / C)`` pods and engine starts each).
SIZES: Final[dict[str, tuple[int, ...]]] = {"small": (40, 20), "default": (40, 20, 10)}
SERVED: Final = "meta-llama/Llama-3.1-8B-Instruct"  # the eval prompt's model
STRUCTURED_OUTPUTS: Final = {"backend": "xgrammar", "disable_any_whitespace": True}
MAX_MODEL_LEN: Final = 512


def _engine_python() -> tuple[Path | None, str]:
    """The engine's interpreter, or ``None`` and why not."""
    python = Path(os.environ.get("ABP_ENGINE_PYTHON") or REPO_ROOT / ".venv-vllm" / "bin" / "python")
    marker = REPO_ROOT / ".venv-vllm" / ".unavailable"
    if marker.exists():
        return None, f"skipped: the engine could not be installed: {marker.read_text().strip()}"
    if not python.exists():
        return None, f"skipped: no engine venv at {python}; run `make venv-vllm` (or set ABP_ENGINE_PYTHON)"
    return python, ""


def _engine_args(model: Path) -> list[str]:
    return [
        "--model", str(model), "--served-model-name", SERVED, "--enforce-eager",
        "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
    ]  # fmt: skip


def _airflow_home(folder: Path) -> dict[str, str]:
    from tests.support.airflow_run import run_airflow

    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{folder / 'airflow.db'}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    proc = run_airflow(env, "db", "migrate")
    if proc.returncode != 0:
        raise RuntimeError(f"`airflow db migrate` failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return env


def _bare(python: Path, source: Path, model: Path, folder: Path) -> dict[str, float | None]:
    """One bare ``run_batch`` over ``source``: its wall time and its engine start."""
    from tests.vllm_engine.conftest import ENGINE_ENV
    from tests.vllm_engine.pods import ENGINE_UP

    env = {**os.environ, **ENGINE_ENV, "PYTHONWARNINGS": "ignore"}
    command = [str(python), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source),
               "-o", str(folder / "bare.output.jsonl"), "--max-model-len", str(MAX_MODEL_LEN),
               *_engine_args(model)]  # fmt: skip
    start = time.time()
    up: float | None = None
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if up is None and ENGINE_UP in line:
                up = time.time()
        rc = proc.wait()
    wall = time.time() - start
    if rc != 0:
        raise RuntimeError(f"bare run_batch over {source} exited {rc}")
    return {"wall_s": wall, "engine_start_s": None if up is None else up - start}


def _planner_share(input_tokens: float, output_tokens: float, items: int) -> tuple[float, float]:
    """The planner's assumed engine start and its share of a pod of ``items`` requests."""
    from airflow_batch_provider.core.gpu_planner import Workload, plan

    workload = Workload(items, input_tokens, output_tokens)
    p = plan(params_b=8, precision="bf16", gpu="L4", workload=workload, usd_per_gpu_hour=1.0)
    return p.load_s, p.load_s / p.run_s


def _point(python: Path, model: Path, chunk: int, folder: Path) -> list[dict[str, Any]]:
    from tests.vllm_engine.conftest import Engine
    from tests.vllm_engine.pods import run_engine_dag

    home = _airflow_home(folder / "airflow")
    start = time.time()
    variables = {"nightly_eval_vllm_chunk": str(chunk)}
    engine = Engine(python, "", Path())  # the lane needs only its interpreter
    (folder / "lane").mkdir(parents=True)
    lane = run_engine_dag(
        home, folder / "lane", engine, "nightly_eval_vllm", variables, _engine_args(model), MAX_MODEL_LEN
    )
    lane_wall = time.time() - start
    pods = [p for p in lane["pods"] if p["run_s"] is not None]
    first = sorted(lane["exchange"].glob("*.output.jsonl"))[0]
    source = first.with_name(first.name.removesuffix(".output.jsonl") + ".jsonl")
    bare = _bare(python, source, model, folder)
    usage = lane["report"]["usage"]
    load_s, share = _planner_share(usage["input_tokens"] / ITEMS, usage["output_tokens"] / ITEMS, chunk)
    pod_run = sum(p["run_s"] for p in pods) / len(pods)
    starts = [p["engine_start_s"] for p in pods if p["engine_start_s"] is not None]
    pod_start = sum(starts) / len(starts) if starts else None
    case = f"chunk {chunk} ({len(pods)} pods of {ITEMS} prompts)"
    lane_note = f"lane {lane_wall:.0f} s for {len(pods)} pods; bare run_batch over one pod's {chunk} lines"
    share_note = f"planner assumes load_s {load_s:.0f} s, {share:.0%} of a {chunk}-request pod (8B BF16, L4)"
    return [
        row(f"{case}: lane wall per pod", "s", lane_wall / len(pods), bare["wall_s"],
            subject="airflow dags test nightly_eval_vllm", baseline_name="bare run_batch", note=lane_note),
        row(f"{case}: pod container time", "s", pod_run, bare["wall_s"],
            subject="pod (vllm run-batch)", baseline_name="bare run_batch"),
        row(f"{case}: engine start per pod", "s", pod_start, bare["engine_start_s"],
            subject="pod, start to 'Reading batch from'", baseline_name="bare run_batch's"),
        row(f"{case}: engine start share of a pod", "share",
            None if pod_start is None else pod_start / pod_run, share,
            subject="measured", baseline_name="planner's assumption", note=share_note),
    ]  # fmt: skip


def run(size: str = "small", items: int | None = None) -> dict[str, Any]:
    """Run the benchmark at ``size``; skipped with the reason where the engine is missing.

    :param size: ``small`` or ``default`` (the chunk sizes)
    :param items: one chunk size instead of the size's
    """
    check_size(size)
    chunks = (items,) if items is not None else SIZES.get(size, ())
    out: dict[str, Any] = {"name": NAME, "size": size, "params": {"items": ITEMS, "chunks": list(chunks)}}
    out.update(rows=[], skipped=[], notes=[])
    python, reason = _engine_python()
    if not chunks:
        reason = f"skipped: no chunk sizes at size {size!r}; use {' or '.join(SIZES)}"
    if python is None or not chunks:
        out["skipped"].append({"case": "the real engine", "reason": reason})
        return out
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        folder = Path(tmp)
        model = folder / "tiny-llama"
        built = subprocess.run(
            [str(python), str(REPO_ROOT / "tests" / "vllm_engine" / "tiny_chat_model.py"), str(model)],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
        if built.returncode != 0:
            raise RuntimeError(f"building the tiny chat model failed: {built.stderr[-2000:]}")
        for chunk in chunks:
            out["rows"].extend(_point(python, model, chunk, folder / f"chunk-{chunk}"))
    out["notes"].append(
        "one run per point; pods run one after another in `airflow dags test`; the engine start is"
        " imports (torch, vLLM) in two processes, model load and a 1 GiB KV cache (CPU, eager)"
    )
    return out


if __name__ == "__main__":
    cli(__doc__, run, [s for s in SIZES])
