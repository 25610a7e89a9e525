"""Processes that race each other for one shared quota (spawned by ``test_quota.py``).

Each worker opens its own ledger (its own connections), waits at a shared barrier, then asks as
fast as it can and reports what it was given.
"""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.quota import EnqueuedQuotaStore, SharedRateStore


def reserve_rounds(url: str, rounds: int, barrier: Any, results: Any) -> None:
    """In each of ``rounds`` windows of one request, race the others for it; put how many were won."""
    ledger = Ledger.from_url(url)
    store = SharedRateStore(ledger.engine, "conn-a")
    try:
        won = 0
        for k in range(rounds):
            barrier.wait()
            rid, _ = store.reserve(1, 1000.0 + 60.0 * k, 1, None, 60.0)
            if rid is not None:
                store.commit(rid, 1, 1000.0 + 60.0 * k)
                won += 1
        results.put(won)
    finally:
        ledger.engine.dispose()


def admit_rounds(url: str, job_ids: list[str], barrier: Any, results: Any) -> None:
    """For job ``k`` (100 tokens) race the others for model ``m<k>``'s limit of 100; put the ids won."""
    ledger = Ledger.from_url(url)
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    try:
        won = []
        for k, job_id in enumerate(job_ids):
            barrier.wait()
            if store.admit(job_id, f"m{k}", 100, 100, 1000.0).admitted:
                won.append(job_id)
        results.put(won)
    finally:
        ledger.engine.dispose()
