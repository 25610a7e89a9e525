"""The page's view model: pure functions from frozen ledger records to what the page and JSON show."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_batch_provider.core.cost import ROUTES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.reads import RunRecord
from airflow_batch_provider.ledger.records import AuditRow, ItemRow, JobRow
from airflow_batch_provider.plugins import view

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def record(finished: bool = True, report: Any = None, started: datetime | None = None) -> RunRecord:
    raw = report if isinstance(report, str) or report is None else json.dumps(report)
    return RunRecord(
        workload="wl",
        run_id="r1",
        dag_id="d",
        provider="openai",
        model="m",
        started_at=started or NOW - timedelta(hours=1),
        finished_at=NOW if finished else None,
        report_json=raw,
    )


def job(**values: Any) -> JobRow:
    row: dict[str, Any] = {c.name: None for c in s.jobs.columns}
    row.update(
        job_id="j1",
        workload="wl",
        run_id="r1",
        round=1,
        chunk_index=0,
        provider="openai",
        model="m",
        state="submitted",
        staged_path="/secret-bucket/j1.jsonl",
        input_ref="file-secret",
        lines=3,
        size_bytes=300,
        created_at=NOW,
    )
    row.update(values)
    return JobRow.from_row(row)


def item(key: str, **values: Any) -> ItemRow:
    row: dict[str, Any] = {c.name: None for c in s.items.columns}
    row.update(
        workload="wl",
        item_key=key,
        prompt_version="v1",
        app_id=f"app-{key}",
        state="review",
        attempts=2,
        run_id="r1",
        updated_at=NOW,
    )
    row.update(values)
    return ItemRow.from_row(row)


def test_a_finished_run_shows_the_states_its_report_recorded_not_a_live_count() -> None:
    run = view.run_view(record(report={"states": {"succeeded": 3, "review": 1}}), {"succeeded": 0}, NOW)
    assert run.states == {"succeeded": 3, "review": 1}
    assert (run.items, run.usable, run.open, run.finished) == (4, 3, 0, True)


def test_the_report_states_fall_back_to_items_by_state_and_then_to_the_live_count() -> None:
    assert view.recorded_states(record(report={"states": {}, "items_by_state": {"succeeded": 2}})) == {
        "succeeded": 2
    }
    assert view.recorded_states(record(report="not json")) is None
    assert view.recorded_states(record(report=["a", "list"])) is None
    assert view.recorded_states(record(finished=False, report={"states": {"succeeded": 1}})) is None
    live = view.run_view(record(report="{broken"), {"pending": 5}, NOW)
    assert live.states == {"pending": 5} and live.report is None


def test_an_unfinished_run_is_stale_only_after_the_stale_limit() -> None:
    young = view.run_view(record(finished=False, started=NOW - view.STALE_AFTER), {"pending": 1}, NOW)
    old = view.run_view(
        record(finished=False, started=NOW - view.STALE_AFTER - timedelta(seconds=1)), {"pending": 1}, NOW
    )
    done = view.run_view(record(started=NOW - 10 * view.STALE_AFTER), {}, NOW)
    assert (young.stale, old.stale, done.stale) == (False, True, False)


def test_states_and_routes_are_shown_in_display_order_with_unknown_ones_last() -> None:
    assert list(view.ordered({"zeta": 1, "review": 2, "succeeded": 3, "fallback": 0}, view.STATE_ORDER)) == [
        "succeeded",
        "review",
        "zeta",
    ]
    assert set(view.ROUTE_ORDER) == set(ROUTES)  # every route of the cost report has its place
    assert view.ROUTE_ORDER.index("exhausted_sync") < view.ROUTE_ORDER.index("unchanged")


def test_a_finished_runs_routes_come_from_its_report_and_a_live_runs_from_the_ledger() -> None:
    report = {"states": {"succeeded": 2}, "items_by_route": {"batch": 1, "exhausted_sync": 1, "fallback": 0}}
    finished = view.run_view(record(report=report), None, NOW)
    assert view.recorded_routes(finished) == {"batch": 1, "exhausted_sync": 1, "fallback": 0}
    live = view.run_view(record(finished=False), {"pending": 1}, NOW)
    assert view.recorded_routes(live) is None
    assert view.live_routes({("succeeded", "batch"): 2, ("review", "batch"): 1, ("pending", "-"): 4}) == {
        "batch": 3
    }


def test_the_run_detail_caps_the_attention_sample_and_counts_every_item_needing_attention() -> None:
    run = view.run_view(record(report={"states": {"review": 40, "succeeded": 1}}), None, NOW)
    rows = [
        {
            "app_id": f"a{i}",
            "state": "review",
            "attempts": 1,
            "error_code": "x",
            "error_message": "m",
            "extra": 1,
        }
        for i in range(40)
    ]
    detail = view.run_detail(
        run, routes={"unchanged": 0, "batch": 41}, jobs=[], attention=rows, paid_so_far_nusd=1500
    )
    assert detail["attention"]["total"] == 40
    assert len(detail["attention"]["sample"]) == view.ATTENTION_SAMPLE
    assert set(detail["attention"]["sample"][0]) == set(view.ATTENTION_FIELDS)
    assert detail["routes"] == {"batch": 41}
    assert detail["paid_so_far"] == "0.0000015"
    json.dumps(detail)


def test_a_job_row_shows_no_staging_path_or_file_id_and_links_only_a_created_batch() -> None:
    created = view.job_row(job(batch_id="batch_1"), "https://console/batch_1")
    assert "staged_path" not in created and "input_ref" not in created
    assert "/secret-bucket" not in json.dumps(created) and "file-secret" not in json.dumps(created)
    assert created["console_url"] == "https://console/batch_1"
    assert created["created_at"] == NOW.isoformat()
    assert view.job_row(job(), "https://console/none")["console_url"] is None


def test_a_review_page_counts_the_filtered_code_or_the_whole_queue() -> None:
    counts = {"boom": 3, "-": 1}
    rows = view.review_rows(
        [item("k1", error_code="boom"), item("k2", error_code="boom")], {("k1", "v1"): 2_500_000_000}
    )
    assert [r["cost_so_far"] for r in rows] == ["2.5", "0"]
    assert list(rows[0]) == list(view.REVIEW_FIELDS)
    assert view.review_page("wl", "boom", counts, rows, 0)["total"] == 3
    assert view.review_page("wl", None, counts, rows, 0)["total"] == 4
    assert view.review_page("wl", "nothing", counts, [], 0)["total"] == 0


def test_in_doubt_and_audit_rows_are_json_safe_and_name_no_staging_path() -> None:
    doubt = view.in_doubt_rows([job(state="in_doubt", in_doubt_reason="create timed out", in_doubt_at=NOW)])
    assert doubt[0]["reason"] == "create timed out" and doubt[0]["since"] == NOW.isoformat()
    assert "/secret-bucket" not in json.dumps(doubt)
    audit = AuditRow(1, NOW, "ann", "redrive", "wl", 2, '{"item_keys": ["k1"]}', "prompt fixed")
    assert view.audit_rows([audit])[0]["at"] == NOW.isoformat()
    json.dumps(view.audit_rows([audit]))


def test_no_exported_cell_starts_a_formula() -> None:
    rows = [dict.fromkeys(view.REVIEW_FIELDS, "=HYPERLINK(1)") | {"attempts": -1}]
    text = "".join(view.review_csv(rows))
    assert "\n=" not in text and ",=" not in text and ",-1" not in text
    assert view.csv_cell(None) == "" and view.csv_cell("@x") == "'@x"
