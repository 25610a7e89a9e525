"""BatchConsumeOperator: a real ledger (SQLite and PostgreSQL) behind the ledger setting, real staging, a recording consumer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_batch_provider.exceptions import ConsumerActError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.handoffs import HandOff
from airflow_batch_provider.operators.consume import BatchConsumeOperator
from airflow_batch_provider.sinks.consumer import Consumer
from airflow_batch_provider.staging import Staging
from tests.unit.ledger.nights import night

WL = "tickets"
MOODS = {"t1": "negative", "t2": "positive", "t3": "negative", "t4": "negative"}


def test_the_task_acts_once_per_answer_and_puts_its_counts_in_the_report_and_report_json(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", ledger.engine.url.render_as_string(False))
    night(
        ledger,
        WL,
        "r1",
        dict.fromkeys(MOODS, "text"),
        outputs={a: {"sentiment": m} for a, m in MOODS.items()},
    )
    calls: list[str] = []
    failing = {"t3"}

    def open_ticket(handoff: HandOff) -> None:
        if handoff.app_id in failing:
            raise RuntimeError("helpdesk answered 503")
        calls.append(handoff.key)

    operator = BatchConsumeOperator(
        task_id="deliver_escalations",
        workload=WL,
        consumer=Consumer("escalations", open_ticket, where=lambda h: h.output["sentiment"] == "negative"),
        staging_root=f"file://{tmp_path / 'staging'}",
    )
    with pytest.raises(
        ConsumerActError,
        match=r"'escalations' failed on 1 hand-off\(s\) of run 'r1' \(first: t3: RuntimeError: helpdesk answered 503\)",
    ):
        operator.execute({"run_id": "r1"})
    assert len(calls) == 2  # the failure stopped no other hand-off
    report_json = Staging(f"file://{tmp_path / 'staging'}").run_dir(WL, "r1") / "report.json"
    failed = json.loads(report_json.read_text())["deliveries"]["escalations"]
    assert (failed["acted"], failed["left_out"], failed["failed"]) == (2, 1, 1)
    assert failed["messages"] == ["t3: RuntimeError: helpdesk answered 503"]
    failing.clear()
    retried = operator.execute({"run_id": "r1"})  # a retry: the failed one again, nothing else
    assert len(calls) == 3 and len(set(calls)) == 3
    expected = {
        "acted": 1,
        "already_acknowledged": 2,
        "left_out": 1,
        "failed": 0,
        "pending": 0,
        "messages": [],
    }
    assert {k: retried[k] for k in expected} == expected
    cleared = operator.execute({"run_id": "r1"})
    assert (cleared["acted"], cleared["already_acknowledged"], len(calls)) == (0, 3, 3)
    stored = json.loads(ledger.runs(WL)[0]["report_json"])["deliveries"]["escalations"]
    assert stored == {**{k: v for k, v in cleared.items() if k != "consumer"}, "kind": "consumer"}
    assert json.loads(report_json.read_text())["deliveries"]["escalations"] == stored
