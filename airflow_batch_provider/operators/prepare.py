"""``BatchPrepareOperator``: the first step of a run, from records to staged round-1 chunks.

Its ``execute`` reads as the task's steps; reading and rendering live in
:mod:`airflow_batch_provider.services.records`, the budget check in
:mod:`airflow_batch_provider.services.budget`, staging in :mod:`airflow_batch_provider.services.round`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import IO, TYPE_CHECKING, Any

from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.core.names import check_workload, is_templated
from airflow_batch_provider.core.options import BudgetOptions, BuiltLane, ChunkOptions
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError, RecordSourceError
from airflow_batch_provider.hooks.lane import check_conn_lane
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.ledger.runs import reopen_newest_run
from airflow_batch_provider.operators.base import (
    BatchBaseOperator,
    PromptSource,
    check_distributed,
    harvest_earlier_runs,
    load_prompt,
)
from airflow_batch_provider.operators.lineage import operator_lineage, renderer
from airflow_batch_provider.operators.sources import (
    RecordSource,
    describe_source,
    open_records,
    source_dataset,
)
from airflow_batch_provider.operators.takeover import adopt_dead_runs_jobs, inherit_dead_runs_lines
from airflow_batch_provider.services import budget as budgets
from airflow_batch_provider.services.records import PrepareResult, Reject, check_kind, load_records
from airflow_batch_provider.services.runs import (
    check_run_connection,
    keep_run_prompt,
    warn_prompt_edited_in_place,
)
from airflow_batch_provider.task_glue import dag_id_of

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_batch_provider.operators.lineage import Lineage
    from airflow_batch_provider.services.records import SourceRecord


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

    :param records: a path/URL of a JSONL or CSV file (read with ``ObjectStoragePath``), a
        callable taking the task context and returning an iterable of dicts, a ``SqlSource``, a
        ``ParquetSource`` or a ``WorkloadSource`` (another workload's published answers)
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
        return open_records(
            self.records,
            context=context,
            stack=stack,
            render=self.render_template,
            template=template or self.template(context),
            records_conn_id=self.records_conn_id,
            ledger_conn_id=self.ledger_conn_id,
        )

    def estimate_and_check_budget(self, run_id: str, context: Context | None = None) -> None:
        """Log the cost estimate of the items staged and not yet submitted; stop over the budget.

        Over the budget, a ``budget_refused`` alert is sent before the error is raised (the check
        is :func:`~airflow_batch_provider.services.budget.check_before_submit`).

        :param run_id: the Airflow run id
        :param context: the task context (for the alert)
        :raises BudgetExceededError: the estimate exceeds the budget (nothing was submitted)
        """

        def refused(verdict: budgets.BudgetVerdict) -> None:
            if context is not None:
                self.emit(
                    context, budgets.refused_before_submit(self.workload, run_id, verdict, dag_id_of(context))
                )

        budgets.check_before_submit(
            self.ledger, self.workload, run_id, self.budget, self.adapter.name, refused
        )

    def execute(self, context: Context) -> list[dict[str, Any]]:
        run_id = context["run_id"]
        if self.is_history(context):
            return []
        template, chunking = self.check_before_start(context)
        self.start_run(context, template)
        # before the items: what finished runs left unharvested (a batch resolved late) is this run's
        harvest_earlier_runs(self, run_id, template, context)
        # a dead run whose workload this run took over left jobs in flight: this run's round 1 has them
        adopt_dead_runs_jobs(self, run_id, context)
        result = self.read_records(context, template)
        # the harvested attempts of a dead run's items the read reopened follow them into this run
        inherit_dead_runs_lines(self, run_id, context, after_read=True)
        failpoint("prepare.after_upsert")
        if result.source_error:
            raise RecordSourceError(
                f"the records source {describe_source(self.records)} stopped "
                f"early: {result.source_error}. The {result.read} records read are in the ledger "
                f"({result.rejected} rejected) and nothing was staged; fix the source and retry the task."
            )
        pending = self.ledger.iter_item_rows(self.workload, run_id, states=["pending"], shape=OpenItem)
        manifests = self.stage_round(context, 1, pending, chunking.request_limit, chunking.max_bytes)
        failpoint("prepare.after_stage")
        self.estimate_and_check_budget(run_id, context)
        check_reject_ratio(result, chunking.max_reject_ratio)
        self.log.info("round 1: %d jobs staged", len(manifests))
        return manifests

    def get_openlineage_facets_on_start(self) -> Lineage:
        """What the task reads, for Airflow's OpenLineage provider: the records' table, query or file."""
        return self.get_openlineage_facets_on_complete(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Lineage:
        """What the task read, for Airflow's OpenLineage provider (as on start).

        :param task_instance: the finished task instance (``None``: the running task's context renders)
        """
        return operator_lineage(inputs=[source_dataset(self.records)], render=renderer(self, task_instance))

    def is_history(self, context: Context) -> bool:
        """Whether the run finished and a later run followed it (this prepare then does nothing).

        The newest finished run, its prepare cleared, is reopened and prepared again.

        :param context: the task context
        """
        run_id = context["run_id"]
        finished = self.finished_run(context)
        if finished is None:
            return False
        if reopen_newest_run(self.ledger, self.workload, run_id):
            self.log.warning(
                "run %s of workload %s finished at %s and no run of the workload started after it: "
                "this cleared prepare re-reads the input, and the run's publish writes its report again.",
                run_id,
                self.workload,
                finished.finished_at.isoformat(),
            )
            return False
        self.log.warning(
            "run %s of workload %s finished at %s (its report is published) and a later run "
            "followed it: it is history, so this cleared prepare reads nothing, stages nothing and "
            "takes no item; start a new run to process the input again.",
            run_id,
            self.workload,
            finished.finished_at.isoformat(),
        )
        return True

    def check_before_start(self, context: Context) -> tuple[PromptTemplate, ChunkOptions]:
        """Refuse, before anything is recorded, what cannot run: the lane, the executor, the chunk size, the kind.

        Returns the run's prompt and chunking.

        :param context: the task context
        :raises ConfigurationError: the connection, the executor's defaults or the chunking cannot run
        """
        if self.lane is not None:
            check_conn_lane(self.batch_conn_id, self.lane)
        check_distributed(self.ledger_conn_id, self.staging_root)
        template = self.template(context)
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
        return template, chunking

    def start_run(self, context: Context, template: PromptTemplate) -> None:
        """Record the run (its provider, model, DAG and connection) and keep the prompt it started with.

        :param context: the task context
        :param template: the run's prompt
        :raises ConfigurationError: the run started on another connection, or with another prompt
        """
        run_id = context["run_id"]
        # the run's DAG decides who may see it in the UI (the auth manager's DAG permissions)
        started_on = self.ledger.start_run(
            self.workload,
            run_id,
            self.adapter.name,
            template.model,
            dag_id=dag_id_of(context),
            batch_conn_id=self.batch_conn_id,
        )
        if started_on != self.batch_conn_id:  # another prepare of this run recorded another one meanwhile
            check_run_connection(self.ledger, self.workload, run_id, self.batch_conn_id, self.task_id)
        # the run keeps the prompt it started with: a cleared prepare with an edited one refuses
        keep_run_prompt(self.ledger, self.workload, run_id, template, self.task_id)
        warn_prompt_edited_in_place(self.ledger, self.workload, run_id, template, self.log)

    def read_records(self, context: Context, template: PromptTemplate) -> PrepareResult:
        """Read, render and record the records; keep the rejected ones whole; write the summary.

        The summary goes to ``prepare_summary.json`` in the run's folder and to the XCom
        ``prepare_counts``; rejected records, with their reasons, to ``rejects.jsonl`` beside it.

        :param context: the task context
        :param template: the run's prompt
        """
        run_id = context["run_id"]
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
                ledger=self.ledger,
                workload=self.workload,
                run_id=run_id,
                template=template,
                records=self.source_records(context, files, template),
                write_reject=write_reject,
                log=self.log,
                adapter=self.adapter,
            )
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
        return result


def check_reject_ratio(result: PrepareResult, ratio: float) -> None:
    """Fail the task (after recording and staging) when the share of rejected records is over ``ratio``.

    :param result: what the read found
    :param ratio: ``ChunkOptions.max_reject_ratio``
    :raises ConfigurationError: more records were rejected than the ratio allows
    """
    total = result.read
    if total and result.rejected / total > ratio:
        raise ConfigurationError(
            f"{result.rejected} of {total} records were rejected ({result.rejected / total:.1%}), more "
            f"than max_reject_ratio={ratio:.1%}; the good records are staged and the bad ones "
            "are in the log and the ledger (state review). Fix the input, or raise "
            "ChunkOptions(max_reject_ratio=...)."
        )
