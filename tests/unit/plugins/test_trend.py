"""The workload's trend (plugins/trend.py) over real ledgers: its JSON, its page table, its queries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.results import ItemResult
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.operators.batch import build_report
from airflow_batch_provider.plugins import trend
from airflow_batch_provider.plugins.access import StaticAccess
from airflow_batch_provider.plugins.api import create_app, open_readonly
from airflow_batch_provider.plugins.view import money
from tests.unit.plugins.test_api import DAG, MODEL, USAGE, WL, client_for, cost_of, prep, stage_and_submit

FIRST_NIGHT = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)


def night_id(n: int) -> str:
    return f"scheduled__{(FIRST_NIGHT + timedelta(days=n)).isoformat()}"


def dated(ledger: Ledger, run_id: str, n: int, workload: str = WL) -> None:
    """The run as if prepare had started it on night ``n`` (the nights of a month, not of a second)."""
    with ledger.engine.begin() as conn:
        conn.execute(
            s.runs.update()
            .where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
            .values(started_at=FIRST_NIGHT + timedelta(days=n))
        )


def seed_night(
    ledger: Ledger,
    n: int,
    *,
    ok: int,
    permanent: int,
    realtime: int,
    dag_id: str | None = DAG,
    workload: str = WL,
) -> dict[str, Any]:
    """Night ``n`` through the ledger as the tasks do it; return its report as publish stored it.

    ``ok`` items are answered in the batch, ``permanent`` fail for good (to review, where they stay:
    the queue grows night by night) and ``realtime`` are answered by the real-time fallback.
    """
    run_id = night_id(n)
    ids = [f"n{n:03d}-{i:03d}" for i in range(ok + permanent + realtime)]
    ledger.start_run(workload, run_id, "openai", MODEL, dag_id=dag_id)
    ledger.upsert_items(workload, run_id, [prep(a) for a in ids])
    sent = ids[: ok + permanent]
    job, cids = stage_and_submit(ledger, workload, run_id, sent, 1, f"batch_night_{n}")
    results = [ItemResult(cids[a], "succeeded", output={"label": "ok"}, usage=USAGE) for a in sent[:ok]]
    results += [
        ItemResult(cids[a], "failed_permanent", error_code="400", error_message="bad") for a in sent[ok:]
    ]
    ledger.apply_results(job, results, cost_of)
    ledger.update_job(job, state="reconciled", batch_state="completed", result_lines=len(sent))
    for a in ids[ok + permanent :]:
        cid = ledger.begin_sync_attempt(workload, run_id, item_key(a), "v1", ["pending"])
        assert cid is not None
        ledger.record_sync_result(
            workload, run_id, ItemResult(cid, "succeeded", output={"label": "rt"}, usage=USAGE), 900
        )
    ledger.retry_candidates(workload, run_id, max_attempts=1)
    report = build_report(ledger, workload, run_id, "openai", None)
    ledger.finish_run(workload, run_id, report)
    dated(ledger, run_id, n, workload)
    return report


def seed_year(ledger: Ledger, nights: int, workload: str = WL) -> None:
    """``nights`` published runs as a retention policy leaves them: runs and reports, no item rows.

    Written in one statement (a year of runs through the whole flow would take minutes): each
    report is a real one (a night of workload ``sample``, published) with the figures the trend
    reads set to vary by night.
    """
    base = seed_night(ledger, 0, ok=2, permanent=1, realtime=1, workload="sample")
    rows = []
    for n in range(nights):
        usable = 1000 + n
        report = {
            **base,
            "currency": "USD",
            "items": usable + n % 7 + n % 5,
            "states": {"succeeded": usable, "review": n % 7, "fallback": 0, "failed_permanent": n % 5},
            "items_by_route": {"batch": usable, "fallback": n % 5, "exhausted_sync": n % 7},
            "usable_results": usable,
            "paid": str(Decimal("0.25") + Decimal(n) / 1000),
            "cost_per_usable_result": str((Decimal("0.25") + Decimal(n) / 1000) / usable),
            "savings": str(Decimal("0.25") + Decimal(n) / 1000),
            "review_queue": 10 + n,
            "table": "x" * 1500,  # the text table publish logs: a report's bulk
        }
        rows.append(
            {
                "workload": workload,
                "run_id": night_id(n),
                "provider": "openai",
                "model": MODEL,
                "dag_id": DAG,
                "started_at": FIRST_NIGHT + timedelta(days=n),
                "finished_at": FIRST_NIGHT + timedelta(days=n, hours=3),
                "report_json": json.dumps(report),
            }
        )
    with ledger.engine.begin() as conn:
        conn.execute(s.runs.insert(), rows)


@pytest.fixture
def writer(ledger_url: str) -> Iterator[Ledger]:
    ledger = Ledger.from_url(ledger_url)
    yield ledger
    ledger.engine.dispose()
    open_readonly(ledger_url).engine.dispose()
    open_readonly.cache_clear()


def share(part: int, whole: int) -> str:
    return str((Decimal(part) / Decimal(whole)).quantize(Decimal("0.000001")))


# ------------------------------------------------------------------------------------------ the JSON


def test_the_trend_endpoint_gives_each_night_its_states_cost_savings_review_queue_and_real_time_share(
    writer: Ledger, ledger_url: str
) -> None:
    reports = [
        seed_night(writer, 0, ok=6, permanent=1, realtime=1),
        seed_night(writer, 1, ok=9, permanent=2, realtime=0),
        seed_night(writer, 2, ok=4, permanent=0, realtime=3),
    ]
    writer.start_run(WL, night_id(3), "openai", MODEL, dag_id=DAG)  # tonight's run, still going
    dated(writer, night_id(3), 3)

    body = client_for(ledger_url).get("/api/trend", params={"workload": WL}).json()

    assert (body["workload"], body["nights_requested"], body["older_runs"]) == (WL, 30, False)
    assert body["currency"] == "USD"
    assert body["states"] == ["succeeded", "review"]
    assert [n["run_id"] for n in body["nights"]] == [night_id(i) for i in range(4)]  # oldest first
    published = body["nights"][:3]
    assert [n["states"] for n in published] == [
        {"succeeded": 7, "review": 1},
        {"succeeded": 9, "review": 2},
        {"succeeded": 7},
    ]
    assert [n["items"] for n in published] == [8, 11, 7]
    # the figures are the reports' own, exact
    assert [n["cost_per_usable_result"] for n in published] == [r["cost_per_usable_result"] for r in reports]
    assert [n["savings"] for n in published] == [r["savings"] for r in reports]
    assert [n["paid"] for n in published] == [r["paid"] for r in reports]
    assert Decimal(published[1]["cost_per_usable_result"]) == cost_of(USAGE)  # a night all in batch
    # review is sticky: the queue as each night left it holds the earlier nights' items too
    assert [n["review_queue"] for n in published] == [1, 3, 3]
    assert [n["realtime_items"] for n in published] == [1, 0, 3]
    assert [n["realtime_share"] for n in published] == [share(1, 8), share(0, 11), share(3, 7)]
    tonight = body["nights"][3]
    assert tonight["published"] is False
    assert tonight["states"] == {} and tonight["items"] is None and tonight["cost_per_usable_result"] is None


def test_the_trend_shows_the_nights_asked_for_and_says_when_older_runs_are_kept(
    writer: Ledger, ledger_url: str
) -> None:
    seed_year(writer, 40)
    client = client_for(ledger_url)

    default = client.get("/api/trend", params={"workload": WL}).json()
    assert len(default["nights"]) == trend.DEFAULT_NIGHTS and default["older_runs"] is True
    assert default["nights"][-1]["run_id"] == night_id(39)
    assert default["nights"][0]["run_id"] == night_id(10)
    every = client.get("/api/trend", params={"workload": WL, "nights": 365}).json()
    assert len(every["nights"]) == 40 and every["older_runs"] is False
    assert (
        client.get("/api/trend", params={"workload": WL, "nights": trend.MAX_NIGHTS + 1}).status_code == 422
    )
    missing = client.get("/api/trend", params={"workload": "no-such-workload"})
    assert missing.status_code == 404 and "no-such-workload" in missing.json()["detail"]


def test_the_trend_shows_only_the_runs_of_dags_the_user_may_read(writer: Ledger, ledger_url: str) -> None:
    seed_night(writer, 0, ok=2, permanent=0, realtime=0)
    seed_night(writer, 1, ok=2, permanent=0, realtime=0, dag_id="other_dag")

    def client(access: StaticAccess) -> TestClient:
        return TestClient(create_app(lambda: ledger_url, access_for=lambda: access, authenticate=False))

    viewer = client(StaticAccess("viewer", read=frozenset({DAG}))).get("/api/trend", params={"workload": WL})
    assert [n["run_id"] for n in viewer.json()["nights"]] == [night_id(0)]
    nobody = client(StaticAccess("nobody", read=frozenset())).get("/api/trend", params={"workload": WL})
    assert nobody.status_code == 403 and WL in nobody.json()["detail"]


def test_a_report_written_before_the_queue_was_recorded_is_a_gap_not_a_zero() -> None:
    from airflow_batch_provider.ledger.reads import RunRecord

    old = {"states": {"succeeded": 3}, "items_by_route": {"batch": 3}, "cost_per_usable_result": "0.01"}
    run = RunRecord(WL, "r", DAG, "openai", MODEL, FIRST_NIGHT, FIRST_NIGHT, json.dumps(old))
    point = trend.night(run)
    assert point["review_queue"] is None
    assert (point["realtime_items"], point["realtime_share"]) == (0, "0.000000")
    no_routes = trend.night(RunRecord(WL, "r", DAG, "openai", MODEL, FIRST_NIGHT, FIRST_NIGHT, "{}"))
    assert (no_routes["realtime_share"], no_routes["items"]) == (None, 0)


# ------------------------------------------------------------------------------------------ the page


def test_the_workload_page_tables_the_trend_and_points_its_script_at_the_json(
    writer: Ledger, ledger_url: str
) -> None:
    reports = [seed_night(writer, n, ok=3 + n, permanent=n % 2, realtime=1) for n in range(3)]
    client = client_for(ledger_url)

    page = client.get("/", params={"workload": WL, "nights": 90}).text

    section = page.split('<section class="trend"', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r'<tr data-run-id="([^"]+)">', section)
    assert rows == [night_id(n) for n in (2, 1, 0)]  # newest first, as the runs table
    for report in reports:
        assert money(report["cost_per_usable_result"]) in section
    assert 'data-trend-src="/api/trend?workload=feedback&amp;nights=90"' in section
    assert '<option value="90" selected>' in section
    assert '<script src="/static/trend.js" defer></script>' in page
    # the all-workloads page has no trend (a chart per workload, on its page)
    assert 'class="trend"' not in client.get("/").text
    script = client.get("/static/trend.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert script.text == trend.script().decode()


def test_a_year_of_nights_is_two_queries_of_the_runs_table_and_reads_no_item_row(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'year.sqlite'}"
    writer = Ledger.from_url(url)
    seed_year(writer, 365)
    writer.engine.dispose()
    client = client_for(url)
    client.get("/api/trend", params={"workload": WL})  # opens the read-only engine
    statements: list[str] = []
    event.listen(
        open_readonly(url).engine,
        "before_cursor_execute",
        lambda conn, cur, statement, *rest: statements.append(statement),
    )
    try:
        body = client.get("/api/trend", params={"workload": WL, "nights": 365}).json()
        trend_reads = list(statements)
        statements.clear()
        page = client.get("/", params={"workload": WL, "nights": 365}).text
    finally:
        open_readonly(url).engine.dispose()
        open_readonly.cache_clear()

    assert len(body["nights"]) == 365
    assert [n["review_queue"] for n in body["nights"]] == [10 + n for n in range(365)]
    assert body["nights"][100]["realtime_share"] == share(100 % 5 + 100 % 7, 1100 + 100 % 7 + 100 % 5)
    ledger_reads = [st for st in trend_reads if "FROM abp_" in st]
    # which DAGs ran the workload (who may read them), then its runs: never the items
    assert len(ledger_reads) == 2, ledger_reads
    assert all(
        "abp_runs" in st and not re.search(r"abp_(items|attempts|results|jobs)\b", st) for st in ledger_reads
    )
    assert page.count('<tr data-run-id="') == 365
    # the page adds its runs table and its latest run's detail, a few queries whatever the nights
    assert len([st for st in statements if "FROM abp_" in st]) < 15


def test_the_trend_names_its_runs_currency_and_says_mixed_when_they_differ() -> None:
    from airflow_batch_provider.ledger.reads import RunRecord

    def run(i: int, currency: str) -> RunRecord:
        report = json.dumps({"states": {"succeeded": 1}, "currency": currency})
        return RunRecord(WL, f"r{i}", DAG, "openai", MODEL, FIRST_NIGHT, FIRST_NIGHT, report)

    assert trend.trend(WL, [run(0, "EUR"), run(1, "EUR")], 2)["currency"] == "EUR"
    assert trend.trend(WL, [run(0, "EUR"), run(1, "USD")], 2)["currency"] == "mixed"
    assert trend.trend(WL, [], 30) | {"nights": []} == trend.trend(WL, [], 30)
    assert trend.trend(WL, [], 30)["currency"] == "USD"
