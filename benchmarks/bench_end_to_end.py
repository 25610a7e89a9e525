"""End to end: the package's tasks at N items against the emulator, each task in its own process.

Subject: ``batch_inference_group``'s tasks (prepare, upload, submit, wait, download, reconcile,
resubmit, publish; ``stages_abp.py``), each ``execute``d as its DAG task would be, in a process of
its own (``e2e.py``), with an SQLite ledger, ``file://`` staging, records of 1 KB, OpenAI's 50,000
requests per batch, and the emulator as a separate process that fails 2% of the lines with a 500
(so round 2 resubmits them). Figures per stage: items per second (the stage's own work, without
the interpreter's start and imports) and the stage process's peak resident size (``ru_maxrss``).

Baseline: the seeds' blueprint (``blueprint.py``) on the same records, the same emulator, the same
machine, stage by stage: lists of dicts, each result file read whole as text, no ledger, no
resubmission. The ratio of a speed is package / blueprint (below 1: the package is slower); of a
peak resident size, package / blueprint (below 1: the package holds less).

Usage::

    python benchmarks/bench_end_to_end.py [--size tiny|small|default|large] [--items N]

Sizes: ``tiny`` 300 items (chunks of 100), ``small`` 5,000 and 20,000 (chunks of N/4),
``default`` 10,000 and 100,000, ``large`` 100,000 and 1,000,000 (chunks of 50,000).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import cli, machine, result, row  # noqa: E402
from e2e import EmulatorProcess, StageRun, dir_bytes, run_stage, write_records  # noqa: E402

#: size -> item counts (each run end to end); chunk = None: the provider's 50,000
SIZES: Final[dict[str, tuple[tuple[int, ...], int | None]]] = {
    "tiny": ((300,), 100),
    "small": ((5_000, 20_000), None),
    "default": ((10_000, 100_000), None),
    "large": ((100_000, 1_000_000), None),
}
FAIL_RATE: Final = 0.02
#: the blueprint is not run above this many items: its reconcile task holds every record and every
#: result as dicts (about 1 GiB at 100,000 items, growing linearly), too much for a shared machine
NAIVE_MAX_ITEMS: Final = 200_000
CONN_ID: Final = "bench_openai"
RUN_ID: Final = "manual__2026-11-30T00:00:00+00:00"
MAX_ATTEMPTS: Final = 2
WAIT: Final = "emulator (wait)"
ROUND_2: Final = "round 2 (resubmit, upload, submit, download, reconcile)"
ROUND_2_WAIT: Final = "round 2 emulator (wait)"
#: the stages reported, in order, with the items each one handles
STAGE_ORDER: Final = (
    "prepare",
    "chunk",
    "upload",
    "submit",
    WAIT,
    "download",
    "reconcile",
    ROUND_2,
    ROUND_2_WAIT,
    "publish",
)


def abp_env(workdir: Path, emulator: EmulatorProcess) -> dict[str, str]:
    """The stage processes' environment: the ledger, staging, the connection, a private Airflow home."""
    return {
        "AIRFLOW_HOME": str(workdir / "airflow_home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": f"sqlite:///{workdir / 'ledger.sqlite'}",
        "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT": f"file://{workdir / 'staging'}",
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
            {"conn_type": "openai_batch", "host": f"{emulator.url}/v1", "password": "sk-bench"}
        ),
    }


def run_abp(records: Path, workdir: Path, emulator: EmulatorProcess, chunk: int | None) -> dict[str, Any]:
    """Run the package's tasks over ``records``; return each stage's report and the outcome.

    :param records: the JSONL records
    :param workdir: where the ledger, staging and the stage files go
    :param emulator: the running emulator
    :param chunk: requests per chunk (``None``: the provider's limit)
    """
    env = abp_env(workdir, emulator)
    base = {"conn_id": CONN_ID, "run_id": RUN_ID, "chunk": chunk, "max_attempts": MAX_ATTEMPTS}
    runs: dict[str, list[StageRun]] = {}
    start = time.perf_counter()

    def stage(name: str, key: str, **spec: Any) -> Any:
        got = run_stage(f"abp.{name}", {**base, **spec}, workdir, env)
        runs.setdefault(key, []).append(got)
        return got.out

    prepared = stage("prepare", "prepare", records=f"file://{records}")
    manifests = prepared["manifests"]
    resubmitted = 0
    for round_ in range(1, MAX_ATTEMPTS + 1):
        key = (lambda s: s) if round_ == 1 else (lambda s: ROUND_2_WAIT if s == WAIT else ROUND_2)
        if round_ > 1:
            manifests = stage("resubmit", key("resubmit"), round=round_)["manifests"]
            if not manifests:
                break
            resubmitted += sum(int(m["lines"]) for m in manifests)
        manifests = stage("upload", key("upload"), manifests=manifests)["manifests"]
        batches = stage("submit", key("submit"), manifests=manifests)["batches"]
        batches = stage("wait", key(WAIT), batches=batches)["batches"]
        batches = stage("download", key("download"), batches=batches)["batches"]
        stage("reconcile", key("reconcile"), batches=batches)
    published = stage("publish", "publish")
    wall = time.perf_counter() - start
    return {
        "runs": runs,
        "prepared": prepared,
        "published": published,
        "items": {ROUND_2: resubmitted, ROUND_2_WAIT: resubmitted},
        "wall_s": wall,
        "staging_bytes": dir_bytes(workdir / "staging"),
    }


def run_naive(records: Path, workdir: Path, emulator: EmulatorProcess) -> dict[str, Any]:
    """Run the seeds' blueprint over ``records``; return each stage's report and the outcome.

    :param records: the JSONL records
    :param workdir: where its files go
    :param emulator: the running emulator
    """
    env = {"BENCH_EMULATOR_URL": emulator.url}
    runs: dict[str, list[StageRun]] = {}
    start = time.perf_counter()
    spec: dict[str, Any] = {"records": str(records), "dir": str(workdir)}
    for name, key in (
        ("prepare", "prepare"),
        ("submit", "submit"),
        ("wait", WAIT),
        ("download", "download"),
        ("reconcile", "reconcile"),
        ("publish", "publish"),
    ):
        got = run_stage(f"naive.{name}", spec, workdir, env)
        runs.setdefault(key, []).append(got)
        spec = {**spec, **got.out}
    return {"runs": runs, "published": spec.get("counts", {}), "wall_s": time.perf_counter() - start}


def stage_figures(
    runs: dict[str, list[StageRun]],
    n: int,
    prepared: dict[str, Any] | None = None,
    items: dict[str, int] | None = None,
) -> dict[str, dict[str, float]]:
    """Items per second and peak resident size per reported stage.

    The prepare process does both prepare and chunk (one task): its time is split between them
    (``stage_round`` timed apart), its peak resident size is the same for both.

    :param runs: the stage reports by stage
    :param n: the run's items
    :param prepared: the prepare stage's output (its split time), or ``None`` (the blueprint)
    :param items: the items of a stage that does not handle all ``n`` (round 2: the resubmitted)
    """
    out: dict[str, dict[str, float]] = {}
    for key, got in runs.items():
        seconds = sum(g.seconds for g in got)
        count = (items or {}).get(key, n)
        out[key] = {
            "seconds": seconds,
            "items": count,
            "items_per_s": count / seconds if seconds else 0.0,
            "peak_rss_mib": max(g.peak_rss_mib for g in got),
            "import_rss_mib": max(g.import_rss_mib for g in got),
        }
    if prepared is not None and "prepare" in out:
        rss = out["prepare"]["peak_rss_mib"]
        imp = out["prepare"]["import_rss_mib"]
        for key, secs in (("prepare", prepared["prepare_s"]), ("chunk", prepared["chunk_s"])):
            out[key] = {
                "seconds": secs,
                "items": n,
                "items_per_s": n / secs if secs else 0.0,
                "peak_rss_mib": rss,
                "import_rss_mib": imp,
            }
    return out


def run(size: str = "default", items: int | None = None) -> dict[str, Any]:
    """Run the package and the blueprint end to end at each of the size's item counts.

    :param size: ``tiny``, ``small``, ``default`` or ``large``
    :param items: one item count instead of the size's
    """
    counts, chunk = SIZES[size]
    if items is not None:
        counts = (items,)
    rows: list[dict[str, Any]] = []
    params: dict[str, Any] = {"items": list(counts), "chunk": chunk or 50_000, "fail_rate": FAIL_RATE}
    notes: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="abp-e2e-", dir=os.environ.get("ABP_BENCH_TMP")))
    try:
        for n in counts:
            folder = root / f"n{n}"
            folder.mkdir()
            records = folder / "records.jsonl"
            records_bytes = write_records(records, n)
            figures: dict[str, Any] = {"records_mib": records_bytes / 2**20}
            kinds = ("abp", "naive") if n <= NAIVE_MAX_ITEMS else ("abp",)
            for kind in kinds:
                workdir = folder / kind
                workdir.mkdir()
                with EmulatorProcess(workdir, faults=[f"rate_500={FAIL_RATE}"]) as emulator:
                    got = (
                        run_abp(records, workdir, emulator, chunk)
                        if kind == "abp"
                        else run_naive(records, workdir, emulator)
                    )
                    got["emulator_stats"] = emulator.stats()
                    emulator.stop()
                got["emulator_peak_rss_mib"] = (emulator.peak_rss_kib or 0) / 1024
                got["stages"] = stage_figures(got["runs"], n, got.get("prepared"), got.get("items"))
                figures[kind] = got
                shutil.rmtree(workdir, ignore_errors=True)
            rows += size_rows(n, figures)
            notes.append(outcome_note(n, figures))
            print(
                json.dumps({"items": n, "rows": rows[-40:], "note": notes[-1]}), file=sys.stderr, flush=True
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params["machine"] = machine()
    return result("end_to_end", size, params, rows, notes=notes)


def size_rows(n: int, figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one item count: per stage items/s and peak RSS, the emulator, the run.

    :param n: the item count
    :param figures: what :func:`run` gathered for the package (``abp``) and the blueprint (``naive``)
    """
    abp = figures["abp"]["stages"]
    naive = figures["naive"]["stages"] if "naive" in figures else {}
    naive_run = figures.get("naive", {})
    rows = []
    for key in STAGE_ORDER:
        if key not in abp:
            continue
        mine, floor = abp[key], naive.get(key)
        label = key if mine["items"] == n else f"{key}, {int(mine['items']):,} items"
        rows.append(
            row(
                f"{n:,} items: {label}",
                "items/s",
                mine["items_per_s"],
                floor["items_per_s"] if floor else None,
                subject="package task",
                baseline_name="seeds' blueprint" if floor else "",
            )
        )
        rows.append(
            row(
                f"{n:,} items: {label}, task process",
                "peak RSS MiB",
                mine["peak_rss_mib"],
                floor["peak_rss_mib"] if floor else None,
                subject="package task",
                baseline_name="seeds' blueprint" if floor else "",
                note=f"after imports {mine['import_rss_mib']:.0f} MiB",
            )
        )
    rows.append(
        row(
            f"{n:,} items: emulator process",
            "peak RSS MiB",
            figures["abp"]["emulator_peak_rss_mib"],
            naive_run.get("emulator_peak_rss_mib"),
            subject="with the package",
            baseline_name="with the blueprint",
        )
    )
    rows.append(
        row(
            f"{n:,} items: the whole run",
            "items/s",
            n / figures["abp"]["wall_s"],
            n / naive_run["wall_s"] if naive_run else None,
            subject="package (process starts included)",
            baseline_name="seeds' blueprint",
        )
    )
    return rows


def usable(counts: dict[str, Any]) -> int:
    """Items with a usable answer at the end (state ``succeeded``).

    :param counts: items by state
    """
    return int(counts.get("succeeded", 0))


def outcome_note(n: int, figures: dict[str, Any]) -> str:
    """One sentence on what each pipeline ended with at ``n`` items.

    :param n: the item count
    :param figures: what :func:`run` gathered
    """
    abp_states = figures["abp"]["published"].get("items_by_state", {})
    mine = (
        f"{n:,} items ({figures['records_mib']:.0f} MiB of records): package usable {usable(abp_states):,} "
        f"({abp_states}), wall {figures['abp']['wall_s']:.0f} s, staging {figures['abp']['staging_bytes'] / 2**20:.0f} "
        f"MiB, emulator counters {figures['abp']['emulator_stats'].get('counters')}"
    )
    if "naive" not in figures:
        return f"{mine}; blueprint not run above {NAIVE_MAX_ITEMS:,} items (it holds every record as a dict)."
    naive_states = figures["naive"]["published"]
    return (
        f"{mine}; blueprint usable {usable(naive_states):,} ({naive_states}), "
        f"wall {figures['naive']['wall_s']:.0f} s."
    )


def main(argv: list[str] | None = None) -> None:
    """``--size`` and ``--items``; the figures as JSON on stdout."""
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
