"""Do four fallback task processes on one connection hold the key's RPM/TPM limit times the headroom, together?

Four processes start at one barrier, each a fallback task of its own workload (the real
:func:`~airflow_batch_provider.services.fallback.run_fallback`: the OpenAI SDK's async client over
HTTP, one SQLite ledger file shared by all four) against the emulator's ``/v1/chat/completions``,
which enforces the key's RPM and TPM (time scale 0.1: its "minute" is 6 s) and answers 429 past
them. Subject: one window shared through the ledger (quota key = the connection). Baseline: the
same four tasks each with its own window (the limiter before this change), each set to the same
limits and headroom.

Figures, from the emulator's own record of the answers it gave: the most requests and tokens it
counted in any one window, over the key's limit times the headroom (at most 1.00 is the goal),
the steady rate over the same, and the 429s it answered.

Usage: ``python benchmarks/bench_shared_limiter.py [--size small|default]`` (JSON on stdout)
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_fallback_limiter import Outcome, Scenario  # noqa: E402

#: the emulator's time scale: its rate window is 6 s
TIME_SCALE = 0.1
WINDOW_S = 60.0 * TIME_SCALE
TASKS = 4
RPM, TPM, HEADROOM = 60, 4000, 0.8
#: requests per task by size; ``tiny`` is skipped (it waits out the emulator's windows)
SIZES = {"small": 20, "default": 40}


def send(
    url: str, emulator: str, workload: str, items: int, shared: bool, barrier: Any, results: Any
) -> None:
    """One fallback task: stage ``items``, wait for the others, send them; put its summary."""
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from bench_fallback_limiter import PROMPT, _texts

    from airflow_batch_provider.adapters.base import AdapterSettings
    from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
    from airflow_batch_provider.core.pricing import PriceTable
    from airflow_batch_provider.ledger import Ledger
    from airflow_batch_provider.ledger.records import OpenItem
    from airflow_batch_provider.ledger.store import PreparedItem
    from airflow_batch_provider.services.fallback import FALLBACK_FROM, FallbackSettings, run_fallback

    ledger = Ledger.from_url(url)
    try:
        ledger.start_run(workload, "run", "openai", PROMPT.model)
        ledger.upsert_items(
            workload,
            "run",
            [
                PreparedItem(f"{workload}{k}", PROMPT.render({"id": k, "text": t}))
                for k, t in _texts(items).items()
            ],
        )
        rows = list(ledger.iter_item_rows(workload, "run", states=FALLBACK_FROM, shape=OpenItem))
        adapter = OpenAIBatchAdapter(AdapterSettings(api_key="sk-bench", base_url=f"{emulator}/v1"))
        settings = FallbackSettings(
            RPM, TPM, 8, WINDOW_S, HEADROOM, quota_key="bench-conn" if shared else None
        )
        barrier.wait()
        summary = asyncio.run(
            run_fallback(
                ledger=ledger,
                workload=workload,
                run_id="run",
                provider="openai",
                client=adapter.realtime_client(),
                rows=rows,
                template=PROMPT,
                settings=settings,
                prices=PriceTable.load(),
            )
        )
        results.put(summary)
    finally:
        ledger.engine.dispose()


def _get(emulator: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{emulator}{path}", timeout=30) as resp:
        return dict(json.loads(resp.read()))


def scenario(emulator: str, folder: Path, items: int, shared: bool) -> Outcome:
    """Run the four tasks; return what the emulator counted."""
    from bench_fallback_limiter import PROMPT, _put

    # a fresh record and an empty window, then the key's limits
    urllib.request.urlopen(urllib.request.Request(f"{emulator}/_emulator/reset", method="POST"), timeout=10)
    _put(emulator, {"faults": {"rpm_limit": RPM, "tpm_limit": TPM}})
    url = f"sqlite:///{folder / ('shared' if shared else 'own')}.sqlite"
    from airflow_batch_provider.ledger import Ledger

    Ledger.from_url(url).engine.dispose()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(TASKS), ctx.Queue()
    procs = [
        ctx.Process(target=send, args=(url, emulator, f"wl{n}", items, shared, barrier, results))
        for n in range(TASKS)
    ]
    started = time.monotonic()
    for p in procs:
        p.start()
    summaries = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    elapsed = time.monotonic() - started
    answers = _get(emulator, "/_emulator/record")["realtime"].get("openai", [])
    ceiling = int(PROMPT.params["max_tokens"])
    # what the emulator counted against TPM: prompt tokens plus the output ceiling, when it answered
    stamps = sorted(
        (float(a["at"]), a["usage"]["input_tokens"] + a["usage"]["cached_input_tokens"] + ceiling)
        for a in answers
    )
    counters = _get(emulator, "/_emulator/stats").get("counters", {})
    return Outcome(
        Scenario("shared" if shared else "per task", RPM, TPM, True),
        len(stamps),
        elapsed,
        [(t - stamps[0][0], n) for t, n in stamps],
        int(counters.get("openai.sync_429", 0)),
        sum(int(s.get("succeeded", 0)) for s in summaries),
    )


def run(size: str, items: int | None = None) -> dict[str, Any]:
    """Run both scenarios (``run_all.py`` entry point) and return their figures.

    :param size: ``tiny`` (skipped), ``small`` or ``default``
    :param items: requests per task instead of the size's
    """
    from common import result, row  # importing it puts this tree first on sys.path

    if size not in SIZES and items is None:
        reason = "waits out the emulator's rate windows; use --size small or default"
        return result("shared_limiter", size, {}, [], skipped=[{"case": "all", "reason": reason}])
    from batch_emulator.config import EmulatorConfig
    from batch_emulator.testing import run_emulator

    n = items or SIZES[size]
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_emulator(EmulatorConfig(time_scale=TIME_SCALE)) as emulator,
    ):
        shared = scenario(emulator, Path(tmp), n, shared=True)
        own = scenario(emulator, Path(tmp), n, shared=False)
    allowed_r, allowed_t = RPM * HEADROOM, TPM * HEADROOM
    subject, baseline = "one window per connection (ledger)", "one window per task"

    def compare(case: str, metric: str, value: float, base: float, note: str = "") -> dict[str, Any]:
        return row(case, metric, value, base, subject=subject, baseline_name=baseline, note=note)

    rows = [
        compare(
            "peak requests in any window / (RPM x headroom)",
            "ratio",
            shared.peak()[0] / allowed_r,
            own.peak()[0] / allowed_r,
        ),
        compare(
            "peak tokens in any window / (TPM x headroom)",
            "ratio",
            shared.peak()[1] / allowed_t,
            own.peak()[1] / allowed_t,
        ),
        compare(
            "mean tokens per window / (TPM x headroom)",
            "ratio",
            shared.per_window()[1] / allowed_t,
            own.per_window()[1] / allowed_t,
        ),
        compare("HTTP 429 answers", "count", shared.http_429, own.http_429),
        compare(
            "wall time, all tasks",
            "s",
            shared.elapsed_s,
            own.elapsed_s,
            f"{TASKS} x {n} requests; succeeded {shared.succeeded} vs {own.succeeded}",
        ),
    ]
    params = {
        "tasks": TASKS,
        "items_per_task": n,
        "rpm": RPM,
        "tpm": TPM,
        "headroom": HEADROOM,
        "window_s": WINDOW_S,
    }
    return result("shared_limiter", size, params, rows)


if __name__ == "__main__":
    from common import SIZES as ALL_SIZES
    from common import cli

    cli(__doc__, run, ALL_SIZES)
