from __future__ import annotations

import re
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_batch_provider.core.options import BudgetOptions, ChunkOptions, DeadlineOptions, FallbackLimits
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
    dag = build(max_attempts=1, poll=policy, deadline=DeadlineOptions("PT1H", "skip"))
    wait: Any = dag.get_task("w.wait")
    harvest: Any = dag.get_task("w.harvest")
    assert wait.partial_kwargs["poll"] is harvest.partial_kwargs["poll"] is policy
    assert harvest.partial_kwargs["deadline"].harvest_timeout_s >= 600


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
    dag = build(max_attempts=2, alerts=alerts, deadline=DeadlineOptions("PT1H", "skip"))
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
    dag = build(max_attempts=2, exhausted="sync", budget=BudgetOptions(budget_usd=5))
    publish: Any = dag.get_task("w.publish")
    assert (publish.exhausted, publish.budget.budget) == ("sync", 5)
    with pytest.raises(ConfigurationError, match="exhausted='dlq'"):
        build(exhausted="dlq")


def test_the_group_hands_each_task_its_options_as_one_object_each() -> None:
    chunking = ChunkOptions(max_requests=50, max_bytes=10_000, max_reject_ratio=0.2)
    deadline = DeadlineOptions("06:30 Europe/Berlin", "sync_fallback", margin_s=60, harvest_timeout_s=120)
    fallback = FallbackLimits(rpm=100, tpm=10_000, concurrency=4, headroom=0.8)
    budget = BudgetOptions(budget_usd="7.50", pricing_override={"openai": {}})
    dag = build(max_attempts=2, chunking=chunking, deadline=deadline, fallback=fallback, budget=budget)
    task: Any = dag.get_task
    for task_id in ("w.prepare", "w.resubmit_2"):
        assert task(task_id).chunking is chunking, task_id
    for task_id in ("w.prepare", "w.resubmit_2", "w.publish", "w.sync_fallback"):
        assert task(task_id).budget is budget, task_id
    for task_id in ("w.submit", "w.reconcile", "w.submit_2"):
        assert task(task_id).partial_kwargs["budget"] is budget, task_id
    assert task("w.publish").fallback is fallback and task("w.sync_fallback").limits is fallback
    assert task("w.submit").partial_kwargs["fallback"] is fallback
    # the tasks after the deadline task read the run's deadline from it; the rest of the options are the DAG's
    resolved = task("w.deadline_branch").deadline
    assert resolved == task("w.resubmit_2").deadline == task("w.harvest").partial_kwargs["deadline"]
    assert (resolved.policy, resolved.margin_s, resolved.harvest_timeout_s) == ("sync_fallback", 60, 120)
    assert task("w.deadline_branch").deadline_at == "{{ ti.xcom_pull(task_ids='w.deadline')['deadline'] }}"
    assert "deadline_at" in task("w.resubmit_2").template_fields
    assert task("w.wait").partial_kwargs["deadline_margin"] == 60
    # the pricing override is nowhere else: one object carries it
    assert not any("pricing_override" in vars(t) for t in dag.tasks if not hasattr(t, "partial_kwargs"))


def test_an_absolute_deadline_needs_no_deadline_task_and_each_task_reads_it_as_is() -> None:
    dag = build(max_attempts=2, deadline=DeadlineOptions("2026-01-01T06:30:00+00:00", "skip"))
    assert "w.deadline" not in dag.task_ids
    assert dag.get_task("w.deadline_branch").deadline_at == "2026-01-01T06:30:00+00:00"  # type: ignore[attr-defined]


def test_a_templated_deadline_is_rendered_once_per_run_by_the_deadline_task_and_every_task_reads_that() -> (
    None
):
    when = "{{ var.value.get('w_deadline', '') }}"
    dag = build(max_attempts=2, deadline=DeadlineOptions(when, "skip", margin_s=30))
    resolve: Any = dag.get_task("w.deadline")
    assert (resolve.when, resolve.spec, resolve.policy, resolve.margin_s) == (when, None, "skip", 30)
    assert resolve.downstream_task_ids >= {"w.prepare"}
    read = "{{ ti.xcom_pull(task_ids='w.deadline')['deadline'] }}"
    assert dag.get_task("w.deadline_branch").deadline_at == read  # type: ignore[attr-defined]
    assert dag.get_task("w.resubmit_2").deadline_at == read  # type: ignore[attr-defined]
    assert dag.get_task("w.wait").partial_kwargs["deadline"] == read  # type: ignore[attr-defined]


def test_a_templated_chunk_size_reaches_prepare_and_resubmit_unrendered() -> None:
    chunking = ChunkOptions(max_requests="{{ var.value.get('w_chunk', '20') }}")
    dag = build(max_attempts=2, chunking=chunking)
    assert dag.get_task("w.prepare").chunking is chunking  # type: ignore[attr-defined]
    assert dag.get_task("w.resubmit_2").chunking is chunking  # type: ignore[attr-defined]


def test_prepare_is_told_the_lane_the_group_built_so_it_can_check_the_connection_when_the_run_starts() -> (
    None
):
    assert build(max_attempts=1).get_task("w.prepare").lane == "provider"  # type: ignore[attr-defined]
    with DAG("t", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        batch_inference_group(
            workload="w",
            records="file:///x.jsonl",
            prompt=PROMPT,
            batch_conn_id="{{ var.value.w }}",
            lane="pod",
        )
    assert dag.get_task("w.prepare").lane == "pod"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("flat", "hint"),
    [
        (
            {"max_requests_per_chunk": 10},
            "max_requests_per_chunk= -> chunking=ChunkOptions(max_requests=...)",
        ),
        ({"pricing_override": "p.json"}, "pricing_override= -> budget=BudgetOptions(pricing_override=...)"),
        (
            {"fallback_rpm": 5, "deadline_margin": 3},
            "deadline_margin= -> deadline=DeadlineOptions(..., margin_s=...)",
        ),
    ],
)
def test_a_flat_keyword_of_the_old_form_is_refused_naming_the_option_object_it_moved_to(
    flat: dict[str, Any], hint: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(hint)):
        build(**flat)


def test_an_option_of_the_wrong_kind_is_refused_with_the_class_to_use() -> None:
    with pytest.raises(ConfigurationError, match=r"budget=5; give a BudgetOptions\(...\)"):
        build(budget=5)
    with pytest.raises(ConfigurationError, match=r"chunking=\{'max_requests': 5\}; give a ChunkOptions"):
        build(chunking={"max_requests": 5})


def test_the_upload_of_each_chunk_is_a_mapped_task_of_its_own_between_prepare_and_submit() -> None:
    dag = build(max_attempts=2)
    assert dag.get_task("w.upload").downstream_task_ids == {"w.submit"}
    assert dag.get_task("w.submit").upstream_task_ids == {"w.upload"}
    assert dag.get_task("w.upload").upstream_task_ids == {"w.prepare"}
    assert dag.get_task("w.upload_2").upstream_task_ids == {"w.resubmit_2"}


def test_each_sink_adds_one_deliver_task_after_publish_and_two_sinks_of_one_name_are_refused() -> None:
    from airflow_batch_provider.sinks import SqlUpsertSink

    labels = SqlUpsertSink(
        conn_id="db", table="public.tickets", key_columns=["id"], columns={"label": "$.label"}
    )
    scores = SqlUpsertSink(
        conn_id="db", table="scores", key_columns=["id"], columns={"score": "$.score"}, name="s"
    )
    for deadline in (None, DeadlineOptions("PT2H", "publish_pending")):
        dag = build(sinks=[labels, scores], deadline=deadline)
        for task_id in ("w.deliver_public_tickets", "w.deliver_s"):
            assert dag.get_task(task_id).upstream_task_ids == {"w.publish"}
    with pytest.raises(ConfigurationError, match="two sinks are named 'scores'"):
        build(
            sinks=[scores.__class__(conn_id="db", table="scores", key_columns=["id"], columns={"a": "$"})] * 2
        )
    with pytest.raises(ConfigurationError, match="give sink objects"):
        build(sinks=["db.tickets"])


def test_a_consumer_among_the_sinks_adds_its_deliver_task_after_publish_and_shares_the_sinks_names() -> None:
    from airflow_batch_provider.operators.consume import BatchConsumeOperator
    from airflow_batch_provider.operators.deliver import BatchDeliverOperator
    from airflow_batch_provider.sinks import Consumer, SqlUpsertSink

    labels = SqlUpsertSink(conn_id="db", table="tickets", key_columns=["id"], columns={"label": "$.label"})
    escalations = Consumer("escalations", print, where=lambda h: h.output["label"] == "negative")
    dag = build(sinks=[labels, escalations], ledger_conn_id="ledger_pg")
    consume = dag.get_task("w.deliver_escalations")
    assert isinstance(consume, BatchConsumeOperator) and consume.consumer is escalations
    assert isinstance(dag.get_task("w.deliver_tickets"), BatchDeliverOperator)
    assert consume.upstream_task_ids == {"w.publish"} and consume.ledger_conn_id == "ledger_pg"
    with pytest.raises(ConfigurationError, match="two sinks are named 'tickets'"):
        build(sinks=[labels, Consumer("tickets", print)])
