"""How many status triggers can one event loop carry without being blocked?

The triggerer runs every deferred task's trigger as a task on one asyncio event loop; one blocking
call delays every other trigger (and Airflow warns when the loop is blocked). Measured here:

1. **Building one SDK status client** (``adapter.async_client()`` of the OpenAI adapter: an
   ``AsyncOpenAI`` with its httpx pool and SSL context), timed on its own, with the memory it
   holds. Until 30 Nov every trigger built its own, synchronously, on the loop.
2. **N concurrent** :class:`~airflow_batch_provider.triggers.batch.BatchStatusTrigger` ``run()``
   tasks on one loop, as shipped (one client per connection and loop, built off the loop, shared:
   :meth:`BatchHook.aget_status_client`), against the emulator in **a separate process**
   (``python -m batch_emulator``), N distinct batches that stay in progress. Each
   trigger polls every ``interval`` seconds until a deadline ends it. A ticker task asks to wake every
   10 ms and records how late it woke (**event-loop lag**: p50, p99, max) and how much CPU the loop's
   thread spent meanwhile (the loop's own share of the lag, without the time the OS gave other
   processes: these machines are shared). Also **polls per second**
   (every trigger's poll count over the wall time) against N / interval, and **memory per trigger**
   (the process's RSS growth over the run, divided by N), and CPU per poll.
3. The same with the earlier behaviour (a client per trigger, built on the loop) at a tenth of N,
   for comparison in the same run.

Usage: ``python benchmarks/bench_triggers.py [--size tiny|small|default] [--items N]``
(``--items``: triggers)
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT, check_size, cli, per_s, result, row

from airflow_batch_provider.adapters.base import AdapterSettings, AsyncStatusClient
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.triggers.batch import BatchStatusTrigger

#: size -> (triggers, seconds each trigger polls, seconds between polls)
SIZES: dict[str, tuple[int, float, float]] = {
    "tiny": (20, 2.0, 0.5),
    "small": (200, 20.0, 10.0),
    "default": (1000, 60.0, 30.0),  # 30 s: the poll policy's default first interval
}
CONN_ID = "bench_triggers"
TICK_S = 0.01
CLIENT_BUILDS = 20
REQUEST = CanonicalRequest("a1", "v1", "gpt-4o-mini", messages=({"role": "user", "content": "hi"},))


def rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def emulator_process() -> Iterator[str]:
    """Start the emulator as its own process on a free port; yield its base URL; stop it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_emulator", "--port", "0", "--time-scale", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the emulator did not start: {line!r} (exit {proc.poll()})")
        yield line.rsplit(" ", 1)[-1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submit_batches(url: str, n: int) -> list[str]:
    """N distinct batches over one uploaded file (they stay in progress at time scale 1000).

    The SDK is called directly (one create each, 8 at a time): the adapter's idempotent submit
    makes four calls per batch, which would take minutes for 1,000 and is not what is measured.

    :param url: the emulator's base URL
    :param n: how many
    """
    from concurrent.futures import ThreadPoolExecutor

    import openai

    adapter = OpenAIBatchAdapter(AdapterSettings("sk-bench", f"{url}/v1"))
    line = adapter.format_line(REQUEST, "a1__a1c0") + b"\n"
    client = openai.OpenAI(api_key="sk-bench", base_url=f"{url}/v1", max_retries=0)
    upload = client.files.create(file=("bench.jsonl", line), purpose="batch")

    def create(_: int) -> str:
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        return batch.id

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(create, range(n)))
    client.close()
    return ids


def client_build_cost(url: str) -> tuple[list[float], float]:
    """Seconds of each of :data:`CLIENT_BUILDS` status-client builds, and RSS bytes each holds.

    :param url: any base URL (nothing is called)
    """
    adapter = OpenAIBatchAdapter(AdapterSettings("sk-bench", f"{url}/v1"))
    adapter.async_client()  # the SDK import, once, is not part of a build
    held: list[AsyncStatusClient] = []
    times = []
    before = rss_bytes()
    for _ in range(CLIENT_BUILDS):
        start = time.perf_counter()
        held.append(adapter.async_client())
        times.append(time.perf_counter() - start)
    return times, (rss_bytes() - before) / CLIENT_BUILDS


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _until_event(trigger: BatchStatusTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise RuntimeError("a trigger ended without an event")


async def _run_triggers(batch_ids: list[str], seconds: float, interval: float) -> dict[str, Any]:
    """Run one trigger per batch on this loop with a lag ticker; return lag, polls and memory."""
    lateness: list[float] = []
    busy: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(TICK_S)
            lateness.append(time.perf_counter() - start - TICK_S)
            busy.append(time.thread_time() - cpu)  # what the loop's thread computed meanwhile

    peak = [rss_bytes()]

    async def sampler() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            await asyncio.sleep(0.25)

    before = rss_bytes()
    tick = asyncio.create_task(ticker())
    sample = asyncio.create_task(sampler())
    await asyncio.sleep(0.5)  # the ticker's own floor before any trigger
    idle = list(lateness)
    start = time.time()
    cpu = time.process_time()
    policy = PollPolicy(
        initial_interval=interval, factor=1.0, max_interval=interval, deadline=start + seconds
    ).to_dict()
    triggers = [
        BatchStatusTrigger(
            CONN_ID, f"job-{i}", bid, "openai", f"abp-bench-trigger-{i}", start, policy, "bench"
        )
        for i, bid in enumerate(batch_ids)
    ]
    events = await asyncio.gather(*(_until_event(t) for t in triggers))
    wall = time.time() - start
    cpu = time.process_time() - cpu
    done.set()
    await asyncio.gather(tick, sample)
    statuses = {str(e["status"]) for e in events}
    return {
        "lag": lateness[len(idle) :],
        "busy": busy[len(idle) :],
        "idle_lag": idle,
        "polls": sum(int(e["polls"]) for e in events),
        "wall": wall,
        "cpu": cpu,
        "rss_growth": max(0, peak[0] - before),
        "statuses": sorted(statuses),
    }


def run_triggers(
    url: str, batch_ids: list[str], seconds: float, interval: float, per_trigger_on_loop: bool
) -> dict[str, Any]:
    """Run the triggers in a fresh event loop; ``per_trigger_on_loop`` restores the earlier client build.

    :param url: the emulator's base URL
    :param batch_ids: one trigger per batch
    :param seconds: how long each trigger polls (its deadline)
    :param interval: seconds between polls
    :param per_trigger_on_loop: build one client per trigger, synchronously on the loop
    """
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
        {"conn_type": "openai_batch", "host": f"{url}/v1", "password": "sk-bench"}
    )
    shipped = BatchHook.aget_status_client

    async def on_loop(batch_conn_id: str) -> AsyncStatusClient:
        adapter = await BatchHook.aget_adapter(batch_conn_id)
        return adapter.async_client()  # what BatchStatusTrigger.run did until 30 Nov

    if per_trigger_on_loop:
        BatchHook.aget_status_client = on_loop  # type: ignore[method-assign]
    try:
        return asyncio.run(_run_triggers(batch_ids, seconds, interval))
    finally:
        BatchHook.aget_status_client = shipped  # type: ignore[method-assign,assignment]


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _quiet() -> None:
    """INFO logs off (the SDK's per-request lines and the trigger's per-poll line)."""
    import logging

    import structlog

    for name in ("httpx", "httpx2", "openai", "airflow_batch_provider"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # the trigger's own logger is Airflow's structlog one
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def run(size: str = "default", items: int | None = None) -> dict[str, Any]:
    """Run the trigger benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small`` or ``default``
    :param items: triggers instead of the size's
    """
    check_size(size)
    n, seconds, interval = SIZES[size]
    if items is not None:
        n = items
    old_n = max(1, n // 10)
    _quiet()
    with emulator_process() as url:
        builds, held = client_build_cost(url)
        batch_ids = submit_batches(url, n)
        shared = run_triggers(url, batch_ids, seconds, interval, per_trigger_on_loop=False)
        earlier = run_triggers(url, batch_ids[:old_n], seconds, interval, per_trigger_on_loop=True)
    idle_p99 = percentile(shared["idle_lag"], 0.99)
    rows = [
        row(
            "build one SDK status client (OpenAI), on the calling thread",
            "ms",
            _ms(statistics.median(builds)),
            None,
            subject="OpenAIBatchAdapter.async_client",
            note=f"median of {CLIENT_BUILDS}; max {_ms(max(builds)):.1f} ms; holds {held / 2**20:.2f} MiB RSS each",
        ),
        row(
            f"{n:,} triggers on one loop: event-loop lag p99",
            "ms",
            _ms(percentile(shared["lag"], 0.99)),
            _ms(idle_p99),
            subject="BatchStatusTrigger.run (shared client, built off the loop)",
            baseline_name="the ticker alone on the same loop, before any trigger",
            note=f"p50 {_ms(percentile(shared['lag'], 0.5)):.1f} ms, max {_ms(max(shared['lag'])):.1f} ms; "
            f"{len(shared['lag']):,} ticks of {_ms(TICK_S):.0f} ms",
        ),
        row(
            f"{n:,} triggers on one loop: loop thread's CPU between two ticks, p99",
            "ms",
            _ms(percentile(shared["busy"], 0.99)),
            _ms(TICK_S),
            subject="BatchStatusTrigger.run (shared client, built off the loop)",
            baseline_name="the tick",
            note=f"max {_ms(max(shared['busy'])):.1f} ms: the lag the loop's own work causes, "
            "without the time the OS gave other processes (this machine is shared)",
        ),
        row(
            f"{n:,} triggers on one loop: status polls",
            "polls/s",
            per_s(shared["polls"], shared["wall"]),
            n / interval,
            subject="BatchStatusTrigger.run (shared client, built off the loop)",
            baseline_name=f"N / interval ({interval:g} s): every trigger on time",
            note=f"{shared['polls']:,} polls in {shared['wall']:.1f} s; events: {', '.join(shared['statuses'])}",
        ),
        row(
            f"{n:,} triggers on one loop: CPU per poll",
            "ms",
            _ms(shared["cpu"] / max(1, shared["polls"])),
            None,
            subject="BatchStatusTrigger.run (shared client, built off the loop)",
            note="this process's CPU time over the run / polls (the emulator is another process)",
        ),
        row(
            f"{n:,} triggers on one loop: memory per trigger",
            "KiB",
            shared["rss_growth"] / n / 1024,
            held / 1024,
            subject="BatchStatusTrigger.run (shared client, built off the loop)",
            baseline_name="one SDK status client (what each trigger held before)",
            note="peak RSS growth over the run / N (RSS: Python and C allocations)",
        ),
        row(
            f"earlier code, {old_n:,} triggers (a client each, built on the loop): lag p99",
            "ms",
            _ms(percentile(earlier["lag"], 0.99)),
            _ms(idle_p99),
            subject="BatchStatusTrigger.run as of 29 Nov",
            baseline_name="the ticker alone on the same loop, before any trigger",
            note=f"max {_ms(max(earlier['lag'])):.1f} ms; loop CPU between ticks p99 "
            f"{_ms(percentile(earlier['busy'], 0.99)):.1f} ms, max {_ms(max(earlier['busy'])):.1f} ms; memory per trigger "
            f"{earlier['rss_growth'] / old_n / 1024:.0f} KiB; "
            f"{per_s(earlier['polls'], earlier['wall']):.1f} polls/s against {old_n / interval:g}",
        ),
    ]
    return result(
        "triggers",
        size,
        {
            "triggers": n,
            "seconds": seconds,
            "interval_s": interval,
            "earlier_triggers": old_n,
            "tick_s": TICK_S,
        },
        rows,
        notes=[
            "The emulator runs as a separate process on the same machine (it shares the CPUs).",
            "Lag: how late a task that sleeps 10 ms wakes; every trigger's callbacks run in between.",
            "INFO logging is off (the SDK's line per request, the trigger's line per poll).",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
