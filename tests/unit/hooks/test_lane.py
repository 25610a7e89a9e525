"""The pipeline builds the lane it is told (or, for ``auto``, the connection's), and a run refuses the wrong one."""

from __future__ import annotations

import json

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_batch_provider.core.options import BuiltLane, DeadlineOptions
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.lane import built_lane, check_conn_lane, runs_in_pod
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
            workload="w",
            records="x.jsonl",
            prompt=PromptTemplate(version="v1", model="m", user="{{ text }}"),
            batch_conn_id=conn_id,
            max_attempts=2,
            **kwargs,
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
            prompt=PromptTemplate(version="v1", model="m", user="{{ text }}"),
            batch_conn_id="gpu",
            max_attempts=2,
            deadline=DeadlineOptions("PT4H", "skip", margin_s=30),
        )
    for task_id in ("w.run", "w.run_2"):
        kwargs = dag.get_task(task_id).partial_kwargs  # type: ignore[attr-defined]
        assert "xcom_pull(task_ids='w.deadline')" in kwargs["deadline"]
        assert kwargs["deadline_margin"] == 30
    assert {"w.deadline_branch", "w.skip_unfinished"} <= {t.task_id for t in dag.tasks}


TEMPLATED = "{{ var.value.get('eval_conn', 'gpu') }}"


@pytest.fixture
def no_connection_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) every connection the Task SDK is asked for."""
    from airflow.sdk.execution_time import context

    asked: list[str] = []

    def refuse(conn_id: str) -> None:
        asked.append(conn_id)
        raise RuntimeError(f"connection {conn_id!r} read")

    monkeypatch.setattr(context, "_get_connection", refuse)
    return asked


def test_the_pod_lane_is_built_from_a_templated_connection_without_reading_any_connection(
    no_connection_read: list[str],
) -> None:
    with DAG("d", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), schedule=None) as dag:
        batch_inference_group(
            workload="w",
            records="x.jsonl",
            prompt=PromptTemplate(version="v1", model="m", user="{{ text }}"),
            batch_conn_id=TEMPLATED,
            lane="pod",
            max_attempts=2,
        )
    ids = {t.task_id for t in dag.tasks}
    assert {"w.run", "w.run_2"} <= ids and not {"w.submit", "w.wait", "w.upload"} & ids
    assert dag.get_task("w.run").partial_kwargs["batch_conn_id"] == TEMPLATED  # type: ignore[attr-defined]
    assert dag.get_task("w.prepare").lane == "pod"  # type: ignore[attr-defined]
    assert no_connection_read == []


def test_an_explicit_provider_lane_reads_no_connection_and_prepare_checks_it_when_the_run_starts(
    no_connection_read: list[str],
) -> None:
    assert build("gpu", lane="provider") >= {"upload", "submit", "wait"}
    assert no_connection_read == []


def test_auto_reads_a_literal_connection_at_parse_time_and_takes_a_template_for_a_provider() -> None:
    assert built_lane("auto", "gpu") == "pod"
    assert built_lane("auto", "oai") == "provider"
    assert built_lane("auto", TEMPLATED) == "provider"  # as before lanes were explicit
    assert built_lane("pod", "oai") == "pod"  # explicit: not read; prepare refuses it at run time


def test_an_unknown_lane_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match=r"lane='gpu' is not one of \['auto', 'provider', 'pod'\]"):
        build("gpu", lane="gpu")


@pytest.mark.parametrize(
    ("conn_id", "lane", "conn_type", "fix"),
    [("oai", "pod", "openai_batch", "lane='provider'"), ("gpu", "provider", "vllm_kubernetes", "lane='pod'")],
)
def test_a_connection_of_the_other_lane_is_refused_naming_it_its_type_the_lane_and_the_fix(
    conn_id: str, lane: BuiltLane, conn_type: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_conn_lane(conn_id, lane)
    message = str(refused.value)
    for part in (repr(conn_id), repr(conn_type), f"built the {lane} lane", fix, "before submitting anything"):
        assert part in message, message


def test_a_connection_of_the_lane_built_passes_and_its_type_is_returned() -> None:
    assert check_conn_lane("gpu", "pod") == "vllm_kubernetes"
    assert check_conn_lane("oai", "provider") == "openai_batch"
