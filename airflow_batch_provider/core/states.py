"""The state vocabulary: item states and their moves (DESIGN.md, "Item states"), batch states.

Every other module names these sets instead of repeating state names.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

ItemState = Literal[
    "pending",
    "staged",
    "submitted",
    "succeeded",
    "failed_retryable",
    "failed_permanent",
    "expired",
    "cancelled",
    "review",
    "fallback",
    "skipped",
    "unchanged",
]
ITEM_STATES: Final[tuple[str, ...]] = get_args(ItemState)

#: States an item may be in when a run is over: nothing more will happen to it in this run.
FINAL_STATES: Final[frozenset[str]] = frozenset(
    {"succeeded", "unchanged", "review", "skipped", "pending", "cancelled"}
)
#: States whose item may be sent again in a new job while attempts remain.
RETRYABLE_STATES: Final[frozenset[str]] = frozenset({"failed_retryable", "expired"})
#: States that hold a usable result.
USABLE_STATES: Final[frozenset[str]] = frozenset({"succeeded", "unchanged"})
#: States with work in flight at a provider or in staging.
OPEN_STATES: Final[frozenset[str]] = frozenset({"pending", "staged", "submitted", "fallback"})

_ALL: Final[frozenset[str]] = frozenset(ITEM_STATES)

# Allowed moves. Every state may also stay where it is (idempotent reruns) and every state may
# go back to ``pending`` when a new run brings a changed input for the item.
_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "pending": frozenset({"staged", "unchanged", "skipped", "review", "fallback"}),
    "staged": frozenset({"submitted", "skipped", "fallback", "review"}),
    "submitted": frozenset(
        {
            "succeeded",
            "failed_retryable",
            "failed_permanent",
            "expired",
            "cancelled",
            "fallback",
            "skipped",
            "review",
        }
    ),
    "failed_retryable": frozenset({"staged", "review", "fallback", "skipped", "succeeded"}),
    "expired": frozenset({"staged", "review", "fallback", "skipped", "succeeded"}),
    "cancelled": frozenset({"staged", "review", "fallback", "skipped", "succeeded"}),
    "failed_permanent": frozenset({"review"}),
    "fallback": frozenset({"succeeded", "failed_permanent", "review", "failed_retryable"}),
    "succeeded": frozenset(),
    "unchanged": frozenset(),
    # a person's decision on a review item (Ledger.skip_review); a re-drive goes back to pending;
    # an item sent to review because its job was in doubt is ``submitted`` again when the job is
    # resolved to its batch (Ledger.resolve_job): the batch's answer is harvested, never re-sent
    "review": frozenset({"skipped", "submitted"}),
    "skipped": frozenset(),
}


def can_transition(current: str, target: str) -> bool:
    """Say whether an item may move from ``current`` to ``target``.

    :param current: the state the ledger holds
    :param target: the state asked for
    """
    if current not in _ALL or target not in _ALL:
        return False
    if current == target or target == "pending":
        return True
    return target in _TRANSITIONS[current]


def sources_of(target: str, *, reopen: bool = False) -> frozenset[str]:
    """Return every state from which ``target`` may be reached (for guarded bulk updates).

    :param target: the state asked for
    :param reopen: the move is a new run's prepare, which reopens the item (back to ``pending``)
        and decides again in the same write: every state that may reach ``pending`` counts when
        ``pending`` may reach ``target`` (e.g. ``succeeded`` -> ``unchanged``, ``failed_permanent``
        -> ``review``)
    """
    if reopen and can_transition("pending", target):
        return frozenset(s for s in ITEM_STATES if can_transition(s, "pending"))
    return frozenset(s for s in ITEM_STATES if can_transition(s, target))


#: States in which an item may be at a provider or in a staged file another run will send: a new
#: run never takes these over (items in flight stay with their run).
IN_FLIGHT_STATES: Final[frozenset[str]] = frozenset({"staged", "submitted", "fallback"})
#: Item states of a dead run's job that the run taking its workload over adopts and carries on
#: with (``fallback`` stays with the dead run, for a person: an interrupted real-time send).
ADOPTABLE_ITEM_STATES: Final[tuple[str, ...]] = ("staged", "submitted")
#: Item states of a dead run's item, with an answer harvested, that the run taking its workload
#: over inherits as they are (ledger/inheritance.py): settled, nothing more is sent for it unless
#: its input or prompt changes (then the prepare reopens it, as for any run's item).
INHERITED_ITEM_STATES: Final[tuple[str, ...]] = (
    "succeeded",
    "unchanged",
    "review",
    "skipped",
    "failed_permanent",
)

#: Item states without a result and without a person's decision yet: what the deadline policy deals
#: with, and what the synchronous fallback may send (``fallback``: an interrupted earlier send).
UNSETTLED_STATES: Final[tuple[str, ...]] = (
    "pending",
    "staged",
    "submitted",
    "failed_retryable",
    "expired",
    "cancelled",
    "fallback",
)

#: Item states a closing run settles with its ``unfinished`` choice: sent, or to be sent again, in
#: a batch. ``pending`` items were never staged and ``fallback`` ones are closed first.
UNFINISHED_STATES: Final[tuple[str, ...]] = (
    "staged",
    "submitted",
    "failed_retryable",
    "expired",
    "cancelled",
)

#: Item states a person should look at after a run (the UI lists them per run).
ATTENTION_STATES: Final[tuple[str, ...]] = ("review", "failed_permanent", "pending", "skipped")
#: Where items still open when a run closes may go (publish's settling).
UNFINISHED_ROUTES: Final[tuple[str, ...]] = ("review", "pending", "skipped")

#: States a person may re-drive (back to ``pending``, attempts 0): every settled failure or skip.
REDRIVABLE_STATES: Final[frozenset[str]] = frozenset(
    {"review", "failed_permanent", "failed_retryable", "expired", "cancelled", "skipped"}
)


#: A provider batch's lifecycle, normalised across providers (:class:`~airflow_batch_provider.core.batch.BatchStatus`).
BatchState = Literal[
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"
]
BATCH_STATES: Final[tuple[str, ...]] = get_args(BatchState)
#: Batch states after which the provider does nothing more with the job.
TERMINAL_BATCH_STATES: Final[frozenset[str]] = frozenset({"completed", "failed", "expired", "cancelled"})

#: A job's steps in ``abp_jobs`` (one staged chunk and what became of it at the provider).
JobState = Literal[
    "staged", "submitting", "uploaded", "in_doubt", "submitted", "sync", "downloaded", "reconciled"
]
JOB_STATES: Final[tuple[str, ...]] = get_args(JobState)
#: Job states before the batch's create: no claimed step of the job is in flight and the provider
#: holds no batch of it (an uploaded file at most).
NOT_CREATED_JOB_STATES: Final[frozenset[str]] = frozenset({"staged", "uploaded"})
#: Job states whose batch holds enqueued tokens at the provider, or is about to (admitted, not yet
#: created), until the batch ends.
ENQUEUED_JOB_STATES: Final[frozenset[str]] = NOT_CREATED_JOB_STATES | {"submitting", "in_doubt", "submitted"}
#: Job states whose create may have reached the provider without a recorded batch id (the send
#: guard, :mod:`airflow_batch_provider.ledger.unharvested`, treats their job as holding a batch).
UNKNOWN_CREATE_JOB_STATES: Final[frozenset[str]] = frozenset({"in_doubt", "submitting"})
#: The item error code of items whose job was still in doubt when waiting stopped.
IN_DOUBT_CODE: Final = "in_doubt"
#: Job states in which every result of the job is in the ledger: a harvest has nothing left to do.
HARVESTED_JOB_STATES: Final[frozenset[str]] = frozenset({"downloaded", "reconciled"})
#: Job states whose every line is in the ledger and that nothing moves again (a prune may remove
#: such a job once nothing points at it).
PRUNABLE_JOB_STATES: Final[tuple[str, ...]] = ("reconciled", "sync")
