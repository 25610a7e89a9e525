"""What ``batch_inference_group`` calls for a lane whose adapter runs each chunk in a pod.

The pipeline asks :func:`runs_in_pod` once (the connection's adapter declares
``runs_in_pod``), then builds :func:`pod_tasks` in place of submit and wait. Everything after
(download, reconcile, resubmit, publish) is the same for every lane.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.exceptions import ConfigurationError


def runs_in_pod(batch_conn_id: str) -> bool:
    """Whether the connection's adapter runs chunks as pod tasks (read when the DAG is parsed).

    A connection that cannot be read at parse time (not defined yet) means the provider lane,
    as before this lane existed.

    :param batch_conn_id: the batch connection id
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn_type = BaseHook.get_connection(batch_conn_id).conn_type or ""
        return bool(getattr(adapter_class(conn_type), "runs_in_pod", False))
    except (AirflowNotFoundException, ConfigurationError):
        return False


def pod_tasks(
    *,
    task_id: str,
    manifests: Any,
    common: Mapping[str, Any],
    policy: PollPolicy,
    deferrable: bool,
    deadline: Any = None,
    deadline_margin: float = 0.0,
) -> Any:
    """The mapped pod task of one round (one pod per job); returns its output for download.

    :param task_id: the task id (``run``, ``run_2`` ...)
    :param manifests: the round's job manifests (prepare's or resubmit's output)
    :param common: workload, connections and staging, as every batch operator takes them
    :param policy: the poll policy (its initial interval paces the pod polls)
    :param deferrable: wait in the triggerer
    :param deadline: the run's resolved deadline (aware datetime, ISO string or a template of
        one; ``None``: none): each pod is stopped there and its job ends with reason ``deadline``
    :param deadline_margin: seconds before the deadline at which the pods stop
    """
    from airflow_batch_provider.kubernetes.operators import VllmBatchPodOperator

    interval = max(1.0, min(policy.initial_interval, 30.0))
    run = VllmBatchPodOperator.partial(
        task_id=task_id,
        deferrable=deferrable,
        poll_interval=interval,
        startup_check_interval_seconds=max(1, int(interval)),
        deadline=deadline,
        deadline_margin=deadline_margin,
        **common,
    ).expand(job=manifests)
    return run.output
