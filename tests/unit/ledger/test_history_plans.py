"""Query plans of each nightly stage on a ledger with history (SQLite and PostgreSQL).

A ledger holding nights of one workload (written in bulk by ``benchmarks/bench_history.py``), then
night N+1 through prepare, reconcile, publish and the workload page's reads: every statement the
stage sends is explained on its own database (``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN`` on
PostgreSQL after ``ANALYZE`` with sequential scans off for the probe, so that a test-sized table
shows the plan a history-sized one gets; SQLite without statistics, as the ledger leaves it), and none may read a whole table
that grows with the nights or the items.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from airflow_batch_provider.ledger import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import bench_history  # benchmarks/ is no package: imported from its folder

#: the tables that grow with the nights (attempts, jobs, extra lines, prompt changes, audit) or the items
GROWING = (
    "abp_attempts",
    "abp_jobs",
    "abp_items",
    "abp_results",
    "abp_extra_lines",
    "abp_prompt_changes",
    "abp_audit",
)
#: SQLite: a whole table, or a whole workload's rows of it (the search is on the workload alone)
SQLITE_SCAN = re.compile(
    r"\bSCAN ("
    + "|".join(GROWING)
    + r")\b|SEARCH ("
    + "|".join(GROWING)
    + r") USING (COVERING )?INDEX \S+ \(workload=\?\)"
)
#: PostgreSQL: a whole table (its test-sized plans read a third of the workload's items by its
#: index where a history-sized table gets key look-ups: the workload-only rule is SQLite's)
PG_SCAN = re.compile(r"Seq Scan on (" + "|".join(GROWING) + r")\b")
NIGHTS, ITEMS = 6, 3000


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def history(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('plans') / 'history.sqlite'}"
        name = None
    else:
        server = request.getfixturevalue("postgres_server")
        name = server.create_database("ledger_history_plans")
        url = server.url_for(name)
    ledger = Ledger.from_url(url)
    built = bench_history.History(ledger, ITEMS)
    for _ in range(NIGHTS):
        built.add_night()
    bench_history.vacuum(ledger)
    ledger.history = built  # type: ignore[attr-defined]
    try:
        yield ledger
    finally:
        ledger.engine.dispose()
        if name is not None:
            server.drop_database(name)


def explain(cursor: Any, dialect: str, statement: str, params: Any) -> str:
    """The plan of ``statement`` on the session that is about to run it (its temporary tables included)."""
    probe = cursor.connection.cursor()
    try:
        if dialect == "sqlite":
            probe.execute("EXPLAIN QUERY PLAN " + statement, params)
            return "\n".join(str(r[3]) for r in probe.fetchall())
        # a sequential scan is the cheaper plan of a test-sized table: with it off, the plan shows
        # whether an index can serve the statement at all (the plan a history-sized table gets)
        probe.execute("SET enable_seqscan = off")
        try:
            probe.execute("EXPLAIN " + statement, params)
            return "\n".join(str(r[0]) for r in probe.fetchall())
        finally:
            probe.execute("RESET enable_seqscan")
    finally:
        probe.close()


def full_scans(ledger: Ledger, work: Callable[[], Any]) -> tuple[int, list[str]]:
    """Run ``work``, explaining each statement it sends before it runs; return how many, and those reading a whole growing table."""
    dialect = ledger.engine.dialect.name
    scan = SQLITE_SCAN if dialect == "sqlite" else PG_SCAN
    seen: list[int] = []
    bad: list[str] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        head = statement.lstrip().split(None, 1)[0].upper()
        if head not in ("SELECT", "UPDATE", "DELETE", "WITH") or "abp_" not in statement or many:
            return
        seen.append(1)
        plan = explain(cursor, dialect, statement, params)
        if scan.search(plan):
            bad.append(f"{statement[:400]}\n{plan}")

    event.listen(ledger.engine, "before_cursor_execute", keep)
    try:
        work()
    finally:
        event.remove(ledger.engine, "before_cursor_execute", keep)
    return len(seen), bad


def test_no_statement_of_a_nightly_stage_reads_a_whole_growing_table_at_history_size(history: Ledger) -> None:
    from airflow_batch_provider.plugins import api, review

    built: bench_history.History = history.history  # type: ignore[attr-defined]
    items = bench_history.tonight(built)
    run_id = "scheduled__plans"
    stages: dict[str, tuple[int, list[str]]] = {}
    stages["prepare"] = full_scans(history, lambda: history.upsert_items(bench_history.WL, run_id, items))
    history.start_run(bench_history.WL, run_id, "openai", "gpt-4o-mini")
    found: dict[str, Any] = {}
    stages["reconcile"] = full_scans(
        history, lambda: found.update(bench_history.stage_and_answer(history, run_id))
    )
    stages["publish"] = full_scans(
        history,
        lambda: (
            history.publish(bench_history.WL, run_id),
            list(history.iter_cost_rows(bench_history.WL, run_id)),
        ),
    )

    def page() -> None:
        api.list_runs(history, bench_history.WL, 20, bench_history.DAGS)
        run = api.find_run(history, bench_history.WL, run_id)
        assert run is not None
        api.run_detail(history, run)
        review.review_page(history, bench_history.WL, None)
        history.jobs_in_doubt(bench_history.WL)

    stages["ui"] = full_scans(history, page)
    assert found["lines"] > 0
    assert all(count > 0 for count, _ in stages.values()), stages
    bad = {stage: plans for stage, (_, plans) in stages.items()}
    assert bad == {stage: [] for stage in stages}, "\n\n".join(p for plans in bad.values() for p in plans)


@pytest.mark.postgres
def test_postgresql_finds_a_small_nights_cost_rows_by_an_index_with_its_own_plan(history: Ledger) -> None:
    """The report's attempt look-ups leave the run's predicate to PostgreSQL's planner (its statistics).

    ``run_id || ''`` keeps SQLite (no statistics) off the run's index; on PostgreSQL it kept the
    planner off that index too, and a night whose changes are a few percent read the whole
    attempts table for every page of keys (3.2 ms a page at 9,350 attempts, 0.2 ms by the index).
    """
    if history.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's planner: SQLite's plans are the test above")
    built: bench_history.History = history.history  # type: ignore[attr-defined]
    run_id = "scheduled__small_night"
    history.start_run(bench_history.WL, run_id, "openai", "gpt-4o-mini")
    history.upsert_items(bench_history.WL, run_id, bench_history.tonight(built))
    bench_history.stage_and_answer(history, run_id)
    bench_history.vacuum(history)
    plans: list[str] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        # the look-ups by the run (those of unchanged items' earlier answers go by job and custom id)
        if (
            statement.lstrip().upper().startswith("SELECT")
            and "abp_attempts.run_id" in statement.split("WHERE", 1)[-1]
        ):
            probe = cursor.connection.cursor()
            try:
                probe.execute("EXPLAIN " + statement, params)
                plans.append("\n".join(str(r[0]) for r in probe.fetchall()))
            finally:
                probe.close()

    event.listen(history.engine, "before_cursor_execute", keep)
    try:
        rows = list(history.iter_cost_rows(bench_history.WL, run_id))
    finally:
        event.remove(history.engine, "before_cursor_execute", keep)
    assert rows and plans
    assert [p for p in plans if "Seq Scan on abp_attempts" in p] == [], plans[0]
