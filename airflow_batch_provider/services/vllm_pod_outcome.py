"""What a finished pod means for its job: a reason code, its GPU time and what that cost.

Pure Python over the pod as the Kubernetes API last showed it (no Airflow, no Kubernetes client
import): the pod task (:class:`~airflow_batch_provider.operators.vllm_pod.VllmBatchPodOperator`)
records the row :func:`infra_cost_row` returns in ``abp_infra_costs`` and the reason in the job.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import models as k8s

    from airflow_batch_provider.ledger.records import JobRow


def gpu_cost_nusd(gpu_seconds: int, gpu_count: int, usd_per_gpu_hour: float) -> int:
    """Nano-dollars of ``gpu_seconds`` of pod time on ``gpu_count`` GPUs (rounded up).

    :param gpu_seconds: wall seconds the pod's container ran
    :param gpu_count: GPUs the pod held
    :param usd_per_gpu_hour: the hourly rate of one GPU
    """
    micros = round(Decimal(str(usd_per_gpu_hour)) * 1_000_000)
    return math.ceil(Decimal(gpu_seconds * gpu_count * micros * 1000) / 3600)


def failure_reason(pod: k8s.V1Pod | None, error: str | None) -> str:
    """A short reason code for a job whose pod did not succeed.

    :param pod: the pod as last seen (``None`` if never seen)
    :param error: the operator's error text
    """
    text = (error or "").lower()
    if text.startswith(("killed", "pod_lost", "deadline", "invalid_line")):
        return text.split(":", 1)[0]
    status = pod.status if pod is not None else None
    if status is not None and (status.reason or "").lower() == "evicted":
        return "evicted"
    if status is not None and status.reason == "DeadlineExceeded":
        return "deadline"  # the pod's activeDeadlineSeconds (the run's deadline) stopped it
    for cs in (status.container_statuses or []) if status is not None else []:
        term = cs.state.terminated if cs.state else None
        wait = cs.state.waiting if cs.state else None
        if term is not None and term.reason == "OOMKilled":
            return "oom_killed"
        if wait is not None and wait.reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
            return "image_pull_failed"
        if term is not None and term.exit_code not in (None, 0):
            return f"exit_{term.exit_code}"
    if status is not None and status.phase in ("Pending", "Unknown"):
        unscheduled = any(c.type == "PodScheduled" and c.status != "True" for c in status.conditions or [])
        return "unschedulable_timeout" if unscheduled else "startup_timeout"
    if "imagepullbackoff" in text or "errimagepull" in text:
        return "image_pull_failed"
    if "too long to be scheduled" in text:
        return "unschedulable_timeout"
    if "too long to start" in text:
        return "startup_timeout"
    return "pod_failed"


def pod_times(pod: k8s.V1Pod | None) -> tuple[datetime | None, datetime | None]:
    """When the pod's container started and finished (now, while it runs; ``None``: it never ran).

    :param pod: the pod as last seen
    """
    if pod is None or pod.status is None:
        return None, None
    for cs in pod.status.container_statuses or []:
        state = cs.state
        if state is None:
            continue
        if state.terminated is not None and state.terminated.started_at is not None:
            return state.terminated.started_at, state.terminated.finished_at or datetime.now(UTC)
        if state.running is not None and state.running.started_at is not None:
            return state.running.started_at, datetime.now(UTC)
    return None, None


def infra_cost_row(
    job: JobRow,
    pod: k8s.V1Pod | None,
    gpu_type: str,
    gpu_count: int,
    usd_per_gpu_hour: float,
    outcome: str,
    reason: str | None,
) -> dict[str, Any]:
    """The ``abp_infra_costs`` row of a job's pod: its GPU time from the container's start and finish.

    :param job: the ledger job row
    :param pod: the pod as last seen (``None``: no pod ran; no GPU time)
    :param gpu_type: the GPU model the connection names
    :param gpu_count: GPUs the pod held
    :param usd_per_gpu_hour: the hourly rate of one GPU
    :param outcome: ``completed`` or ``failed``
    :param reason: why it failed (``None``: it succeeded)
    """
    started, finished = pod_times(pod)
    seconds = max(0, math.ceil((finished - started).total_seconds())) if started and finished else 0
    return {
        "job_id": job.job_id,
        "workload": job.workload,
        "run_id": job.run_id,
        "pod_name": pod.metadata.name if pod is not None and pod.metadata else None,
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "started_at": started,
        "finished_at": finished,
        "gpu_seconds": seconds,
        "usd_per_gpu_hour_micros": round(Decimal(str(usd_per_gpu_hour)) * 1_000_000),
        "cost_nusd": gpu_cost_nusd(seconds, gpu_count, usd_per_gpu_hour),
        "outcome": outcome,
        "reason": reason,
    }


def exception_messages(exc: BaseException) -> str:
    """The exception's message, the first line of each exception it was raised during before it."""
    parts = [str(exc).splitlines()[0] if str(exc) else type(exc).__name__]
    seen: BaseException | None = exc.__context__
    while seen is not None and len(parts) < 5:
        parts.append(f"{type(seen).__name__}: {str(seen).splitlines()[0] if str(seen) else ''}")
        seen = seen.__context__
    return " <- ".join(parts)
