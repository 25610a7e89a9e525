from __future__ import annotations

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.runs import check_run_connection


@pytest.fixture
def ledger(ledger_url: str) -> Ledger:
    return Ledger.from_url(ledger_url)


def test_a_task_on_the_connection_its_run_started_on_goes_ahead(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m", batch_conn_id="openai_a")
    check_run_connection(ledger, "wl", "r1", "openai_a", "wl.submit")
    check_run_connection(ledger, "wl", "r2", "anything", "wl.prepare")  # a run not started yet


def test_a_connection_changed_during_the_run_is_refused_with_both_ids_and_the_fix(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m", batch_conn_id="openai_a")
    with pytest.raises(ConfigurationError) as caught:
        check_run_connection(ledger, "wl", "r1", "anthropic_b", "wl.wait")
    message = str(caught.value)
    assert "wl.wait" in message and "'anthropic_b'" in message and "started on 'openai_a'" in message
    assert "Set it back to 'openai_a'" in message and "next run" in message
