"""The status sensor's two paths (worker polling and deferral) share one decision object."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.exceptions import PollError
from airflow_batch_provider.sensors.batch import BatchStatusSensor
from airflow_batch_provider.services import submit
from airflow_batch_provider.triggers.batch import BatchStatusTrigger
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator
from tests.unit.services.workload import RUN, WORKLOAD, World, world

REQUEST = CanonicalRequest("a1", "v1", "gpt-4o-mini", messages=({"role": "user", "content": "great"},))
FAST = PollPolicy(initial_interval=0.05, factor=1.0, max_interval=0.05)


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    with run_emulator(EmulatorConfig(time_scale=0.02)) as url:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SENSOR_EMU",
            json.dumps({"conn_type": "openai_batch", "host": f"{url}/v1", "password": "k"}),
        )
        yield url


def submitted(url: str, key: str) -> dict[str, Any]:
    adapter = OpenAIBatchAdapter(AdapterSettings("k", f"{url}/v1"))
    data = adapter.format_line(REQUEST, "a1__a1c0") + b"\n"
    ref = adapter.submit(adapter.stage(io.BytesIO(data), f"{key}.jsonl", len(data)), key, {})
    return {
        "job_id": f"job-{key}",
        "batch_id": ref.batch_id,
        "idempotency_key": key,
        "submitted_at": time.time(),
    }


def sensor(batch: dict[str, Any], **kw: Any) -> BatchStatusSensor:
    return BatchStatusSensor(task_id="wait", batch=batch, batch_conn_id="sensor_emu", poll=FAST, **kw)


def test_polling_in_the_worker_returns_the_terminal_state_and_counts(emulator: str) -> None:
    result = sensor(submitted(emulator, "k1"), deferrable=False).execute({})  # type: ignore[arg-type]
    assert result["state"] == "completed"
    assert result["deadline"] is False
    assert result["counts"] == {"total": 1, "completed": 1, "failed": 0}


def test_a_batch_that_failed_at_the_provider_ends_the_wait_with_its_cause_instead_of_failing_the_task(
    emulator: str,
) -> None:
    httpx.put(f"{emulator}/_emulator/config", json={"faults": {"fail_validation": 1}}).raise_for_status()
    result = sensor(submitted(emulator, "k2"), deferrable=False).execute({})  # type: ignore[arg-type]
    assert result["state"] == "failed"
    assert result["deadline"] is False
    assert result["error_code"]


def test_the_deadline_ends_the_wait_without_failing(emulator: str) -> None:
    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 100.0}).raise_for_status()
    past = "2026-01-01T00:00:00+00:00"
    result = sensor(submitted(emulator, "k3"), deferrable=False, deadline=past).execute({})  # type: ignore[arg-type]
    assert result["deadline"] is True
    assert result["state"] in {"validating", "in_progress"}


def test_the_deferrable_path_hands_the_same_policy_to_the_trigger(emulator: str) -> None:
    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 100.0}).raise_for_status()
    batch = submitted(emulator, "k4")
    with pytest.raises(TaskDeferred) as deferred:
        sensor(batch, deferrable=True).execute({})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, BatchStatusTrigger)
    assert trigger.batch_id == batch["batch_id"]
    assert PollPolicy.from_dict(trigger.policy).initial_interval == FAST.initial_interval
    assert deferred.value.method_name == "execute_complete"


def test_a_trigger_that_gave_up_fails_the_task_with_its_reason(emulator: str) -> None:
    event = {"status": "give_up", "batch": None, "reason": "6 status errors in a row (limit 5)", "polls": 6}
    with pytest.raises(
        PollError, match=r"stopped waiting for batch .*: 6 status errors in a row \(limit 5\)\."
    ):
        sensor(submitted(emulator, "k5")).execute_complete({}, event)  # type: ignore[arg-type]


def test_a_finished_trigger_event_resumes_with_the_batch_state(emulator: str) -> None:
    batch = submitted(emulator, "k6")
    event = {
        "status": "done",
        "batch": {"state": "expired", "total": 4, "completed": 2, "failed": 0},
        "polls": 3,
    }
    result = sensor(batch).execute_complete({}, event)  # type: ignore[arg-type]
    assert (result["state"], result["counts"]["completed"]) == ("expired", 2)


# ---------------------------------------------------------------------------- jobs in doubt


def in_doubt_sensor(
    w: World, job_id: str, script: str, **kw: Any
) -> tuple[BatchStatusSensor, dict[str, Any]]:
    w.upload(job_id)
    w.arm(script)
    sub = submit.submit_job(ledger=w.ledger, adapter=w.adapter, staging=w.staging, job_id=job_id, owner="t1")
    assert sub.in_doubt
    op = BatchStatusSensor(
        task_id="wait", batch=sub.to_xcom(w.adapter.name, "k"), poll=FAST, deferrable=False, **kw
    )
    op.__dict__.update(ledger=w.ledger, adapter=w.adapter, staging=w.staging)  # the real ones, no connection
    return op, sub.to_xcom(w.adapter.name, "k")


CONTEXT: Any = {"run_id": RUN, "ti": SimpleNamespace(dag_id="d", task_id="wait", map_index=0, try_number=1)}


def test_a_job_still_in_doubt_at_the_deadline_sends_its_items_to_review_and_is_never_created_again(
    tmp_path: Path,
) -> None:
    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        (manifest,) = w.stage(3)
        op, _ = in_doubt_sensor(
            w, manifest["job_id"], "create:500_after", deadline="2026-01-01T00:00:00+00:00"
        )
        result = op.execute(CONTEXT)
        assert (result["in_doubt"], result["deadline"], result["batch_id"]) == (True, True, None)
        rows = list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state", "error_code"]))
        assert {(r["state"], r["error_code"]) for r in rows} == {("review", "in_doubt")}
        assert w.batches_created() == 1


def test_the_wait_attaches_to_the_batch_of_a_job_in_doubt_once_the_provider_shows_it(tmp_path: Path) -> None:
    with world(tmp_path, provider="anthropic") as w:
        (manifest,) = w.stage(3)
        op, xcom = in_doubt_sensor(w, manifest["job_id"], "create:500_after")
        result = op.execute(CONTEXT)
        job = w.ledger.get_job(manifest["job_id"])
        assert (result["state"], result["batch_id"]) == ("completed", job.batch_id)
        assert result["submitted_at"] == xcom["submitted_at"]  # the timeout still counts from the intent
        assert w.batches_created() == 1


def test_the_wait_creates_a_job_in_doubt_that_the_provider_proves_absent(tmp_path: Path) -> None:
    with world(tmp_path, provider="anthropic") as w:
        (manifest,) = w.stage(3)
        op, _ = in_doubt_sensor(w, manifest["job_id"], "create:500")
        result = op.execute(CONTEXT)
        assert result["state"] == "completed" and result["batch_id"]
        assert w.batches_created() == 1


def test_a_deferrable_wait_on_a_job_in_doubt_defers_between_look_ups_and_resumes_to_its_batch(
    tmp_path: Path,
) -> None:
    import asyncio

    with world(tmp_path, provider="anthropic", time_scale=1.0) as w:
        (manifest,) = w.stage(3)
        op, xcom = in_doubt_sensor(w, manifest["job_id"], "create:500_after")
        op.deferrable = True
        step: Any = lambda: op.execute(CONTEXT)  # noqa: E731
        rechecks = 0
        while True:
            try:
                result = step()
                break
            except TaskDeferred as deferred:
                trigger = deferred.trigger
                assert isinstance(trigger, BatchStatusTrigger)
                kwargs = deferred.kwargs or {}
                if deferred.method_name == "execute_complete":
                    # attached: the status poll as before (the trigger would report the ended batch)
                    job = w.ledger.get_job(manifest["job_id"])
                    assert w.wait_terminal(job.job_id) == "completed"
                    event = {"status": "done", "batch": w.adapter.status(w.ref(job.job_id)).to_dict()}
                    step = lambda e=event, k=kwargs: op.execute_complete(CONTEXT, e, **k)  # noqa: E731
                    continue
                # in doubt: the wait between two look-ups is the trigger's, serialised as primitives
                assert deferred.method_name == "execute_in_doubt"
                assert trigger.batch_id == "" and trigger.recheck_at is not None
                assert set(trigger.serialize()[1]) >= {"recheck_at", "job_id", "batch_conn_id"}
                rechecks += 1

                async def fire(t: BatchStatusTrigger = trigger) -> dict[str, Any]:
                    async for ev in t.run():
                        return dict(ev.payload)
                    raise AssertionError("the trigger fired nothing")

                payload = asyncio.run(fire())
                assert payload["status"] == "recheck"
                step = lambda p=payload, k=kwargs: op.execute_in_doubt(CONTEXT, p, **k)  # noqa: E731
        job = w.ledger.get_job(manifest["job_id"])
        assert rechecks >= 1
        assert (result["state"], result["batch_id"]) == ("completed", job.batch_id)
        assert result["submitted_at"] == xcom["submitted_at"]
        assert w.batches_created() == 1


# ---------------------------------------------------------------------------- Airflow conventions


def link_context(xcom: dict[str, Any]) -> Any:
    from airflow.sdk import DAG

    def xcom_push(key: str, value: Any) -> None:
        xcom[key] = value

    ti = SimpleNamespace(dag_id="nightly", task_id="wait", map_index=0, try_number=1, xcom_push=xcom_push)
    return {"run_id": RUN, "ti": ti, "dag": DAG("nightly", schedule=None)}


def test_deferral_follows_the_operators_default_deferrable_setting_like_the_official_operators() -> None:
    import inspect

    from airflow.providers.common.compat.sdk import conf

    default = inspect.signature(BatchStatusSensor.__init__).parameters["deferrable"].default
    assert default is conf.getboolean("operators", "default_deferrable", fallback=False)
    assert sensor({"job_id": "j"}).deferrable is default


def test_a_deferred_wait_keeps_the_sensor_timeout_and_has_stored_its_console_link_naming_the_batch(
    emulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.links.batch import BatchConsoleLink, LedgerRunLink

    # the emulator's host is not api.openai.com: its console page is the configured one
    monkeypatch.setenv(
        "AIRFLOW__BATCH_PROVIDER__CONSOLE_URLS", json.dumps({"openai": emulator + "/b/{batch_id}"})
    )

    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 100.0}).raise_for_status()
    batch = submitted(emulator, "k7")
    xcom: dict[str, Any] = {}
    op = sensor(batch, deferrable=True, timeout=3600)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(link_context(xcom))
    assert deferred.value.timeout is not None and deferred.value.timeout.total_seconds() == 3600
    assert xcom[BatchConsoleLink().xcom_key] == f"{emulator}/b/{batch['batch_id']}"
    assert "run_id=" in xcom[LedgerRunLink().xcom_key] and "dag_id=nightly" in xcom[LedgerRunLink().xcom_key]
    assert [type(link) for link in op.operator_extra_links] == [BatchConsoleLink, LedgerRunLink]


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ("done", "a str, not a mapping"),
        ({"status": "finished", "batch": None}, "status 'finished' is not one of"),
        ({"status": "done", "batch": None}, "status done without a terminal batch state"),
        ({"status": "done", "batch": ["completed"]}, "its batch is a list"),
        ({"status": "done", "batch": {"total": 3}}, "its batch status is malformed"),
        ({"status": "done", "batch": {"state": "exploded"}}, "batch state 'exploded' is unknown"),
        ({"status": "done", "batch": {"state": "completed"}, "job_id": "job-other"}, "about job 'job-other'"),
    ],
)
def test_a_malformed_trigger_event_fails_with_a_clear_error_naming_the_job_and_records_nothing(
    event: Any, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.exceptions import TriggerEventError

    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    op = sensor({"job_id": "job-mine", "batch_id": "batch_1", "idempotency_key": "k", "submitted_at": 0.0})
    with pytest.raises(TriggerEventError, match="job job-mine: the status trigger sent an event") as raised:
        op.execute_complete({}, event)  # type: ignore[arg-type]
    assert problem in str(raised.value)
    assert "Nothing in the ledger was changed" in str(raised.value)


def test_reschedule_mode_pokes_without_deferral_and_frees_the_slot_until_the_batch_is_done(
    emulator: str,
) -> None:
    from airflow.sdk.exceptions import AirflowRescheduleException

    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 100.0}).raise_for_status()
    batch = submitted(emulator, "k8")
    first: list[Any] = []
    ti = SimpleNamespace(
        dag_id="d",
        task_id="wait",
        map_index=0,
        try_number=1,
        xcom_push=lambda key, value: None,
        get_first_reschedule_date=lambda context: first[0] if first else None,
    )
    context: Any = {"run_id": RUN, "ti": ti}
    op = sensor(batch, deferrable=False, mode="reschedule")
    with pytest.raises(AirflowRescheduleException):
        op.execute(context)  # not done: the slot is given back, no trigger
    httpx.put(f"{emulator}/_emulator/config", json={"time_scale": 0.001}).raise_for_status()
    httpx.post(f"{emulator}/_emulator/clock", json={"advance_s": 10 * 86400}).raise_for_status()
    from airflow.sdk import timezone

    first.append(timezone.utcnow())
    fresh = sensor(batch, deferrable=False, mode="reschedule")  # a rescheduled try is a new task object
    result = fresh.execute(context)
    assert result["state"] == "completed" and result["batch_id"] == batch["batch_id"]


def test_a_sensor_on_its_own_polls_with_the_configured_intervals_like_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__POLL_INITIAL_INTERVAL", "2")
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__POLL_MAX_INTERVAL", "20")
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__POLL_MAX_CONSECUTIVE_ERRORS", "9")
    sensor = BatchStatusSensor(task_id="wait", batch={"batch_id": "b"})
    assert (sensor.poke_interval, sensor.max_wait) == (2.0, timedelta(seconds=20))
    assert sensor.poll.max_consecutive_errors == 9


def test_a_sensor_waits_on_the_connection_the_docs_name_by_default() -> None:
    assert BatchStatusSensor(task_id="wait", batch={"batch_id": "b"}).batch_conn_id == "openai_batch_default"
