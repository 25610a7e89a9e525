"""Operators of one batch workload run: prepare, upload, submit, download, reconcile, resubmit, publish.

They are thin: the ledger holds state, the adapter talks to the provider, ``core`` decides, and
what a task does lives in ``services/``. Every operator can be cleared and run again; it converges
to the same ledger and never creates a second provider batch. XCom carries job ids and small
manifests only. The shared base class and task glue are in :mod:`.base` and
:mod:`airflow_batch_provider.task_glue`; prepare is in :mod:`.prepare` (all importable from here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

from airflow_batch_provider import metrics, notifications
from airflow_batch_provider.adapters.base import TERMINAL_BATCH_STATES
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.deadline import deadline_passed
from airflow_batch_provider.core.options import BudgetOptions, ChunkOptions, DeadlineOptions, FallbackLimits
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.states import RETRYABLE_STATES
from airflow_batch_provider.exceptions import ConfigurationError, WorkloadLeasedError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow, OpenItem
from airflow_batch_provider.ledger.runs import FinishedRun
from airflow_batch_provider.links.batch import BatchConsoleLink, LedgerRunLink
from airflow_batch_provider.operators import liveness
from airflow_batch_provider.operators.base import (
    DISTRIBUTED_EXECUTORS as DISTRIBUTED_EXECUTORS,
)
from airflow_batch_provider.operators.base import (
    EXHAUSTED_ROUTES as EXHAUSTED_ROUTES,
)
from airflow_batch_provider.operators.base import (
    BatchBaseOperator,
    asset_extra,
    harvest_earlier_runs,
)
from airflow_batch_provider.operators.base import PromptSource as PromptSource
from airflow_batch_provider.operators.base import (
    check_distributed as check_distributed,
)
from airflow_batch_provider.operators.base import check_exhausted as check_exhausted
from airflow_batch_provider.operators.base import (
    distributed_executors as distributed_executors,
)
from airflow_batch_provider.operators.base import (
    limits_settings as limits_settings,
)
from airflow_batch_provider.operators.base import (
    load_prompt as load_prompt,
)
from airflow_batch_provider.operators.prepare import BatchPrepareOperator as BatchPrepareOperator
from airflow_batch_provider.operators.sources import RecordSource as RecordSource
from airflow_batch_provider.operators.takeover import MOVED, moved_to_another_run
from airflow_batch_provider.services import budget as budgets
from airflow_batch_provider.services import harvest, report, submit
from airflow_batch_provider.services import publish as publishing
from airflow_batch_provider.services import round as rounds
from airflow_batch_provider.services.admission import admit
from airflow_batch_provider.services.fallback import FALLBACK_FROM
from airflow_batch_provider.services.publish import publish_outcome as publish_outcome
from airflow_batch_provider.services.publish import run_event_extra as run_event_extra
from airflow_batch_provider.services.realtime import job_to_realtime
from airflow_batch_provider.task_glue import (
    attempt_owner,
    batch_ended,
    dag_id_of,
    in_doubt_alert,
    kill_claim,
    persist_links,
)
from airflow_batch_provider.task_glue import (
    emit_alert as emit_alert,
)
from airflow_batch_provider.task_glue import (
    known_job as known_job,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)

#: Compatibility name: the report module prices batch lines.
batch_pricer = report.batch_pricer
#: Compatibility name: the report is built by the report service.
build_report = report.build_report


class BatchUploadOperator(BatchBaseOperator):
    """Stage one chunk at the provider, exactly once, and record where it is; never creates a batch.

    The steps are :func:`airflow_batch_provider.services.submit.upload_job`'s: a recorded upload
    is used as it is (a cleared upload sends nothing); otherwise, under the job's claim, the
    staged chunk is uploaded (a file), written to the object store the provider reads (a URI), or,
    for providers that take the requests inline, only checked; the file id or URI is recorded in
    the ledger. The adapter looks a file up by the job's key before uploading, so a lost reply is
    found; a second file is never used, and is reported (``orphan_input``). A chunk that goes
    through the real-time API (below the provider's minimum) is not uploaded.

    :param job: the job manifest from prepare or resubmit (``job_id``)
    :param claim_lease_s: how long the claim is held (default: longer than the look-up and the
        upload can take with their retries, at least 30 minutes)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "job")
    ui_color = "#dcebf7"

    def __init__(self, *, job: Mapping[str, Any], claim_lease_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.claim_lease_s = claim_lease_s
        self._claim: tuple[str, str] | None = None
        self._killed = False

    def execute(self, context: Context) -> dict[str, Any]:
        job_id = str(self.job["job_id"])
        if moved_to_another_run(self.ledger.get_job(job_id), context):
            return dict(self.job)
        self._claim = (job_id, attempt_owner(context))
        try:
            done = submit.upload_job(
                ledger=self.ledger,
                adapter=self.adapter,
                staging=self.staging,
                job_id=job_id,
                owner=self._claim[1],
                lease_s=self.claim_lease_s,
                stop=lambda: self._killed,
            )
        finally:
            self._claim = None
        return {**dict(self.job), **done.to_xcom()}

    def on_kill(self) -> None:
        """Stop before the upload and give back the claim when nothing is in flight (see :func:`kill_claim`)."""
        kill_claim(self)


class BatchSubmitOperator(BatchBaseOperator):
    """Create one uploaded chunk's provider batch, exactly once; never uploads.

    The steps are :func:`airflow_batch_provider.services.submit.submit_job`'s: claim the job in
    the ledger (compare-and-set, so a zombie attempt and its retry never both create), re-attach
    to a recorded batch, ask the provider for a batch with the job's key, and only then create it
    from the input the upload task recorded. A create whose outcome is unknown leaves the job *in
    doubt*: nothing is created for it again, and the wait task resolves it.

    A chunk smaller than the provider's minimum job size (Bedrock: 100 records) is not padded and
    not merged across rounds: its items go through the provider's real-time API right here, at
    full price, rate-limited like the deadline fallback, and the job is marked ``sync``. The
    downstream tasks of that chunk pass through.

    :param job: the upload task's result for one job (``job_id``)
    :param prompt: the workload's prompt (output validation on the synchronous path)
    :param budget: its ``pricing_override`` prices the synchronous path
    :param fallback: rate limits of the synchronous path (default from config)
    :param claim_lease_s: how long the submit claim is held (default: longer than the look-up
        and the create can take with their retries, at least 30 minutes)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "job")

    def __init__(
        self,
        *,
        job: Mapping[str, Any],
        prompt: PromptSource | None = None,
        budget: BudgetOptions | None = None,
        fallback: FallbackLimits | None = None,
        claim_lease_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.prompt = prompt
        self.budget = budget or BudgetOptions()
        self.fallback = fallback or FallbackLimits()
        self.claim_lease_s = claim_lease_s
        self._claim: tuple[str, str] | None = None
        self._killed = False

    operator_extra_links = (BatchConsoleLink(), LedgerRunLink())

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.ledger.get_job(self.job["job_id"])
        out = {"job_id": job.job_id, "provider": self.adapter.name, "idempotency_key": job.idempotency_key}
        if moved_to_another_run(job, context):  # the wait and the harvest pass it through
            return {**out, "route": MOVED}
        if self.prompt is not None:
            # before anything is sent or paid: the answers will be judged by the run's prompt
            self.run_template(self.prompt, context)
        if submit.goes_sync(job, self.adapter):
            return {**out, **self.send_synchronously(context, job)}
        admission = admit(self.ledger, self.adapter, job, self.batch_conn_id)
        if not admission.admitted:  # the connection's enqueued tokens are full: free the slot, ask again
            self.log.info("%s", admission.reason)
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(seconds=admission.retry_in_s)), method_name="resume"
            )
        done = self.create_batch(context, job)
        if done.batch_id:
            persist_links(context, self.adapter.name, [done.batch_id], self.adapter.settings.base_url)
        return done.to_xcom(self.adapter.name, job.idempotency_key)

    def create_batch(self, context: Context, job: JobRow) -> submit.Submitted:
        """Create the job's provider batch under its claim (:func:`~airflow_batch_provider.services.submit.submit_job`).

        :param context: the task context
        :param job: the ledger job row
        """
        self._claim = (job.job_id, attempt_owner(context))
        try:
            return submit.submit_job(
                ledger=self.ledger,
                adapter=self.adapter,
                staging=self.staging,
                job_id=job.job_id,
                owner=self._claim[1],
                lease_s=self.claim_lease_s,
                on_in_doubt=in_doubt_alert(self.alerts, context, self.adapter.name),
                stop=lambda: self._killed,
            )
        finally:
            self._claim = None

    def resume(self, context: Context, event: Any = None) -> dict[str, Any]:
        """Ask for admission again once the timer of a refused submit fired.

        :param context: the task context
        :param event: the timer's event (unused)
        """
        return self.execute(context)

    def on_kill(self) -> None:
        """Stop before the next provider call and give back the submit claim when nothing is in flight.

        See :func:`~airflow_batch_provider.services.submit.release_on_kill`: only the claim this
        attempt took is released, only while nothing of the job was sent; nothing else is marked.
        """
        kill_claim(self)

    def send_synchronously(self, context: Context, job: JobRow) -> dict[str, Any]:
        """Send a below-minimum chunk's items through the real-time API (idempotent per item).

        :param context: the task context
        :param job: the ledger job row
        """
        if self.prompt is None:
            raise ConfigurationError(
                f"job {job.job_id} has {job.lines} lines, below {self.adapter.name}'s minimum of "
                f"{self.adapter.limits.min_requests} per batch, and must go through the real-time API, which "
                "needs the prompt: pass prompt= to BatchSubmitOperator (batch_inference_group does)."
            )
        template = self.run_template(self.prompt, context)
        self.log.warning(
            "job %s has %d lines, below %s's minimum of %d per batch: sending them through the real-time "
            "API at full price instead of padding the batch",
            job.job_id,
            job.lines,
            self.adapter.name,
            self.adapter.limits.min_requests,
        )
        rows = job_to_realtime(self.ledger, self.workload, context["run_id"], job.job_id)
        summary = self.send_in_real_time(
            context, rows, template, limits=self.fallback, budget=self.budget, refused_state="review"
        )
        self.log.info("synchronous path for job %s: %s", job.job_id, summary)
        return {"batch_id": None, "route": "sync", "submitted_at": time.time()}


class BatchDownloadOperator(BatchBaseOperator):
    """Stream a finished batch's output and error files into staging, once they are complete.

    See :func:`airflow_batch_provider.services.harvest.download_job`: files fetched at a
    terminal state are complete and not fetched again; otherwise (a harvest that ran out of time)
    nothing is written and reconcile fetches them later.

    :param batch: the sensor's result for one job (``job_id``, ``batch_id``)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "batch")

    def __init__(self, *, batch: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch = batch

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.ledger.get_job(self.batch["job_id"])
        if job.state == "sync" or not job.batch_id or moved_to_another_run(job, context):
            return dict(self.batch)  # real-time API (no files), or still in doubt (no batch)
        got = harvest.download_job(self.ledger, self.adapter, self.staging, job.job_id)
        return {**dict(self.batch), **got.paths, "files_complete": got.complete}


class BatchReconcileOperator(BatchBaseOperator):
    """Apply a job's downloaded results to the ledger by custom id; settle a failed batch; mark missing lines.

    See :func:`airflow_batch_provider.services.harvest.reconcile_job`. Out-of-order lines,
    duplicates and late answers are handled by the ledger; a line that does not parse is counted
    and its item ends ``missing`` (retryable); the lines of a batch that failed get its cause.

    :param batch: the download task's result for one job
    :param prompt: the workload's prompt (for output validation)
    :param budget: its ``pricing_override`` prices the answers
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "batch")

    def __init__(
        self,
        *,
        batch: Mapping[str, Any],
        prompt: PromptSource,
        budget: BudgetOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch = batch
        self.prompt = prompt
        self.budget = budget or BudgetOptions()

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.ledger.get_job(self.batch["job_id"])
        if moved_to_another_run(job, context):
            return {"job_id": job.job_id, "complete": False, "moved_to_run": job.run_id}
        return harvest.reconcile_job(
            self.ledger,
            self.adapter,
            self.staging,
            job.job_id,
            self.run_template(self.prompt, context),
            report.batch_pricer(self.adapter.name, job.model, self.budget.pricing_override),
        )


class BatchResubmitOperator(BatchBaseOperator):
    """Stage retryable items (failed with 429/5xx, expired, missing, invalid output, a failed batch) as a new round.

    Items keep their item key; the custom id carries the new attempt number. Items at the
    attempts cap, and permanent failures, go to ``review``. After a batch failed on the
    provider's enqueued-token limit, the round's chunks are halved.

    :param round_number: the round this task stages (2 for the first resubmission)
    :param max_attempts: attempts cap per item (the first submission counts as 1)
    :param chunking: tighter per-chunk request and byte limits
    :param deadline: this run's deadline, as a moment (``DeadlineOptions.resolved_by`` for a rule);
        once it has passed (minus its margin) no new round starts and the items are left to the
        deadline policy
    :param budget: the run's budget: a round whose estimate, added to what the run has paid so
        far, exceeds it is not started, and its items go to ``review`` (``budget_exceeded``)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "deadline_at")

    def __init__(
        self,
        *,
        round_number: int,
        max_attempts: int,
        chunking: ChunkOptions | None = None,
        deadline: DeadlineOptions | None = None,
        budget: BudgetOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if round_number < 2 or round_number > max_attempts:
            raise ConfigurationError(
                f"round_number {round_number} must be within 2..max_attempts ({max_attempts})."
            )
        self.round_number = round_number
        self.max_attempts = max_attempts
        self.chunking = chunking or ChunkOptions()
        self.deadline = deadline
        #: the run's deadline (templated: rendered when the task runs)
        self.deadline_at: str | None = deadline.at() if deadline is not None else None
        self.budget = budget or BudgetOptions()

    def execute(self, context: Context) -> list[dict[str, Any]]:
        run_id = context["run_id"]
        margin = self.deadline.margin_s if self.deadline is not None else 0.0
        if deadline_passed(self.deadline_at or None, margin, utcnow()):
            self.log.info(
                "round %d not started: the deadline %s has passed; open items go to the deadline policy",
                self.round_number,
                self.deadline_at,
            )
            return []
        retry, to_review = self.ledger.retry_candidates(self.workload, run_id, self.max_attempts)
        self.log.info(
            "round %d: %d items to resubmit, %d sent to review", self.round_number, retry, to_review
        )
        # Every pass streams the rows again from the ledger (a page at a time): a list of them all
        # held ~1.5 GB when every item of a million-item run failed.
        started = self.ledger.get_jobs(self.workload, run_id, self.round_number)
        if self.budget.budget is not None and retry and not started and self.over_budget(run_id, context):
            return []
        chunking = self.run_chunking(self.chunking, context)
        max_requests = rounds.retry_chunk_limit(
            self.ledger,
            self.workload,
            run_id,
            self.round_number,
            self.eligible(run_id),
            chunking.request_limit,
        )
        return self.stage_round(
            context, self.round_number, self.eligible(run_id), max_requests, chunking.max_bytes
        )

    def eligible(self, run_id: str) -> Iterator[OpenItem]:
        """A fresh stream of the items this round resubmits: retryable, under the attempts cap.

        Each call reads them again from the ledger, a page at a time, so no pass holds them all.

        :param run_id: the Airflow run id
        """
        rows = self.ledger.iter_item_rows(
            self.workload, run_id, states=sorted(RETRYABLE_STATES), shape=OpenItem
        )
        return (r for r in rows if r.attempts < self.max_attempts)

    def over_budget(self, run_id: str, context: Context | None = None) -> bool:
        """Say whether this round would take the run over its budget; if so, send its items to review.

        The check is :func:`~airflow_batch_provider.services.budget.round_within_budget` (it streams
        :meth:`eligible`); a refused round is a ``budget_refused`` alert.

        :param run_id: the Airflow run id
        :param context: the task context (for the alert)
        """

        def refused(verdict: budgets.BudgetVerdict) -> None:
            if context is None or verdict.budget is None:
                return
            event = notifications.budget_refused(
                self.workload,
                run_id,
                budget=verdict.budget,
                spent=verdict.spent,
                needed=verdict.needed,
                items=verdict.items,
                dag_id=dag_id_of(context),
            )
            self.emit(context, event)

        return not budgets.round_within_budget(
            self.ledger,
            self.workload,
            run_id,
            self.round_number,
            self.eligible(run_id),
            self.max_attempts,
            self.budget,
            self.adapter.name,
            refused,
        )


class BatchPublishOperator(BatchBaseOperator):
    """Close the run: harvest late files, settle what is unfinished, publish results and the report.

    Jobs whose files were not complete (a harvest that ran out of time) are fetched once more if
    their batch has ended meanwhile; answers for items another route settled are kept as
    discarded cost. Items that exhausted their batch attempts go where ``exhausted`` says:
    ``review`` (default), or ``sync``: the provider's real-time API at full price, within
    the budget (the report counts them apart, as ``exhausted_sync``). Permanent failures go
    to ``review``. Items still open go where ``unfinished`` says. Then every item of the run is in
    exactly one final state; the results table is upserted, ``results.jsonl`` and ``report.json``
    (with the failed and in-doubt batches) are written to staging, the report is logged and
    returned (small), and the run's workload lease is released.

    Then the run is told about: the ``run_summary`` alert, a ``review_growth`` alert when the run
    sent at least the threshold to review, the run's metrics (``metrics.record_run``), and each
    outlet Asset's event carries the run's counts, cost and results location in its ``extra``.

    :param max_attempts: the attempts cap (as in resubmit)
    :param unfinished: ``review`` (default), ``pending`` (published as pending) or ``skipped``
    :param prompt: the workload's prompt (validates late results); without it no late harvest
    :param exhausted: ``review`` (default) or ``sync``: where items that exhausted their batch
        attempts go
    :param budget: the run's budget and prices; ``sync`` sends exhausted items only while the
        run's paid cost plus their estimate at real-time prices stays within the budget (else they
        go to review and a ``budget_refused`` alert is sent)
    :param fallback: rate limits of the real-time sends (default from config)
    """

    def __init__(
        self,
        *,
        max_attempts: int,
        unfinished: str = "review",
        prompt: PromptSource | None = None,
        exhausted: str = "review",
        budget: BudgetOptions | None = None,
        fallback: FallbackLimits | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if unfinished not in ("review", "pending", "skipped"):
            raise ConfigurationError(f"unfinished={unfinished!r}; use 'review', 'pending' or 'skipped'.")
        check_exhausted(exhausted, prompt)
        self.max_attempts = max_attempts
        self.unfinished = unfinished
        self.prompt = prompt
        self.exhausted = exhausted
        self.budget = budget or BudgetOptions()
        self.fallback = fallback or FallbackLimits()

    def execute(self, context: Context) -> dict[str, Any]:
        run_id = context["run_id"]
        finished = self.finished_run(context)
        if finished is not None:
            return self.published_before(context, finished)
        template = self.run_template(self.prompt, context) if self.prompt is not None else None
        if template is not None:
            harvest_earlier_runs(self, run_id, template, context)
            self.harvest_late(run_id, template, context)
            if self.exhausted == "sync":
                self.send_exhausted(context, template)
        publishing.settle_run(self.ledger, self.workload, run_id, self.max_attempts, self.unfinished)
        done = publishing.publish_run(
            self.ledger,
            self.staging,
            self.workload,
            run_id,
            self.adapter.name,
            self.budget.pricing_override,
            self.max_attempts,
        )
        self.log.info("\n%s", done.summary["table"])
        out = publish_outcome(done.summary, done.report)
        self.tell(context, done.summary, out, done.results)
        return out

    def published_before(self, context: Context, finished: FinishedRun) -> dict[str, Any]:
        """A cleared publish of a finished run: what it published then, unchanged, and nothing else.

        No item moves, no report is rebuilt or rewritten, no alert or Asset event is sent again.

        :param context: the task context
        :param finished: the run as publish finished it
        """
        folder = self.staging.run_dir(self.workload, context["run_id"])
        self.log.warning(
            "run %s of workload %s finished at %s: it is history, so this cleared publish changes neither "
            "its items nor its report (%s); start a new run to process the input again.",
            context["run_id"],
            self.workload,
            finished.finished_at.isoformat(),
            folder / "report.json",
        )
        return publish_outcome(finished.report, str(folder / "report.json"))

    def tell(
        self, context: Context, summary: Mapping[str, Any], out: Mapping[str, Any], results: str
    ) -> None:
        """After the run is published: alerts, metrics and the Asset events' extra (none of it fails the task).

        :param context: the task context
        :param summary: the cost report
        :param out: what the task returns
        :param results: where ``results.jsonl`` is
        """
        run_id = context["run_id"]
        self.emit(context, notifications.run_summary(self.workload, run_id, summary, dag_id_of(context)))
        try:
            added = int(summary.get("states", {}).get("review", 0))
            if self.alerts is not None and added >= self.alerts.review_growth_threshold:
                queue = len(self.ledger.review_items(self.workload, limit=1_000_000))
                self.alerts.review_growth(context, self.workload, run_id, added=added, queue=queue)
        except Exception:
            self.log.exception("the review growth alert of %s could not be sent", self.workload)
        try:
            metrics.record_run(summary, workload=self.workload, provider=self.adapter.name)
        except Exception as exc:
            self.log.warning("run metrics not recorded: %s", exc)
        asset_extra(context, self.outlets, run_event_extra(self.workload, run_id, out, results))

    def send_exhausted(self, context: Context, template: PromptTemplate) -> dict[str, Any]:
        """Send the items that exhausted their batch attempts through the real-time API, within the budget.

        Resumable like the deadline fallback (:func:`~airflow_batch_provider.services.fallback.run_fallback`):
        a crash between a send and its record is found, closed as ``possibly_paid_twice`` and sent
        again by the rerun. Over the budget nothing is sent: the items go to review as usual, and
        a ``budget_refused`` alert says so.

        :param context: the task context
        :param template: the workload's prompt
        """
        rows = [
            r
            for r in self.ledger.iter_item_rows(
                self.workload,
                context["run_id"],
                states=[s for s in sorted(RETRYABLE_STATES) if s in FALLBACK_FROM],
                shape=OpenItem,
            )
            if r.attempts >= self.max_attempts
        ]
        if not rows:
            return {"items": 0}
        self.log.warning(
            "%d items exhausted their %d batch attempts: sending them through the real-time API of %s "
            "at full price (exhausted='sync'), within the budget",
            len(rows),
            self.max_attempts,
            self.adapter.name,
        )
        summary = self.send_in_real_time(
            context, rows, template, limits=self.fallback, budget=self.budget, refused_state="review"
        )
        self.log.info("exhausted items sent synchronously: %s", summary)
        return summary

    def harvest_late(
        self, run_id: str, template: PromptTemplate | None, context: Mapping[str, Any] | None = None
    ) -> None:
        """Fetch and apply the files of jobs that were not complete, where the batch has ended since.

        A batch first seen ended here is counted, and a failed one is a ``batch_failed`` alert.

        :param run_id: the Airflow run id
        :param template: the workload's prompt (``None``: no late harvest)
        :param context: the task context (for the alert)
        """
        if template is None:
            return
        for job in publishing.late_jobs(self.ledger, self.workload, run_id):
            cost_of = report.batch_pricer(self.adapter.name, job.model, self.budget.pricing_override)
            done = harvest.reconcile_job(
                self.ledger, self.adapter, self.staging, job.job_id, template, cost_of
            )
            self.log.info("late harvest of job %s: %s", job.job_id, done)
            after = self.ledger.get_job(job.job_id)
            state = after.batch_state
            if context is not None and state in TERMINAL_BATCH_STATES and state != job.batch_state:
                code = str(after.error or "").partition(":")[0] or None
                batch_ended(self.alerts, context, job, state, self.adapter.name, code)


#: DAG-run states of a run that may still hold its workload (anything else is over).
LIVE_RUN_STATES = frozenset({"queued", "running"})


def dagrun_state(dag_id: str, run_id: str) -> str | None:
    """The state of another DAG run as Airflow knows it (``None`` when it cannot be read).

    :param dag_id: the DAG id
    :param run_id: the run id
    """
    # the task runner is the supervised worker's: imported only when a lease is contended
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    try:
        return str(RuntimeTaskInstance.get_dagrun_state(dag_id, run_id))
    except Exception as exc:  # no supervisor (tests), or the run was deleted
        log.warning("state of DAG run %s/%s unreadable: %s", dag_id, run_id, exc)
        return None


def holder_is_live(dag_id: str, run_id: str) -> bool:
    """Whether a run Airflow marks running still has a live task instance (unknown counts as live).

    :param dag_id: the DAG of the run that holds the workload
    :param run_id: that run
    """
    signs = liveness.holder_task_instances(dag_id, run_id)
    if not signs:  # unreadable, or none recorded yet: never take a lease on a guess
        return True
    timeout_s = liveness.heartbeat_timeout_s()
    live = liveness.live_task_instances(signs, utcnow(), timeout_s)
    if live:
        log.info(
            "run %s of DAG %s is alive (heartbeat timeout %.0f s): %s",
            run_id,
            dag_id,
            timeout_s,
            "; ".join(sign.describe() for sign in live[:5]),
        )
        return True
    log.warning(
        "run %s of DAG %s is marked running but none of its %d task instances is alive "
        "(none with a sign of life in the last %.0f s, [scheduler] task_instance_heartbeat_timeout)",
        run_id,
        dag_id,
        len(signs),
        timeout_s,
    )
    return False


def take_workload_lease(ledger: Ledger, workload: str, context: Context) -> None:
    """Take the workload for this run, or fail fast naming the run that holds it.

    One run of a workload at a time: a second run (a manual run beside the scheduled one, a
    backfill, another DAG with the same workload name) would move the first run's items. The
    lease is the ledger's (:meth:`Ledger.acquire_workload_lease`); taking it again in the same
    run is a no-op. When another run holds it, Airflow is asked for that run's state: a run that is
    no longer queued or running (failed, succeeded without publishing, marked by hand) loses the
    lease to this one. So does a run still marked running that has no live task instance, judged
    as the scheduler judges one (:mod:`~airflow_batch_provider.operators.liveness`: no heartbeat,
    start, end or update younger than ``[scheduler] task_instance_heartbeat_timeout``; a run killed
    where no scheduler would mark it failed, such as ``airflow dags test``). A live run keeps it and
    this task fails with the ledger's message.

    :param ledger: the ledger
    :param workload: workload name
    :param context: the task context
    """
    run_id = context["run_id"]
    ti = context.get("ti")
    dag_id = getattr(ti, "dag_id", None)
    owner = attempt_owner(context)
    try:
        ledger.acquire_workload_lease(workload, run_id, owner, dag_id=dag_id)
        return
    except WorkloadLeasedError as exc:
        holder_dag, holder_run = exc.dag_id, exc.run_id
        state = dagrun_state(holder_dag, holder_run) if holder_dag else None
        if state is None:
            raise
        if state in LIVE_RUN_STATES:
            assert holder_dag is not None
            if holder_is_live(holder_dag, holder_run):
                raise
            state = f"{state} with no live task instance"
        log.warning(
            "workload %r was held by run %s of DAG %s, which is %s: taking it over for run %s",
            workload,
            holder_run,
            holder_dag,
            state,
            run_id,
        )
    ledger.acquire_workload_lease(workload, run_id, owner, dag_id=dag_id, takeover=True)


class BatchWorkloadLeaseOperator(BatchBaseOperator):
    """The first task of a run: take the workload (one run of it at a time); publish gives it back.

    See :func:`take_workload_lease`.
    """

    ui_color = "#e8f1fb"

    def execute(self, context: Context) -> None:
        take_workload_lease(self.ledger, self.workload, context)
        self.log.info("run %s holds workload %r until its publish task", context["run_id"], self.workload)


def release_workload_lease(ledger: Ledger, workload: str, run_id: str) -> None:
    """Give the workload back at the end of a run (a no-op when this run does not hold it).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    ledger.release_workload_lease(workload, run_id)
