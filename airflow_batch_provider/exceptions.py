"""Exceptions by phase of a batch run.

Every message states what was found, the limit it broke and what to do about it, so that the
line in the task log is enough to act on without reading code.
"""

from __future__ import annotations

from datetime import datetime


class BatchProviderError(Exception):
    """Base class of every error raised by this package."""


class ConfigurationError(BatchProviderError):
    """A DAG, connection or operator argument is wrong; fix the DAG or the connection."""


class ItemError(BatchProviderError):
    """One input record cannot be sent; the other records go on.

    :param app_id: the application id of the record, or ``None`` where it has none
    :param code: a short machine-readable reason, e.g. ``template_variable_missing``
    :param message: the reason, the limit and the fix, in words
    :param position: the record's position in the input (0-based), when known
    """

    def __init__(self, app_id: str | None, code: str, message: str, position: int | None = None) -> None:
        self.app_id = app_id
        self.code = code
        self.position = position
        where = f"record {position}" if position is not None else "record"
        who = f"{where} (id {app_id!r})" if app_id is not None else where
        super().__init__(f"{who}: {message}")


class ChunkingError(BatchProviderError):
    """Records cannot be split into files within the adapter's limits."""


class StagingError(BatchProviderError):
    """A staged file is missing or does not match the checksum the ledger recorded."""


class SubmitError(BatchProviderError):
    """The provider refused a batch, or a submit could not be made idempotent."""


class PollError(BatchProviderError):
    """Status polling gave up: too many consecutive errors, or the timeout passed."""


class BatchFailedError(BatchProviderError):
    """The provider ended a batch as failed before any item ran (e.g. validation failed)."""


class DownloadError(BatchProviderError):
    """An output or error file could not be read back."""


class ReconcileError(BatchProviderError):
    """Result lines cannot be matched to the ledger."""


class LedgerError(BatchProviderError):
    """The ledger refused a write: schema mismatch or a forbidden state transition."""


class InvalidTransitionError(LedgerError):
    """An item was asked to move between two states that DESIGN.md does not connect."""


class PricingError(BatchProviderError):
    """A model has no price, or a pricing file is malformed."""


class BudgetExceededError(BatchProviderError):
    """The cost estimate of what is about to be submitted exceeds the run's budget."""


class RecordSourceError(BatchProviderError):
    """The input source failed part-way (a records callable raised, a read failed, a bad CSV header).

    The records read before it are kept; the rest are unknown, so the prepare task fails.
    """


class JobClaimedError(LedgerError):
    """Another task attempt holds the claim on a job's create call, and its lease has not expired.

    :param job_id: the job
    :param holder: who holds the claim
    :param expires_at: when the claim may be taken over (ISO 8601, UTC)
    """

    def __init__(self, job_id: str, holder: str, expires_at: str) -> None:
        self.job_id = job_id
        self.holder = holder
        self.expires_at = expires_at
        super().__init__(
            f"job {job_id!r} is claimed by {holder!r} until {expires_at}; another attempt is creating "
            "its batch. Nothing was sent. Wait for that attempt (or for the claim to expire), then "
            "retry this task: it will find the batch by its idempotency key."
        )


class JobNotClaimableError(LedgerError):
    """A job may not be claimed to create a batch: it has one already, or its create is in doubt.

    :param job_id: the job
    :param reason: ``in_doubt`` or ``submitted``
    :param detail: the in-doubt reason or the batch id
    """

    def __init__(self, job_id: str, reason: str, detail: str) -> None:
        self.job_id = job_id
        self.reason = reason
        self.detail = detail
        if reason == "in_doubt":
            remedy = (
                "a batch may already exist at the provider; nothing will be created for it until the "
                "doubt is resolved: by matching the provider's batch list, or by a person with "
                f"`airflow-batch jobs resolve {job_id} --batch-id ID --note WHAT_YOU_CHECKED` (or `--absent`)."
            )
        else:
            remedy = f"it has batch {detail!r} already; poll that batch instead of creating another."
        super().__init__(f"job {job_id!r} cannot be claimed for create ({reason}: {detail}): {remedy}")


class BatchNotHarvestedError(LedgerError):
    """Items may not be sent again: their current job holds a batch that may have answered and billed them.

    :param action: what was refused (``redrive``)
    :param workload: the workload
    :param jobs: ``(job_id, job state, batch id, items)`` of each job that holds such a batch
    """

    def __init__(self, action: str, workload: str, jobs: list[tuple[str, str, str | None, int]]) -> None:
        self.action = action
        self.workload = workload
        self.jobs = jobs
        parts = []
        for job_id, state, batch_id, count in jobs[:5]:
            if state == "in_doubt" or batch_id is None:
                parts.append(
                    f"{count} item(s) of job {job_id!r}, whose create is {state} (a batch may exist and bill "
                    f"them): resolve it first with `airflow-batch jobs resolve {job_id} --batch-id ID "
                    "--note WHAT_YOU_CHECKED` (then the next run of the workload harvests the batch once it "
                    "has ended, or its own run's publish if that run is not finished) or `--absent`"
                )
            else:
                parts.append(
                    f"{count} item(s) of job {job_id!r}, whose batch {batch_id!r} is not harvested yet (job "
                    f"{state}): its answers are harvested first, once the batch has ended (by its run's publish, or by "
                    "the next run of the workload when its run is finished)"
                )
        more = f"; and {len(jobs) - 5} more job(s)" if len(jobs) > 5 else ""
        super().__init__(
            f"{action} of workload {workload!r} refused, nothing moved: sending these items again would pay "
            f"for them twice. {'; '.join(parts)}{more}; then {action} what is left."
        )


class WorkloadLeasedError(LedgerError):
    """Another run holds the workload: two runs of one workload must not move each other's items.

    :param workload: the workload
    :param run_id: the run holding it
    :param dag_id: that run's DAG, when known
    :param since: since when it holds the workload (ISO 8601, UTC)
    """

    def __init__(self, workload: str, run_id: str, dag_id: str | None, since: str) -> None:
        self.workload = workload
        self.run_id = run_id
        self.dag_id = dag_id
        self.since = since
        dag = f"DAG {dag_id!r}, " if dag_id else ""
        super().__init__(
            f"workload {workload!r} is held by {dag}run {run_id!r} since {since}; one run at a time "
            "may work on a workload. Wait for that run to finish, set max_active_runs=1 on the DAG "
            "(and give each DAG its own workload name), or, after checking that the run is dead, "
            f"release it with `airflow-batch lease release --workload {workload} --run-id {run_id} --reason WHY`."
        )


class BatchInDoubtError(SubmitError):
    """A create may or may not have made a provider batch, and the provider cannot tell yet.

    Raised by ``BatchAdapter.submit`` after an ambiguous failure (timeout, dropped connection,
    5xx) where the provider cannot be asked whether the batch exists, and by
    ``BatchAdapter.resolve_in_doubt`` while that is still undecidable. Nothing may be created for
    the job until the doubt is resolved, or the chunk could be paid twice.

    :param key: the job's idempotency key
    :param created_after: when the create was attempted (a batch it made was created after this)
    :param request_count: requests in the chunk (0 when unknown)
    :param reason: what happened and what is unknown
    """

    def __init__(self, key: str, created_after: datetime, request_count: int, reason: str) -> None:
        self.key = key
        self.created_after = created_after
        self.request_count = request_count
        self.reason = reason
        count = f"{request_count} requests" if request_count else "its requests"
        super().__init__(
            f"job {key} is in doubt: a batch of {count} may have been created at the provider after "
            f"{created_after.isoformat()}, and it is unknown whether it was: {reason}. Nothing new is created "
            "for this job until the doubt is resolved: resolve_in_doubt() matches the provider's batch list "
            "(created after that time, same request count, the job's custom ids once the batch has ended), "
            "or a person resolves the job with its batch id (or none) after checking the provider's console."
        )


class TriggerEventError(PollError):
    """A trigger event the waiting task cannot read: not a mapping, an unknown status, a bad batch.

    :param job_id: the ledger job the task waits for
    :param problem: what is wrong with the event
    :param event: the event as received (shown shortened)
    """

    def __init__(self, job_id: str, problem: str, event: object) -> None:
        self.job_id = job_id
        self.problem = problem
        shown = repr(event)
        shown = shown if len(shown) <= 300 else shown[:300] + "..."
        super().__init__(
            f"job {job_id}: the status trigger sent an event this task cannot read ({problem}): {shown}. "
            "Nothing in the ledger was changed; clear the task to poll the batch again, and report the "
            "event if it recurs (the triggerer may run another version of the provider than the worker)."
        )


class VectorDimensionError(ConfigurationError):
    """An embedding's length is not the vector column's: the model and the sink disagree; fix either."""


class ConsumerActError(BatchProviderError):
    """A consumer's function failed on some hand-offs; the others were acted on and acknowledged.

    :param consumer: the consumer's name
    :param run_id: the run whose answers it was handed
    :param failed: how many hand-offs failed
    :param first: the first failure, ``app_id: message``
    """

    def __init__(self, consumer: str, run_id: str, failed: int, first: str) -> None:
        self.consumer = consumer
        self.run_id = run_id
        self.failed = failed
        super().__init__(
            f"consumer {consumer!r} failed on {failed} hand-off(s) of run {run_id!r} (first: {first}); "
            "the others were acted on and acknowledged. The failed ones are in the review list (error "
            "code sink_refused) with their messages; fix the cause and clear the task (or let it retry): "
            "they are offered again with the same idempotency keys."
        )
