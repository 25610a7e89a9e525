"""What a run keeps and owns (airflow_batch_provider.ledger.runs), on SQLite and PostgreSQL."""

from __future__ import annotations

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.runs import (
    RunPrompt,
    finished_run,
    newer_runs,
    record_run_prompt,
    reopen_newest_run,
    run_prompt,
)


def test_the_first_prompt_recorded_for_a_run_is_the_one_it_keeps(ledger: Ledger) -> None:
    assert record_run_prompt(ledger, "wl", "r1", RunPrompt("v1", "a" * 64)) is None  # not started
    ledger.start_run("wl", "r1", "openai", "m")
    assert run_prompt(ledger, "wl", "r1") is None
    assert record_run_prompt(ledger, "wl", "r1", RunPrompt("v1", "a" * 64)) == RunPrompt("v1", "a" * 64)
    assert record_run_prompt(ledger, "wl", "r1", RunPrompt("v2", "b" * 64)) == RunPrompt("v1", "a" * 64)
    assert run_prompt(ledger, "wl", "r1") == RunPrompt("v1", "a" * 64)


def test_a_run_is_finished_once_publish_recorded_its_report(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m")
    assert finished_run(ledger, "wl", "r1") is None
    ledger.finish_run("wl", "r1", {"items_by_state": {"succeeded": 2}})
    done = finished_run(ledger, "wl", "r1")
    assert done is not None and done.report == {"items_by_state": {"succeeded": 2}}
    assert finished_run(ledger, "wl", "r2") is None


def test_only_runs_that_started_later_count_as_newer(ledger: Ledger) -> None:
    for run in ("r1", "r2", "r3"):
        ledger.start_run("wl", run, "openai", "m")
    ledger.start_run("other", "r9", "openai", "m")
    with ledger.engine.connect() as conn:
        assert newer_runs(conn, "wl", "r2", ["r1", "r2", "r3", "r9"]) == {"r3"}
        assert newer_runs(conn, "wl", "r3", ["r1", "r2"]) == set()
        assert newer_runs(conn, "wl", "unrecorded", ["r1", "r2"]) == set()


def test_a_finished_run_is_reopened_only_while_no_run_of_its_workload_started_after_it(
    ledger: Ledger,
) -> None:
    ledger.start_run("wl", "r1", "openai", "m")
    assert not reopen_newest_run(ledger, "wl", "r1")  # not finished: nothing to reopen
    ledger.finish_run("wl", "r1", {"items_by_state": {"review": 1}})
    ledger.start_run("other", "r9", "openai", "m")  # another workload's run does not count
    assert reopen_newest_run(ledger, "wl", "r1")
    assert finished_run(ledger, "wl", "r1") is None
    ledger.finish_run("wl", "r1", {"items_by_state": {"succeeded": 1}})
    ledger.start_run("wl", "r2", "openai", "m")
    assert not reopen_newest_run(ledger, "wl", "r1")  # a later run followed it: history
    done = finished_run(ledger, "wl", "r1")
    assert done is not None and done.report == {"items_by_state": {"succeeded": 1}}
    ledger.finish_run("wl", "r2", {"items_by_state": {"unchanged": 1}})
    assert reopen_newest_run(ledger, "wl", "r2")
    assert not reopen_newest_run(ledger, "wl", "unrecorded")
