"""Peers side by side: the package, Airflow's own ``LLMBatchOperator`` and the seeds' blueprint.

The same workload for all three: N records of 1 KB (50,000 at the default size: one OpenAI
batch), the same prompt, the same emulator (a separate process, a fresh one per pipeline) that
fails 2% of the lines with a 500, on the same machine, one after another in one run.

- **package**: ``batch_inference_group``'s tasks, each in its own process (``bench_end_to_end``'s
  ``run_abp``), two rounds (the failed lines are resubmitted once).
- **peer**: ``LLMBatchOperator`` from apache-airflow-providers-common-ai 1.0.0, installed by this
  benchmark in a virtualenv of its own (``peer_llm_batch.py``; deferrable, polling at its
  minimum of 30 s). It does not resubmit.
- **blueprint**: the naive floor (``blueprint.py``).

Figures: wall time; worker-slot seconds (the task processes' lives, start and imports included,
without the waits that defer to the triggerer: the package's and the peer's waits; the
blueprint's polling holds its slot); the largest peak resident size of any of its processes;
provider calls (uploads, batch creates and batch retrieves as counted by the emulator; file
downloads are not counted there); usable results at the end. Ratios: package / peer.

Usage: ``python benchmarks/bench_peers.py [--size small|default] [--items N]``. The peer's
virtualenv goes to ``benchmarks/results/peer-venv`` (gitignored) unless ``ABP_BENCH_PEER_VENV``
names one; building it downloads from the package registry (about 3 minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_end_to_end import FAIL_RATE, RUN_ID, WAIT, run_abp, run_naive  # noqa: E402
from common import cli, machine, result, row  # noqa: E402
from e2e import EmulatorProcess, StageRun, run_stage, write_records  # noqa: E402

#: size -> items (no ``tiny``: the smoke test would build the peer's virtualenv)
SIZES: Final[dict[str, int]] = {"small": 5_000, "default": 50_000}
PEER_REQUIREMENTS: Final = ("apache-airflow==3.3.2", "apache-airflow-providers-common-ai[openai]==1.0.0")
PEER_VENV: Final = HERE / "results" / "peer-venv"
PROVIDER_CALLS: Final = ("openai.upload_calls", "openai.create_calls", "openai.retrieve_requests")


def peer_python() -> Path:
    """The peer's interpreter: ``ABP_BENCH_PEER_VENV``'s, or a virtualenv built here once.

    :raises RuntimeError: the virtualenv cannot be built (the installer's output is in the message)
    """
    venv = Path(os.environ.get("ABP_BENCH_PEER_VENV") or PEER_VENV)
    python = venv / "bin" / "python"
    stamp = venv / ".abp-peer-installed"
    if stamp.exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *PEER_REQUIREMENTS],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(PEER_REQUIREMENTS)} failed: {proc.stderr[-3000:]}")
    stamp.write_text(" ".join(PEER_REQUIREMENTS) + "\n")
    return python


def provider_calls(stats: dict[str, Any]) -> int:
    """Uploads, batch creates and batch retrieves the emulator counted.

    :param stats: ``GET /_emulator/stats``
    """
    counters = stats.get("counters") or {}
    return sum(int(counters.get(name, 0)) for name in PROVIDER_CALLS)


def slot_seconds(runs: dict[str, list[StageRun]], deferred: tuple[str, ...]) -> float:
    """Seconds the task processes held a worker slot: their lives, without the stages that defer.

    :param runs: the stage reports by stage
    :param deferred: the stages that wait in the triggerer in production
    """
    return sum(g.wall_s for key, got in runs.items() if key not in deferred for g in got)


def task_seconds(runs: dict[str, list[StageRun]]) -> dict[str, dict[str, float]]:
    """Per stage: the processes' lives and, within them, the stage's own work, in seconds.

    :param runs: the stage reports by stage
    """
    return {
        key: {
            "process_s": round(sum(g.wall_s for g in got), 1),
            "work_s": round(sum(g.seconds for g in got), 1),
        }
        for key, got in runs.items()
    }


def peak_rss(runs: dict[str, list[StageRun]]) -> float:
    """The largest peak resident size of any stage process, in MiB.

    :param runs: the stage reports by stage
    """
    return max(g.peak_rss_mib for got in runs.values() for g in got)


def run_peer(records: Path, workdir: Path, emulator: EmulatorProcess, python: Path) -> dict[str, Any]:
    """Run ``LLMBatchOperator`` over ``records`` in its virtualenv.

    :param records: the JSONL records
    :param workdir: where its results go
    :param emulator: the running emulator
    :param python: the peer virtualenv's interpreter
    """
    env = {
        "AIRFLOW_HOME": str(workdir / "airflow_home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_BENCH_PEER": json.dumps(
            {"conn_type": "pydanticai", "host": f"{emulator.url}/v1", "password": "sk-bench"}
        ),
    }
    start = time.perf_counter()
    got = run_stage(
        "peer.run",
        {"records": str(records), "dir": str(workdir), "run_id": RUN_ID},
        workdir,
        env,
        python=str(python),
    )
    return {"run": got, "wall_s": time.perf_counter() - start}


def run(size: str = "default", items: int | None = None) -> dict[str, Any]:
    """Run the three pipelines on the same records, one after another.

    :param size: ``small`` or ``default``
    :param items: one item count instead of the size's
    """
    n = items or SIZES[size]
    skipped: list[dict[str, str]] = []
    figures: dict[str, dict[str, Any]] = {}
    root = Path(tempfile.mkdtemp(prefix="abp-peers-", dir=os.environ.get("ABP_BENCH_TMP")))
    try:
        records = root / "records.jsonl"
        write_records(records, n)
        python: Path | None = None
        try:
            python = peer_python()
        except Exception as exc:  # reported as the reason, the others still run
            skipped.append({"case": "peer", "reason": f"skipped: {type(exc).__name__}: {exc}"})
        for kind in ("package", "peer", "blueprint"):
            if kind == "peer" and python is None:
                continue
            workdir = root / kind
            workdir.mkdir()
            with EmulatorProcess(workdir, faults=[f"rate_500={FAIL_RATE}"]) as emulator:
                try:
                    figures[kind] = measure(kind, records, workdir, emulator, python)
                except RuntimeError as exc:
                    if kind != "peer":
                        raise
                    skipped.append({"case": "peer", "reason": f"skipped: it could not run: {exc}"})
                    continue
                figures[kind]["provider_calls"] = provider_calls(emulator.stats())
                emulator.stop()
            figures[kind]["emulator_peak_rss_mib"] = (emulator.peak_rss_kib or 0) / 1024
            shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = {"items": n, "fail_rate": FAIL_RATE, "peer": list(PEER_REQUIREMENTS), "machine": machine()}
    notes = [f"{kind}: {json.dumps(f.get('detail'), default=str)}" for kind, f in figures.items()]
    return result("peers", size, params, peer_rows(n, figures), skipped, notes)


def measure(
    kind: str, records: Path, workdir: Path, emulator: EmulatorProcess, python: Path | None
) -> dict[str, Any]:
    """Run one pipeline and reduce it to the compared figures.

    :param kind: ``package``, ``peer`` or ``blueprint``
    :param records: the JSONL records
    :param workdir: its folder
    :param emulator: the running emulator
    :param python: the peer's interpreter
    """
    if kind == "package":
        got = run_abp(records, workdir, emulator, None)
        states = got["published"]["items_by_state"]
        return {
            "wall_s": got["wall_s"],
            "slot_s": slot_seconds(got["runs"], (WAIT,)),
            "peak_rss_mib": peak_rss(got["runs"]),
            "usable": int(states.get("succeeded", 0)),
            "detail": {"states": states, "task_seconds": task_seconds(got["runs"])},
        }
    if kind == "blueprint":
        got = run_naive(records, workdir, emulator)
        return {
            "wall_s": got["wall_s"],
            "slot_s": slot_seconds(got["runs"], ()),
            "peak_rss_mib": peak_rss(got["runs"]),
            "usable": int(got["published"].get("succeeded", 0)),
            "detail": got["published"],
        }
    assert python is not None
    peer = run_peer(records, workdir, emulator, python)
    stage: StageRun = peer["run"]
    return {
        "wall_s": peer["wall_s"],
        "slot_s": stage.wall_s - float(stage.out["deferred_s"]),
        "peak_rss_mib": stage.peak_rss_mib,
        "usable": int((stage.out.get("counts") or {}).get("succeeded", 0)),
        "detail": {k: v for k, v in stage.out.items() if k != "first_row"},
    }


def peer_rows(n: int, figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per figure: the package against the peer (or, without the peer, the blueprint).

    :param n: the item count
    :param figures: the reduced figures by pipeline
    """
    mine = figures["package"]
    other_name = "peer" if "peer" in figures else "blueprint"
    other = figures[other_name]
    label = "LLMBatchOperator 1.0.0" if other_name == "peer" else "seeds' blueprint"
    rows = []
    for metric, key, unit in (
        ("wall time", "wall_s", "s"),
        ("worker-slot seconds held", "slot_s", "s"),
        ("largest task peak RSS", "peak_rss_mib", "MiB"),
        ("emulator peak RSS", "emulator_peak_rss_mib", "MiB"),
        ("provider calls (upload, create, retrieve)", "provider_calls", "calls"),
        ("usable results at the end", "usable", "items"),
    ):
        note = "; ".join(f"{k}: {float(f[key]):,.1f}" for k, f in figures.items())
        rows.append(
            row(
                f"{n:,} items, 2% failed lines: {metric}",
                unit,
                float(mine[key]),
                float(other[key]),
                subject="airflow-batch-provider",
                baseline_name=label,
                note=note,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """``--size`` and ``--items``; the figures as JSON on stdout."""
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
