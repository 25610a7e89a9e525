"""``batch_inference_group``: the standard TaskGroup of one batch workload.

::

    prepare -> submit[] -> wait[] -> download[] -> reconcile[]          (round 1, mapped per chunk)
            -> resubmit_2 -> submit_2[] -> ... -> reconcile_2[]          (retryable items, new jobs)
            -> ... up to max_attempts rounds
            -> publish                                                  (final states, results, cost)

Rounds with nothing to resubmit map over an empty list and are skipped; later tasks run with
``none_failed``. Every task can be cleared and rerun: the ledger makes it converge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import TaskGroup

from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.operators.batch import (
    BatchDownloadOperator,
    BatchPrepareOperator,
    BatchPublishOperator,
    BatchReconcileOperator,
    BatchResubmitOperator,
    BatchSubmitOperator,
    RecordSource,
)
from airflow_batch_provider.sensors.batch import BatchStatusSensor
from airflow_batch_provider.settings import get_setting


def default_poll_policy() -> PollPolicy:
    """The poll policy from the ``[batch_provider]`` config.

    Options: ``poll_initial_interval``, ``poll_factor``, ``poll_max_interval``,
    ``poll_max_consecutive_errors`` and ``poll_timeout``.
    """
    return PollPolicy(
        initial_interval=float(get_setting("poll_initial_interval", "30")),
        factor=float(get_setting("poll_factor", "1.5")),
        max_interval=float(get_setting("poll_max_interval", "600")),
        max_consecutive_errors=int(get_setting("poll_max_consecutive_errors", "5")),
        timeout=float(get_setting("poll_timeout", str(26 * 3600))),
    )


def batch_inference_group(
    *,
    workload: str,
    records: RecordSource,
    prompt: PromptTemplate | str,
    batch_conn_id: str,
    ledger_conn_id: str | None = None,
    staging_root: str | None = None,
    staging_conn_id: str | None = None,
    max_attempts: int = 3,
    max_requests_per_chunk: int | None = None,
    max_reject_ratio: float = 0.1,
    poll: PollPolicy | None = None,
    deadline: datetime | str | None = None,
    deadline_margin: float = 0.0,
    unfinished: str = "review",
    pricing_override: str | Mapping[str, Any] | None = None,
    deferrable: bool = True,
    outlets: Sequence[Any] = (),
    group_id: str | None = None,
) -> TaskGroup:
    """Build the TaskGroup that runs one workload through a provider's batch API.

    Call inside a ``DAG`` context.

    :param workload: the workload's name (ledger namespace, staging folder)
    :param records: JSONL/CSV path or URL, or a callable(context) returning dicts
    :param prompt: the prompt, or the path of its YAML file
    :param batch_conn_id: provider connection; its type picks the adapter (change it, and the
        model in the prompt, to move the workload to another provider)
    :param ledger_conn_id: ledger connection (``None``: embedded SQLite)
    :param staging_root: staging URL (default ``[batch_provider] staging_root``)
    :param staging_conn_id: object store connection for ``staging_root``
    :param max_attempts: attempts per item, the first included; one round per attempt
    :param max_requests_per_chunk: a tighter per-job request limit than the provider's
    :param max_reject_ratio: largest tolerated share of bad input records
    :param poll: poll policy (default from the ``[batch_provider]`` config)
    :param deadline: when waiting stops and the deadline policy takes over (templated)
    :param deadline_margin: seconds before the deadline to stop waiting
    :param unfinished: where items still open at the end go: ``review``, ``pending``, ``skipped``
    :param pricing_override: prices merged over the shipped table (file path or dict)
    :param deferrable: wait in the triggerer (default) rather than in a worker
    :param outlets: assets the publish task updates
    :param group_id: the TaskGroup id (default: the workload name)
    """
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts={max_attempts}; use 1 or more (1 means no resubmission).")
    policy = poll or default_poll_policy()
    common: dict[str, Any] = {
        "workload": workload,
        "batch_conn_id": batch_conn_id,
        "ledger_conn_id": ledger_conn_id,
        "staging_root": staging_root,
        "staging_conn_id": staging_conn_id,
    }
    with TaskGroup(group_id or workload, tooltip=f"batch inference: {workload}") as group:
        prepare = BatchPrepareOperator(
            task_id="prepare",
            records=records,
            prompt=prompt,
            max_requests_per_chunk=max_requests_per_chunk,
            max_reject_ratio=max_reject_ratio,
            **common,
        )
        manifests: Any = prepare.output
        last: Any = prepare
        for round_number in range(1, max_attempts + 1):
            suffix = "" if round_number == 1 else f"_{round_number}"
            if round_number > 1:
                resubmit = BatchResubmitOperator(
                    task_id=f"resubmit{suffix}",
                    round_number=round_number,
                    max_attempts=max_attempts,
                    max_requests_per_chunk=max_requests_per_chunk,
                    trigger_rule="none_failed",
                    **common,
                )
                last >> resubmit
                manifests = resubmit.output
            submit = BatchSubmitOperator.partial(task_id=f"submit{suffix}", **common).expand(job=manifests)
            wait = BatchStatusSensor.partial(
                task_id=f"wait{suffix}",
                batch_conn_id=batch_conn_id,
                ledger_conn_id=ledger_conn_id,
                poll=policy,
                deadline=deadline,
                deadline_margin=deadline_margin,
                deferrable=deferrable,
            ).expand(batch=submit.output)
            download = BatchDownloadOperator.partial(task_id=f"download{suffix}", **common).expand(
                batch=wait.output
            )
            last = BatchReconcileOperator.partial(
                task_id=f"reconcile{suffix}", prompt=prompt, pricing_override=pricing_override, **common
            ).expand(batch=download.output)
        publish = BatchPublishOperator(
            task_id="publish",
            max_attempts=max_attempts,
            unfinished=unfinished,
            pricing_override=pricing_override,
            trigger_rule="none_failed",
            outlets=list(outlets),
            **common,
        )
        last >> publish
    return group
