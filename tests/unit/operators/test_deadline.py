"""The deadline tasks: resolve, harvest (cancel against the emulator), branch, settle; and the group shape."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pendulum
import pytest

from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef, InputRef
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.deadline import DeadlineSpec
from airflow_batch_provider.core.options import DeadlineOptions
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.operators.batch import BatchResubmitOperator
from airflow_batch_provider.operators.deadline import (
    BatchDeadlineBranchOperator,
    BatchDeadlineHarvestOperator,
    BatchDeadlineOperator,
    BatchDeadlineSettleOperator,
)
from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.faults import FaultConfig
from batch_emulator.testing import run_emulator

WORKLOAD = "wl"
RUN = "run1"
PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", params={"max_tokens": 8})
NOW = datetime.now(timezone.utc)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    led.start_run(WORKLOAD, RUN, "openai", PROMPT.model)
    items = [PreparedItem(f"c{i}", PROMPT.render({"id": f"c{i}", "text": f"t{i}"})) for i in range(4)]
    led.upsert_items(WORKLOAD, RUN, items)
    return led


def _inject(op: Any, **props: Any) -> Any:
    op.__dict__.update(props)  # cached_property values: the real ledger/adapter, no connection
    return op


def _branch(ledger: Ledger, deadline: datetime) -> BatchDeadlineBranchOperator:
    op = BatchDeadlineBranchOperator(
        task_id="deadline_branch",
        workload=WORKLOAD,
        ledger_conn_id=None,
        deadline=DeadlineOptions(deadline.isoformat(), "skip", margin_s=5),
        publish_task_id="g.publish",
        policy_task_id="g.skip_unfinished",
    )
    _inject(op, ledger=ledger)
    return op


def test_the_deadline_task_resolves_the_run_deadline_from_its_start() -> None:
    spec = DeadlineSpec.parse("PT15S", "skip", margin_s=5)
    start = pendulum.datetime(2026, 3, 1, 2, 0, tz="UTC")
    op = BatchDeadlineOperator(task_id="deadline", spec=spec)
    out = op.execute({"dag_run": SimpleNamespace(start_date=start, logical_date=None)})  # type: ignore[arg-type]
    assert out == {
        "deadline": "2026-03-01T02:00:15+00:00",
        "stop_at": "2026-03-01T02:00:10+00:00",
        "policy": "skip",
        "margin_s": 5.0,
    }


def test_the_deadline_task_anchors_a_time_of_day_to_the_logical_date() -> None:
    spec = DeadlineSpec.parse("06:30 Europe/Berlin", "sync_fallback")
    run = SimpleNamespace(start_date=pendulum.datetime(2026, 3, 1, 9, 0, tz="UTC"))
    out = BatchDeadlineOperator(task_id="deadline", spec=spec).execute(
        {"dag_run": run, "logical_date": pendulum.datetime(2026, 3, 1, 1, 0, tz="UTC")}  # type: ignore[arg-type]
    )
    assert out["deadline"] == "2026-03-01T05:30:00+00:00"  # already past at the late start


def test_the_branch_publishes_when_every_item_is_done(ledger: Ledger) -> None:
    ledger.transition(WORKLOAD, RUN, "skipped", ["pending"])
    assert _branch(ledger, NOW - timedelta(hours=1)).choose_branch({"run_id": RUN}) == "g.publish"  # type: ignore[arg-type]


def test_the_branch_publishes_while_the_deadline_is_ahead(ledger: Ledger) -> None:
    assert _branch(ledger, NOW + timedelta(hours=1)).choose_branch({"run_id": RUN}) == "g.publish"  # type: ignore[arg-type]


def test_the_branch_takes_the_policy_once_the_deadline_minus_margin_passed(ledger: Ledger) -> None:
    soon = datetime.now(timezone.utc) + timedelta(seconds=2)  # within the 5 s margin
    assert _branch(ledger, soon).choose_branch({"run_id": RUN}) == "g.skip_unfinished"  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["pending", "skipped"])
def test_settling_moves_open_items_and_sends_exhausted_ones_to_review(ledger: Ledger, state: str) -> None:
    rows = list(ledger.iter_items(WORKLOAD, RUN, columns=["app_id"]))
    keys = [(r["item_key"], r["prompt_version"]) for r in rows]
    ledger.transition(WORKLOAD, RUN, "staged", ["pending"], keys=keys[:3])
    ledger.transition(WORKLOAD, RUN, "submitted", ["staged"], keys=keys[:3])
    ledger.transition(WORKLOAD, RUN, "failed_retryable", ["submitted"], keys=keys[:1], attempts=2)
    ledger.transition(WORKLOAD, RUN, "cancelled", ["submitted"], keys=keys[1:2])
    ledger.transition(WORKLOAD, RUN, "succeeded", ["submitted"], keys=keys[2:3])
    op = _inject(
        BatchDeadlineSettleOperator(task_id="settle", workload=WORKLOAD, state=state, max_attempts=2),
        ledger=ledger,
    )
    out = op.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert out["review"] == 1
    assert ledger.count_states(WORKLOAD, RUN) == {"review": 1, state: 2, "succeeded": 1}
    (cut,) = list(ledger.iter_items(WORKLOAD, RUN, states=["cancelled", state], columns=["error_code"]))[:1]
    assert cut["error_code"] in ("deadline", None)


def test_settling_refuses_other_states() -> None:
    with pytest.raises(ConfigurationError, match="'pending' or 'skipped'"):
        BatchDeadlineSettleOperator(task_id="s", workload=WORKLOAD, state="review", max_attempts=1)


def test_no_resubmission_round_starts_after_the_deadline(ledger: Ledger) -> None:
    op = BatchResubmitOperator(
        task_id="resubmit_2",
        workload=WORKLOAD,
        round_number=2,
        max_attempts=3,
        deadline=DeadlineOptions((NOW - timedelta(seconds=1)).isoformat(), "skip"),
    )
    assert _inject(op, ledger=ledger).execute({"run_id": RUN}) == []  # type: ignore[arg-type]


@pytest.fixture
def slow_emulator() -> Iterator[str]:
    """An emulator whose first batch finishes a tenth of its items and then stalls until cancelled."""
    timings = Timings(validating_s=0.2, in_progress_s=3.0, finalizing_s=0.2, cancelling_s=1.0)
    faults = FaultConfig(stuck_batches=(0,), stuck_after_fraction=0.1)
    with run_emulator(EmulatorConfig(time_scale=1.0, timings=timings, faults=faults)) as url:
        yield url


def _wait_until_items_finished(url: str, batch_id: str, n: int) -> None:
    """Poll the emulator until ``n`` items of the batch are done (the emulator decides, not a sleep)."""
    while True:
        counts = httpx.get(f"{url}/v1/batches/{batch_id}", headers={"Authorization": "Bearer k"}).json()
        done = counts["request_counts"]["completed"] + counts["request_counts"]["failed"]
        if done >= n:
            return
        time.sleep(0.1)


def _submit(adapter: OpenAIBatchAdapter, n: int) -> BatchRef:
    import io

    lines = b"\n".join(
        adapter.format_line(
            CanonicalRequest(f"c{i}", "v1", "gpt-4o-mini", messages=({"role": "user", "content": f"x{i}"},)),
            f"c{i}__a1c0",
        )
        for i in range(n)
    )
    ref: InputRef = adapter.stage(io.BytesIO(lines), "k.jsonl", len(lines))
    return adapter.submit(ref, "key-1", {"w": "t"})


def test_the_harvest_passes_a_finished_batch_through(ledger: Ledger) -> None:
    op = BatchDeadlineHarvestOperator(
        task_id="harvest", workload=WORKLOAD, batch={"job_id": "j", "deadline": False}
    )
    assert op.execute({"run_id": RUN}) == {"job_id": "j", "deadline": False}  # type: ignore[arg-type]


def test_the_harvest_cancels_a_batch_cut_short_and_waits_for_its_partial_results(
    ledger: Ledger, slow_emulator: str
) -> None:
    adapter = OpenAIBatchAdapter(AdapterSettings(api_key="k", base_url=f"{slow_emulator}/v1"))
    ref = _submit(adapter, 30)
    _wait_until_items_finished(slow_emulator, ref.batch_id, 3)  # 3 of 30 done, then the batch stalls
    batch = {
        "job_id": "j",
        "batch_id": ref.batch_id,
        "idempotency_key": ref.idempotency_key,
        "deadline": True,
    }
    op = _inject(
        BatchDeadlineHarvestOperator(
            task_id="harvest",
            workload=WORKLOAD,
            batch=batch,
            poll=PollPolicy(initial_interval=0.2, factor=1.0, max_interval=0.2),
        ),
        ledger=ledger,
        adapter=adapter,
    )
    out = op.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert out["state"] == "cancelled" and out["harvested"] is True
    outcomes = [r.outcome for r in adapter.iter_results(ref)]  # type: ignore[union-attr]
    assert len(outcomes) == 30
    assert 0 < outcomes.count("succeeded") <= 3
    assert outcomes.count("cancelled") == 30 - outcomes.count("succeeded")


def test_a_deadline_without_its_policy_or_with_an_unknown_one_is_refused_when_the_dag_is_parsed() -> None:
    from airflow.sdk import DAG

    from airflow_batch_provider.pipeline import batch_inference_group

    with pytest.raises(ConfigurationError, match="without deadline_policy"):
        DeadlineOptions("PT1H", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'later' is not one of"):
        DeadlineOptions("PT1H", "later")  # type: ignore[arg-type]
    common: dict[str, Any] = {"workload": "w", "records": "x.jsonl", "prompt": PROMPT, "batch_conn_id": "c"}
    with DAG(dag_id="d1", schedule=None), pytest.raises(ConfigurationError, match="give DeadlineOptions"):
        batch_inference_group(deadline="PT1H", **common)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "task"),
    [("sync_fallback", "sync_fallback"), ("publish_pending", "keep_pending"), ("skip", "skip_unfinished")],
)
def test_the_group_routes_the_deadline_branch_to_the_policy_task_then_publish(policy: str, task: str) -> None:
    from airflow.sdk import DAG

    from airflow_batch_provider.pipeline import batch_inference_group

    with DAG(dag_id=f"d_{policy}", schedule=None) as dag:
        batch_inference_group(
            workload="w",
            records="x.jsonl",
            prompt=PROMPT,
            batch_conn_id="c",
            max_attempts=2,
            deadline=DeadlineOptions("06:30 Europe/Berlin", policy),  # type: ignore[arg-type]
        )
    ids = set(dag.task_ids)
    assert {"w.deadline", "w.harvest", "w.harvest_2", "w.deadline_branch", f"w.{task}", "w.publish"} <= ids
    assert dag.get_task("w.deadline").downstream_task_ids == {"w.prepare"}
    assert dag.get_task("w.deadline_branch").downstream_task_ids == {f"w.{task}", "w.publish"}
    assert dag.get_task(f"w.{task}").downstream_task_ids == {"w.publish"}
    wait: Any = dag.get_task("w.wait")
    assert wait.partial_kwargs["deadline"] == "{{ ti.xcom_pull(task_ids='w.deadline')['deadline'] }}"


def test_a_deadline_passed_with_items_open_is_told_once_by_the_branch_and_a_deadline_ahead_is_not(
    ledger: Ledger,
) -> None:
    from airflow.sdk import DAG

    from airflow_batch_provider.notifications import BatchAlerts, BatchEvent

    heard: list[BatchEvent] = []
    alerts = BatchAlerts(notifiers=[lambda context, event: heard.append(event)])
    context: Any = {"run_id": RUN, "dag": DAG("nightly", schedule=None)}
    ahead = _branch(ledger, NOW + timedelta(hours=1))
    ahead.alerts = alerts
    assert ahead.choose_branch(context) == "g.publish"
    assert heard == []
    passed = _branch(ledger, NOW - timedelta(hours=1))
    passed.alerts = alerts
    assert passed.choose_branch(context) == "g.skip_unfinished"
    (event,) = heard
    assert (event.kind, event.details["open_items"], event.dag_id) == ("deadline_missed", 4, "nightly")


TEMPLATE = "{{ params.deadline }}"


def resolve_template(rendered: str, policy: str = "sync_fallback", margin_s: float = 0.0) -> dict[str, Any]:
    """Run the deadline task with a templated deadline, rendered as the task runner would."""
    op = BatchDeadlineOperator(task_id="deadline", when=TEMPLATE, policy=policy, margin_s=margin_s)  # type: ignore[arg-type]
    start = pendulum.datetime(2026, 3, 1, 2, 0, tz="UTC")
    ctx = {"dag_run": SimpleNamespace(start_date=start, logical_date=start), "params": {"deadline": rendered}}
    op.render_template_fields(ctx)  # type: ignore[arg-type]
    return op.execute(ctx)  # type: ignore[arg-type,no-any-return]


def test_a_templated_deadline_that_renders_to_a_rule_is_resolved_for_this_run() -> None:
    out = resolve_template("PT2H", margin_s=60)
    assert (out["deadline"], out["stop_at"]) == ("2026-03-01T04:00:00+00:00", "2026-03-01T03:59:00+00:00")
    assert resolve_template("06:30 UTC")["deadline"] == "2026-03-01T06:30:00+00:00"


def test_a_templated_deadline_that_renders_to_a_moment_is_that_moment() -> None:
    assert resolve_template("2026-03-01T05:00:00+00:00")["deadline"] == "2026-03-01T05:00:00+00:00"


def test_a_templated_deadline_that_renders_to_nothing_means_no_deadline_this_run_all_the_way_down(
    ledger: Ledger,
) -> None:
    out = resolve_template("  ")
    assert (out["deadline"], out["stop_at"], out["policy"]) == ("", "", "sync_fallback")
    # what each later task renders from that XCom: an empty deadline, which each reads as none
    branch = BatchDeadlineBranchOperator(
        task_id="deadline_branch",
        workload=WORKLOAD,
        ledger_conn_id=None,
        deadline=DeadlineOptions("{{ params.at }}", "sync_fallback"),
        publish_task_id="g.publish",
        policy_task_id="g.sync_fallback",
    )
    _inject(branch, ledger=ledger)
    branch.render_template_fields({"params": {"at": out["deadline"]}})  # type: ignore[arg-type]
    assert ledger.count_states(WORKLOAD, RUN) == {"pending": 4}  # open items, yet no deadline
    assert branch.choose_branch({"run_id": RUN}) == "g.publish"  # type: ignore[arg-type]
    resubmit = BatchResubmitOperator(
        task_id="resubmit_2",
        workload=WORKLOAD,
        round_number=2,
        max_attempts=2,
        deadline=DeadlineOptions("{{ params.at }}", "sync_fallback"),
    )
    resubmit.render_template_fields({"params": {"at": out["deadline"]}})  # type: ignore[arg-type]
    assert resubmit.deadline_at == ""
    from airflow_batch_provider.core.deadline import deadline_passed

    assert not deadline_passed(resubmit.deadline_at, 0.0, NOW + timedelta(days=3650))


def test_a_templated_deadline_that_renders_to_something_unreadable_fails_naming_the_template_and_value() -> (
    None
):
    with pytest.raises(
        ConfigurationError, match=r"'\{\{ params.deadline \}\}' rendered to 'soon' for this run"
    ):
        resolve_template("soon")


def test_the_deadline_task_takes_a_spec_or_a_template_not_both_nor_neither() -> None:
    spec = DeadlineSpec.parse("PT1H", "skip")
    with pytest.raises(ConfigurationError, match="give exactly one"):
        BatchDeadlineOperator(task_id="deadline", spec=spec, when=TEMPLATE, policy="skip")
    with pytest.raises(ConfigurationError, match="give exactly one"):
        BatchDeadlineOperator(task_id="deadline")
    with pytest.raises(ConfigurationError, match="without deadline_policy"):
        BatchDeadlineOperator(task_id="deadline", when=TEMPLATE)
