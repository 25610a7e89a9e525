"""The vLLM version a pod ran, read from its log and judged against the lane's minimum."""

# ruff: noqa: F811  (the fixtures ``api`` and ``ledger`` of test_vllm_pod, imported by name)

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.adapters.vllm_engine import logged_version, version_problem
from airflow_batch_provider.ledger import Ledger
from tests.support.kube_api import KubeApi, PodFault
from tests.unit.operators.test_vllm_pod import JOB_ID, api, context, ledger, operator  # noqa: F401

pytest.importorskip("airflow.providers.cncf.kubernetes")


@pytest.mark.parametrize(
    ("log", "version"),
    [
        ("INFO 12-02 [run_batch.py:26] vLLM batch processing API version 0.33.0\n", (0, 33, 0)),
        ("(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: m", (0, 32, 0)),
        ("INFO vLLM batch processing API version 0.31.2+cu128\n", (0, 31, 2)),
        ("INFO Loading model\n", None),
    ],
)  # fmt: skip
def test_the_version_is_read_from_the_engine_s_start_lines(
    log: str, version: tuple[int, int, int] | None
) -> None:
    assert logged_version(log) == version


def test_a_version_below_the_minimum_is_named_with_the_remedy_and_a_supported_one_is_not() -> None:
    problem = version_problem((0, 31, 2), "vllm/vllm-openai:latest")
    assert (
        problem is not None and "vLLM 0.31.2" in problem and "older than the lane's minimum 0.32.0" in problem
    )
    assert "vllm/vllm-openai:v0.33.0" in problem  # the remedy
    assert version_problem((0, 32, 0), "x") is None and version_problem(None, "x") is None


def test_a_pod_whose_log_names_an_engine_below_the_minimum_says_so_in_the_task_log_and_the_job(
    tmp_path: Path, api: KubeApi, ledger: Ledger, capfd: pytest.CaptureFixture[str]
) -> None:
    api.add_fault(PodFault("env", env={"FAKE_VLLM_VERSION": "0.31.0", "FAKE_VLLM_CRASH_AFTER": "2"}))
    result = operator(tmp_path).execute(context())  # type: ignore[arg-type]
    assert result["state"] == "failed"
    job = ledger.get_job(JOB_ID)
    assert job.error is not None and job.error.startswith("exit_1")
    assert "the pod's engine is vLLM 0.31.0" in job.error and "older than the lane's minimum" in job.error
    out, err = capfd.readouterr()
    assert "job w:" in out + err and "the pod's engine is vLLM 0.31.0" in out + err  # the task log
