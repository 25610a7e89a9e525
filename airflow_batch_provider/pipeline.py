"""``batch_inference_group``: the standard TaskGroup of one batch workload.

::

    lease -> prepare -> upload[] -> submit[] -> wait[] -> download[] -> reconcile[]  (round 1, per chunk)
            -> resubmit_2 -> upload_2[] -> submit_2[] -> ... -> reconcile_2[]    (retryable items, new jobs)
            -> ... up to max_attempts rounds
            -> publish                                                  (final states, results, cost)
            -> deliver_<sink> ...                                       (one per sink: results into the user's table,
                                                                         or a consumer's action per result)

``upload`` stages each chunk at the provider and records the file id (or object URI) in the
ledger; ``submit`` only creates the batch from it, so the grid shows the upload apart from the
batch's queueing (``wait``), and a cleared submit never uploads again.

``lease`` takes the workload for the run (one run of a workload at a time; a second live run fails
fast naming the holder, a dead holder's lease is taken over); ``publish`` gives it back.

With a deadline (and its policy, which has no default), a ``deadline`` task resolves the run's
deadline first; each sensor stops at it, a ``harvest`` task after each sensor cancels a batch the
deadline cut short and waits for its partial results; no new round starts after it; and a
``deadline_branch`` routes the end of the run::

    ... reconcile[] -> deadline_branch -> publish                     (all done, or deadline ahead)
                                       -> sync_fallback   -> publish  (policy sync_fallback)
                                       -> keep_pending    -> publish  (policy publish_pending)
                                       -> skip_unfinished -> publish  (policy skip)

Rounds with nothing to resubmit map over an empty list and are skipped; later tasks run with
``none_failed``. Every task can be cleared and rerun: the ledger makes it converge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from airflow.sdk import TaskGroup

from airflow_batch_provider.core.names import check_workload, is_templated
from airflow_batch_provider.core.options import (
    BudgetOptions,
    ChunkOptions,
    DeadlineOptions,
    FallbackLimits,
    Lane,
    refuse_moved,
)
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.lane import built_lane
from airflow_batch_provider.notifications import BatchAlerts
from airflow_batch_provider.operators.batch import (
    BatchDownloadOperator,
    BatchPrepareOperator,
    BatchPublishOperator,
    BatchReconcileOperator,
    BatchResubmitOperator,
    BatchSubmitOperator,
    BatchUploadOperator,
    BatchWorkloadLeaseOperator,
    PromptSource,
    RecordSource,
    check_exhausted,
)
from airflow_batch_provider.operators.consume import BatchConsumeOperator
from airflow_batch_provider.operators.deadline import (
    BatchDeadlineBranchOperator,
    BatchDeadlineHarvestOperator,
    BatchDeadlineOperator,
    BatchDeadlineSettleOperator,
)
from airflow_batch_provider.operators.deliver import BatchDeliverOperator
from airflow_batch_provider.operators.fallback import BatchSyncFallbackOperator
from airflow_batch_provider.prompt_path import resolve_prompt_path
from airflow_batch_provider.sensors.batch import BatchStatusSensor
from airflow_batch_provider.services.consumers import HandOffConsumer
from airflow_batch_provider.services.delivery import Sink
from airflow_batch_provider.settings import default_poll_policy

__all__ = ["batch_inference_group", "default_poll_policy"]


def batch_inference_group(
    *,
    workload: str,
    records: RecordSource,
    prompt: PromptSource,
    batch_conn_id: str,
    lane: Lane = "auto",
    ledger_conn_id: str | None = None,
    staging_root: str | None = None,
    staging_conn_id: str | None = None,
    max_attempts: int = 3,
    chunking: ChunkOptions | None = None,
    poll: PollPolicy | None = None,
    deadline: DeadlineOptions | None = None,
    fallback: FallbackLimits | None = None,
    budget: BudgetOptions | None = None,
    unfinished: str = "review",
    exhausted: str = "review",
    deferrable: bool = True,
    alerts: BatchAlerts | None = None,
    outlets: Sequence[Any] = (),
    sinks: Sequence[Sink | HandOffConsumer] = (),
    group_id: str | None = None,
    **moved: Any,
) -> TaskGroup:
    """Build the TaskGroup that runs one workload through a provider's batch API.

    Call inside a ``DAG`` context. The options come in four frozen objects
    (:mod:`airflow_batch_provider.core.options`), each checked when it is built and handed as one
    object to the tasks that use it.

    :param workload: the workload's name (ledger namespace, staging folder)
    :param records: JSONL/CSV/Parquet path or URL, a callable(context) returning dicts, a
        ``SqlSource`` (a table or query through an Airflow SQL connection), a ``ParquetSource``, or
        a ``WorkloadSource`` (another workload's published answers: chain this group after that
        workload's group, or schedule the DAG on the Asset its publish updates)
    :param prompt: the prompt, the path of its YAML file (a relative path is resolved against the
        DAG file's folder and must exist when the DAG is parsed), or a callable(context) returning
        the prompt when the task runs (e.g. its model from an Airflow Variable)
    :param batch_conn_id: provider connection; its type picks the adapter (change it, and the
        model in the prompt, to move the workload to another provider); templated, e.g.
        ``"{{ var.value.get('my_conn_id', 'openai_batch_default') }}"`` to choose it at run time
    :param lane: ``provider`` (upload, submit and wait at a batch API), ``pod`` (one ``vllm
        run-batch`` pod per chunk, for a ``vllm_kubernetes`` connection) or ``auto`` (a literal
        ``batch_conn_id`` is read when the DAG is parsed and its type decides; a templated one
        means ``provider``). ``provider`` and ``pod`` read no connection at parse time, so the id
        may be a template in either; when the run starts, prepare refuses a connection whose type
        runs in the other lane, before anything is recorded or paid
    :param ledger_conn_id: ledger connection (``None``: embedded SQLite)
    :param staging_root: staging URL (default ``[batch_provider] staging_root``)
    :param staging_conn_id: object store connection for ``staging_root``
    :param max_attempts: attempts per item, the first included; one round per attempt
    :param chunking: requests and bytes per job, tighter than the provider's, and the tolerated
        share of bad input (:class:`~airflow_batch_provider.core.options.ChunkOptions`; prepare and
        resubmit)
    :param poll: poll policy (default from the ``[batch_provider]`` config)
    :param deadline: when waiting stops, the policy for what is not done by then, the margin and
        the harvest timeout (:class:`~airflow_batch_provider.core.options.DeadlineOptions`;
        ``None``: no deadline). A templated ``when`` is rendered once per run by the ``deadline``
        task: a moment, a rule (``PT2H``, ``06:30 Europe/Berlin``) or nothing (no deadline this
        run: the branch then goes to publish)
    :param fallback: rate limits of the real-time sends: the ``sync_fallback`` policy,
        ``exhausted='sync'`` and chunks below the provider's minimum
        (:class:`~airflow_batch_provider.core.options.FallbackLimits`; default from config)
    :param budget: the run's budget and the prices that estimate and report its cost
        (:class:`~airflow_batch_provider.core.options.BudgetOptions`)
    :param unfinished: where items still open at the end go: ``review``, ``pending``, ``skipped``
    :param exhausted: where items that exhausted their batch attempts go: ``review`` (default) or
        ``sync`` (the provider's real-time API at full price, within the budget; reported as
        ``exhausted_sync`` in the cost report)
    :param deferrable: wait in the triggerer. The group turns deferral on (the operators on their
        own follow ``[operators] default_deferrable``); ``False`` polls in a worker
    :param alerts: where the group's alert events go (deadline missed, budget refused, a failed or
        in-doubt batch, review growth, the run's summary); see :mod:`airflow_batch_provider.notifications`
    :param outlets: assets the publish task updates
    :param sinks: where the run's final answers go after publish (e.g.
        :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink`): one ``deliver_<name>`` task per
        sink, each row written once and recorded per item in the ledger; a
        :class:`~airflow_batch_provider.sinks.consumer.Consumer` acts once per answer instead
        (a ticket, an email), each hand-off with its idempotency key and acknowledged in the ledger
    :param group_id: the TaskGroup id (default: the workload name)
    :raises ConfigurationError: a keyword of the flat form (``max_requests_per_chunk=`` ...),
        naming the option object it moved to, an option of the wrong type, or an unknown lane
    """
    refuse_moved("batch_inference_group", moved)
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts={max_attempts}; use 1 or more (1 means no resubmission).")
    chunking = _option("chunking", chunking, ChunkOptions)
    fallback = _option("fallback", fallback, FallbackLimits)
    budget = _option("budget", budget, BudgetOptions)
    if deadline is not None and not isinstance(deadline, DeadlineOptions):
        raise ConfigurationError(
            f"deadline={deadline!r}; give DeadlineOptions(when, policy), e.g. "
            "DeadlineOptions('06:30 Europe/Berlin', 'sync_fallback'), or None."
        )
    _check_sinks(sinks)
    policy = poll or default_poll_policy()
    check_workload(workload)  # before Airflow's own key check, with the workload's rule and a fix
    common: dict[str, Any] = {
        "workload": workload,
        "batch_conn_id": batch_conn_id,
        "ledger_conn_id": ledger_conn_id,
        "staging_root": staging_root,
        "staging_conn_id": staging_conn_id,
    }
    prompt = resolve_prompt_path(prompt)  # beside the DAG file, and there now, not at run time
    check_exhausted(exhausted, prompt)
    # self-hosted lane: a pod task per chunk replaces upload + submit + wait
    lane_built = built_lane(lane, batch_conn_id)
    in_pod = lane_built == "pod"
    # a workload may contain '.', which Airflow refuses in a group id
    with TaskGroup(group_id or workload.replace(".", "_"), tooltip=f"batch inference: {workload}") as group:
        lease = BatchWorkloadLeaseOperator(task_id="lease", **common)
        prepare = BatchPrepareOperator(
            task_id="prepare",
            records=records,
            prompt=prompt,
            chunking=chunking,
            budget=budget,
            alerts=alerts,
            lane=lane_built,
            **common,
        )
        # the run's deadline: a rule (time of day, offset) or a template is resolved per run by the
        # deadline task, and every later task reads it from there
        run_deadline = deadline
        templated = deadline is not None and isinstance(deadline.when, str) and is_templated(deadline.when)
        if deadline is not None and (deadline.spec is not None or templated):
            resolve = BatchDeadlineOperator(
                task_id="deadline",
                spec=deadline.spec,
                when=str(deadline.when) if templated else None,
                policy=deadline.policy,
                margin_s=deadline.margin_s,
                doc_md=deadline.describe(),
            )
            run_deadline = deadline.resolved_by(resolve.task_id)
            resolve >> prepare
        lease >> prepare
        manifests: Any = prepare.output
        last: Any = prepare
        for round_number in range(1, max_attempts + 1):
            suffix = "" if round_number == 1 else f"_{round_number}"
            if round_number > 1:
                resubmit = BatchResubmitOperator(
                    task_id=f"resubmit{suffix}",
                    round_number=round_number,
                    max_attempts=max_attempts,
                    chunking=chunking,
                    deadline=run_deadline,
                    budget=budget,
                    trigger_rule="none_failed",
                    alerts=alerts,
                    **common,
                )
                last >> resubmit
                manifests = resubmit.output
            waited: Any
            if in_pod:  # the cncf-kubernetes provider (the kubernetes extra) only for this lane
                from airflow_batch_provider.operators.vllm_pod import pod_tasks

                waited = pod_tasks(
                    task_id=f"run{suffix}",
                    manifests=manifests,
                    common=common,
                    policy=policy,
                    deferrable=deferrable,
                    deadline=run_deadline.at() if run_deadline is not None else None,
                    deadline_margin=run_deadline.margin_s if run_deadline is not None else 0.0,
                )
            else:
                upload = BatchUploadOperator.partial(task_id=f"upload{suffix}", **common).expand(
                    job=manifests
                )
                submit = BatchSubmitOperator.partial(
                    task_id=f"submit{suffix}",
                    prompt=prompt,
                    budget=budget,
                    fallback=fallback,
                    alerts=alerts,
                    **common,
                ).expand(job=upload.output)
                wait = BatchStatusSensor.partial(
                    task_id=f"wait{suffix}",
                    batch_conn_id=batch_conn_id,
                    ledger_conn_id=ledger_conn_id,
                    poll=policy,
                    deadline=run_deadline.at() if run_deadline is not None else None,
                    deadline_margin=run_deadline.margin_s if run_deadline is not None else 0.0,
                    deferrable=deferrable,
                    staging_root=staging_root,
                    staging_conn_id=staging_conn_id,
                    alerts=alerts,
                ).expand(batch=submit.output)
                waited = wait.output
                if run_deadline is not None:
                    harvest = BatchDeadlineHarvestOperator.partial(
                        task_id=f"harvest{suffix}",
                        deadline=run_deadline,
                        poll=policy,
                        alerts=alerts,
                        **common,
                    ).expand(batch=wait.output)
                    waited = harvest.output
            download = BatchDownloadOperator.partial(task_id=f"download{suffix}", **common).expand(
                batch=waited
            )
            last = BatchReconcileOperator.partial(
                task_id=f"reconcile{suffix}", prompt=prompt, budget=budget, **common
            ).expand(batch=download.output)
        publish = BatchPublishOperator(
            task_id="publish",
            max_attempts=max_attempts,
            unfinished=unfinished,
            prompt=prompt,
            exhausted=exhausted,
            budget=budget,
            fallback=fallback,
            trigger_rule="none_failed",
            outlets=list(outlets),
            alerts=alerts,
            **common,
        )
        after_publish: dict[str, Any] = {
            "workload": workload,
            "ledger_conn_id": ledger_conn_id,
            "staging_root": staging_root,
            "staging_conn_id": staging_conn_id,
        }
        for sink in sinks:
            if isinstance(sink, HandOffConsumer):
                publish >> BatchConsumeOperator(
                    task_id=f"deliver_{sink.sink_name}", consumer=sink, **after_publish
                )
            else:
                publish >> BatchDeliverOperator(
                    task_id=f"deliver_{sink.sink_name}", sink=sink, **after_publish
                )
        if run_deadline is None:
            last >> publish
            return group
        policy_task: Any
        if run_deadline.policy == "sync_fallback":
            policy_task = BatchSyncFallbackOperator(
                task_id="sync_fallback",
                prompt=prompt,
                limits=fallback,
                budget=budget,
                over_budget=run_deadline.over_budget,
                **common,
            )
        else:
            pending = run_deadline.policy == "publish_pending"
            policy_task = BatchDeadlineSettleOperator(
                task_id="keep_pending" if pending else "skip_unfinished",
                state="pending" if pending else "skipped",
                max_attempts=max_attempts,
                **common,
            )
        branch = BatchDeadlineBranchOperator(
            task_id="deadline_branch",
            workload=workload,
            ledger_conn_id=ledger_conn_id,
            deadline=run_deadline,
            publish_task_id=publish.task_id,
            policy_task_id=policy_task.task_id,
            trigger_rule="none_failed",
            alerts=alerts,
        )
        last >> branch >> [policy_task, publish]
        policy_task >> publish
    return group


def _check_sinks(sinks: Sequence[Sink | HandOffConsumer]) -> None:
    """Every sink has a ``sink_name`` and the names are unique (each names a task and its records)."""
    seen: set[str] = set()
    for sink in sinks:
        name = getattr(sink, "sink_name", None)
        if not isinstance(name, str) or not (hasattr(sink, "row_for") or isinstance(sink, HandOffConsumer)):
            raise ConfigurationError(
                f"sinks=[... {sink!r} ...]; give sink objects such as SqlUpsertSink(conn_id=..., table=..., ...) "
                "or Consumer(name=..., act=...)."
            )
        if name in seen:
            raise ConfigurationError(
                f"two sinks are named {name!r}; give one of them name='...' (it names its task and its records)."
            )
        seen.add(name)


_O = TypeVar("_O", ChunkOptions, FallbackLimits, BudgetOptions)


def _option(name: str, value: _O | None, kind: type[_O]) -> _O:
    """The option object given, or its defaults; anything else is refused with the type to use."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ConfigurationError(
            f"{name}={value!r}; give a {kind.__name__}(...) from airflow_batch_provider.core.options."
        )
    return value
