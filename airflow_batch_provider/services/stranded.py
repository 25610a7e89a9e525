"""Items a dead run left in ``fallback``: re-drive them or resolve them, audited.

An item is in ``fallback`` while its run sends it through the real-time API: its attempt is
recorded before the call and settled with the answer. A run that dies between the two leaves it
there, and nothing else will finish it: a new run never takes over items in flight. A person
settles them, once the run is known to be dead (it no longer holds the workload's lease:
``airflow-batch lease release`` after checking):

- the open real-time attempt is closed as ``answer_lost`` at cost 0 (the provider may have
  billed it; its usage is unknown), as the run itself would have closed it;
- the items go to ``review`` with that error code, then through the ledger's review API:
  **re-drive** (back to ``pending``, attempts 0: the next run sends them) or **resolve** (they
  stay out of every run until their input or prompt version changes). The review API writes the
  action to the audit table: who, when, which items, why.

Safe to repeat: a crash half-way leaves the items in the review queue with ``answer_lost``, and
the next call finishes them.

Command line: ``airflow-batch fallback list | redrive | resolve`` (:mod:`airflow_batch_provider.cli`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from airflow_batch_provider.exceptions import LedgerError, WorkloadLeasedError
from airflow_batch_provider.ledger import reads
from airflow_batch_provider.ledger.records import OpenItem, sync_job_id
from airflow_batch_provider.services.fallback import ANSWER_LOST, close_interrupted_sends

if TYPE_CHECKING:
    from airflow_batch_provider.ledger import Ledger
    from airflow_batch_provider.ledger.reads import StrandedFallback

StrandedAction = Literal["redrive", "resolve"]
STRANDED_ACTIONS: Final[tuple[StrandedAction, ...]] = ("redrive", "resolve")


def stranded_fallback(ledger: Ledger, workload: str | None = None) -> list[StrandedFallback]:
    """List, per run, the items left in ``fallback`` and whether that run still holds the workload.

    :param ledger: the ledger
    :param workload: only this workload
    """
    return reads.stranded_fallback(ledger, workload)


def _settle_keys(ledger: Ledger, workload: str, run_id: str) -> list[tuple[str, str]]:
    """Close the run's open real-time attempts and put their items in review; return their keys.

    Also returns the items an earlier, interrupted call already put in review (``answer_lost`` on
    the run's real-time job, no person's decision yet), so that a repeat finishes them.
    """
    left = {
        (r.item_key, r.prompt_version) for r in close_interrupted_sends(ledger, workload, run_id, ANSWER_LOST)
    }
    # close_interrupted_sends also returns the run's items it closed before as possibly_paid_twice
    # (the run sent them again itself); only those closed as answer_lost are this action's
    keys = sorted(
        (r.item_key, r.prompt_version)
        for r in ledger.iter_item_rows(
            workload,
            run_id,
            states=["failed_retryable"],
            shape=OpenItem,
            job_id=sync_job_id(workload, run_id),
        )
        if (r.item_key, r.prompt_version) in left and r.error_code == ANSWER_LOST
    )
    if keys:
        ledger.transition(workload, run_id, "review", ["failed_retryable"], keys=keys, error_code=ANSWER_LOST)
    queued = ledger.iter_item_rows(
        workload, run_id, states=["review"], shape=OpenItem, job_id=sync_job_id(workload, run_id)
    )
    return sorted((r.item_key, r.prompt_version) for r in queued if r.error_code == ANSWER_LOST)


def settle_stranded_fallback(
    ledger: Ledger, workload: str, run_id: str, action: StrandedAction, *, actor: str, reason: str
) -> int:
    """Re-drive or resolve the items a dead run left in ``fallback``; return how many moved.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the dead run
    :param action: ``redrive`` (the next run sends them) or ``resolve`` (they stay out of every run)
    :param actor: who (written to the audit table)
    :param reason: why (written to the audit table)
    :raises WorkloadLeasedError: the run still holds the workload: it may be alive and sending
    :raises LedgerError: no actor or reason, or an unknown action
    """
    if action not in STRANDED_ACTIONS:
        raise LedgerError(
            f"action {action!r} on stranded fallback items; use one of {', '.join(STRANDED_ACTIONS)}."
        )
    if not actor or not reason:
        raise LedgerError(
            f"{action} of run {run_id!r}'s fallback items needs an actor and a reason, for the audit table."
        )
    lease = ledger.workload_lease(workload)
    if lease is not None and lease.run_id == run_id:
        raise WorkloadLeasedError(workload, run_id, lease.dag_id, lease.acquired_at.isoformat())
    keys = _settle_keys(ledger, workload, run_id)
    if not keys:
        return 0
    item_keys = sorted({k for k, _v in keys})
    why = f"{reason} (items run {run_id!r} left in fallback; their real-time answers were lost)"
    if action == "redrive":
        return ledger.redrive(workload, item_keys=item_keys, error_code=ANSWER_LOST, actor=actor, reason=why)
    return ledger.resolve_review(workload, item_keys=item_keys, error_code=ANSWER_LOST, actor=actor, note=why)
