from __future__ import annotations

from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.pipeline import batch_inference_group, default_poll_policy

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}")


def build(**kw: object) -> DAG:
    with DAG("t", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        batch_inference_group(workload="w", records="file:///x.jsonl", prompt=PROMPT, batch_conn_id="c", **kw)  # type: ignore[arg-type]
    return dag


def test_one_round_per_attempt_then_publish() -> None:
    dag = build(max_attempts=3, poll=PollPolicy(initial_interval=1))
    ids = set(dag.task_ids)
    for suffix in ("", "_2", "_3"):
        assert {f"w.submit{suffix}", f"w.wait{suffix}", f"w.download{suffix}", f"w.reconcile{suffix}"} <= ids
    assert {"w.prepare", "w.resubmit_2", "w.resubmit_3", "w.publish"} <= ids
    assert "w.resubmit_4" not in ids


def test_rounds_with_nothing_to_resubmit_do_not_block_the_rest() -> None:
    dag = build(max_attempts=2)
    assert dag.get_task("w.resubmit_2").trigger_rule == "none_failed"
    assert dag.get_task("w.publish").trigger_rule == "none_failed"
    assert dag.get_task("w.wait").partial_kwargs["deferrable"] is True


def test_max_attempts_below_one_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts=0"):
        build(max_attempts=0)


def test_the_default_poll_policy_comes_from_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__POLL_INITIAL_INTERVAL", "7")
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__POLL_MAX_INTERVAL", "70")
    policy = default_poll_policy()
    assert (policy.initial_interval, policy.max_interval) == (7.0, 70.0)


def test_the_run_takes_the_workload_lease_before_prepare() -> None:
    dag = build(max_attempts=1)
    assert dag.get_task("w.lease").downstream_task_ids == {"w.prepare"}
    assert dag.get_task("w.lease").upstream_task_ids == set()


def test_the_sensor_and_the_harvest_poll_with_the_same_policy_and_the_harvest_waits_ten_minutes() -> None:
    policy = PollPolicy(initial_interval=2)
    dag = build(max_attempts=1, poll=policy, deadline="PT1H", deadline_policy="skip")
    wait: Any = dag.get_task("w.wait")
    harvest: Any = dag.get_task("w.harvest")
    assert wait.partial_kwargs["poll"] is harvest.partial_kwargs["poll"] is policy
    assert harvest.partial_kwargs["harvest_timeout"] >= 600


@pytest.mark.parametrize("workload", ["../..", "a/b", "", "x" * 101])  # hostile input
def test_a_workload_name_that_could_leave_the_staging_root_is_refused_with_the_rule(workload: str) -> None:
    with (
        pytest.raises(ConfigurationError, match="is not a valid workload name"),
        DAG("t", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")),
    ):
        batch_inference_group(workload=workload, records="file:///x.jsonl", prompt=PROMPT, batch_conn_id="c")


def test_a_workload_with_a_dot_gets_a_group_id_airflow_accepts() -> None:
    with DAG("t", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        batch_inference_group(
            workload="team.feedback", records="file:///x.jsonl", prompt=PROMPT, batch_conn_id="c"
        )
    assert "team_feedback.prepare" in dag.task_ids
    assert dag.get_task("team_feedback.prepare").workload == "team.feedback"  # type: ignore[attr-defined]


def test_the_group_hands_its_alerts_to_every_task_that_raises_an_event() -> None:
    from airflow_batch_provider.notifications import BatchAlerts

    alerts = BatchAlerts(notifiers=[lambda context, event: None])
    dag = build(max_attempts=2, alerts=alerts, deadline="PT1H", deadline_policy="skip")
    for task_id in ("w.prepare", "w.resubmit_2", "w.publish", "w.deadline_branch"):
        assert dag.get_task(task_id).alerts is alerts, task_id  # type: ignore[attr-defined]
    for task_id in ("w.submit", "w.wait", "w.harvest", "w.submit_2", "w.wait_2"):
        assert dag.get_task(task_id).partial_kwargs["alerts"] is alerts, task_id  # type: ignore[attr-defined]


def test_the_group_turns_deferral_on_whatever_the_operators_default() -> None:
    dag = build(max_attempts=1)
    assert dag.get_task("w.wait").partial_kwargs["deferrable"] is True  # type: ignore[attr-defined]
    assert build(max_attempts=1, deferrable=False).get_task("w.wait").partial_kwargs["deferrable"] is False  # type: ignore[attr-defined]


def test_the_connection_may_be_chosen_at_run_time_from_a_template() -> None:
    conn = "{{ var.value.get('w_conn_id', 'openai_batch_default') }}"
    with DAG("t", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        batch_inference_group(workload="w", records="file:///x.jsonl", prompt=PROMPT, batch_conn_id=conn)
    assert "batch_conn_id" in dag.get_task("w.prepare").template_fields
    assert "batch_conn_id" in dag.get_task("w.wait").template_fields


def test_the_exhausted_route_is_handed_to_publish_and_an_unknown_one_is_refused() -> None:
    dag = build(max_attempts=2, exhausted="sync", budget_usd=5)
    publish: Any = dag.get_task("w.publish")
    assert (publish.exhausted, publish.budget_usd) == ("sync", 5)
    with pytest.raises(ConfigurationError, match="exhausted='dlq'"):
        build(exhausted="dlq")
