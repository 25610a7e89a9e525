"""Processes that race each other for the same job claims and workload leases (spawned by the tests).

Each worker opens its own ledger (its own connections), waits at a shared barrier before every
attempt, and reports what it won, so that the parent can check that exactly one process won each.
"""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.exceptions import JobClaimedError, WorkloadLeasedError
from airflow_batch_provider.ledger import Ledger


def claim_each(url: str, job_ids: list[str], owner: str, barrier: Any, results: Any) -> None:
    """Try to claim every job in turn; put ``(owner, job_id, won)`` for each."""
    ledger = Ledger.from_url(url)
    try:
        for job_id in job_ids:
            barrier.wait()
            try:
                ledger.claim_job(job_id, owner, 600)
                results.put((owner, job_id, True))
            except JobClaimedError:
                results.put((owner, job_id, False))
    finally:
        ledger.engine.dispose()


def lease_each(url: str, workloads: list[str], run_id: str, barrier: Any, results: Any) -> None:
    """Try to lease every workload in turn for ``run_id``; put ``(run_id, workload, won)`` for each."""
    ledger = Ledger.from_url(url)
    try:
        for workload in workloads:
            barrier.wait()
            try:
                ledger.acquire_workload_lease(workload, run_id, f"{run_id}-task")
                results.put((run_id, workload, True))
            except WorkloadLeasedError:
                results.put((run_id, workload, False))
    finally:
        ledger.engine.dispose()
