"""Uploading and submitting one job exactly once: upload, then submit, each under a claim.

Upload is claim -> stage -> record; submit is claim -> re-attach | find -> create -> record. The job row written at staging is the intent. Two tasks act on it, each a create-like call:

- **upload** (:func:`upload_job`): under the job's claim, the staged chunk is put where the
  provider reads it (an uploaded file, an object URI; nothing for providers that take the
  requests inline) and recorded with :meth:`Ledger.record_upload`. A recorded upload is used as
  it is; the adapter looks a file up by the job's key before uploading, so a lost upload reply is
  found, not sent again; where two files exist anyway, the first recorded one is used and the
  other is reported. Upload never creates a batch;
- **submit** (:func:`submit_job`): creates the batch from the recorded input. It never uploads:
  a cleared or retried submit re-attaches, or creates from the same file.

The rules:

- **claim**: the job is claimed in the ledger with compare-and-set (:meth:`Ledger.claim_job`)
  before anything reaches the provider. A zombie attempt (lost heartbeat, still running) and the
  new attempt of the same task have different owners, so they can never both pass this point;
  the loser waits while the holder's lease runs, re-attaching if the holder records its result.
  The lease (:func:`claim_lease_s`) is longer than the worst case of the look-up and the call
  with their bounded retries, so a live holder never loses it mid-call;
- **re-attach first**: a batch id the ledger recorded is used as it is; then the provider is
  asked for a batch created with the job's idempotency key (a create whose reply was lost);
  only then is the batch created;
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
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef, InputRef
from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.core.states import IN_DOUBT_CODE, NOT_CREATED_JOB_STATES
from airflow_batch_provider.exceptions import (
    BatchInDoubtError,
    JobClaimedError,
    JobNotClaimableError,
    SubmitError,
)
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import ItemRef, JobRow
from airflow_batch_provider.services.finished_jobs import finished_run_refusal
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)
_S = TypeVar("_S")

#: The shortest submit claim, in seconds (see :func:`claim_lease_s`).
CLAIM_LEASE_S: Final = 30 * 60.0
#: Seconds a call may take when the connection sets no ``timeout`` (the SDK clients' default).
SDK_TIMEOUT_S: Final = 600.0
#: Seconds between two claim attempts while another live attempt holds the job.
CLAIM_RETRY_S: Final = 5.0
#: The job state of a job whose create may or may not have taken effect.
IN_DOUBT: Final = "in_doubt"


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

    The steps under a claim are a look-up by key and an upload or a create; each create-like call
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
    ledger: Ledger,
    job_id: str,
    owner: str,
    lease_s: float,
    sleep: Callable[[float], None],
    settled: Callable[[JobRow], _S | None],
) -> _S | None:
    """Claim the job; while another live attempt holds it, wait for its lease or for ``settled``.

    ``settled`` says what makes waiting pointless (the holder recorded the batch, or the upload):
    its answer is returned instead of a claim. A holder proven dead (a process of this host that
    is gone, e.g. killed mid-call) has its claim released at once instead of waiting for the
    lease to end.
    """
    while True:
        try:
            ledger.claim_job(job_id, owner, lease_s)
            return None
        except (JobClaimedError, JobNotClaimableError) as exc:
            known = settled(ledger.get_job(job_id))
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
            log.warning("%s; waiting %.0fs for it to finish or for its lease to end", exc, CLAIM_RETRY_S)
            sleep(CLAIM_RETRY_S)


def _stop_check(stop: Callable[[], bool] | None, job_id: str, before: str) -> None:
    if stop is not None and stop():
        raise SubmitError(
            f"job {job_id}: the task was killed before {before}; nothing more was sent for it. "
            "Its claim is released and its retry goes on from what the ledger recorded."
        )


def goes_sync(job: JobRow, adapter: BatchAdapter) -> bool:
    """Whether a job's items go through the real-time API instead of a batch (below the provider's minimum).

    Such a chunk is neither uploaded nor created: the submit task sends its items one by one.

    :param job: the ledger job row
    :param adapter: the provider adapter
    """
    return job.state == "sync" or (not job.batch_id and job.lines < adapter.limits.min_requests)


# ---------------------------------------------------------------------------- upload


@dataclass(frozen=True)
class Uploaded:
    """Where a job's input stands after the upload task.

    :param job_id: the ledger job
    :param input_kind: ``file``, ``uri`` or ``inline`` (``None``: nothing to upload, see ``how``)
    :param input_ref: the provider's file id or the object URI (``None`` for ``inline``)
    :param how: ``uploaded`` now, ``recorded`` (the ledger knew the upload), ``submitted`` (the
        job has a batch or is in doubt: its input is the provider's already), ``sync`` (the chunk
        goes through the real-time API: nothing is uploaded)
    :param orphan: a second file this attempt uploaded for the chunk while another was recorded
        (a lost upload reply): it is not used; delete it at the provider
    """

    job_id: str
    input_kind: str | None
    input_ref: str | None
    how: Literal["uploaded", "recorded", "submitted", "sync"]
    orphan: str | None = None

    def to_xcom(self) -> dict[str, Any]:
        """The small dict the submit task reads (it reads the ledger, not this)."""
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "input_kind": self.input_kind,
            "input_ref": self.input_ref,
            "upload": self.how,
        }
        if self.orphan is not None:
            out["orphan_input"] = self.orphan
        return out


def _upload_settled(job: JobRow, adapter: BatchAdapter) -> Uploaded | None:
    if job.batch_id or job.state == IN_DOUBT:
        return Uploaded(job.job_id, job.input_kind, job.input_ref, "submitted")
    if job.input_kind is not None:
        log.info(
            "job %s: its input is staged at the provider already (%s %s)",
            job.job_id,
            job.input_kind,
            job.input_ref,
        )
        return Uploaded(job.job_id, job.input_kind, job.input_ref, "recorded")
    if goes_sync(job, adapter):
        return Uploaded(job.job_id, None, None, "sync")
    return None


def upload_job(
    *,
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    job_id: str,
    owner: str,
    lease_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    stop: Callable[[], bool] | None = None,
) -> Uploaded:
    """Stage a job's chunk at the provider at most once and record it; never creates a batch.

    A recorded upload is used as it is (a cleared upload task sends nothing). Otherwise, under
    the job's claim, the staged chunk is checked against its checksum and handed to
    :meth:`BatchAdapter.stage`, which looks a file up by the job's key before uploading it (a
    lost upload reply is found, not uploaded again); the result is recorded with
    :meth:`Ledger.record_upload`, where the first recorded file wins.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area
    :param job_id: the ledger job
    :param owner: this attempt's claim owner (:func:`claim_owner`)
    :param lease_s: how long the claim is held (default :func:`claim_lease_s`)
    :param sleep: how to wait while another attempt holds the claim
    :param stop: asked before the upload; ``True`` (the task is being killed) ends the call with
        :class:`SubmitError` before anything reaches the provider
    """
    done = _upload_settled(ledger.get_job(job_id), adapter)
    if done is not None:
        return done
    waited = _claim(
        ledger, job_id, owner, lease_s or claim_lease_s(adapter), sleep, lambda j: _upload_settled(j, adapter)
    )
    if waited is not None:
        return waited
    try:
        return stage_input(ledger, adapter, staging, job_id, stop)
    finally:
        ledger.release_job_claim(job_id, owner)


def stage_input(
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    job_id: str,
    stop: Callable[[], bool] | None = None,
) -> Uploaded:
    """The upload step under the claim: stage the chunk at the provider and record where it is.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area
    :param job_id: the claimed job
    :param stop: asked before the upload (see :func:`upload_job`)
    """
    job = ledger.get_job(job_id)  # read again under the claim: an earlier holder may have finished
    done = _upload_settled(job, adapter)
    if done is not None:
        return done
    path = staging.at(job.staged_path)
    staging.verify(path, job.input_sha256)
    _stop_check(stop, job_id, "the upload")
    ledger.update_job(job_id, state="submitting")  # an upload may be in flight from here on
    with path.open("rb") as fh:
        ref = adapter.stage(fh, f"{job.idempotency_key}.jsonl", int(job.size_bytes))
    failpoint("upload.after_upload")
    value = None if ref.kind == "inline" else ref.value
    if ref.kind == "inline":
        _discard_spool(ref, path)
    kind, held = ledger.record_upload(job_id, ref.kind, value)
    if (kind, held) != (ref.kind, value):
        log.error(
            "job %s: %s %s was recorded for this chunk before this attempt's %s %s; the recorded one is used "
            "and %s is not: delete it at the provider",
            job_id,
            kind,
            held,
            ref.kind,
            value,
            value,
        )
        return Uploaded(job_id, kind, held, "recorded", orphan=value)
    log.info("job %s: staged at the provider as %s %s (%d lines)", job_id, ref.kind, value, job.lines)
    return Uploaded(job_id, ref.kind, value, "uploaded")


def _discard_spool(ref: InputRef, staged: Any) -> None:
    """Remove a local copy an adapter made of an inline chunk (the submit task makes its own).

    Only a local file that is not the staged chunk itself is removed.
    """
    spool = Path(ref.value)
    local = str(staged).removeprefix("file://")
    if spool.is_absolute() and spool.is_file() and spool.resolve() != Path(local).resolve():
        spool.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- submit


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
    """Create the provider batch of an uploaded job at most once, or re-attach to it.

    Submit never uploads: the input is the one the upload task recorded (:func:`upload_job`).

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area (an inline chunk is read from it and verified)
    :param job_id: the ledger job
    :param owner: this attempt's claim owner (:func:`claim_owner`)
    :param lease_s: how long the claim is held (default :func:`claim_lease_s`)
    :param sleep: how to wait while another attempt holds the claim
    :param on_in_doubt: called with the job row and the reason right after the job is marked in
        doubt (the ``batch_in_doubt`` alert); an error it raises is logged, never raised
    :param stop: asked before the create; ``True`` (the task is being killed) ends the call with
        :class:`SubmitError` before anything more reaches the provider
    :raises SubmitError: no upload is recorded for the job (run its upload task first), or its run
        finished (a finished run creates no batch: :mod:`~airflow_batch_provider.services.finished_jobs`)
    """
    known = _known(ledger.get_job(job_id))
    if known is not None:
        return known
    waited = _claim(ledger, job_id, owner, lease_s or claim_lease_s(adapter), sleep, _known)
    if waited is not None:
        return waited
    try:
        failpoint("submit.after_claim")
        return create_batch(ledger, adapter, staging, job_id, on_in_doubt, stop)
    finally:
        ledger.release_job_claim(job_id, owner)


def recorded_input(job: JobRow, adapter: BatchAdapter, staging: Staging) -> InputRef:
    """The input the upload task recorded for a job, ready for :meth:`BatchAdapter.submit`.

    An ``inline`` input is nothing at the provider: the staged chunk is read again here (a local
    step of the adapter, which the create posts). Nothing is ever uploaded here.

    :param job: the ledger job row
    :param adapter: the provider adapter
    :param staging: the staging area
    :raises SubmitError: no upload is recorded, or the adapter would upload the chunk now
    """
    if job.input_kind is None:
        raise SubmitError(
            f"job {job.job_id} (round {job.round}, chunk {job.chunk_index}) has no uploaded input in the "
            "ledger, and submit never uploads: run (or clear) its upload task first, then submit."
        )
    if job.input_kind != "inline":
        return InputRef(job.input_kind, str(job.input_ref))  # type: ignore[arg-type]
    path = staging.at(job.staged_path)
    staging.verify(path, job.input_sha256)
    with path.open("rb") as fh:
        ref = adapter.stage(fh, f"{job.idempotency_key}.jsonl", int(job.size_bytes))
    if ref.kind != "inline":
        raise SubmitError(
            f"job {job.job_id}: its input was recorded as inline, but {adapter.name} staged it as {ref.kind} "
            f"{ref.value} now; submit never uploads. Clear the job's upload task and submit again."
        )
    return ref


def create_batch(
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    job_id: str,
    on_in_doubt: Callable[[JobRow, str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Submitted:
    """The create step under the claim: re-attach by key, or create the batch from the recorded input.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area (inline inputs)
    :param job_id: the claimed job
    :param on_in_doubt: see :func:`submit_job`
    :param stop: asked before the create (see :func:`submit_job`)
    """
    job = ledger.get_job(job_id)  # read again under the claim: an earlier holder may have finished
    known = _known(job)
    if known is not None:
        return known
    key = job.idempotency_key
    intent = aware(job.created_at)
    found = adapter.find(key, created_after=intent)
    if found is None and job.state == "submitting":
        # The attempt that recorded ``submitting`` stopped before it recorded a batch (killed, or
        # its host lost): its create may have reached the provider. ``find`` may be blind to such
        # a batch (Anthropic shows no custom ids while a batch runs), so only the provider's
        # in-doubt rule may say it is absent; until it can, the job is in doubt, never created.
        try:
            found = adapter.resolve_in_doubt(
                key, intent, int(job.lines), custom_ids=_staged_custom_ids(ledger, job)
            )
        except BatchInDoubtError as exc:
            return _in_doubt(
                ledger,
                job,
                f"an earlier attempt stopped after it began creating the batch ({exc}); nothing is "
                "created again until the batch is found or proven absent",
                on_in_doubt,
            )
    if found is not None:
        log.info("found batch %s created earlier with key %s; re-attaching", found.batch_id, key)
        ledger.mark_submitted(job_id, found.batch_id, job.input_ref or "")
        return Submitted(job_id, found.batch_id, epoch(job.created_at), "found")
    refusal = finished_run_refusal(ledger, job, "create a batch")
    if refusal is not None:
        raise SubmitError(refusal)
    input_ref = recorded_input(job, adapter, staging)
    _stop_check(stop, job_id, "the create")
    ledger.update_job(job_id, state="submitting")  # a create may be in flight from here on
    try:
        ref: BatchRef = adapter.submit(
            input_ref, key, batch_metadata(job), kind=job.kind, created_after=intent
        )
    except BatchInDoubtError as exc:
        return _in_doubt(ledger, job, str(exc), on_in_doubt, exc.reason)
    failpoint("submit.after_create")
    ledger.mark_submitted(job_id, ref.batch_id, job.input_ref or "")
    log.info("created batch %s for job %s (%d lines)", ref.batch_id, job_id, job.lines)
    return Submitted(job_id, ref.batch_id, time.time(), "created")


def _in_doubt(
    ledger: Ledger,
    job: JobRow,
    message: str,
    on_in_doubt: Callable[[JobRow, str], None] | None,
    reason: str | None = None,
) -> Submitted:
    """Mark a job in doubt (its create's outcome unknown), tell ``on_in_doubt``; the in-doubt answer.

    :param ledger: the ledger
    :param job: the job
    :param message: what happened, recorded as the job's in-doubt reason
    :param on_in_doubt: see :func:`submit_job`
    :param reason: the short reason handed to ``on_in_doubt`` (default ``message``)
    """
    log.error(
        "job %s: %s; it is in doubt and will not be created again until that is resolved", job.job_id, message
    )
    ledger.mark_job_in_doubt(job.job_id, message)
    if on_in_doubt is not None:
        try:
            on_in_doubt(job, reason or message)
        except Exception:  # telling someone must never change what happened
            log.exception("the in-doubt callback of job %s failed", job.job_id)
    return Submitted(job.job_id, None, epoch(job.created_at), "in_doubt")


def _staged_custom_ids(ledger: Ledger, job: JobRow) -> list[str]:
    """The custom ids of the job's items still ``staged`` under it (what its batch would answer).

    :param ledger: the ledger
    :param job: the job
    """
    return [
        r.custom_id
        for r in ledger.iter_item_rows(
            job.workload, job.run_id, states=["staged"], shape=ItemRef, job_id=job.job_id
        )
        if r.custom_id
    ]


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
    try:
        ref = adapter.resolve_in_doubt(
            job.idempotency_key, created_after, int(job.lines), custom_ids=_staged_custom_ids(ledger, job)
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
        f"nothing was created again; {why}. Resolve it: `airflow-batch jobs resolve {job_id} --batch-id ID "
        "--note WHAT_YOU_CHECKED` when the batch exists (then the next run of the workload harvests its "
        "items from it once the batch has ended, and prices it in its report under late_harvest; never "
        "re-drive them), or `--absent` when it does not (then re-drive them). A re-drive before that is "
        "refused."
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


def release_on_kill(ledger: Ledger, job_id: str, owner: str) -> bool:
    """Release a killed attempt's claim when nothing of its job can be in flight; say whether it did.

    Called from ``on_kill`` (the task's SIGTERM handler, which runs between two statements of
    the task itself). While the job is ``staged`` or ``uploaded`` no upload and no create is in
    flight, and the task stops at its next check (:func:`upload_job`, :func:`submit_job`), so its
    retry may claim the job at once. Once
    the job is ``submitting`` an upload or a create may be in flight: the claim is kept until its
    lease ends (or its holder is seen dead), and the retry re-attaches by key. Nothing else is
    changed.

    :param ledger: the ledger
    :param job_id: the job the attempt claimed
    :param owner: the attempt's claim owner
    """
    job = ledger.get_job(job_id)
    if job.state not in NOT_CREATED_JOB_STATES or job.batch_id:
        log.warning(
            "killed while job %s is %s: its claim is kept until its lease ends (a create may be in flight)",
            job_id,
            job.state,
        )
        return False
    return ledger.release_job_claim(job_id, owner)
