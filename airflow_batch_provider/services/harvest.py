"""Harvesting a batch: wait for its terminal state, cancel it at the deadline, download, reconcile.

The rules that make a rerun converge:

- a job's files are *complete* only when they were fetched at a terminal state; download records
  that (job state ``downloaded``), and only then may a later download skip. A file that exists in
  staging proves nothing (a download killed half way leaves one);
- reconcile re-fetches when the job's files are not complete, and applies results in slices
  that a rerun applies again without effect;
- a failed batch is a normal outcome: every line it never answered gets the batch's cause
  (retryable or permanent, by :data:`FAILED_BATCH_CAUSES`), so the items go to the next round or
  to review, and the run goes on to publish;
- results that arrive after another route (the deadline fallback) answered an item are kept as
  discarded cost by the ledger, never applied twice;
- a downloaded file that is not a result file (an HTML page served with HTTP 200) is fetched
  again, and if it stays invalid the download is incomplete, never "every item missing"
  (:mod:`~airflow_batch_provider.services.result_files`); so is a staged file replaced after its
  download by something that is not a result file, before reconcile reads it;
- an item keeps its success over an error line of the same id, whatever their order, and every
  other billed line (a second answer, an unreadable line at an estimate) is priced
  (:mod:`~airflow_batch_provider.services.result_lines`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import IO, Any, Final, Literal

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef, BatchStatus
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.core.policy import PollPolicy, decide, start
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.core.states import HARVESTED_JOB_STATES, TERMINAL_BATCH_STATES
from airflow_batch_provider.core.validation import check_output
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.extra_lines import record_extra_lines
from airflow_batch_provider.ledger.records import ItemRef, JobRow
from airflow_batch_provider.services.finished_jobs import finished_run_refusal
from airflow_batch_provider.services.result_files import (
    INVALID_FILE,
    fetch_result_file,
    invalid_file_note,
    staged_file_problem,
)
from airflow_batch_provider.services.result_lines import LineSorter, price_unreadable, succeeded_ids
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)

#: The item outcome each cause of a failed batch leads to (DESIGN: a failed batch is an outcome).
#: An unknown cause is retryable: nothing ran and nothing was billed, and the attempts cap bounds it.
FAILED_BATCH_CAUSES: Final[dict[str, Literal["failed_retryable", "failed_permanent"]]] = {
    "token_limit_exceeded": "failed_retryable",
    "quota_exceeded": "failed_retryable",
    "provider_error": "failed_retryable",
    "invalid_file": "failed_permanent",
}
#: Error code of items whose batch failed without a cause the adapter could name.
BATCH_FAILED: Final = "batch_failed"
#: Results applied per ledger transaction in reconcile (the ``reconcile.mid`` fail point fires after the first).
SLICE: Final = 1000
#: Job states whose files were fetched at a terminal state.
COMPLETE_STATES: Final = HARVESTED_JOB_STATES


def error_code_of(status: BatchStatus | None) -> str | None:
    """The cause of a failed batch, as the adapter named it (``None`` when not failed or unknown).

    :param status: the batch's last status
    """
    if status is None or status.state != "failed":
        return None
    return status.error_code


def failure_note(status: BatchStatus) -> tuple[str, str]:
    """The cause of a failed batch and the note the job keeps (``"<code>: <provider's words>"``).

    :param status: a status in state ``failed``
    """
    code = error_code_of(status) or BATCH_FAILED
    return code, f"{code}: {status.error_message or status.reason or 'no reason given'}"


def read_status(adapter: BatchAdapter, ref: BatchRef) -> tuple[BatchStatus | None, str | None]:
    """One status read: the status, or the error that the poll policy counts.

    :param adapter: the provider adapter
    :param ref: the batch
    """
    try:
        return adapter.status(ref), None
    except Exception as exc:  # any transient failure counts against max_consecutive_errors
        error = f"{type(exc).__name__}: {exc}"
        log.warning("status of batch %s: %s", ref.batch_id, error)
        return None, error


@dataclass(frozen=True)
class Waited:
    """How a blocking wait ended.

    :param action: the policy's last action (``done``, ``deadline``, ``timeout``, ``give_up``)
    :param status: the last status read
    :param reason: the policy's words
    """

    action: str
    status: BatchStatus | None
    reason: str


def wait_terminal(
    adapter: BatchAdapter,
    ref: BatchRef,
    policy: PollPolicy,
    started_at: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_status: Callable[[BatchStatus], None] | None = None,
) -> Waited:
    """Poll until the batch is terminal or the policy stops (the sensor's worker path and the harvest).

    :param adapter: the provider adapter
    :param ref: the batch
    :param policy: the poll policy (the timeout counts from ``started_at``)
    :param started_at: epoch seconds the timeout counts from
    :param sleep: how to wait between polls
    :param on_status: called with every status read (progress logs)
    """
    state = start(policy, started_at)
    while True:
        status, error = read_status(adapter, ref)
        decision = decide(policy, state, time.time(), status=status, error=error)
        state = decision.state
        if status is not None and on_status is not None:
            on_status(status)
        if decision.action != "wait":
            return Waited(decision.action, status, decision.reason)
        sleep(decision.delay)


def harvest_policy(policy: PollPolicy, timeout: float) -> PollPolicy:
    """The harvest's policy: the sensor's intervals and error tolerance, its own timeout, no deadline.

    :param policy: the run's poll policy
    :param timeout: seconds to wait for the terminal state after the cancel
    """
    data = {**policy.to_dict(), "timeout": timeout, "deadline": None, "deadline_margin": 0.0}
    return PollPolicy.from_dict(data)


def cancel_and_wait(
    ledger: Ledger,
    adapter: BatchAdapter,
    job_id: str,
    ref: BatchRef,
    policy: PollPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Waited:
    """Cancel a batch the deadline cut short and wait for its terminal state (bounded by ``policy``).

    A batch that is already terminal is not cancelled. The last state read is recorded on the job.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param job_id: the ledger job
    :param ref: the batch
    :param policy: :func:`harvest_policy` of the run's policy
    :param sleep: how to wait between polls
    """
    status, _ = read_status(adapter, ref)
    if status is None or not status.terminal:
        try:
            adapter.cancel(ref)
            log.info("deadline: cancelled batch %s (job %s)", ref.batch_id, job_id)
        except Exception as exc:  # the batch may have ended between the poll and the cancel
            log.warning("cancel of batch %s refused: %s; reading its state", ref.batch_id, exc)
        waited = wait_terminal(adapter, ref, policy, time.time(), sleep=sleep)
    else:
        waited = Waited("done", status, f"batch is {status.state}")
    if waited.status is not None:
        ledger.update_job(job_id, batch_state=waited.status.state)
    return waited


class _FailpointSink:
    """A writable stream that passes ``download.mid`` once part of the file is written."""

    def __init__(self, sink: IO[bytes]) -> None:
        self._sink = sink
        self._passed = False

    def write(self, data: bytes) -> int:
        written = self._sink.write(data)
        if not self._passed and data:
            self._passed = True
            self._sink.flush()
            failpoint("download.mid")
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


@dataclass(frozen=True)
class Download:
    """What :func:`download_job` did.

    :param complete: the files were fetched at a terminal state (they hold everything the batch did)
    :param fetched: this call fetched them (``False``: an earlier complete download was kept)
    :param paths: ``output_path``/``error_path`` staged URLs (``None`` where not fetched)
    :param status: the batch status read (``None`` when not read)
    """

    complete: bool
    fetched: bool
    paths: Mapping[str, str | None]
    status: BatchStatus | None = None


def download_job(ledger: Ledger, adapter: BatchAdapter, staging: Staging, job_id: str) -> Download:
    """Stream a job's output and error files into staging, once they are complete.

    Skips only when an earlier download was complete (job ``downloaded``/``reconciled``) and its
    files are still in staging (and, until reconcile read them, still result files: a page copied
    over one is fetched again). Otherwise reads the batch's status: not terminal yet means its
    files are incomplete, nothing is written and the job stays as it is (a later download or
    reconcile fetches them); terminal means the files are fetched, overwriting any partial file,
    and the job is marked ``downloaded``.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area
    :param job_id: the ledger job
    """
    job = ledger.get_job(job_id)
    recorded = {"output_path": job.output_path, "error_path": job.error_path}
    if job.state in COMPLETE_STATES:
        # Before reconcile reads them, the staged files must still be result files; after, that
        # they exist (their lines are in the ledger already).
        problem = staged_file_problem(adapter, staging, recorded.values(), check=job.reconciled_at is None)
        if problem is None:
            log.info("files of batch %s already downloaded complete: %s", job.batch_id, recorded)
            return Download(True, False, recorded)
        log.warning(
            "files of batch %s were downloaded complete, but %s: fetching them again", job.batch_id, problem
        )
    if job.batch_id is None:
        log.warning("job %s has no batch (in doubt or never created); nothing to download", job_id)
        return Download(False, False, recorded)
    ref = BatchRef(adapter.name, job.batch_id, job.idempotency_key)
    if job.batch_state in TERMINAL_BATCH_STATES:
        # A terminal state never changes, and the wait step (or a pod task, whose outcome only
        # the ledger knows) recorded it with its cause: keep it, do not ask again.
        status: BatchStatus | None = BatchStatus(job.batch_state, raw_state="recorded")  # type: ignore[arg-type]
        error = None
    else:
        status, error = read_status(adapter, ref)
    if status is None or not status.terminal:
        log.warning(
            "batch %s (job %s) is %s: its result files are not complete yet; nothing downloaded",
            ref.batch_id,
            job_id,
            status.state if status else f"unreadable ({error})",
        )
        if status is not None:
            ledger.update_job(job_id, batch_state=status.state)
        return Download(False, False, recorded, status)
    folder = staging.run_dir(job.workload, job.run_id) / f"round-{job.round}"
    paths: dict[str, str | None] = {}
    kinds: tuple[tuple[Literal["output", "errors"], str], ...] = (
        ("output", "output_path"),
        ("errors", "error_path"),
    )
    for kind, column in kinds:
        target = folder / f"{kind}-{job.chunk_index:05d}.jsonl"
        problem = fetch_result_file(adapter, staging, ref, kind, target, _FailpointSink)  # type: ignore[arg-type]
        if problem is not None:
            # Not a result file (an HTML page served with 200): never read as "every item missing".
            update: dict[str, Any] = {"batch_state": status.state}
            if status.state != "failed":
                update["error"] = invalid_file_note(kind, ref, problem)
            ledger.update_job(job_id, **update)
            return Download(False, False, recorded, status)
        paths[column] = str(target)
    values: dict[str, Any] = {
        "state": "downloaded",
        "batch_state": status.state,
        "finished_at": utcnow(),
        **paths,
    }
    if status.state == "failed" and status.raw_state != "recorded":
        values["error"] = failure_note(status)[1]
    elif str(job.error or "").startswith(INVALID_FILE):
        values["error"] = None  # an earlier download's note; the files came valid this time
    ledger.update_job(job_id, **values)
    return Download(True, True, paths, status)


def _lines(
    adapter: BatchAdapter, staging: Staging, job: JobRow, template: PromptTemplate
) -> Iterator[ItemResult | MalformedLine]:
    """Every line of the job's output and error files, in reading order, outputs validated."""
    for path in (job.output_path, job.error_path):
        if not path:
            continue
        with staging.at(path).open("rb") as fh:
            for res in adapter.parse_results(fh):
                if isinstance(res, MalformedLine):
                    yield res
                    continue
                yield check_output(res, template.output_format, template.output_schema)


def _failed_batch_results(ledger: Ledger, job: JobRow) -> Iterator[ItemResult]:
    """One result per line a failed batch never answered, carrying the batch's cause."""
    code, _, reason = str(job.error or BATCH_FAILED).partition(": ")
    outcome = FAILED_BATCH_CAUSES.get(code, "failed_retryable")
    message = f"batch {job.batch_id} failed at the provider ({code}): {reason or 'no reason given'}"
    rows = ledger.iter_item_rows(
        job.workload, job.run_id, states=["submitted"], shape=ItemRef, job_id=job.job_id
    )
    for row in rows:
        if row.custom_id:
            yield ItemResult(row.custom_id, outcome, usage=Usage(), error_code=code, error_message=message)


def reconcile_job(
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    job_id: str,
    template: PromptTemplate,
    cost_of: Callable[[Usage], Decimal],
) -> dict[str, Any]:
    """Apply a job's result files to the ledger; settle a failed batch's lines; mark missing lines.

    A job of a finished run is refused: nothing is applied, and the summary says why under
    ``refused`` (:mod:`~airflow_batch_provider.services.finished_jobs`; the next run harvests it).
    Re-fetches the files first when they are not complete. When they still are not (the batch is
    not terminal), nothing is applied and the job's items stay ``submitted`` (open): the deadline
    policy or publish deals with them, and a later reconcile of the same job still harvests them.

    :param ledger: the ledger
    :param adapter: the provider adapter
    :param staging: the staging area
    :param job_id: the ledger job
    :param template: the workload's prompt (output validation)
    :param cost_of: prices one line's usage
    """
    job = ledger.get_job(job_id)
    if job.state == "sync":
        log.info("job %s went through the real-time API; its items are settled", job_id)
        return {"job_id": job_id, "route": "sync"}
    refusal = finished_run_refusal(ledger, job, "reconcile")
    if refusal is not None:
        log.warning("%s Nothing is applied.", refusal)
        return {"job_id": job_id, "complete": False, "refused": refusal}
    if not job.batch_id:
        log.warning("job %s has no batch (in doubt or never created); nothing to reconcile", job_id)
        return {"job_id": job_id, "complete": False}
    if not download_job(ledger, adapter, staging, job_id).complete:
        return {"job_id": job_id, "complete": False}
    job = ledger.get_job(job_id)
    outcomes: dict[str, int] = {}
    late = unknown = 0
    slice_: list[ItemResult] = []
    first = True

    def apply(batch: list[ItemResult]) -> None:
        nonlocal late, unknown, first
        stats = ledger.apply_results(job_id, batch, cost_of)
        late += stats.late
        unknown += stats.unknown
        for outcome, n in stats.outcomes.items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
        if first:
            first = False
            failpoint("reconcile.mid")

    # Two passes over the files: the first finds the ids with a success, so that the second keeps
    # the success over an error line of the same id whatever their order (result_lines).
    sorter = LineSorter(succeeded_ids(_lines(adapter, staging, job, template)), cost_of)
    for res in sorter.kept(_lines(adapter, staging, job, template)):
        slice_.append(res)
        if len(slice_) >= SLICE:
            apply(slice_)
            slice_ = []
    if slice_ or first:
        apply(slice_)
    # A failed batch that answered nothing (refused file, token limit): its lines carry its cause.
    # One that answered part of its lines (a vLLM pod that crashed mid-file) left the rest missing.
    if job.batch_state == "failed" and not sum(outcomes.values()):
        settled = list(_failed_batch_results(ledger, job))
        if settled:
            apply(settled)
            log.warning(
                "batch %s failed: %d items settled with its cause (%s)",
                job.batch_id,
                len(settled),
                job.error,
            )
    malformed = [bad for _, bad in sorter.unreadable]
    for bad in malformed[:20]:
        log.warning("malformed result line %d: %s (%s)", bad.line_number, bad.reason, bad.excerpt)
    # Every other line the provider billed: second answers, superseded errors with usage, and
    # damaged lines at an estimate (never free).
    unreadable = price_unreadable(ledger, job_id, sorter.unreadable, cost_of)
    record_extra_lines(ledger, job_id, [*sorter.extras, *unreadable])
    duplicates = sorter.duplicates
    missing = ledger.mark_missing(job_id)
    ledger.update_job(
        job_id,
        state="reconciled",
        result_lines=sum(outcomes.values()),
        malformed_lines=len(malformed),
        duplicate_lines=duplicates,
        unknown_lines=unknown,
        missing=missing,
        reconciled_at=job.reconciled_at or utcnow(),
    )
    summary = {
        "job_id": job_id,
        "complete": True,
        "outcomes": outcomes,
        "late": late,
        "duplicates": duplicates,
        "unknown": unknown,
        "malformed": len(malformed),
        "superseded": sorter.superseded,
        "unreadable": len(unreadable),
        "missing": missing,
    }
    log.info("reconciled job %s: %s", job_id, summary)
    return summary
