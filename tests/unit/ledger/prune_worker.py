"""A process that prunes a workload over and over while the test runs nights of it (spawned by the tests)."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.retention import RetentionPolicy, prune


def prune_until_stopped(url: str, workload: str, ready: Any, stop: Any, results: Any) -> None:
    """Prune ``workload`` to its newest run, two rows a transaction, until ``stop``; put the rows removed.

    One last prune runs after ``stop``, so the parent sees the history of every night it ran go.
    """
    ledger = Ledger.from_url(url)
    removed = 0
    passes = 0
    try:
        ready.set()
        while True:
            stopping = stop.is_set()
            removed += prune(ledger, workload, RetentionPolicy(keep_runs=1), batch_rows=2).total
            passes += 1
            if stopping:
                break
    finally:
        ledger.engine.dispose()
        results.put((removed, passes))
