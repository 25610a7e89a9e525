"""A fallback task in its own process, for the tests of a limit shared by many (spawned by ``test_fallback.py``).

Each worker opens its own ledger, stages its own workload's items, waits at a shared barrier and
sends them through :func:`run_fallback` against the emulator, under one quota key (shared) or
none (its own window).
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.pricing import PriceTable
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.services.fallback import FALLBACK_FROM, FallbackSettings, run_fallback

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", params={"max_tokens": 16})


def send(
    url: str,
    emulator: str,
    workload: str,
    items: int,
    settings: FallbackSettings,
    barrier: Any,
    results: Any,
) -> None:
    """Stage ``items`` for ``workload``, wait for the others, send them; put the summary."""
    ledger = Ledger.from_url(url)
    try:
        ledger.start_run(workload, "run", "openai", PROMPT.model)
        ledger.upsert_items(
            workload,
            "run",
            [
                PreparedItem(
                    f"{workload}{i:03d}", PROMPT.render({"id": f"{workload}{i}", "text": f"comment {i}"})
                )
                for i in range(items)
            ],
        )
        rows = list(ledger.iter_item_rows(workload, "run", states=FALLBACK_FROM, shape=OpenItem))
        adapter = OpenAIBatchAdapter(AdapterSettings(api_key="k", base_url=f"{emulator}/v1"))
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
