"""Submitting one job exactly once: claim -> (re-attach | find) -> upload -> create -> record.

The job row written at staging is the intent. The rules:

- **claim**: the job is claimed in the ledger with compare-and-set (:meth:`Ledger.claim_job`)
  before anything reaches the provider. A zombie attempt (lost heartbeat, still running) and the
  new attempt of the same task have different owners, so they can never both pass this point;
  the loser waits while the holder's lease runs, re-attaching if the holder records a batch.
  The lease (:func:`claim_lease_s`) is longer than the worst case of the look-up, the upload and
  the create with their bounded retries, so a live holder never loses it mid-call;
- **re-attach first**: a batch id the ledger recorded is used as it is; then the provider is
  asked for a batch created with the job's idempotency key (a create whose reply was lost);
  only then is the input uploaded and the batch created;
- **in doubt**: when the adapter cannot tell whether a create it sent took effect
  (:class:`BatchInDoubtError`), the job is marked in doubt and nothing is created for it again
  until :func:`resolve_in_doubt` decides: found (attach), proven absent (the job is claimable again
  and created in the same task), or still unknown (keep waiting; at the deadline or the poll
  timeout its items go to review with code ``in_doubt``);
- the poll timeout of a job re-attached by :meth:`BatchAdapter.find` counts from the intent (the
  job's creation), never from the re-attach.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final, Literal

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef
from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.exceptions import (
    BatchInDoubtError,
    JobClaimedError,
    JobNotClaimableError,
    SubmitError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import ItemRef, JobRow
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)

#: The shortest submit claim, in seconds (see :func:`claim_lease_s`).
CLAIM_LEASE_S: Final = 30 * 60.0
#: Seconds a call may take when the connection sets no ``timeout`` (the SDK clients' default).
SDK_TIMEOUT_S: Final = 600.0
#: Seconds between two claim attempts while another live attempt holds the job.
CLAIM_RETRY_S: Final = 5.0
#: The job state of a job whose create may or may not have taken effect.
IN_DOUBT: Final = "in_doubt"
#: The item error code of items whose job was still in doubt when waiting stopped.
IN_DOUBT_CODE: Final = "in_doubt"


def aware(value: datetime) -> datetime:
    """A ledger timestamp with its zone: a naive one is UTC.

    :param value: the timestamp
    """
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def epoch(value: datetime | None, default: float | None = None) -> float:
    """Epoch seconds of a ledger timestamp; a naive one is UTC (SQLite drops the zone).

    :param value: the timestamp
    :param default: returned for ``None`` (default: now)
    """
    if value is None:
        return time.time() if default is None else default
    return aware(value).timestamp()


def claim_lease_s(adapter: BatchAdapter) -> float:
    """How long a submit claim is held: longer than the create steps can take at their worst.

    The steps under the claim are a look-up by key, an upload and a create; each create-like call
    makes up to ``create_attempts`` tries of at most ``timeout`` seconds, with the backoff and
    ``Retry-After`` waits between them. The lease is twice that sum (the look-ups after an
    ambiguous failure page through the provider's list), and never below :data:`CLAIM_LEASE_S`.

    :param adapter: the provider adapter (its connection extras)
    """
    policy = adapter.create_policy()
    timeout = float(adapter.settings.extra.get("timeout", SDK_TIMEOUT_S))
    per_call = policy.max_attempts * (timeout + max(policy.max_delay, policy.max_retry_after))
    return max(CLAIM_LEASE_S, 2 * 3 * per_call)


def claim_owner(dag_id: str, run_id: str, task_id: str, map_index: int | None, try_number: int | None) -> str:
    """The claim owner of one task attempt: dag/run/task/map index/try number@host:pid.

    :param dag_id: the DAG id
    :param run_id: the run id
    :param task_id: the task id
    :param map_index: the map index (-1 or ``None`` when not mapped)
    :param try_number: the try number
    """
    return f"{dag_id}/{run_id}/{task_id}/{map_index}/{try_number}@{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Submitted:
    """Where a job stands after submit.

    :param job_id: the ledger job
    :param batch_id: the provider batch (``None`` while in doubt)
    :param submitted_at: epoch seconds the poll timeout counts from
    :param how: ``created`` now, ``recorded`` (the ledger knew the batch), ``found`` by key,
        ``in_doubt``
    """

    job_id: str
    batch_id: str | None
    submitted_at: float
    how: Literal["created", "recorded", "found", "in_doubt"]

    @property
    def in_doubt(self) -> bool:
        """True while nobody knows whether the provider has a batch for this job."""
        return self.how == "in_doubt"

    def to_xcom(self, provider: str, key: str) -> dict[str, Any]:
        """The small dict the wait task reads.

        :param provider: the adapter name
        :param key: the job's idempotency key
        """
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "provider": provider,
            "idempotency_key": key,
            "batch_id": self.batch_id,
            "submitted_at": self.submitted_at,
        }
        if self.in_doubt:
            out["in_doubt"] = True
        return out


def batch_metadata(job: JobRow) -> dict[str, str]:
    """The small labels a job's batch carries at the provider (workload, run, round, chunk, model).

    :param job: the ledger job row
    """
    return {
        "workload": str(job.workload)[:500],
        "run_id": str(job.run_id)[:500],
        "round": str(job.round),
        "chunk": str(job.chunk_index),
        "model": str(job.model),
    }


def _known(job: JobRow) -> Submitted | None:
    if job.batch_id:
        log.info("job %s already submitted as batch %s; re-attaching", job.job_id, job.batch_id)
        at = job.submitted_at or job.created_at
        return Submitted(job.job_id, job.batch_id, epoch(at), "recorded")
    if job.state == IN_DOUBT:
        log.warning("job %s is in doubt (%s); nothing is created for it", job.job_id, job.error)
        return Submitted(job.job_id, None, epoch(job.created_at), "in_doubt")
    return None


def holder_is_dead(holder: str) -> bool:
    """Say whether a claim's owner is a process of this host that no longer runs.

    Only a process on this host can be proven dead (its pid is gone, or it is a zombie waiting to
    be reaped); a holder elsewhere is presumed alive until its lease ends.

    :param holder: an owner string from :func:`claim_owner` (``...@host:pid``)
    """
    _, _, where = holder.rpartition("@")
    host, _, pid_text = where.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def _claim(
    ledger: Ledger, job_id: str, owner: str, lease_s: float, sleep: Callable[[float], None]
) -> Submitted | None:
    """Claim the job; while another live attempt holds it, wait for its lease or its batch id.

    A holder proven dead (a process of this host that is gone, e.g. killed mid-submit) has its
    claim released at once instead of waiting for the lease to end.
    """
    while True:
        try:
            ledger.claim_job(job_id, owner, lease_s)
            return None
        except (JobClaimedError, JobNotClaimableError) as exc:
            known = _known(ledger.get_job(job_id))
            if known is not None:
                return known
            if isinstance(exc, JobClaimedError) and holder_is_dead(exc.holder):
                log.warning(
                    "the claim on job %s is held by %s, a process that is gone: releasing it",
                    job_id,
                    exc.holder,
                )
                ledger.release_job_claim(job_id, exc.holder)
                continue
            log.warning(
                "%s; waiting %.0fs for it to record its batch or for its lease to end", exc, CLAIM_RETRY_S
            )
            sleep(CLAIM_RETRY_S)


def submit_job(
    *,
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    job_id: str,
    owner: str,
    lease_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_in_doubt: Callable[[JobRow, str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Submitted:
    """Create the provider batch of a staged job at most once, or re-attach to it.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area (the staged chunk is verified against its checksum)
    :param job_id: the ledger job
    :param owner: this attempt's claim owner (:func:`claim_owner`)
    :param lease_s: how long the claim is held (default :func:`claim_lease_s`)
    :param sleep: how to wait while another attempt holds the claim
    :param on_in_doubt: called with the job row and the reason right after the job is marked in
        doubt (the ``batch_in_doubt`` alert); an error it raises is logged, never raised
    :param stop: asked before the upload and before the create; ``True`` (the task is being
        killed) ends the call with :class:`SubmitError` before anything more reaches the provider
    """
    known = _known(ledger.get_job(job_id))
    if known is not None:
        return known
    waited = _claim(ledger, job_id, owner, lease_s or claim_lease_s(adapter), sleep)
    if waited is not None:
        return waited
    try:
        failpoint("submit.after_claim")
        return _create(ledger, adapter, staging, job_id, on_in_doubt, stop)
    finally:
        ledger.release_job_claim(job_id, owner)


def _create(
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    job_id: str,
    on_in_doubt: Callable[[JobRow, str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Submitted:
    def check(before: str) -> None:
        if stop is not None and stop():
            raise SubmitError(
                f"job {job_id}: the task was killed before {before}; nothing more was sent for it. "
                "Its claim is released and its retry submits it (re-attaching by key to anything sent)."
            )

    job = ledger.get_job(job_id)  # read again under the claim: an earlier holder may have finished
    known = _known(job)
    if known is not None:
        return known
    key = job.idempotency_key
    intent = aware(job.created_at)
    found = adapter.find(key, created_after=intent)
    if found is not None:
        log.info("found batch %s created earlier with key %s; re-attaching", found.batch_id, key)
        ledger.mark_submitted(job_id, found.batch_id, job.input_ref or "")
        return Submitted(job_id, found.batch_id, epoch(job.created_at), "found")
    path = staging.at(job.staged_path)
    staging.verify(path, job.input_sha256)
    ledger.update_job(job_id, state="submitting")
    check("the upload")
    with path.open("rb") as fh:
        input_ref = adapter.stage(fh, f"{key}.jsonl", int(job.size_bytes))
    ledger.update_job(job_id, input_ref=input_ref.value)
    failpoint("submit.after_upload")
    check("the create")
    try:
        ref: BatchRef = adapter.submit(
            input_ref, key, batch_metadata(job), kind=job.kind, created_after=intent
        )
    except BatchInDoubtError as exc:
        log.error(
            "job %s: %s; it is in doubt and will not be created again until that is resolved", job_id, exc
        )
        ledger.mark_job_in_doubt(job_id, str(exc))
        if on_in_doubt is not None:
            try:
                on_in_doubt(job, exc.reason)
            except Exception:  # telling someone must never change what happened
                log.exception("the in-doubt callback of job %s failed", job_id)
        return Submitted(job_id, None, epoch(job.created_at), "in_doubt")
    failpoint("submit.after_create")
    ledger.mark_submitted(job_id, ref.batch_id, input_ref.value)
    log.info("created batch %s for job %s (%d lines)", ref.batch_id, job_id, job.lines)
    return Submitted(job_id, ref.batch_id, time.time(), "created")


Resolution = Literal["found", "absent", "unknown"]


def resolve_in_doubt(
    ledger: Ledger, adapter: BatchAdapter, job_id: str, actor: str
) -> tuple[Resolution, str | None]:
    """Try once to decide an in-doubt job: the batch found, proven absent, or still unknown.

    Found: the job is resolved to that batch (and its items are ``submitted``). Proven absent:
    the job is resolved without a batch and may be claimed and created again. Unknown: nothing
    changes.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param job_id: the in-doubt job
    :param actor: who resolved it (the task attempt's owner string)
    :return: the resolution and, when found, the batch id
    """
    job = ledger.get_job(job_id)
    if job.state != IN_DOUBT:
        return ("found", job.batch_id) if job.batch_id else ("absent", None)
    created_after = aware(job.created_at)
    custom_ids = [
        r.custom_id
        for r in ledger.iter_item_rows(
            job.workload, job.run_id, states=["staged"], shape=ItemRef, job_id=job_id
        )
        if r.custom_id
    ]
    try:
        ref = adapter.resolve_in_doubt(
            job.idempotency_key, created_after, int(job.lines), custom_ids=custom_ids
        )
    except BatchInDoubtError as exc:
        log.info("job %s still in doubt: %s", job_id, exc)
        return "unknown", None
    if ref is None:
        ledger.resolve_job(job_id, None, actor, "proven absent at the provider; claimable again")
        log.warning("job %s: no batch exists at the provider; it will be created now", job_id)
        return "absent", None
    ledger.resolve_job(
        job_id, ref.batch_id, actor, f"found batch {ref.batch_id} at the provider", submitted_at=created_after
    )
    log.warning("job %s: found its batch %s at the provider; attaching", job_id, ref.batch_id)
    return "found", ref.batch_id


def settle_in_doubt(ledger: Ledger, job_id: str, why: str) -> int:
    """Send the items of a job still in doubt to review (code ``in_doubt``); return how many moved.

    :param ledger: the ledger
    :param job_id: the in-doubt job
    :param why: why waiting stopped (deadline, timeout)
    """
    job = ledger.get_job(job_id)
    keys = [
        (r.item_key, r.prompt_version)
        for r in ledger.iter_item_rows(
            job.workload, job.run_id, states=["staged"], shape=ItemRef, job_id=job_id
        )
    ]
    message = (
        f"job {job_id} is in doubt ({job.error}): the provider may or may not have its batch, and "
        f"nothing was created again; {why}. Resolve it with the ledger's resolve command, then re-drive."
    )
    moved = ledger.transition(
        job.workload,
        job.run_id,
        "review",
        ["staged"],
        keys=keys,
        error_code=IN_DOUBT_CODE,
        error_message=message,
    )
    log.error("%s %d items to review.", message, moved)
    return moved


#: Job states in which nothing of the job has reached the provider under the current claim.
NOTHING_SENT: Final = frozenset({"staged"})


def release_on_kill(ledger: Ledger, job_id: str, owner: str) -> bool:
    """Release a killed attempt's claim when nothing of its job can be in flight; say whether it did.

    Called from ``on_kill`` (the task's SIGTERM handler, which runs between two statements of
    the task itself). While the job is still ``staged`` nothing was uploaded or created, and the
    task stops at its next :func:`submit_job` check, so its retry may claim the job at once. Once
    the job is ``submitting`` an upload or a create may be in flight: the claim is kept until its
    lease ends (or its holder is seen dead), and the retry re-attaches by key. Nothing else is
    changed.

    :param ledger: the ledger
    :param job_id: the job the attempt claimed
    :param owner: the attempt's claim owner
    """
    job = ledger.get_job(job_id)
    if job.state not in NOTHING_SENT or job.batch_id:
        log.warning(
            "killed while job %s is %s: its claim is kept until its lease ends (a create may be in flight)",
            job_id,
            job.state,
        )
        return False
    return ledger.release_job_claim(job_id, owner)
