"""What the operators and the status sensor share about the task they run in (``task_glue``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_batch_provider import task_glue
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.notifications import BatchAlerts, BatchEvent

RUN = "manual__2026-12-02T00:00:00+00:00"


def test_a_task_attempt_is_named_by_its_dag_run_task_map_index_and_try() -> None:
    ti = SimpleNamespace(dag_id="d", task_id="submit", map_index=3, try_number=2)
    owner = task_glue.attempt_owner({"ti": ti, "run_id": RUN})
    assert owner.startswith(f"d/{RUN}/submit/3/2@")
    assert task_glue.dag_id_of({"ti": ti}) == "d"
    assert task_glue.dag_id_of({"dag": SimpleNamespace(dag_id="from_dag"), "ti": ti}) == "from_dag"
    assert task_glue.dag_id_of({}) is None


def test_a_batch_the_ledger_does_not_know_is_none_and_a_killed_task_without_a_claim_only_stops(
    tmp_path: Path,
) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'l.sqlite'}")
    assert task_glue.known_job(ledger, "w:nope:r1:c00000") is None
    task: Any = SimpleNamespace(_claim=None, ledger=ledger)
    task_glue.kill_claim(task)
    assert task._killed is True


def test_an_alert_whose_notifier_fails_never_fails_the_task() -> None:
    def broken(context: Any, event: BatchEvent) -> None:
        raise RuntimeError("smtp down")

    event = BatchEvent("run_summary", "w", RUN, "done")
    task_glue.emit_alert(BatchAlerts(notifiers=[broken]), {}, event)  # logged, not raised
    task_glue.emit_alert(None, {}, event)  # no alerts: only the metric is counted
    assert {"sync", task_glue.MOVED} == task_glue.PASS_THROUGH_ROUTES
