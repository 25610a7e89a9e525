"""A workload's published answers as another workload reads them: the newest finished run's, whole (SQLite and PostgreSQL)."""

from __future__ import annotations

from sqlalchemy import event

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.answers import (
    iter_answers,
    latest_published_run,
    published_states,
    runs_publishing_after,
    workloads_with_answers,
)
from tests.unit.ledger.answered import answered_run

WL = "entities"


def test_the_answers_read_are_the_newest_finished_runs_only_its_input_and_its_prompt_version(
    ledger: Ledger,
) -> None:
    answered_run(ledger, WL, "r1", {"a": {"x": 1}, "b": {"x": 2}, "gone": {"x": 3}})
    # r2: "gone" left the input, "b" changed, "c" is new, "bad" fails; "a" is unchanged
    answered_run(ledger, WL, "r2", {"a": {"x": 1}, "b": {"x": 20}, "c": {"x": 4}, "bad": {}}, failing={"bad"})
    run = latest_published_run(ledger, WL)
    assert run is not None and (run.run_id, run.prompt_version) == ("r2", "v1")
    answers = {a.app_id: (a.state, a.output) for a in iter_answers(ledger, run)}
    assert answers == {
        "a": ("unchanged", {"x": 1}),
        "b": ("succeeded", {"x": 20}),
        "c": ("succeeded", {"x": 4}),
    }
    assert published_states(ledger, run) == {"unchanged": 1, "succeeded": 2, "failed_permanent": 1}
    # a new prompt version: the v1 answers are not the newest run's, whatever their items
    answered_run(ledger, WL, "r3", {"a": {"x": 1}}, version="v2")
    run = latest_published_run(ledger, WL)
    assert run is not None and (run.run_id, run.prompt_version) == ("r3", "v2")
    assert [(a.app_id, a.prompt_version, a.state) for a in iter_answers(ledger, run)] == [
        ("a", "v2", "succeeded")
    ]


def test_a_run_in_progress_is_not_read_and_one_publishing_is_named(ledger: Ledger) -> None:
    assert latest_published_run(ledger, WL) is None
    answered_run(ledger, WL, "r1", {"a": {"x": 1}, "b": {"x": 2}})
    ledger.start_run(WL, "r2", "openai", "gpt-4o-mini")  # prepared, not published
    run = latest_published_run(ledger, WL)
    assert run is not None and run.run_id == "r1"
    assert runs_publishing_after(ledger, run) == []
    # r3 published its rows and has not finished (its publish is still running)
    answered_run(ledger, WL, "r3", {"a": {"x": 9}}, finish=False)
    run = latest_published_run(ledger, WL)
    assert run is not None and run.run_id == "r1"
    assert runs_publishing_after(ledger, run) == ["r3"]
    assert [a.app_id for a in iter_answers(ledger, run)] == ["b"]  # r3 replaced a's row
    assert workloads_with_answers(ledger) == [WL]


def test_the_answers_come_a_page_per_query_in_key_order_each_once(ledger: Ledger) -> None:
    answered_run(ledger, WL, "r1", {f"i{n:02d}": {"n": n} for n in range(23)})
    run = latest_published_run(ledger, WL)
    assert run is not None
    queries: list[str] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "FROM abp_results" in statement:
            queries.append(statement)

    read = list(iter_answers(ledger, run, page=5))
    assert sorted(a.app_id for a in read) == [f"i{n:02d}" for n in range(23)]
    assert [a.item_key for a in read] == sorted(a.item_key for a in read)
    assert len(queries) == 5  # 5 + 5 + 5 + 5 + 3
