"""Run every benchmark (``benchmarks/bench_*.py``), print a table and write the figures as JSON.

Usage::

    python benchmarks/run_all.py [--size tiny|small|default|large] [--only NAME ...] [--json OUT.json]

A benchmark module is any ``bench_<name>.py`` next to this file that exposes
``run(size: str) -> dict`` (see ``common.py`` for the dict's shape; a module whose dict has no
``rows`` is still recorded, and printed as JSON). A module without ``run`` is recorded as skipped;
one that raises is recorded with its error and the others go on (the exit status is then 1).
``tiny`` is for the smoke test; ``default`` is what ``make bench`` runs; ``large`` (the million
items end to end) runs only the modules whose ``SIZES`` name it, and records the others as skipped. The JSON goes to
``benchmarks/results/latest.json`` unless ``--json`` says otherwise (that folder is gitignored).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import SIZES, machine  # noqa: E402

DEFAULT_JSON = HERE / "results" / "latest.json"


def discover(folder: Path = HERE) -> dict[str, Path]:
    """Return the benchmark modules in ``folder`` by name (``bench_x.py`` -> ``x``), sorted.

    :param folder: where to look
    """
    return {p.stem.removeprefix("bench_"): p for p in sorted(folder.glob("bench_*.py"))}


def load(name: str, path: Path) -> ModuleType:
    """Import one benchmark module from its file.

    :param name: the benchmark's name
    :param path: its file
    """
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_one(name: str, path: Path, size: str) -> dict[str, Any]:
    """Run one benchmark; never raises (errors and skips are recorded in the result).

    :param name: the benchmark's name
    :param path: its file
    :param size: the size to run at
    """
    start = time.perf_counter()
    try:
        module = load(name, path)
        runner = getattr(module, "run", None)
        sizes = getattr(module, "SIZES", None)
        if not callable(runner):
            out: dict[str, Any] = {
                "name": name,
                "status": "skipped",
                "reason": f"{path.name} has no run(size) function; it can still be run on its own.",
            }
        elif isinstance(sizes, dict) and size not in sizes:
            out = {
                "name": name,
                "status": "skipped",
                "reason": f"{path.name} has no size {size!r} (it has {', '.join(sizes)}).",
            }
        else:
            out = dict(runner(size))
            out.setdefault("name", name)
            out["status"] = "ok"
    except Exception as exc:
        out = {
            "name": name,
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    out["elapsed_s"] = round(time.perf_counter() - start, 2)
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def table(results: Sequence[dict[str, Any]]) -> str:
    """Render every benchmark's rows as one plain-text table.

    :param results: what :func:`run_one` returned for each benchmark
    """
    head = ("benchmark", "case", "metric", "value", "baseline", "ratio")
    lines: list[tuple[str, ...]] = [head]
    extra: list[str] = []
    for res in results:
        name = str(res.get("name"))
        if res.get("status") != "ok":
            extra.append(f"{name}: {res.get('status')}: {res.get('reason') or res.get('error')}")
            continue
        rows = res.get("rows")
        if not isinstance(rows, list):
            extra.append(
                f"{name}: {json.dumps({k: v for k, v in res.items() if k != 'status'}, default=str)}"
            )
            continue
        for r in rows:
            lines.append(
                (
                    name,
                    str(r.get("case", "")),
                    str(r.get("metric", "")),
                    _fmt(r.get("value")),
                    _fmt(r.get("baseline")),
                    _fmt(r.get("ratio")),
                )
            )
        for skip in res.get("skipped") or []:
            extra.append(f"{name}: {skip.get('case')}: {skip.get('reason')}")
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    rendered = []
    for i, line in enumerate(lines):
        cells = [
            c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        rendered.append("  ".join(cells))
        if i == 0:
            rendered.append("  ".join("-" * w for w in widths))
    return "\n".join(rendered + (["", *extra] if extra else []))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the benchmarks in benchmarks/bench_*.py.")
    parser.add_argument("--size", choices=SIZES, default="default", help="tiny is for the smoke test")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run only this one (repeatable)"
    )
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, metavar="OUT", help=f"default {DEFAULT_JSON}"
    )
    args = parser.parse_args(argv)

    found = discover()
    unknown = [n for n in args.only if n not in found and f"bench_{n}" not in found]
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)}; found {', '.join(found)}")
    wanted = {n.removeprefix("bench_") for n in args.only}
    chosen = {n: p for n, p in found.items() if not wanted or n in wanted}

    started = datetime.now(timezone.utc)
    before = machine()
    results = []
    for name, path in chosen.items():
        print(f"running {name} ({args.size}) ...", file=sys.stderr, flush=True)
        res = run_one(name, path, args.size)
        print(f"  {name}: {res['status']} in {res['elapsed_s']} s", file=sys.stderr, flush=True)
        results.append(res)
    after = machine()
    report = {
        "started_at": started.isoformat(),
        "size": args.size,
        "machine": before,
        "load_avg_after": after.get("load_avg_1_5_15"),
        "benchmarks": {r["name"]: r for r in results},
    }
    print(table(results))
    load_note = f"load average (1/5/15 min) before {before.get('load_avg_1_5_15')}, after {after.get('load_avg_1_5_15')}"
    print(
        f"\n{before.get('cpus')} CPUs, {before.get('mem_total_gib')} GiB, Python {before.get('python')}; {load_note}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"figures written to {args.json}")
    return 1 if any(r["status"] == "error" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
