"""Operators of one batch workload run: prepare, upload, submit, download, reconcile, resubmit, publish.

They are thin: the ledger holds state, the adapter talks to the provider, ``core`` decides.
Every operator can be cleared and run again; it converges to the same ledger and never creates a
second provider batch. XCom carries job ids and small manifests only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from datetime import timedelta
from decimal import Decimal
from functools import cached_property
from typing import IO, TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_batch_provider.adapters.base import TERMINAL_BATCH_STATES, BatchAdapter
from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.core.options import (
    BudgetOptions,
    BuiltLane,
    ChunkOptions,
    DeadlineOptions,
    FallbackLimits,
)
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.core.states import RETRYABLE_STATES, UNFINISHED_STATES
from airflow_batch_provider.exceptions import ConfigurationError, RecordSourceError
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import ItemOutcome, JobRow, OpenItem
from airflow_batch_provider.ledger.runs import FinishedRun, finished_run, reopen_newest_run
from airflow_batch_provider.ledger.store import utcnow
from airflow_batch_provider.links.batch import BatchConsoleLink, LedgerRunLink
from airflow_batch_provider.operators.sources import RecordSource as RecordSource
from airflow_batch_provider.operators.sources import describe_source
from airflow_batch_provider.operators.takeover import (
    MOVED,
    adopt_dead_runs_jobs,
    inherit_dead_runs_lines,
    moved_to_another_run,
)
from airflow_batch_provider.services import harvest, report
from airflow_batch_provider.services import round as rounds
from airflow_batch_provider.services.admission import admit
from airflow_batch_provider.services.fallback import ANSWER_LOST, close_interrupted_sends
from airflow_batch_provider.services.runs import (
    check_run_connection,
    check_run_prompt,
    keep_run_prompt,
    warn_prompt_edited_in_place,
)
from airflow_batch_provider.settings import load_prices
from airflow_batch_provider.staging import Staging

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_batch_provider.core.ratelimit import RetryPolicy
    from airflow_batch_provider.notifications import BatchAlerts, BatchEvent
    from airflow_batch_provider.services.fallback import FallbackSettings
    from airflow_batch_provider.services.records import SourceRecord

log = logging.getLogger(__name__)

#: A prompt, the path of its YAML file, or a callable given the task context returning one (run time).
PromptSource = PromptTemplate | str | Callable[..., PromptTemplate]


def load_prompt(prompt: PromptSource, context: Mapping[str, Any] | None = None) -> PromptTemplate:
    """The prompt of a task: ``prompt`` itself, its YAML file, or what a callable returns at run time.

    A callable lets a DAG choose the model from an Airflow Variable when the task runs, not when
    the file is parsed (see ``dags/embeddings_backfill.py``).

    :param prompt: a prompt, the path of its YAML file, or a callable ``(context) -> PromptTemplate``
    :param context: the task context (needed by a callable)
    """
    if callable(prompt) and not isinstance(prompt, PromptTemplate):
        made = prompt(context)
        if not isinstance(made, PromptTemplate):
            raise ConfigurationError(
                f"the prompt callable {getattr(prompt, '__name__', prompt)!r} returned {type(made).__name__}; "
                "it must return a PromptTemplate."
            )
        return made
    return PromptTemplate.load(prompt)


def limits_settings(
    limits: FallbackLimits,
    window_s: float = 60.0,
    retry: RetryPolicy | None = None,
    *,
    extras: Mapping[str, Any] | None = None,
    quota_key: str | None = None,
) -> FallbackSettings:
    """The real-time send settings of a task: the group's limits, then the connection's extras, then the config.

    :param limits: the group's fallback limits
    :param window_s: the rate window in seconds (60 for per-minute limits)
    :param retry: retry policy per item (default :class:`~airflow_batch_provider.core.ratelimit.RetryPolicy`)
    :param extras: the provider connection's extras (``rpm_limit``, ``tpm_limit``, ``rate_headroom``, ...)
    :param quota_key: the key the ledger's shared rate window is kept under (the connection id)
    """
    from airflow_batch_provider.services.realtime import realtime_limits

    return realtime_limits(limits, extras=extras, quota_key=quota_key, window_s=window_s, retry=retry)


def emit_alert(alerts: BatchAlerts | None, context: Mapping[str, Any], event: BatchEvent) -> None:
    """Send an alert event; never fails the task (a notifier's error, or building it, is logged).

    :param alerts: the group's alerts (``None``: only the ``alerts.<kind>`` metric is counted)
    :param context: the task context
    :param event: the event
    """
    try:
        if alerts is None:
            from airflow_batch_provider import metrics

            metrics.record_alert(event.kind)
            return
        alerts.emit(context, event)
    except Exception:
        log.exception("alert %s of %s could not be sent", event.kind, event.workload)


def persist_links(
    context: Mapping[str, Any], provider: str, batch_ids: Sequence[str], base_url: str | None = None
) -> str | None:
    """Store the "Provider batch" and "LLM batch run" links of a task now (before it defers).

    Returns the console URL stored, or ``None`` when the context cannot store links (no task
    instance, no DAG); a link that cannot be stored is logged, never fatal.

    :param context: the task context
    :param provider: provider (adapter) name
    :param batch_ids: the task's provider batch ids
    :param base_url: the connection's API host (a shipped console page is only for its own host)
    """
    from airflow_batch_provider.links.batch import BatchConsoleLink, LedgerRunLink

    if context.get("ti") is None or context.get("dag") is None or not batch_ids:
        return None
    try:
        url = BatchConsoleLink.persist(
            context, provider=provider, batch_ids=list(batch_ids), base_url=base_url
        )
        LedgerRunLink.persist(context)
    except Exception as exc:
        log.warning("the extra links of batch %s could not be stored: %s", ", ".join(batch_ids), exc)
        return None
    return url


def in_doubt_alert(
    alerts: BatchAlerts | None, context: Mapping[str, Any], provider: str
) -> Callable[[JobRow, str], None]:
    """The ``on_in_doubt`` callback of :func:`~airflow_batch_provider.services.submit.submit_job` for a task.

    :param alerts: the group's alerts
    :param context: the task context
    :param provider: provider (adapter) name
    """
    from airflow_batch_provider import notifications

    def send(job: JobRow, reason: str) -> None:
        event = notifications.batch_in_doubt(
            str(job.workload),
            str(job.run_id),
            job_id=str(job.job_id),
            provider=provider,
            lines=int(job.lines or 0),
            reason=reason,
            dag_id=_dag_id(context),
        )
        emit_alert(alerts, context, event)

    return send


def known_job(ledger: Ledger, job_id: str) -> JobRow | None:
    """The job row, or ``None`` for a batch the ledger does not know (a hand-made wait).

    :param ledger: the ledger
    :param job_id: the job
    """
    from airflow_batch_provider.exceptions import LedgerError

    try:
        return ledger.get_job(job_id)
    except LedgerError:
        return None


def batch_ended(
    alerts: BatchAlerts | None,
    context: Mapping[str, Any],
    job: JobRow,
    state: str,
    provider: str,
    error_code: str | None = None,
) -> None:
    """A provider batch reached a terminal state: count it; a failed one is a ``batch_failed`` alert.

    Call it once per job (where the job's recorded ``batch_state`` changes to the terminal one).
    Never raises.

    :param alerts: the group's alerts
    :param context: the task context
    :param job: the ledger job row (as it was before this state was recorded)
    :param state: the terminal state
    :param provider: provider (adapter) name
    :param error_code: why a failed batch failed, when known
    """
    from airflow_batch_provider import metrics, notifications

    try:
        metrics.record_batch(state, workload=str(job.workload), provider=provider)
    except Exception as exc:
        log.warning("metric of batch %s not recorded: %s", job.batch_id, exc)
    if state != "failed":
        return
    event = notifications.batch_failed(
        str(job.workload),
        str(job.run_id),
        job_id=str(job.job_id),
        batch_id=job.batch_id,
        provider=provider,
        lines=int(job.lines or 0),
        error_code=error_code or harvest.BATCH_FAILED,
        dag_id=_dag_id(context),
    )
    emit_alert(alerts, context, event)


#: Executors whose tasks may run on different machines (nothing on one worker's disk is shared).
DISTRIBUTED_EXECUTORS = ("CeleryExecutor", "KubernetesExecutor", "CeleryKubernetesExecutor", "EdgeExecutor")


def distributed_executors(executor: str) -> list[str]:
    """The distributed executors named in an ``[core] executor`` value (a list, aliases, class paths).

    :param executor: the configured value, e.g. ``CeleryExecutor`` or ``LocalExecutor,KubernetesExecutor``
    """
    names = [part.split(":")[-1].strip().rsplit(".", 1)[-1] for part in executor.split(",") if part.strip()]
    return [n for n in names if n in DISTRIBUTED_EXECUTORS]


def check_distributed(ledger_conn_id: str | None, staging_root: str | None) -> None:
    """Refuse the embedded defaults when tasks may run on different machines.

    The embedded ledger (SQLite in ``$AIRFLOW_HOME``) and ``file://`` staging only work when
    every task of a run sees the same disk. Under CeleryExecutor or KubernetesExecutor (``[core]
    executor``, read through the compat layer) the prepare task stops before anything is recorded,
    naming what to configure.

    :param ledger_conn_id: the ledger connection (``None``: ``[batch_provider] ledger_url`` or SQLite)
    :param staging_root: the staging URL (``None``: ``[batch_provider] staging_root``)
    :raises ConfigurationError: a distributed executor with a local ledger or local staging
    """
    from airflow.providers.common.compat.sdk import conf

    from airflow_batch_provider.settings import default_staging_root

    found = distributed_executors(str(conf.get("core", "executor", fallback="") or ""))
    if not found:
        return
    problems = []
    if LedgerHook(ledger_conn_id).url().startswith("sqlite"):
        problems.append(
            "the ledger is a SQLite file on the worker's disk: set ledger_conn_id= on the group to a "
            "postgres connection (or [batch_provider] ledger_url to a PostgreSQL URL)"
        )
    root = staging_root or default_staging_root()
    if root.startswith("file:") or "://" not in root:
        problems.append(
            f"staging is on the local disk ({root}): set staging_root= (or [batch_provider] staging_root) "
            "to an object store, e.g. s3://bucket/llm-batch or gs://bucket/llm-batch, with staging_conn_id"
        )
    if problems:
        raise ConfigurationError(
            f"[core] executor is {found[0]}: tasks of one run may run on different machines, and "
            + "; ".join(problems)
            + ". The embedded defaults only work when every task runs on one machine."
        )


#: Where items that exhausted their batch attempts go.
EXHAUSTED_ROUTES = ("review", "sync")


def check_exhausted(exhausted: str, prompt: Any) -> None:
    """Refuse an unknown ``exhausted`` choice, or ``sync`` without the prompt (it validates the answers).

    :param exhausted: ``review`` or ``sync``
    :param prompt: the workload's prompt
    """
    if exhausted not in EXHAUSTED_ROUTES:
        raise ConfigurationError(
            f"exhausted={exhausted!r}; use 'review' (a person decides) or 'sync' (the real-time API, within the budget)."
        )
    if exhausted == "sync" and prompt is None:
        raise ConfigurationError(
            "exhausted='sync' needs the workload's prompt (prompt=) to validate the answers."
        )


def run_event_extra(workload: str, run_id: str, out: Mapping[str, Any], results: str) -> dict[str, Any]:
    """The ``extra`` of a published run's Asset event: counts, cost and where the results are (JSON-safe).

    :param workload: the workload
    :param run_id: the run
    :param out: the publish task's result
    :param results: where ``results.jsonl`` is
    """
    return {
        "workload": workload,
        "run_id": run_id,
        "items_by_state": {str(k): int(v) for k, v in dict(out["items_by_state"]).items()},
        "paid_usd": None if out["paid_usd"] is None else str(out["paid_usd"]),
        "cost_per_usable_result_usd": None
        if out["cost_per_usable_result_usd"] is None
        else str(out["cost_per_usable_result_usd"]),
        "results": results,
        "report": str(out["report"]),
    }


def asset_extra(context: Mapping[str, Any], outlets: Iterable[Any], extra: Mapping[str, Any]) -> int:
    """Put ``extra`` on the events of the task's outlet Assets; return how many took it (never raises).

    :param context: the task context (``outlet_events``)
    :param outlets: the task's outlets
    :param extra: JSON-safe values
    """
    from airflow.sdk import Asset

    events = context.get("outlet_events")
    if events is None:
        return 0
    done = 0
    for outlet in outlets or ():
        if not isinstance(outlet, Asset):
            continue
        try:
            events[outlet].extra.update(extra)
            done += 1
        except Exception as exc:
            log.warning("the event of asset %s carries no extra: %s", outlet, exc)
    return done


def kill_claim(task: Any) -> None:
    """``on_kill`` of a task that may hold a submit claim (``task._claim``: job id and owner, or ``None``).

    Sets ``task._killed`` (its submit stops before the next provider call) and releases the claim
    when nothing of the job can be in flight. Never raises: the ledger may be unreachable, and
    the claim's lease then ends by itself.

    :param task: the submit operator or the status sensor
    """
    from airflow_batch_provider.services.submit import release_on_kill

    task._killed = True
    claim = getattr(task, "_claim", None)
    if claim is None:
        return
    job_id, owner = claim
    try:
        if release_on_kill(task.ledger, job_id, owner):
            log.warning("killed: released the submit claim on job %s (nothing was sent)", job_id)
    except Exception as exc:
        log.warning("killed: the claim on job %s could not be released (%s)", job_id, exc)


def _dag_id(context: Mapping[str, Any]) -> str | None:
    found = getattr(context.get("dag"), "dag_id", None) or getattr(context.get("ti"), "dag_id", None)
    return str(found) if found else None


class BatchBaseOperator(BaseOperator):
    """What every batch operator shares: the workload, its connections and staging.

    :param workload: the workload's name (ledger namespace and staging folder)
    :param batch_conn_id: the provider connection (its type picks the adapter)
    :param ledger_conn_id: ``postgres``/``sqlite`` connection of the ledger; ``None`` for the
        embedded SQLite ledger
    :param staging_root: staging URL (``file://``, ``s3://``, ``gs://``); default from config
    :param staging_conn_id: connection of the object store behind ``staging_root``
    :param alerts: where this task's alert events go (set once on ``batch_inference_group``)
    """

    template_fields: Sequence[str] = ("workload", "batch_conn_id", "staging_root")
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        workload: str,
        batch_conn_id: str = BatchHook.default_conn_name,
        ledger_conn_id: str | None = None,
        staging_root: str | None = None,
        staging_conn_id: str | None = None,
        alerts: BatchAlerts | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload = workload
        self.batch_conn_id = batch_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.staging_root = staging_root
        self.staging_conn_id = staging_conn_id
        self.alerts = alerts

    def pre_execute(self, context: Any) -> None:
        """Before every try: the rendered ``batch_conn_id`` must be the one the run started on.

        :param context: the task context
        :raises ConfigurationError: it is not (see :func:`check_run_connection`)
        """
        super().pre_execute(context)
        check_run_connection(self.ledger, self.workload, context["run_id"], self.batch_conn_id, self.task_id)

    def run_template(self, prompt: PromptSource, context: Mapping[str, Any]) -> PromptTemplate:
        """The prompt of this task, which must be the one the run started with (content and version).

        :param prompt: the task's prompt (or its file, or a callable)
        :param context: the task context
        :raises ConfigurationError: the run started with another prompt (see :func:`check_run_prompt`)
        """
        template = load_prompt(prompt, context)
        check_run_prompt(self.ledger, self.workload, context["run_id"], template, self.task_id)
        return template

    def finished_run(self, context: Mapping[str, Any]) -> FinishedRun | None:
        """Return the task's run as publish finished it (``None``: it is not finished).

        A finished run that a later run of the workload followed is history: a cleared task of it
        must change neither its items nor its report, nor take items a newer run owns. The newest
        run, its prepare cleared, is reopened (:func:`reopen_newest_run`).

        :param context: the task context
        """
        return finished_run(self.ledger, self.workload, context["run_id"])

    def emit(self, context: Mapping[str, Any], event: BatchEvent) -> None:
        """Send an alert event (never fails the task).

        :param context: the task context
        :param event: the event
        """
        emit_alert(self.alerts, context, event)

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger."""
        return LedgerHook(self.ledger_conn_id).get_conn()

    @cached_property
    def adapter(self) -> BatchAdapter:
        """The provider adapter of ``batch_conn_id``."""
        return BatchHook(self.batch_conn_id).get_adapter()

    @cached_property
    def staging(self) -> Staging:
        """The staging area."""
        return Staging(self.staging_root, self.staging_conn_id)

    def run_chunking(self, chunking: ChunkOptions, context: Context) -> ChunkOptions:
        """``chunking`` for this run: a templated ``max_requests`` rendered now, as a number.

        :param chunking: the task's chunk options
        :param context: the task context
        :raises ConfigurationError: the template rendered to something other than a whole number
        """
        if not isinstance(chunking.max_requests, str):
            return chunking
        done = chunking.rendered(self.render_template(chunking.max_requests, context))
        self.log.info(
            "requests per job this run: %s (%s)",
            done.max_requests or "the provider's limit",
            chunking.max_requests,
        )
        return done

    def job_manifest(self, job: JobRow) -> dict[str, Any]:
        """The small dict that travels through XCom for one job.

        :param job: a ledger job row
        """
        return rounds.job_manifest(job)

    def stage_round(
        self,
        context: Context,
        round_: int,
        items: Iterable[OpenItem],
        max_requests: int | None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        """Write ``items`` (ledger rows) into this round's chunks and record one job per chunk.

        See :func:`airflow_batch_provider.services.round.stage_round`.

        :param context: the task context
        :param round_: round number (1 for the first submission)
        :param items: the items to stage (streamed from ``Ledger.iter_item_rows``)
        :param max_requests: a tighter per-chunk request limit
        :param max_bytes: a tighter per-chunk byte limit
        """
        return rounds.stage_round(
            ledger=self.ledger,
            adapter=self.adapter,
            staging=self.staging,
            workload=self.workload,
            run_id=context["run_id"],
            round_=round_,
            items=items,
            max_requests=max_requests,
            max_bytes=max_bytes,
        )


class BatchPrepareOperator(BatchBaseOperator):
    """Render records into requests, upsert the ledger, skip unchanged items, stage chunks.

    Reading and rendering live in :mod:`airflow_batch_provider.services.records`. Bad records (no
    or duplicate id, invalid UTF-8 or JSON, a CSV row with a cell too many or too few, a template
    that fails or lacks a field, a line over the byte limit) are logged with their line and the
    fix, kept whole in ``rejects.jsonl``, recorded for review when they have an id, and the other
    records go on; ``items + rejected == read``, in the log, in ``prepare_summary.json`` next to
    the rejects and in the XCom ``prepare_counts``. The task fails when the share of bad records
    exceeds ``max_reject_ratio`` (after recording and staging), and when the source itself fails
    part-way (the records read are kept, nothing is staged; see ``RecordSourceError``).

    :param records: a path/URL of a JSONL or CSV file (read with ``ObjectStoragePath``), or a
        callable taking the task context and returning an iterable of dicts
    :param prompt: the prompt (or a path to its YAML file)
    :param chunking: requests and bytes per job, tighter than the provider's, and the largest
        tolerated share of bad records (``max_reject_ratio``)
    :param records_conn_id: connection of the object store holding ``records``
    :param budget: the run's budget and prices; when the cost estimate of the staged items (batch
        prices, every item at its output ceiling) exceeds the budget, the task fails before any submit
    :param lane: the lane the group built (``provider`` or ``pod``): the connection, read first
        here, must be of a type that runs in it, or the task fails before anything is recorded,
        uploaded or paid (``None``: no check)
    """

    # ``records`` is rendered by hand when it is a string: Airflow would call a callable template
    # field at render time and keep its (huge) result as a rendered field.

    def __init__(
        self,
        *,
        records: RecordSource,
        prompt: PromptSource,
        chunking: ChunkOptions | None = None,
        records_conn_id: str | None = None,
        budget: BudgetOptions | None = None,
        lane: BuiltLane | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        from airflow_batch_provider.core.names import check_workload, is_templated

        if not is_templated(self.workload):
            check_workload(self.workload)  # at DAG parse time; Staging.run_dir checks a rendered one
        self.budget = budget or BudgetOptions()
        self.records = records
        self.prompt = prompt
        self.chunking = chunking or ChunkOptions()
        self.records_conn_id = records_conn_id
        self.lane = lane

    def template(self, context: Context | None = None) -> PromptTemplate:
        """The prompt template (a callable prompt is called with the task context).

        :param context: the task context
        """
        return load_prompt(self.prompt, context)

    def source_records(
        self, context: Context, stack: ExitStack, template: PromptTemplate | None = None
    ) -> Iterator[SourceRecord]:
        """The records of ``records``, read lazily (files stay open in ``stack``).

        :param context: the task context
        :param stack: closes the opened file when prepare is done with it
        :param template: the prompt (default: this task's, loaded now)
        """
        from airflow_batch_provider.operators.sources import open_records

        return open_records(
            self.records,
            context=context,
            stack=stack,
            render=self.render_template,
            template=template or self.template(context),
            records_conn_id=self.records_conn_id,
        )

    def estimate_and_check_budget(self, run_id: str, context: Context | None = None) -> None:
        """Log the cost estimate of the items staged and not yet submitted; stop over the budget.

        Over the budget, a ``budget_refused`` alert is sent before the error is raised.

        :param run_id: the Airflow run id
        :param context: the task context (for the alert)
        :raises BudgetExceededError: the estimate exceeds the budget (nothing was submitted)
        """
        from airflow_batch_provider.core.cost import check_budget, estimate_cost
        from airflow_batch_provider.exceptions import PricingError

        rows = self.ledger.iter_item_rows(self.workload, run_id, states=["staged"], shape=OpenItem)
        requests = (CanonicalRequest.from_dict(json.loads(r.request_json)) for r in rows)
        try:
            estimate = estimate_cost(
                requests, load_prices(self.budget.pricing_override), "batch", provider=self.adapter.name
            )
        except PricingError as exc:
            if self.budget.budget is not None:
                raise
            self.log.warning("no cost estimate: %s", exc)
            return
        budget = self.budget.budget
        shown = "none" if budget is None else f"${budget}"
        self.log.info(
            "cost estimate before submit: $%s for %d items (%d input tokens, up to %d output tokens, "
            "batch prices as of %s); budget %s",
            estimate.cost.quantize(Decimal("0.000001")),
            estimate.items,
            estimate.tokens.input,
            estimate.tokens.max_output,
            estimate.prices_as_of,
            shown,
        )
        if budget is None:
            return
        if estimate.cost > budget and context is not None:
            from airflow_batch_provider.notifications import BatchEvent

            event = BatchEvent(
                "budget_refused",
                self.workload,
                run_id,
                f"{self.workload}: the run was not submitted: its {estimate.items:,} items are estimated at up to "
                f"${estimate.cost.quantize(Decimal('0.000001'))}, over the ${budget} budget. Nothing was paid; "
                "raise BudgetOptions(budget_usd=...), send fewer items, or use a cheaper model.",
                "error",
                {"budget": str(budget), "spent": "0", "needed": str(estimate.cost), "items": estimate.items},
                _dag_id(context),
            )
            self.emit(context, event)
        check_budget(estimate, budget)

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from airflow_batch_provider.services.records import Reject, check_kind, load_records

        run_id = context["run_id"]
        finished = self.finished_run(context)
        if finished is not None and reopen_newest_run(self.ledger, self.workload, run_id):
            self.log.warning(
                "run %s of workload %s finished at %s and no run of the workload started after it: "
                "this cleared prepare re-reads the input, and the run's publish writes its report again.",
                run_id,
                self.workload,
                finished.finished_at.isoformat(),
            )
        elif finished is not None:
            self.log.warning(
                "run %s of workload %s finished at %s (its report is published) and a later run "
                "followed it: it is history, so this cleared prepare reads nothing, stages nothing and "
                "takes no item; start a new run to process the input again.",
                run_id,
                self.workload,
                finished.finished_at.isoformat(),
            )
            return []
        if self.lane is not None:
            from airflow_batch_provider.hooks.lane import check_conn_lane

            check_conn_lane(self.batch_conn_id, self.lane)
        check_distributed(self.ledger_conn_id, self.staging_root)
        template = self.template(context)
        ledger = self.ledger
        floor = self.adapter.limits.min_requests
        chunking = self.run_chunking(self.chunking, context)
        max_requests = chunking.request_limit
        if max_requests is not None and max_requests < floor:
            # Every chunk would go through the real-time API, several at once: full price, and
            # the real-time path resumes a run's interrupted sends assuming one sender at a time.
            raise ConfigurationError(
                f"ChunkOptions(max_requests={max_requests}) is below {self.adapter.name}'s minimum "
                f"of {floor} requests per batch job: every chunk would be sent through the real-time API "
                f"at full price. Raise max_requests to at least {floor}, or leave it unset."
            )
        # a kind the provider does not accept is refused before anything reaches the ledger
        check_kind(self.workload, template, self.adapter)
        # the run's DAG decides who may see it in the UI (the auth manager's DAG permissions)
        dag_id = getattr(context.get("dag"), "dag_id", None) or getattr(context.get("ti"), "dag_id", None)
        started_on = ledger.start_run(
            self.workload,
            run_id,
            self.adapter.name,
            template.model,
            dag_id=dag_id,
            batch_conn_id=self.batch_conn_id,
        )
        if started_on != self.batch_conn_id:  # another prepare of this run recorded another one meanwhile
            check_run_connection(ledger, self.workload, run_id, self.batch_conn_id, self.task_id)
        # the run keeps the prompt it started with: a cleared prepare with an edited one refuses
        keep_run_prompt(ledger, self.workload, run_id, template, self.task_id)
        warn_prompt_edited_in_place(ledger, self.workload, run_id, template, self.log)
        # before the items: what finished runs left unharvested (a batch resolved late) is this run's
        harvest_earlier_runs(self, run_id, template, context)
        # a dead run whose workload this run took over left jobs in flight: this run's round 1 has them
        adopt_dead_runs_jobs(self, run_id, context)  # type: ignore[arg-type]
        folder = self.staging.run_dir(self.workload, run_id)
        rejects_path = folder / "rejects.jsonl"
        with ExitStack() as files:
            opened: list[IO[bytes]] = []

            def write_reject(reject: Reject) -> None:
                # Every rejected record is kept whole, with its reason, so that nothing is lost.
                if not opened:
                    opened.append(files.enter_context(self.staging.writer(rejects_path)))
                opened[0].write(json.dumps(reject.to_dict(), ensure_ascii=False).encode("utf-8") + b"\n")

            result = load_records(
                ledger=ledger,
                workload=self.workload,
                run_id=run_id,
                template=template,
                records=self.source_records(context, files, template),
                write_reject=write_reject,
                log=self.log,
                adapter=self.adapter,
            )
        # the harvested attempts of a dead run's items the read reopened follow them into this run
        inherit_dead_runs_lines(self, run_id, context)
        summary = {**result.to_dict(), "rejects": str(rejects_path) if result.rejected else None}
        with self.staging.writer(folder / "prepare_summary.json") as fh:
            fh.write(json.dumps(summary, indent=2).encode("utf-8"))
        ti = context.get("ti")
        if ti is not None:
            ti.xcom_push(key="prepare_counts", value=summary)
        if result.rejected:
            self.log.warning(
                "%d rejected records, with their reasons, are in %s", result.rejected, rejects_path
            )
        self.log.info("%s", result.describe())
        failpoint("prepare.after_upsert")
        if result.source_error:
            raise RecordSourceError(
                f"the records source {describe_source(self.records)} stopped "
                f"early: {result.source_error}. The {result.read} records read are in the ledger "
                f"({result.rejected} rejected) and nothing was staged; fix the source and retry the task."
            )
        pending = ledger.iter_item_rows(self.workload, run_id, states=["pending"], shape=OpenItem)
        manifests = self.stage_round(context, 1, pending, max_requests, chunking.max_bytes)
        failpoint("prepare.after_stage")
        self.estimate_and_check_budget(run_id, context)
        total = result.read
        ratio = chunking.max_reject_ratio
        if total and result.rejected / total > ratio:
            raise ConfigurationError(
                f"{result.rejected} of {total} records were rejected ({result.rejected / total:.1%}), more "
                f"than max_reject_ratio={ratio:.1%}; the good records are staged and the bad ones "
                "are in the log and the ledger (state review). Fix the input, or raise "
                "ChunkOptions(max_reject_ratio=...)."
            )
        self.log.info("round 1: %d jobs staged", len(manifests))
        return manifests


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
        from airflow_batch_provider.services import submit

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
        from airflow_batch_provider.services import submit

        job = self.ledger.get_job(self.job["job_id"])
        key = job.idempotency_key
        if moved_to_another_run(job, context):  # the wait and the harvest pass it through
            return {
                "job_id": job.job_id,
                "provider": self.adapter.name,
                "idempotency_key": key,
                "route": MOVED,
            }
        if self.prompt is not None:
            # before anything is sent or paid: the answers will be judged by the run's prompt
            self.run_template(self.prompt, context)
        if submit.goes_sync(job, self.adapter):
            out = {"job_id": job.job_id, "provider": self.adapter.name, "idempotency_key": key}
            return {**out, **self.send_synchronously(context, job)}
        admission = admit(self.ledger, self.adapter, job, self.batch_conn_id)
        if not admission.admitted:  # the connection's enqueued tokens are full: free the slot, ask again
            from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

            self.log.info("%s", admission.reason)
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(seconds=admission.retry_in_s)), method_name="resume"
            )
        self._claim = (job.job_id, attempt_owner(context))
        try:
            done = submit.submit_job(
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
        if done.batch_id:
            persist_links(context, self.adapter.name, [done.batch_id], self.adapter.settings.base_url)
        return done.to_xcom(self.adapter.name, key)

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
        from airflow_batch_provider.services.realtime import send_realtime

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
        self.ledger.update_job(job.job_id, state="sync")
        rows = list(
            self.ledger.iter_item_rows(
                self.workload,
                context["run_id"],
                states=["staged", "fallback"],
                shape=OpenItem,
                job_id=job.job_id,
            )
        )
        summary = send_realtime(
            ledger=self.ledger,
            adapter=self.adapter,
            quota_key=self.batch_conn_id,
            workload=self.workload,
            run_id=context["run_id"],
            rows=rows,
            template=template,
            limits=self.fallback,
            budget=self.budget,
            prices=load_prices(self.budget.pricing_override),
            refused_state="review",
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
        from airflow_batch_provider.core.deadline import deadline_passed

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

        The estimate streams :meth:`eligible`; the move to review addresses the same items in one
        statement (retryable, under the attempts cap). A refused round is a ``budget_refused`` alert.

        :param run_id: the Airflow run id
        :param context: the task context (for the alert)
        """
        from airflow_batch_provider.core.cost import estimate_cost

        requests = (CanonicalRequest.from_dict(json.loads(r.request_json)) for r in self.eligible(run_id))
        estimate = estimate_cost(
            requests, load_prices(self.budget.pricing_override), "batch", provider=self.adapter.name
        )
        spent = self.ledger.run_cost(self.workload, run_id)
        budget = self.budget.budget
        assert budget is not None
        if spent + estimate.cost <= budget:
            self.log.info(
                "round %d estimate $%s; paid so far $%s; budget $%s",
                self.round_number,
                estimate.cost,
                spent,
                budget,
            )
            return False
        message = (
            f"round {self.round_number} not started: ${spent:.6f} already paid plus ${estimate.cost:.6f} estimated "
            f"for {estimate.items} items exceeds the run's budget of ${budget}; raise BudgetOptions(budget_usd=...) to resubmit them."
        )
        self.log.error("%s They go to review (error code budget_exceeded).", message)
        if context is not None:
            from airflow_batch_provider import notifications

            event = notifications.budget_refused(
                self.workload,
                run_id,
                budget=budget,
                spent=spent,
                needed=estimate.cost,
                items=estimate.items,
                dag_id=_dag_id(context),
            )
            self.emit(context, event)
        self.ledger.transition(
            self.workload,
            run_id,
            "review",
            sorted(RETRYABLE_STATES),
            attempts_below=self.max_attempts,
            error_code="budget_exceeded",
            error_message=message,
        )
        return True


#: Compatibility name: the report module prices batch lines.
batch_pricer = report.batch_pricer
#: Compatibility name: the report is built by the report service.
build_report = report.build_report


def publish_outcome(summary: Mapping[str, Any], report_path: str) -> dict[str, Any]:
    """What publish returns (its XCom): the counts of the report and where it is.

    :param summary: the run's report
    :param report_path: where ``report.json`` is
    """
    return {
        "items_by_state": summary["items_by_state"],
        "paid_usd": summary["paid"],
        "cost_per_usable_result_usd": summary["cost_per_usable_result"],
        "failed_batches": len(summary["failed_batches"]),
        "in_doubt_jobs": len(summary["in_doubt_jobs"]),
        "possibly_paid_twice": summary["possibly_paid_twice"],
        "report": report_path,
    }


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
        ledger = self.ledger
        finished = self.finished_run(context)
        if finished is not None:
            return self.published_before(context, finished)
        template = self.run_template(self.prompt, context) if self.prompt is not None else None
        if template is not None:
            harvest_earlier_runs(self, run_id, template, context)
        self.harvest_late(run_id, template, context)
        if self.exhausted == "sync" and template is not None:
            self.send_exhausted(context, template)
        # A real-time send that crashed before its answer was recorded leaves its item in
        # ``fallback``, which is not final: close it (the item becomes retryable, then settled).
        close_interrupted_sends(ledger, self.workload, run_id, ANSWER_LOST)
        _, to_review = ledger.retry_candidates(self.workload, run_id, self.max_attempts)
        settled = ledger.transition(
            self.workload,
            run_id,
            self.unfinished,
            UNFINISHED_STATES,
            error_message="not finished when the run closed",
        )
        if to_review or settled:
            self.log.info(
                "%d items to review (attempts exhausted or permanent), %d unfinished -> %s",
                to_review,
                settled,
                self.unfinished,
            )
        summary = report.build_report(
            ledger,
            self.workload,
            run_id,
            self.adapter.name,
            self.budget.pricing_override,
            max_attempts=self.max_attempts,
        )
        published = ledger.publish(self.workload, run_id)
        folder = self.staging.run_dir(self.workload, run_id)
        with self.staging.writer(folder / "results.jsonl") as fh:
            for row in ledger.iter_item_rows(self.workload, run_id, shape=ItemOutcome):
                line = {
                    "id": row.app_id,
                    "state": row.state,
                    "route": row.route,
                    "output": json.loads(row.output_json) if row.output_json else None,
                    "error_code": row.error_code,
                    "error_message": row.error_message,
                }
                fh.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
        with self.staging.writer(folder / "report.json") as fh:
            fh.write(json.dumps(summary, indent=2).encode("utf-8"))
        ledger.finish_run(self.workload, run_id, summary)
        release_workload_lease(ledger, self.workload, run_id)
        self.log.info("published %d items to the results table and %s", published, folder / "results.jsonl")
        self.log.info("\n%s", summary["table"])
        out = publish_outcome(summary, str(folder / "report.json"))
        self.tell(context, summary, out, str(folder / "results.jsonl"))
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
        from airflow_batch_provider import metrics, notifications

        run_id = context["run_id"]
        self.emit(context, notifications.run_summary(self.workload, run_id, summary, _dag_id(context)))
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
        from airflow_batch_provider import notifications
        from airflow_batch_provider.services.fallback import FALLBACK_FROM
        from airflow_batch_provider.services.realtime import send_realtime

        run_id = context["run_id"]
        rows = [
            r
            for r in self.ledger.iter_item_rows(
                self.workload,
                run_id,
                states=[s for s in sorted(RETRYABLE_STATES) if s in FALLBACK_FROM],
                shape=OpenItem,
            )
            if r.attempts >= self.max_attempts
        ]
        if not rows:
            return {"items": 0}
        prices = load_prices(self.budget.pricing_override)
        self.log.warning(
            "%d items exhausted their %d batch attempts: sending them through the real-time API of %s "
            "at full price (exhausted='sync'), within the budget",
            len(rows),
            self.max_attempts,
            self.adapter.name,
        )
        summary = send_realtime(
            ledger=self.ledger,
            adapter=self.adapter,
            quota_key=self.batch_conn_id,
            workload=self.workload,
            run_id=run_id,
            rows=rows,
            template=template,
            limits=self.fallback,
            budget=self.budget,
            prices=prices,
            refused_state="review",
        )
        if summary.get("refused"):
            event = notifications.budget_refused(
                self.workload,
                run_id,
                budget=Decimal(summary["budget"]),
                spent=Decimal(summary["spent"]),
                needed=Decimal(summary["needed"]),
                items=summary["refused"],
                dag_id=_dag_id(context),
            )
            self.emit(context, event)
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
        late = [
            j
            for j in self.ledger.get_jobs(self.workload, run_id)
            if j.batch_id and j.state not in (*harvest.COMPLETE_STATES, "sync")
        ]
        if not late or template is None:
            return
        for job in late:
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


def harvest_earlier_runs(
    task: Any, run_id: str, template: PromptTemplate, context: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Harvest into this run the ended batches that finished runs left unharvested (a late resolve).

    :param task: the prepare or publish task (its ledger, adapter, staging, workload, pricing)
    :param run_id: the Airflow run id
    :param template: the run's prompt
    :param context: the task context
    """
    from airflow_batch_provider.services import late_harvest

    return late_harvest.harvest_earlier_runs(
        task.ledger,
        task.adapter,
        task.staging,
        task.workload,
        run_id,
        template,
        lambda model: report.batch_pricer(task.adapter.name, model, task.budget.pricing_override),
        attempt_owner(context),  # type: ignore[arg-type]
    )


def attempt_owner(context: Context) -> str:
    """The owner string of this task attempt for claims and leases: dag/run/task/map index/try@host:pid.

    :param context: the task context
    """
    from airflow_batch_provider.services.submit import claim_owner

    ti = context.get("ti")
    return claim_owner(
        str(getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "-")),
        context["run_id"],
        str(getattr(ti, "task_id", "-")),
        getattr(ti, "map_index", None),
        getattr(ti, "try_number", None),
    )


#: DAG-run states of a run that may still hold its workload (anything else is over).
LIVE_RUN_STATES = frozenset({"queued", "running"})


def dagrun_state(dag_id: str, run_id: str) -> str | None:
    """The state of another DAG run as Airflow knows it (``None`` when it cannot be read).

    :param dag_id: the DAG id
    :param run_id: the run id
    """
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
    from airflow_batch_provider.operators.liveness import (
        heartbeat_timeout_s,
        holder_task_instances,
        live_task_instances,
    )

    signs = holder_task_instances(dag_id, run_id)
    if not signs:  # unreadable, or none recorded yet: never take a lease on a guess
        return True
    timeout_s = heartbeat_timeout_s()
    live = live_task_instances(signs, utcnow(), timeout_s)
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
    from airflow_batch_provider.exceptions import WorkloadLeasedError

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
