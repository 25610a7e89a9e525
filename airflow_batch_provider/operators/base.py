"""What every batch operator shares: the base class, the prompt, the run's checks, the Asset extra.

The operators of :mod:`~airflow_batch_provider.operators.batch`, ``deadline`` and ``fallback``
derive from :class:`BatchBaseOperator`: the workload, its connections and staging, the ledger
opened once per task, the run's prompt and connection checks. What a task does lives in
``services/``; what operators share with the status sensor is in
:mod:`airflow_batch_provider.task_glue`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk import Asset, BaseOperator

from airflow_batch_provider import notifications
from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.core.options import BudgetOptions, ChunkOptions, FallbackLimits
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow, OpenItem
from airflow_batch_provider.ledger.runs import FinishedRun, finished_run
from airflow_batch_provider.services import late_harvest, report
from airflow_batch_provider.services import round as rounds
from airflow_batch_provider.services.realtime import realtime_limits, send_realtime
from airflow_batch_provider.services.runs import check_run_connection, check_run_prompt
from airflow_batch_provider.settings import default_staging_root, load_prices
from airflow_batch_provider.staging import Staging
from airflow_batch_provider.task_glue import attempt_owner, dag_id_of, emit_alert

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_batch_provider.core.ratelimit import RetryPolicy
    from airflow_batch_provider.notifications import BatchAlerts, BatchEvent
    from airflow_batch_provider.services.fallback import FallbackSettings

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
    return realtime_limits(limits, extras=extras, quota_key=quota_key, window_s=window_s, retry=retry)


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


def asset_extra(context: Mapping[str, Any], outlets: Iterable[Any], extra: Mapping[str, Any]) -> int:
    """Put ``extra`` on the events of the task's outlet Assets; return how many took it (never raises).

    :param context: the task context (``outlet_events``)
    :param outlets: the task's outlets
    :param extra: JSON-safe values
    """
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

    def send_in_real_time(
        self,
        context: Mapping[str, Any],
        rows: Sequence[OpenItem],
        template: PromptTemplate,
        *,
        limits: FallbackLimits,
        budget: BudgetOptions,
        refused_state: str,
        over_budget: str = "refuse",
        window_s: float = 60.0,
        retry: RetryPolicy | None = None,
    ) -> dict[str, Any]:
        """Send ``rows`` through the one real-time send (:func:`~airflow_batch_provider.services.realtime.send_realtime`).

        Every task that sends in real time (the deadline fallback, publish's ``exhausted="sync"``,
        submit's below-minimum chunk) comes here, so what it tells is the same: a send the budget
        refused is a ``budget_refused`` alert, and items that may have been paid twice are logged.

        :param context: the task context
        :param rows: the items to send
        :param template: the workload's prompt (output validation)
        :param limits: the task's fallback limits
        :param budget: the run's budget and prices
        :param refused_state: where items go when the budget refuses them
        :param over_budget: ``refuse`` (default) or ``send`` (the deadline wins over the budget)
        :param window_s: the rate window in seconds
        :param retry: retry policy per item
        """
        run_id = context["run_id"]
        summary = send_realtime(
            ledger=self.ledger,
            adapter=self.adapter,
            quota_key=self.batch_conn_id,
            workload=self.workload,
            run_id=run_id,
            rows=rows,
            template=template,
            limits=limits,
            budget=budget,
            prices=load_prices(budget.pricing_override),
            refused_state=refused_state,
            over_budget=over_budget,
            window_s=window_s,
            retry=retry,
        )
        if summary.get("refused"):
            event = notifications.budget_refused(
                self.workload,
                run_id,
                budget=Decimal(summary["budget"]),
                spent=Decimal(summary["spent"]),
                needed=Decimal(summary["needed"]),
                items=summary["refused"],
                dag_id=dag_id_of(context),
                went_to=refused_state,
            )
            self.emit(context, event)
        if summary.get("possibly_paid_twice"):
            self.log.warning(
                "%d items had been sent before a crash without their answer being recorded; they were sent "
                "again and may have been paid twice (error code possibly_paid_twice in the ledger)",
                summary["possibly_paid_twice"],
            )
        return summary

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


def harvest_earlier_runs(
    task: Any, run_id: str, template: PromptTemplate, context: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Harvest into this run the ended batches that finished runs left unharvested (a late resolve).

    :param task: the prepare or publish task (its ledger, adapter, staging, workload, pricing)
    :param run_id: the Airflow run id
    :param template: the run's prompt
    :param context: the task context
    """
    return late_harvest.harvest_earlier_runs(
        task.ledger,
        task.adapter,
        task.staging,
        task.workload,
        run_id,
        template,
        lambda model: report.batch_pricer(task.adapter.name, model, task.budget.pricing_override),
        attempt_owner(context),
    )
