"""The pipeline picks the pod lane from the connection's adapter, nothing else."""

from __future__ import annotations

import json

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_batch_provider.core.options import DeadlineOptions
from airflow_batch_provider.kubernetes.lane import runs_in_pod
from airflow_batch_provider.pipeline import batch_inference_group


@pytest.fixture(autouse=True)
def connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU", json.dumps({"conn_type": "vllm_kubernetes", "extra": {}}))
    monkeypatch.setenv("AIRFLOW_CONN_OAI", json.dumps({"conn_type": "openai_batch", "password": "k"}))


def test_only_a_connection_whose_adapter_runs_in_a_pod_selects_the_pod_lane() -> None:
    assert runs_in_pod("gpu") is True
    assert runs_in_pod("oai") is False
    assert runs_in_pod("not_defined_yet") is False


def build(conn_id: str, **kwargs: object) -> set[str]:
    with DAG("d", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None) as dag:
        batch_inference_group(
            workload="w", records="x.jsonl", prompt="p.yaml", batch_conn_id=conn_id, max_attempts=2, **kwargs
        )  # type: ignore[arg-type]
    return {t.task_id.split(".", 1)[1] for t in dag.tasks}


def test_switching_the_connection_swaps_submit_and_wait_for_a_pod_task_and_keeps_the_rest() -> None:
    provider = build("oai")
    hosted = build("gpu")
    assert provider - hosted == {"upload", "submit", "wait", "upload_2", "submit_2", "wait_2"}
    assert hosted - provider == {"run", "run_2"}
    assert {
        "prepare",
        "download",
        "reconcile",
        "resubmit_2",
        "download_2",
        "reconcile_2",
        "publish",
    } <= hosted


def test_a_deadline_on_the_pod_lane_reaches_every_round_s_pod_task_with_its_margin() -> None:
    with DAG("d", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None) as dag:
        batch_inference_group(
            workload="w",
            records="x.jsonl",
            prompt="p.yaml",
            batch_conn_id="gpu",
            max_attempts=2,
            deadline=DeadlineOptions("PT4H", "skip", margin_s=30),
        )
    for task_id in ("w.run", "w.run_2"):
        kwargs = dag.get_task(task_id).partial_kwargs  # type: ignore[attr-defined]
        assert "xcom_pull(task_ids='w.deadline')" in kwargs["deadline"]
        assert kwargs["deadline_margin"] == 30
    assert {"w.deadline_branch", "w.skip_unfinished"} <= {t.task_id for t in dag.tasks}
