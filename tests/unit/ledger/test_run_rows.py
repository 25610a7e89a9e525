"""The runs room: a run's row, recorded once, with its report and its first connection."""

from __future__ import annotations

import json
from decimal import Decimal

from airflow_batch_provider.ledger import Ledger
from tests.unit.ledger.store_support import (
    WL,
)


def test_runs_are_recorded_once_and_keep_their_report(ledger: Ledger) -> None:
    ledger.start_run(WL, "r1", "openai", "gpt-4o-mini")
    ledger.start_run(WL, "r1", "openai", "gpt-4o-mini")
    ledger.finish_run(WL, "r1", {"cost": Decimal("1.5"), "items": 3})
    (run,) = ledger.runs(WL)
    assert (run["run_id"], run["provider"]) == ("r1", "openai")
    assert run["finished_at"] is not None
    assert json.loads(run["report_json"]) == {"cost": "1.5", "items": 3}
    assert ledger.runs("other") == []


def test_a_run_keeps_the_first_batch_connection_it_started_on(ledger: Ledger) -> None:
    assert ledger.run_batch_conn_id(WL, "r1") is None
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_a") == "openai_a"
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_b") == "openai_a"
    assert ledger.run_batch_conn_id(WL, "r1") == "openai_a"
    assert ledger.run_batch_conn_id(WL, "r2") is None


def test_a_run_started_before_connections_were_recorded_takes_the_first_one_given(ledger: Ledger) -> None:
    assert ledger.start_run(WL, "r1", "openai", "m") is None
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_b") == "openai_b"
    assert ledger.start_run(WL, "r1", "openai", "m", batch_conn_id="openai_c") == "openai_b"
