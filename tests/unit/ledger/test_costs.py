"""The costs room: attempt totals, cost rows, route counts and the published results."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import select

from airflow_batch_provider.core.money import from_nusd, to_nusd
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from tests.unit.ledger.store_support import (
    WL,
    cost_of,
    fail,
    first_run_all_succeeded,
    ok,
    prep,
    submit,
)

# ---------------------------------------------------------------------------------------------- reporting


def test_attempt_totals_sum_tokens_and_cost_by_mode_outcome_and_discard(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep(a) for a in ("a", "b", "c", "d")])
    job, cids = submit(ledger, "r1", ["a", "b", "c", "d"])
    ledger.apply_results(
        job,
        [
            ok(cids["a"], usage=Usage(1000, 100, 500, 0)),
            ok(cids["b"], usage=Usage(3000, 300, 0, 200)),
            ItemResult(cids["c"], "invalid_output", output="x", usage=Usage(2000, 50)),
            fail(cids["d"], usage=Usage(0, 0)),
        ],
        cost_of,
    )
    totals = {(r["mode"], r["outcome"], bool(r["discarded"])): r for r in ledger.attempt_totals(WL, "r1")}
    assert set(totals) == {
        ("batch", "succeeded", False),
        ("batch", "invalid_output", True),
        ("batch", "failed_retryable", False),
    }
    won = totals[("batch", "succeeded", False)]
    assert (
        won["lines"],
        won["input_tokens"],
        won["output_tokens"],
        won["cached_input_tokens"],
        won["cache_write_tokens"],
    ) == (2, 4000, 400, 500, 200)
    assert won["cost_nusd"] == to_nusd(Decimal("0.0048"))
    assert from_nusd(int(won["cost_nusd"])) == Decimal("0.0048")
    lost = totals[("batch", "invalid_output", True)]
    assert (lost["lines"], lost["input_tokens"], lost["cost_nusd"]) == (1, 2000, to_nusd(Decimal("0.0021")))
    assert totals[("batch", "failed_retryable", False)]["cost_nusd"] == 0
    assert ledger.attempt_totals(WL, "other") == []


def test_iter_cost_rows_gives_each_items_attempts_and_an_unchanged_items_earlier_usage(
    ledger: Ledger,
) -> None:
    ledger.upsert_items(WL, "r1", [prep("kept"), prep("retried")])
    job, cids = submit(ledger, "r1", ["kept", "retried"])
    ledger.apply_results(
        job, [ok(cids["kept"], usage=Usage(40, 4)), fail(cids["retried"], usage=Usage(1, 0))], cost_of
    )
    ledger.upsert_items(WL, "r2", [prep("kept"), prep("retried")])
    job, cids = submit(ledger, "r2", ["retried"], round_=1)
    ledger.apply_results(job, [ok(cids["retried"], usage=Usage(9, 9))], cost_of)

    rows = {r["app_id"]: r for r in ledger.iter_cost_rows(WL, "r2")}
    assert rows["kept"] == {
        "app_id": "kept",
        "state": "unchanged",
        "route": "unchanged",
        "model": "gpt-4o-mini",
        "attempts": [],
        "last_usage": Usage(40, 4),
    }
    assert rows["retried"] == {
        "app_id": "retried",
        "state": "succeeded",
        "route": "batch",
        "model": "gpt-4o-mini",
        "attempts": [
            {
                "usage": Usage(9, 9),
                "mode": "batch",
                "discarded": False,
                "outcome": "succeeded",
                "error_code": None,
            }
        ],
        "last_usage": None,
    }
    first = {r["app_id"]: r for r in ledger.iter_cost_rows(WL, "r1")}
    assert first == {}  # every item moved on to r2


def test_iter_cost_rows_leaves_out_attempts_still_without_an_outcome(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    submit(ledger, "r1", ["a"])
    (row,) = ledger.iter_cost_rows(WL, "r1")
    assert (row["state"], row["attempts"], row["last_usage"]) == ("submitted", [], None)


def test_iter_cost_rows_finds_each_pages_attempts_by_item_not_by_reading_the_whole_run(
    tmp_path: Path,
) -> None:
    # SQLite without statistics searched the (workload, run_id) index: every page read every
    # attempt of the run, quadratic in the run (publish took 555 s at a million items).
    from sqlalchemy import event

    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'plan.sqlite'}")
    many = [f"x{n}" for n in range(300)]  # a page's IN list of hundreds of keys, as in a real run
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b", version="v2"), *(prep(k) for k in many)])
    job, cids = submit(ledger, "r1", ["a", *many])
    ledger.apply_results(job, [ok(cids["a"])], cost_of)
    seen: list[tuple[str, Any]] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM abp_attempts" in statement:
            seen.append((statement, params))

    rows = {r["app_id"]: r for r in ledger.iter_cost_rows(WL, "r1")}
    assert [a["outcome"] for a in rows["a"]["attempts"]] == ["succeeded"] and rows["b"]["attempts"] == []
    assert seen
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        for statement, params in seen:
            plan = " ".join(str(r[3]) for r in raw.execute("EXPLAIN QUERY PLAN " + statement, params))
            assert "USING INDEX ix_abp_attempts_item" in plan, plan


def test_count_routes_groups_items_by_state_and_route(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    ledger.upsert_items(WL, "r2", [prep("a"), prep("b", text="new"), prep("c")])
    assert ledger.count_routes(WL, "r2") == {("unchanged", "unchanged"): 1, ("pending", "-"): 2}


def test_publish_upserts_one_row_per_item_and_follows_later_runs(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    ledger.reject_items(WL, "r1", [(None, "bad", "missing_id", "no id")])
    assert ledger.publish(WL, "r1") == 3
    assert ledger.publish(WL, "r1") == 3
    with ledger.engine.connect() as conn:
        rows = {r["app_id"]: dict(r) for r in conn.execute(select(s.published)).mappings()}
    assert set(rows) == {"a", "b", "bad"}
    assert (rows["a"]["state"], json.loads(rows["a"]["output_json"]), rows["a"]["run_id"]) == (
        "succeeded",
        {"label": "a"},
        "r1",
    )
    assert (rows["bad"]["state"], rows["bad"]["output_json"]) == ("review", None)

    ledger.upsert_items(WL, "r2", [prep("a"), prep("b", text="new")])
    assert ledger.publish(WL, "r2") == 2
    with ledger.engine.connect() as conn:
        rows = {r["app_id"]: dict(r) for r in conn.execute(select(s.published)).mappings()}
    assert len(rows) == 3
    assert (rows["a"]["state"], rows["a"]["run_id"], json.loads(rows["a"]["output_json"])) == (
        "unchanged",
        "r2",
        {"label": "a"},
    )
    assert (rows["b"]["state"], rows["b"]["output_json"]) == ("pending", None)
    assert rows["bad"]["run_id"] == "r1"
