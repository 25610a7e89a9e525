"""A finished pod's GPU-cost row and the words of a failure, from the pod as the API last showed it.

The reason codes of each failure are tried against the real ``KubernetesPodOperator`` in
``tests/unit/operators/test_vllm_pod.py``; here the row itself, on the Kubernetes client's own
model objects.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from airflow_batch_provider.services.vllm_pod_outcome import (
    exception_messages,
    gpu_cost_nusd,
    infra_cost_row,
)

k8s = pytest.importorskip("kubernetes.client")

JOB = SimpleNamespace(job_id="w:r:r1:c00000", workload="w", run_id="r")
START = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def finished_pod(seconds: float) -> k8s.V1Pod:
    terminated = k8s.V1ContainerStateTerminated(
        exit_code=0, started_at=START, finished_at=START + timedelta(seconds=seconds)
    )
    status = k8s.V1PodStatus(
        phase="Succeeded",
        container_statuses=[
            k8s.V1ContainerStatus(
                name="base",
                image="vllm",
                image_id="",
                ready=False,
                restart_count=0,
                state=k8s.V1ContainerState(terminated=terminated),
            )
        ],
    )
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="vllm-batch-1"), status=status)


def test_a_pod_that_ran_a_minute_on_two_gpus_is_charged_two_gpu_minutes_at_the_hourly_rate() -> None:
    row = infra_cost_row(JOB, finished_pod(59.2), "H100", 2, 3.6, "completed", None)  # type: ignore[arg-type]
    assert row["gpu_seconds"] == 60  # rounded up: a started second is paid
    assert row["cost_nusd"] == gpu_cost_nusd(60, 2, 3.6) == 120_000_000  # $0.12
    assert row["usd_per_gpu_hour_micros"] == 3_600_000
    assert (row["pod_name"], row["started_at"], row["outcome"], row["reason"]) == (
        "vllm-batch-1",
        START,
        "completed",
        None,
    )


def test_a_job_whose_pod_never_ran_records_no_gpu_time_and_no_pod() -> None:
    row = infra_cost_row(JOB, None, "L4", 1, 0.8, "failed", "deadline")  # type: ignore[arg-type]
    assert (row["gpu_seconds"], row["cost_nusd"], row["pod_name"], row["started_at"]) == (0, 0, None, None)
    assert (row["job_id"], row["workload"], row["run_id"], row["reason"]) == (
        JOB.job_id,
        "w",
        "r",
        "deadline",
    )


def test_a_failure_is_told_by_the_first_line_of_each_exception_it_was_raised_during() -> None:
    try:
        try:
            raise OSError("connection reset\nby peer")
        except OSError:
            raise RuntimeError("pod vllm-batch-1 ended Failed")  # noqa: B904 (raised during: the context)
    except RuntimeError as exc:
        assert exception_messages(exc) == "pod vllm-batch-1 ended Failed <- OSError: connection reset"
