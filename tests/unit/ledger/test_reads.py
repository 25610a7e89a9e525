"""The ledger's read queries for the page and the command line, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import re
from dataclasses import FrozenInstanceError
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger, reads
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import PreparedItem

WL = "feedback"
HOSTILE = "x' OR '1'='1"
SCHEDULED = "scheduled__2026-11-29T02:00:00+00:00"


def prep(app_id: str, version: str = "v1") -> PreparedItem:
    return PreparedItem(
        item_key(app_id),
        CanonicalRequest(
            app_id=app_id,
            prompt_version=version,
            model="gpt-4o-mini",
            system=None,
            messages=({"role": "user", "content": f"comment {app_id}"},),
            params={},
        ),
    )


def start(ledger: Ledger, workload: str, run_id: str, dag_id: str | None, app_ids: list[str]) -> None:
    ledger.start_run(workload, run_id, "openai", "gpt-4o-mini", dag_id=dag_id)
    ledger.upsert_items(workload, run_id, [prep(a) for a in app_ids])


def to_review(ledger: Ledger, workload: str, run_id: str, app_id: str, code: str | None) -> None:
    ledger.transition(
        workload, run_id, "review", ["pending"], keys=[(item_key(app_id), "v1")], error_code=code
    )


def paid_sync(ledger: Ledger, workload: str, run_id: str, app_id: str, nusd: int) -> None:
    cid = ledger.begin_sync_attempt(workload, run_id, item_key(app_id), "v1", ["pending", "failed_retryable"])
    assert cid is not None
    result = ItemResult(cid, "failed_retryable", usage=Usage(10, 1), error_code="server_error")
    ledger.record_sync_result(workload, run_id, result, nusd)


def test_an_empty_database_reads_as_an_empty_ledger_and_nothing_is_created(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}/empty.sqlite")
    empty = Ledger(engine)
    assert reads.has_tables(empty) is False
    assert reads.run_dags(empty) == []
    assert reads.workload_summaries(empty, frozenset({None, "d"})) == []
    assert reads.recent_runs(empty, frozenset({None, "d"})) == []
    assert reads.find_run(empty, WL, "r") is None
    assert reads.review_counts(empty, WL) == {}
    assert reads.stranded_fallback(empty) == []
    assert inspect(engine).get_table_names() == []


def test_runs_are_filtered_by_the_dags_a_reader_may_see(ledger: Ledger) -> None:
    start(ledger, WL, "r_a", "dag_a", ["a"])
    start(ledger, WL, "r_b", "dag_b", ["b"])
    start(ledger, WL, "r_none", None, ["n"])
    start(ledger, "other", "r_o", "dag_b", ["o"])

    def seen(dags: set[str | None]) -> set[str]:
        return {r.run_id for r in reads.recent_runs(ledger, frozenset(dags), limit=50)}

    assert seen({"dag_a"}) == {"r_a"}
    assert seen({None}) == {"r_none"}
    assert seen({"dag_b"}) == {"r_b", "r_o"}
    assert seen(set()) == set()
    assert {r.run_id for r in reads.recent_runs(ledger, frozenset({"dag_b"}), workload=WL)} == {"r_b"}
    assert reads.run_dags(ledger, WL) == [(WL, None), (WL, "dag_a"), (WL, "dag_b")]
    summaries = reads.workload_summaries(ledger, frozenset({"dag_b"}))
    assert sorted((w.workload, w.runs) for w in summaries) == [("feedback", 1), ("other", 1)]
    assert all(w.last_started is not None and w.last_started.tzinfo is not None for w in summaries)


def test_a_hostile_workload_name_is_matched_literally(ledger: Ledger) -> None:
    start(ledger, WL, "r1", "d", ["a"])
    start(ledger, HOSTILE, "r1", "d", ["b"])
    to_review(ledger, WL, "r1", "a", "boom")
    assert reads.run_dags(ledger, HOSTILE) == [(HOSTILE, "d")]
    assert [r.workload for r in reads.recent_runs(ledger, frozenset({"d"}), workload=HOSTILE)] == [HOSTILE]
    assert reads.review_counts(ledger, HOSTILE) == {}
    assert reads.find_run(ledger, HOSTILE, "r1") is not None
    assert reads.find_run(ledger, "x", "r1") is None


def test_the_newest_run_comes_first_and_the_limit_holds(ledger: Ledger) -> None:
    for i in range(5):
        start(ledger, WL, f"r{i}", "d", [f"i{i}"])
    runs = reads.recent_runs(ledger, frozenset({"d"}), limit=3)
    assert len(runs) == 3
    assert [r.started_at for r in runs] == sorted((r.started_at for r in runs), reverse=True)  # type: ignore[arg-type, return-value]
    assert reads.recent_runs(ledger, frozenset({"d"}), limit=0)  # at least one


def test_a_dag_run_is_matched_on_its_dag_and_its_run_id(ledger: Ledger) -> None:
    # two DAGs on one schedule share their scheduled__ run ids
    start(ledger, "wl_one", SCHEDULED, "dag_one", ["a"])
    start(ledger, "wl_two", SCHEDULED, "dag_two", ["b"])
    start(ledger, "wl_three", SCHEDULED, "dag_one", ["c"])
    found = reads.runs_of_dag_run(ledger, "dag_one", SCHEDULED)
    assert [(r.workload, r.dag_id) for r in found] == [("wl_one", "dag_one"), ("wl_three", "dag_one")]
    assert reads.runs_of_dag_run(ledger, "dag_three", SCHEDULED) == []


def test_a_run_record_is_frozen_with_its_report_and_utc_times(ledger: Ledger) -> None:
    start(ledger, WL, "r1", "d", ["a"])
    ledger.finish_run(WL, "r1", {"states": {"pending": 1}})
    run = reads.find_run(ledger, WL, "r1")
    assert run is not None
    assert (run.workload, run.run_id, run.dag_id, run.provider, run.model) == (
        WL,
        "r1",
        "d",
        "openai",
        "gpt-4o-mini",
    )
    assert run.report_json is not None and '"pending": 1' in run.report_json
    assert run.started_at is not None and run.started_at.utcoffset() == timezone.utc.utcoffset(None)
    assert run.finished_at is not None and run.finished_at >= run.started_at
    with pytest.raises(FrozenInstanceError):
        run.workload = "other"  # type: ignore[misc]


def test_the_review_counts_hold_only_the_open_queue_by_error_code(ledger: Ledger) -> None:
    start(ledger, WL, "r1", "d", ["a", "b", "c", "d", "e", "f"])
    for app_id, code in (("a", "boom"), ("b", "boom"), ("c", None), ("d", "zap"), ("e", "zap")):
        to_review(ledger, WL, "r1", app_id, code)
    ledger.resolve_review(WL, app_ids=["e"], actor="ann", note="answered by hand")
    start(ledger, "other", "r1", "d", ["z"])
    to_review(ledger, "other", "r1", "z", "boom")
    counts = reads.review_counts(ledger, WL)
    assert counts == {"boom": 2, "-": 1, "zap": 1}
    assert list(counts) == ["boom", "-", "zap"]  # largest first, then by code
    assert sum(counts.values()) == len(ledger.review_items(WL))


def test_item_costs_sum_every_runs_attempts_per_item_and_version(ledger: Ledger) -> None:
    start(ledger, WL, "r1", "d", ["a", "b"])
    paid_sync(ledger, WL, "r1", "a", 7)  # it failed: to review; a person sends it again
    assert ledger.redrive(WL, app_ids=["a"], actor="ann", reason="try again") == 1
    ledger.upsert_items(WL, "r2", [prep("a"), prep("b")])
    ledger.start_run(WL, "r2", "openai", "gpt-4o-mini", dag_id="d")
    paid_sync(ledger, WL, "r2", "a", 5)
    start(ledger, "other", "r1", "d", ["a"])
    paid_sync(ledger, "other", "r1", "a", 1000)
    costs = reads.item_costs(ledger, WL, [item_key("a"), item_key("b"), item_key("a")])
    assert costs == {(item_key("a"), "v1"): 12}
    assert reads.item_costs(ledger, WL, []) == {}


def test_item_costs_of_more_keys_than_one_query_takes(ledger: Ledger) -> None:
    ids = [f"i{n}" for n in range(1203)]
    start(ledger, WL, "r1", "d", ids)
    with ledger.engine.begin() as conn:
        conn.execute(
            s.attempts.insert(),
            [
                {
                    "job_id": "j",
                    "custom_id": f"c{n}",
                    "workload": WL,
                    "item_key": item_key(a),
                    "prompt_version": "v1",
                    "run_id": "r1",
                    "attempt": 1,
                    "mode": "batch",
                    "outcome": "succeeded",
                    "cost_nusd": 3,
                    "created_at": ledger_now(),
                    "updated_at": ledger_now(),
                }
                for n, a in enumerate(ids)
            ],
        )
    costs = reads.item_costs(ledger, WL, [item_key(a) for a in ids])
    assert len(costs) == 1203 and set(costs.values()) == {3}


def ledger_now() -> datetime:
    return utcnow()


def test_items_left_in_fallback_are_listed_per_run_with_whether_it_holds_the_workload(ledger: Ledger) -> None:
    start(ledger, WL, "dead", "d", ["a", "b", "c"])
    for app_id in ("a", "b"):
        assert ledger.begin_sync_attempt(WL, "dead", item_key(app_id), "v1", ["pending"]) is not None
    ledger.acquire_workload_lease(WL, "dead", owner="worker-1", dag_id="d")
    (held,) = reads.stranded_fallback(ledger, WL)
    assert (held.workload, held.run_id, held.items, held.holds_lease) == (WL, "dead", 2, True)
    assert ledger.release_workload_lease(WL, "dead", actor="ann", reason="the run was killed")
    (free,) = reads.stranded_fallback(ledger)
    assert (free.items, free.holds_lease) == (2, False) and free.since is not None
    assert reads.fallback_item_keys(ledger, WL, "dead") == sorted(
        [(item_key("a"), "v1"), (item_key("b"), "v1")]
    )
    # another workload's lease held by a run of the same id is not this run's
    ledger.acquire_workload_lease("other", "dead", owner="worker-2", dag_id="d")
    assert reads.stranded_fallback(ledger, WL)[0].holds_lease is False
    # settled items leave the list
    ledger.transition(WL, "dead", "succeeded", ["fallback"])
    assert reads.stranded_fallback(ledger, WL) == []


def test_a_workloads_recent_runs_are_read_from_the_runs_table_alone_on_both_databases(
    ledger: Ledger, ledger_url: str
) -> None:
    # the trend chart's query: a year of nights must not read the items, attempts or results
    from sqlalchemy import event

    for night in range(3):
        start(ledger, WL, f"r{night}", "d", [f"i{night}", f"j{night}"])
    start(ledger, "other", "r0", "d", ["k"])
    seen: list[tuple[str, Any]] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if "FROM abp_" in statement:  # the ledger's tables (not the has-table look-up)
            seen.append((statement, params))

    runs = reads.recent_runs(ledger, frozenset({"d", None}), WL, limit=366)
    assert [r.run_id for r in runs] == ["r2", "r1", "r0"]
    (statement, params), *others = seen
    assert not others
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        if ledger_url.startswith("sqlite"):
            steps = [str(r[3]) for r in raw.execute("EXPLAIN QUERY PLAN " + statement, params)]
            # the runs table, searched by the workload (its primary key's first column)
            assert any(step.startswith("SEARCH abp_runs USING INDEX") for step in steps), steps
        else:
            with raw.cursor() as cur:
                cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
                (((plan,),),) = (cur.fetchall(),)
            steps = json.dumps(plan)
        text = " ".join(steps) if isinstance(steps, list) else steps
        read = {name for name in s.metadata.tables if re.search(rf"\b{name}\b", text)}
        assert read == {"abp_runs"}, steps
