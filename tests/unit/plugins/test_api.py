"""The LLM batch page over a real ledger: SQLite files (and PostgreSQL) written through the Ledger API."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.core.states import ITEM_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.operators.batch import build_report
from airflow_batch_provider.plugins.access import Access, StaticAccess
from airflow_batch_provider.plugins.api import create_app, open_for_actions, open_readonly, readonly_url
from airflow_batch_provider.plugins.view import STATE_COLORS, STATE_ORDER, bar_segments, money, share

MODEL = "gpt-4o-mini"
WL = "feedback"
RUN = "scheduled__2026-11-29T02:00:00+00:00"
DAG = "nightly_feedback"
HOSTILE_WL = '<script>alert("wl")</script>'
HOSTILE_APP = '"><img src=x onerror=alert(1)>'
USAGE = Usage(input_tokens=500, output_tokens=20)


def cost_of(usage: Usage) -> Decimal:
    """Batch price of gpt-4o-mini from the shipped table, as the download task prices lines."""
    return cost(usage, PriceTable.load(None).price("openai", MODEL), "batch")


def prep(app_id: str) -> PreparedItem:
    return PreparedItem(
        item_key(app_id),
        CanonicalRequest(
            app_id=app_id,
            prompt_version="v1",
            model=MODEL,
            system="Label the comment.",
            messages=({"role": "user", "content": f"comment {app_id}"},),
            params={"max_tokens": 20},
        ),
    )


def stage_and_submit(
    ledger: Ledger, workload: str, run_id: str, app_ids: list[str], round_: int, batch_id: str
) -> tuple[str, dict[str, str]]:
    """Record one job the way the prepare/resubmit tasks do, then mark it submitted."""
    job_id = f"{workload}:{run_id}:r{round_}:c00000"
    cids = {}
    placements = []
    for app_id in app_ids:
        attempt = round_
        cid = make_custom_id(item_key(app_id), attempt, 0)
        cids[app_id] = cid
        placements.append((item_key(app_id), "v1", cid, attempt))
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": workload,
            "run_id": run_id,
            "round": round_,
            "chunk_index": 0,
            "provider": "openai",
            "model": MODEL,
            "idempotency_key": f"key-{job_id}",
            "staged_path": f"/secret-bucket/{job_id}.jsonl",
            "input_sha256": "0" * 64,
            "lines": len(placements),
            "size_bytes": 100 * len(placements),
        },
        placements,
    )
    ledger.mark_submitted(job_id, batch_id, f"file-{batch_id}")
    return job_id, cids


@dataclass(frozen=True)
class Seeded:
    url: str
    report: dict[str, Any]


def seed_finished_run(
    ledger: Ledger,
    workload: str = WL,
    hostile_app: bool = False,
    dag_id: str | None = DAG,
    permanent_message: str = "<bad request>",
) -> dict[str, Any]:
    """Ten items: 7 succeed in round 1, 1 fails retryably and succeeds in round 2, 1 fails for good,
    1 is missing from every result file; then the run is published like the publish task does."""
    ids = [f"c{i:02d}" for i in range(9)] + [HOSTILE_APP if hostile_app else "c09"]
    ledger.start_run(workload, RUN, "openai", MODEL, dag_id=dag_id)
    ledger.upsert_items(workload, RUN, [prep(a) for a in ids])
    job1, cids = stage_and_submit(ledger, workload, RUN, ids, 1, "batch_round1_abc")
    results = [ItemResult(cids[a], "succeeded", output={"label": "ok"}, usage=USAGE) for a in ids[:7]]
    results.append(
        ItemResult(cids[ids[7]], "failed_retryable", usage=Usage(), error_code="500", error_message="boom")
    )
    results.append(
        ItemResult(
            cids[ids[9]], "failed_permanent", usage=Usage(), error_code="400", error_message=permanent_message
        )
    )
    ledger.apply_results(job1, results, cost_of)
    missing = ledger.mark_missing(job1)
    assert missing == 1
    ledger.update_job(
        job1,
        state="reconciled",
        batch_state="completed",
        result_lines=9,
        malformed_lines=1,
        duplicate_lines=2,
        missing=missing,
    )
    ledger.transition(workload, RUN, "staged", ["failed_retryable"], keys=[(item_key(ids[7]), "v1")])
    job2, cids2 = stage_and_submit(ledger, workload, RUN, [ids[7]], 2, "batch_round2_def")
    ledger.apply_results(
        job2, [ItemResult(cids2[ids[7]], "succeeded", output={"label": "ok"}, usage=USAGE)], cost_of
    )
    ledger.update_job(job2, state="reconciled", batch_state="completed", result_lines=1)
    # publish: exhausted/permanent items to review, then the report
    ledger.retry_candidates(workload, RUN, max_attempts=1)
    report = build_report(ledger, workload, RUN, "openai", None)
    ledger.finish_run(workload, RUN, report)
    return report


@pytest.fixture
def seeded(ledger_url: str) -> Iterator[Seeded]:
    writer = Ledger.from_url(ledger_url)
    try:
        report = seed_finished_run(writer)
    finally:
        writer.engine.dispose()
    yield Seeded(ledger_url, report)
    open_readonly(ledger_url).engine.dispose()
    open_readonly.cache_clear()


def client_for(url: str) -> TestClient:
    return TestClient(create_app(lambda: url, authenticate=False))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    yield url
    open_readonly.cache_clear()


# ------------------------------------------------------------------------------------------ JSON


def test_the_runs_endpoint_returns_the_published_figures(seeded: Seeded) -> None:
    report = seeded.report
    body = client_for(seeded.url).get("/api/runs", params={"workload": WL, "limit": 5}).json()

    assert len(body["runs"]) == 1
    run = body["runs"][0]
    assert (run["workload"], run["run_id"], run["provider"], run["model"]) == (WL, RUN, "openai", MODEL)
    assert run["finished"] is True
    assert run["items"] == 10
    assert run["usable_results"] == 8
    assert run["states"] == {"succeeded": 8, "review": 2}
    assert run["paid"] == report["paid"]
    assert run["cost_per_usable_result"] == report["cost_per_usable_result"]
    # the figures are the ledger's: 8 successful lines of 500 in / 20 out at batch price (the failed
    # lines carried no usage), over 8 usable results
    assert Decimal(run["paid"]) == 8 * cost_of(USAGE)
    assert Decimal(run["cost_per_usable_result"]) == cost_of(USAGE)


def test_the_run_endpoint_returns_states_routes_jobs_and_report(seeded: Seeded) -> None:
    resp = client_for(seeded.url).get(f"/api/runs/{WL}/{quote(RUN, safe='')}")

    assert resp.status_code == 200
    body = resp.json()
    assert body["states"] == {"succeeded": 8, "review": 2}
    # as the report counts them: every item in exactly one route, review items included
    assert body["routes"] == {"batch": 9, "resubmitted": 1}
    assert body["routes"] == {k: v for k, v in seeded.report["items_by_route"].items() if v}
    assert [(j["round"], j["batch_id"], j["lines"], j["result_lines"]) for j in body["jobs"]] == [
        (1, "batch_round1_abc", 10, 9),
        (2, "batch_round2_def", 1, 1),
    ]
    first = body["jobs"][0]
    assert (first["malformed_lines"], first["duplicate_lines"], first["missing"]) == (1, 2, 1)
    assert body["report"] == seeded.report
    assert Decimal(body["paid_so_far"]) == Decimal(seeded.report["paid"])
    assert body["attention"]["total"] == 2
    assert {(i["state"], i["error_code"]) for i in body["attention"]["sample"]} == {
        ("review", "400"),
        ("review", "missing"),
    }
    # staging paths and provider file ids stay out of the page
    dumped = json.dumps(body)
    assert "secret-bucket" not in dumped
    assert "file-batch_round1_abc" not in dumped


def test_an_unknown_run_is_404_in_json_and_html(seeded: Seeded) -> None:
    client = client_for(seeded.url)

    assert client.get(f"/api/runs/{WL}/no-such-run").status_code == 404
    assert client.get("/api/runs/no-such-workload/" + quote(RUN, safe="")).status_code == 404
    page = client.get("/run", params={"workload": WL, "run_id": "no-such-run"})
    assert page.status_code == 404
    assert "no-such-run" in page.text


# ------------------------------------------------------------------------------------------ HTML


def test_the_page_shows_the_run_its_counts_and_its_cost_per_usable_result(seeded: Seeded) -> None:
    report = seeded.report
    resp = client_for(seeded.url).get("/")

    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    page = resp.text
    assert WL in page
    assert RUN in page
    assert "batch_round1_abc" in page and "batch_round2_def" in page
    assert re.search(r"succeeded <b>8</b>", page)
    assert re.search(r"review <b>2</b>", page)
    assert money(report["cost_per_usable_result"]) in page
    assert money(report["paid"]) in page
    assert money(report["sync_equivalent"]) in page
    assert money(report["savings"]) in page
    # a finished run is not refreshed
    assert 'http-equiv="refresh"' not in page


def test_rows_a_sink_refused_are_in_the_review_queue_with_its_message_and_the_counts_on_the_pages(
    seeded: Seeded,
) -> None:
    from airflow_batch_provider.core.custom_ids import item_key as key_of
    from airflow_batch_provider.ledger.deliveries import Delivery, note_in_report, record_deliveries

    writer = Ledger.from_url(seeded.url)
    try:
        rows = [Delivery(key_of(a), a, "v1", "delivered", "d") for a in ("c00", "c01")]
        rows.append(Delivery(key_of("c02"), "c02", "v1", "refused", "d", "IntegrityError: CHECK <label>"))
        record_deliveries(writer, WL, "tickets", RUN, rows)
        counts = {
            "written": 2,
            "unchanged": 5,
            "refused": 1,
            "messages": ["c02: IntegrityError: CHECK <label>"],
        }
        note_in_report(writer, WL, RUN, "tickets", counts)
    finally:
        writer.engine.dispose()
    client = client_for(seeded.url)
    api = client.get("/api/review", params={"workload": WL}).json()
    assert [(r["sink"], r["app_id"], r["error"]) for r in api["refused_deliveries"]] == [
        ("tickets", "c02", "IntegrityError: CHECK <label>")
    ]
    review = client.get("/review", params={"workload": WL}).text
    assert "Rows a sink refused (1)" in review and "IntegrityError: CHECK &lt;label&gt;" in review
    for page in (
        client.get("/", params={"workload": WL}).text,
        client.get("/run", params={"workload": WL, "run_id": RUN}).text,
    ):
        assert re.search(
            r"<td>tickets</td><td class=\"num\">2</td><td class=\"num\">5</td><td class=\"num\">1</td>", page
        )


def test_a_consumers_counts_are_on_the_run_pages_and_a_hand_off_it_failed_on_is_in_the_review_queue(
    seeded: Seeded,
) -> None:
    from airflow_batch_provider.ledger.handoffs import (
        acknowledge,
        note_handoffs_in_report,
        pending_for,
        settle,
    )

    writer = Ledger.from_url(seeded.url)
    try:
        writer.publish(WL, RUN)  # the run's answers into the results table, as the publish task does
        offered = sorted(pending_for(writer, WL, "escalations", RUN), key=lambda h: h.app_id)
        assert len(offered) == 8
        acknowledge(writer, WL, "escalations", [h.key for h in offered[:2]])
        settle(writer, WL, "escalations", [offered[2].key], "refused", "HTTPError: 503 <helpdesk>")
        settle(writer, WL, "escalations", [h.key for h in offered[3:]], "left_out")
        note_handoffs_in_report(writer, WL, RUN, "escalations", {"acted": 2})
    finally:
        writer.engine.dispose()
    client = client_for(seeded.url)
    api = client.get("/api/review", params={"workload": WL}).json()
    assert [(r["sink"], r["app_id"], r["error"]) for r in api["refused_deliveries"]] == [
        ("escalations", offered[2].app_id, "HTTPError: 503 <helpdesk>")
    ]
    for page in (
        client.get("/", params={"workload": WL}).text,
        client.get("/run", params={"workload": WL, "run_id": RUN}).text,
    ):
        assert "<h2>Consumers</h2>" in page and "<h2>Deliveries</h2>" not in page  # not a sink
        assert (
            '<td>escalations</td><td class="num">2</td><td class="num">0</td>'
            '<td class="num">5</td><td class="num">1</td>'
        ) in page


def test_the_run_page_and_the_dag_run_tab_show_the_same_run(seeded: Seeded) -> None:
    client = client_for(seeded.url)
    run_page = client.get("/run", params={"workload": WL, "run_id": RUN})
    # the Airflow UI fills {RUN_ID} with encodeURIComponent: '+' arrives as %2B
    tab = client.get(f"/dag-run?dag_id={DAG}&run_id={quote(RUN, safe='')}")

    for resp in (run_page, tab):
        assert resp.status_code == 200
        assert "batch_round1_abc" in resp.text
        assert money(seeded.report["cost_per_usable_result"]) in resp.text
    empty = client.get("/dag-run", params={"dag_id": "other", "run_id": "manual__elsewhere"})
    assert empty.status_code == 200
    assert "No batch workload recorded" in empty.text


def test_hostile_workload_and_app_ids_are_escaped(sqlite_url: str) -> None:
    writer = Ledger.from_url(sqlite_url)
    seed_finished_run(writer, workload=HOSTILE_WL, hostile_app=True)
    writer.engine.dispose()
    client = client_for(sqlite_url)

    pages = [
        client.get("/").text,
        client.get("/run", params={"workload": HOSTILE_WL, "run_id": RUN}).text,
        client.get("/dag-run", params={"dag_id": DAG, "run_id": RUN}).text,
        client.get("/", params={"workload": HOSTILE_WL}).text,
    ]
    for page in pages:
        # the only script tag is the plugin's own (on the workload's page)
        assert re.findall(r"<script[^>]*>", page) in ([], ['<script src="/static/trend.js" defer>'])
        assert "<img" not in page
        assert "<bad request>" not in page
    assert "&lt;script&gt;alert(&#34;wl&#34;)&lt;/script&gt;" in pages[0]
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in pages[1]
    assert "&lt;bad request&gt;" in pages[1]
    # links carry the hostile name URL-encoded inside an escaped attribute
    assert "workload=%3Cscript%3Ealert%28%22wl%22%29%3C%2Fscript%3E" in pages[0]
    resp = client.get("/api/runs", params={"workload": HOSTILE_WL}).json()
    assert resp["runs"][0]["workload"] == HOSTILE_WL


def test_the_page_loads_nothing_external_and_runs_only_its_own_script(seeded: Seeded) -> None:
    client = client_for(seeded.url)
    resp = client.get("/")
    page = resp.text

    assert "<script" not in page.lower()
    # the workload's page has one script: the plugin's own file, no inline code
    workload_page = client.get("/", params={"workload": WL}).text
    assert re.findall(r"<script[^>]*>", workload_page) == ['<script src="/static/trend.js" defer>']
    assert re.search(r"<script[^>]*></script>", workload_page)
    assert not re.search(r"""src=["']?(https?:)?//""", page + workload_page)
    # the only external addresses are links (not loads) to the provider's console, opened apart
    external = re.findall(r"""<a href="(https?:)?//[^"]*"([^>]*)>""", page)
    assert external
    assert all('rel="noopener noreferrer"' in attrs for _scheme, attrs in external)
    csp = resp.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "script-src 'self';" in csp and "connect-src 'self';" in csp
    assert "unsafe-eval" not in csp and "'unsafe-inline'" not in csp.split("style-src")[0]
    assert "frame-ancestors 'self'" in csp
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_links_keep_the_mount_prefix(seeded: Seeded) -> None:
    parent = FastAPI()
    parent.mount("/llm-batch", create_app(lambda: seeded.url, authenticate=False))
    client = TestClient(parent)

    page = client.get("/llm-batch/").text
    expected = "/llm-batch/run?" + urlencode({"workload": WL, "run_id": RUN}).replace("&", "&amp;")
    assert expected in page
    assert client.get("/llm-batch/run", params={"workload": WL, "run_id": RUN}).status_code == 200
    assert client.get("/llm-batch/icon.svg").headers["content-type"].startswith("image/svg+xml")


# ------------------------------------------------------------------------------------------ live runs


def test_an_unfinished_run_refreshes_and_shows_what_it_paid_so_far(sqlite_url: str) -> None:
    writer = Ledger.from_url(sqlite_url)
    ids = [f"c{i}" for i in range(6)]
    writer.start_run(WL, RUN, "openai", MODEL, dag_id=DAG)
    writer.upsert_items(WL, RUN, [prep(a) for a in ids])
    job, cids = stage_and_submit(writer, WL, RUN, ids[:4], 1, "batch_live")
    writer.apply_results(job, [ItemResult(cids["c0"], "succeeded", output="x", usage=USAGE)], cost_of)
    writer.engine.dispose()
    client = client_for(sqlite_url)

    detail = client.get(f"/api/runs/{WL}/{quote(RUN, safe='')}").json()
    assert detail["finished"] is False
    assert detail["report"] is None
    assert detail["states"] == {"succeeded": 1, "submitted": 3, "pending": 2}
    assert detail["open_items"] == 5
    assert Decimal(detail["paid_so_far"]) == cost_of(USAGE)
    page = client.get("/").text
    assert '<meta http-equiv="refresh" content="15">' in page
    assert "running" in page
    assert money(str(cost_of(USAGE))) in page


# ------------------------------------------------------------------------------------------ read-only


def test_the_app_opens_sqlite_read_only_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ledger.sqlite"
    url = f"sqlite:///{missing}"
    resp = client_for(url).get("/")

    assert resp.status_code == 503
    assert not missing.exists()
    assert not missing.parent.exists()
    assert str(tmp_path) not in resp.text
    # an empty database file: the page says so, and no table appears
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    url = f"sqlite:///{empty}"
    page = client_for(url).get("/")
    assert page.status_code == 200
    assert "No run recorded" in page.text
    assert client_for(url).get("/api/runs").json() == {"runs": []}
    assert inspect(open_readonly(url).engine).get_table_names() == []
    open_readonly.cache_clear()


def test_the_read_only_engine_refuses_writes(seeded: Seeded) -> None:
    engine = open_readonly(seeded.url).engine
    with pytest.raises(Exception, match=r"(?i)read.?only"), engine.begin() as conn:
        conn.execute(text("DELETE FROM abp_runs"))
    assert client_for(seeded.url).get("/api/runs").json()["runs"][0]["run_id"] == RUN


def test_a_ledger_that_cannot_be_opened_is_reported_without_its_url() -> None:
    secret = "postgresql://admin:hunter2@db.internal:5432/ledger"

    def broken() -> str:
        raise RuntimeError(f"could not connect to {secret}")

    client = TestClient(create_app(broken, authenticate=False))
    page = client.get("/")
    api = client.get("/api/runs")

    assert page.status_code == api.status_code == 503
    for text_ in (page.text, api.text):
        assert "hunter2" not in text_ and "db.internal" not in text_
    assert "RuntimeError" in api.json()["detail"]


def test_no_request_can_make_the_server_open_another_database(seeded: Seeded, tmp_path: Path) -> None:
    opened: list[str] = []

    def configured() -> str:
        opened.append(seeded.url)
        return seeded.url

    client = TestClient(create_app(configured, authenticate=False))
    other = f"sqlite:///{tmp_path / 'elsewhere.sqlite'}"
    for params in ({"conn_id": "ledger_prod"}, {"conn_id": other}, {"ledger_url": other}):
        resp = client.get("/api/runs", params=params)
        assert resp.status_code == 200
        assert [r["run_id"] for r in resp.json()["runs"]] == [RUN]
    assert set(opened) == {seeded.url}
    assert not (tmp_path / "elsewhere.sqlite").exists()


def test_readonly_urls_per_backend() -> None:
    url, kwargs = readonly_url("sqlite:////data/ledger.sqlite")
    parsed = make_url(url)
    assert parsed.database == "file:/data/ledger.sqlite"
    assert dict(parsed.query) == {"mode": "ro", "uri": "true"}
    url, kwargs = readonly_url("postgresql+psycopg2://u:p@h:5432/ledger")
    assert url == "postgresql+psycopg2://u:p@h:5432/ledger"
    assert kwargs["connect_args"]["options"] == "-c default_transaction_read_only=on"


# ------------------------------------------------------------------------------------------ formatting


def test_the_bar_keeps_every_state_visible_and_its_total_width() -> None:
    segments = bar_segments({"review": 1, "succeeded": 2999, "pending": 0})

    assert [s["state"] for s in segments] == ["succeeded", "review"]
    assert segments[1]["width"] >= 0.6
    assert sum(s["width"] for s in segments) == pytest.approx(100, abs=0.01)
    assert segments[1]["x"] == pytest.approx(segments[0]["width"], abs=0.01)
    assert [s["share"] for s in segments] == ["99.9%", "<0.1%"]
    assert bar_segments({}) == []


def test_every_item_state_has_a_place_and_a_colour_on_the_page() -> None:
    assert sorted(STATE_ORDER) == sorted(ITEM_STATES)
    assert set(STATE_COLORS) == set(ITEM_STATES)


def test_money_keeps_fractions_of_a_cent_readable() -> None:
    assert money("1234.5") == "$1,234.50"
    assert money("0.1389") == "$0.1389"
    assert money("0.0000463") == "$0.0000463"
    assert money("0") == "$0.00"
    assert money(None) == "n/a"
    assert share(2999, 3000) == "99.9%"
    assert share(3000, 3000) == "100%"


# ------------------------------------------------------------------------------------------ permissions
#
# Three workloads: ``feedback`` run by DAG nightly_feedback, ``tickets`` by DAG nightly_tickets on
# the same schedule (so the same run id), and ``legacy`` recorded without a DAG. The users are
# fixed lists of DAGs (the auth manager's answers); the Airflow login and auth manager themselves
# are exercised through the real API server in ``test_batch_progress.py``.

TICKETS, TICKETS_DAG, LEGACY = "tickets", "nightly_tickets", "legacy"
USERS: dict[str, StaticAccess] = {
    "admin": StaticAccess("admin", read=None, edit=None),
    "feedback_viewer": StaticAccess("feedback_viewer", read=frozenset({DAG})),
    "feedback_editor": StaticAccess("feedback_editor", read=frozenset({DAG}), edit=frozenset({DAG})),
    "nobody": StaticAccess("nobody", read=frozenset(), edit=frozenset()),
}


@dataclass(frozen=True)
class EditNoTrigger:
    """May edit the feedback DAG but not trigger its runs (an auth manager can answer so)."""

    actor: str = "no_trigger"

    def allowed(self, method: str, dag_id: str | None) -> bool:
        return dag_id == DAG and method in ("GET", "PUT")


SECRET = b"test-form-secret"


def user_from_header(request: Request) -> Access:
    name = request.headers["x-user"]
    return EditNoTrigger() if name == "no_trigger" else USERS[name]


@dataclass(frozen=True)
class Shared:
    url: str
    triggered: list[tuple[str, str, str]] = field(default_factory=list)

    def trigger(self, dag_id: str, actor: str, note: str) -> str:
        """Stands in for Airflow's trigger_dag (the stack test triggers for real)."""
        if dag_id == "broken":
            raise ConnectionError("metadata database unreachable")
        self.triggered.append((dag_id, actor, note))
        return f"manual__{len(self.triggered)}"

    def client(self, user: str) -> TestClient:
        app = create_app(
            lambda: self.url,
            access_for=user_from_header,
            authenticate=False,
            form_secret=SECRET,
            trigger=self.trigger,
        )
        return TestClient(app, headers={"x-user": user})


@pytest.fixture
def shared(sqlite_url: str) -> Iterator[Shared]:
    writer = Ledger.from_url(sqlite_url)
    try:
        seed_finished_run(writer)
        seed_finished_run(writer, workload=TICKETS, dag_id=TICKETS_DAG, permanent_message="=HYPERLINK(1)")
        seed_finished_run(writer, workload=LEGACY, dag_id=None)
    finally:
        writer.engine.dispose()
    yield Shared(sqlite_url)
    open_for_actions.cache_clear()


def run_ids(client: TestClient) -> set[tuple[str, str]]:
    return {(r["workload"], r["dag_id"]) for r in client.get("/api/runs").json()["runs"]}


def test_lists_show_only_the_runs_of_the_dags_a_user_may_read(ledger_url: str) -> None:
    writer = Ledger.from_url(ledger_url)
    seed_finished_run(writer)
    seed_finished_run(writer, workload=TICKETS, dag_id=TICKETS_DAG)
    seed_finished_run(writer, workload=LEGACY, dag_id=None)
    writer.engine.dispose()
    shared = Shared(ledger_url)
    try:
        assert run_ids(shared.client("admin")) == {(WL, DAG), (TICKETS, TICKETS_DAG), (LEGACY, None)}
        assert run_ids(shared.client("feedback_viewer")) == {(WL, DAG)}
        assert run_ids(shared.client("nobody")) == set()
        page = shared.client("feedback_viewer").get("/").text
        assert WL in page
        assert TICKETS not in page and LEGACY not in page
        assert "No run recorded" in shared.client("nobody").get("/").text
    finally:
        open_readonly(ledger_url).engine.dispose()
        open_readonly.cache_clear()


READ_ROUTES: list[tuple[str, str, dict[str, str]]] = [
    ("run page", "/run", {"workload": TICKETS, "run_id": RUN}),
    ("run JSON", f"/api/runs/{TICKETS}/{quote(RUN, safe='')}", {}),
    ("DAG run tab", "/dag-run", {"dag_id": TICKETS_DAG, "run_id": RUN}),
    ("review page", "/review", {"workload": TICKETS}),
    ("review JSON", "/api/review", {"workload": TICKETS}),
    ("review CSV", "/review/export", {"workload": TICKETS, "format": "csv"}),
    ("review JSONL", "/review/export", {"workload": TICKETS, "format": "jsonl"}),
]


@pytest.mark.parametrize(("_name", "path", "params"), READ_ROUTES, ids=[r[0] for r in READ_ROUTES])
def test_every_route_refuses_a_workload_of_a_dag_the_user_may_not_read(
    shared: Shared, _name: str, path: str, params: dict[str, str]
) -> None:
    allowed = shared.client("admin").get(path, params=params)
    refused = shared.client("feedback_viewer").get(path, params=params)

    assert allowed.status_code == 200, allowed.text[:300]
    assert refused.status_code == 403
    for secret_bit in ("HYPERLINK", "batch_round1_abc", "c09"):
        assert secret_bit not in refused.text
    # the same route for the workload of a DAG the user may read
    mine = {k: v.replace(TICKETS_DAG, DAG).replace(TICKETS, WL) for k, v in params.items()}
    assert shared.client("feedback_viewer").get(path.replace(TICKETS, WL), params=mine).status_code == 200


def test_a_run_recorded_without_a_dag_is_shown_only_to_a_user_allowed_on_every_dag(shared: Shared) -> None:
    for path, params in (
        ("/run", {"workload": LEGACY, "run_id": RUN}),
        ("/review", {"workload": LEGACY}),
        (f"/api/runs/{LEGACY}/{quote(RUN, safe='')}", {}),
    ):
        assert shared.client("admin").get(path, params=params).status_code == 200
        assert shared.client("feedback_editor").get(path, params=params).status_code == 403


def test_the_dag_run_tab_matches_the_dag_and_the_run_id(shared: Shared) -> None:
    client = shared.client("admin")

    feedback = client.get("/dag-run", params={"dag_id": DAG, "run_id": RUN}).text
    tickets = client.get("/dag-run", params={"dag_id": TICKETS_DAG, "run_id": RUN}).text

    # both DAGs ran under the same scheduled run id; each tab shows its own workload only
    assert f"{WL}</a>" in feedback and f"{TICKETS}</a>" not in feedback
    assert f"{TICKETS}</a>" in tickets and f"{WL}</a>" not in tickets
    assert client.get("/dag-run", params={"run_id": RUN}).status_code == 422


def test_a_user_refused_a_dag_run_tab_learns_nothing_about_it(shared: Shared) -> None:
    resp = shared.client("feedback_viewer").get("/dag-run", params={"dag_id": TICKETS_DAG, "run_id": "nope"})
    assert resp.status_code == 403
    assert "Forbidden" in resp.text


# ------------------------------------------------------------------------------------------ review queue


def review_form(client: TestClient, workload: str) -> dict[str, str]:
    page = client.get("/review", params={"workload": workload}).text
    token = re.search(r'name="token" value="([0-9a-f]+)"', page)
    assert token, "the review page shows no action form"
    return {"workload": workload, "token": token.group(1)}


def item_state(url: str, workload: str, app_id: str) -> tuple[str, int]:
    reader = Ledger.from_url(url)
    try:
        with reader.engine.connect() as conn:
            row = conn.execute(
                text("SELECT state, attempts FROM abp_items WHERE workload = :w AND item_key = :k"),
                {"w": workload, "k": item_key(app_id)},
            ).one()
        return str(row.state), int(row.attempts)
    finally:
        reader.engine.dispose()


def test_the_review_page_lists_each_item_with_its_error_attempts_and_cost(shared: Shared) -> None:
    client = shared.client("feedback_viewer")
    body = client.get("/api/review", params={"workload": WL}).json()

    assert body["by_error_code"] == {"400": 1, "missing": 1}
    assert body["total"] == 2
    rows = {r["app_id"]: r for r in body["items"]}
    assert (rows["c09"]["error_code"], rows["c09"]["error_message"], rows["c09"]["attempts"]) == (
        "400",
        "<bad request>",
        1,
    )
    assert rows["c08"]["error_code"] == "missing"
    assert Decimal(rows["c09"]["cost_so_far"]) == 0
    filtered = client.get("/api/review", params={"workload": WL, "error_code": "missing"}).json()
    assert [r["app_id"] for r in filtered["items"]] == ["c08"]
    page = client.get("/review", params={"workload": WL, "error_code": "400"}).text
    assert "c09" in page and "c08" not in page
    assert "&lt;bad request&gt;" in page
    # a viewer sees the queue but gets no form
    assert 'name="token"' not in page
    assert "needs edit permission" in page


def test_exports_carry_the_whole_queue_and_no_cell_runs_as_a_formula(shared: Shared) -> None:
    client = shared.client("admin")

    csv_text = client.get("/review/export", params={"workload": TICKETS, "format": "csv"}).text
    jsonl = client.get("/review/export", params={"workload": TICKETS, "format": "jsonl"}).text

    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("app_id,item_key,prompt_version,error_code,error_message")
    assert len(lines) == 3
    assert "'=HYPERLINK(1)" in csv_text
    assert ",=HYPERLINK" not in csv_text
    records = [json.loads(line) for line in jsonl.strip().splitlines()]
    assert {r["app_id"] for r in records} == {"c08", "c09"}
    assert {r["error_message"] for r in records if r["app_id"] == "c09"} == {"=HYPERLINK(1)"}
    only = client.get("/review/export", params={"workload": TICKETS, "format": "jsonl", "error_code": "400"})
    assert [json.loads(x)["app_id"] for x in only.text.strip().splitlines()] == ["c09"]


def test_a_viewer_cannot_act_on_the_queue_even_with_a_valid_form(shared: Shared) -> None:
    form = review_form(shared.client("feedback_editor"), WL)
    viewer = shared.client("feedback_viewer")

    resp = viewer.post(
        "/review/action",
        data={**form, "action": "skip", "reason": "not mine", "item_key": item_key("c09")},
        follow_redirects=False,
    )

    # the token is the editor's; with the viewer's own token the edit check refuses it
    assert resp.status_code == 403
    from airflow_batch_provider.plugins.api import form_token

    resp = viewer.post(
        "/review/action",
        data={
            "workload": WL,
            "token": form_token(SECRET, "feedback_viewer", WL),
            "action": "skip",
            "reason": "not mine",
            "item_key": item_key("c09"),
        },
        follow_redirects=False,
    )
    assert resp.status_code == 403
    assert item_state(shared.url, WL, "c09") == ("review", 1)


def test_an_editor_of_one_dag_cannot_act_on_another_dags_workload(shared: Shared) -> None:
    from airflow_batch_provider.plugins.api import form_token

    resp = shared.client("feedback_editor").post(
        "/review/action",
        data={
            "workload": TICKETS,
            "token": form_token(SECRET, "feedback_editor", TICKETS),
            "action": "redrive",
            "reason": "x",
            "item_key": item_key("c09"),
        },
        follow_redirects=False,
    )
    assert resp.status_code == 403
    assert item_state(shared.url, TICKETS, "c09") == ("review", 1)


def test_a_form_without_the_users_token_is_refused(shared: Shared) -> None:
    editor = shared.client("feedback_editor")
    for token in ("", "0" * 64, review_form(shared.client("admin"), WL)["token"]):
        resp = editor.post(
            "/review/action",
            data={
                "workload": WL,
                "token": token,
                "action": "redrive",
                "reason": "x",
                "item_key": item_key("c09"),
            },
            follow_redirects=False,
        )
        assert resp.status_code == 403
    assert item_state(shared.url, WL, "c09") == ("review", 1)


def test_redrive_resolve_and_skip_move_the_items_and_are_audited(shared: Shared) -> None:
    editor = shared.client("feedback_editor")
    form = review_form(editor, WL)

    redriven = editor.post(
        "/review/action",
        data={**form, "action": "redrive", "reason": "prompt fixed in v2", "item_key": item_key("c09")},
        follow_redirects=False,
    )
    assert redriven.status_code == 303
    assert "done=redrive" in redriven.headers["location"] and "moved=1" in redriven.headers["location"]
    assert item_state(shared.url, WL, "c09") == ("pending", 0)

    skipped = editor.post(
        "/review/action",
        data={**form, "action": "skip", "reason": "source row deleted", "every_with_error_code": "missing"},
        follow_redirects=False,
    )
    assert skipped.status_code == 303
    assert item_state(shared.url, WL, "c08")[0] == "skipped"
    assert editor.get("/api/review", params={"workload": WL}).json()["total"] == 0

    page = editor.get(redriven.headers["location"].removeprefix("http://testserver")).text
    assert "Re-driven: 1 item(s)" in page
    trail = page.split("Audit trail", 1)[1]
    assert "feedback_editor" in trail
    assert "prompt fixed in v2" in trail and "source row deleted" in trail
    # the other workloads' queues are untouched
    assert item_state(shared.url, TICKETS, "c09") == ("review", 1)


def test_a_redrive_of_items_whose_job_is_in_doubt_is_refused_naming_the_job_and_moves_nothing(
    shared: Shared,
) -> None:
    writer = Ledger.from_url(shared.url)
    try:
        writer.upsert_items(WL, "doubt-run", [prep("d01")])
        job_id = f"{WL}:doubt-run:r1:c00000"
        writer.record_job(
            {
                "job_id": job_id,
                "workload": WL,
                "run_id": "doubt-run",
                "round": 1,
                "chunk_index": 0,
                "provider": "anthropic",
                "model": MODEL,
                "idempotency_key": f"key-{job_id}",
                "staged_path": f"/staging/{job_id}.jsonl",
                "input_sha256": "0" * 64,
                "lines": 1,
                "size_bytes": 100,
            },
            [(item_key("d01"), "v1", make_custom_id(item_key("d01"), 1, 0), 1)],
        )
        writer.mark_job_in_doubt(job_id, "lost create reply")
        writer.transition(
            WL, "doubt-run", "review", ["staged"], keys=[(item_key("d01"), "v1")], error_code="in_doubt"
        )
    finally:
        writer.engine.dispose()
    editor = shared.client("feedback_editor")
    resp = editor.post(
        "/review/action",
        data={
            **review_form(editor, WL),
            "action": "redrive",
            "reason": "x",
            "every_with_error_code": "in_doubt",
        },
        follow_redirects=False,
    )
    assert resp.status_code == 409
    assert job_id in resp.text and "airflow-batch jobs resolve" in resp.text
    assert item_state(shared.url, WL, "d01") == ("review", 1)


def test_resolving_needs_a_reason_and_takes_the_item_out_of_the_queue(shared: Shared) -> None:
    editor = shared.client("feedback_editor")
    form = review_form(editor, WL)

    missing_reason = editor.post(
        "/review/action", data={**form, "action": "resolve", "reason": "  ", "item_key": item_key("c09")}
    )
    assert missing_reason.status_code == 400
    nothing_selected = editor.post("/review/action", data={**form, "action": "resolve", "reason": "x"})
    assert nothing_selected.status_code == 400
    resolved = editor.post(
        "/review/action",
        data={
            **form,
            "action": "resolve",
            "reason": "answered by hand in ticket 42",
            "item_key": item_key("c09"),
        },
        follow_redirects=False,
    )
    assert resolved.status_code == 303
    queue = editor.get("/api/review", params={"workload": WL}).json()
    assert [r["app_id"] for r in queue["items"]] == ["c08"]
    assert item_state(shared.url, WL, "c09")[0] == "review"


def test_batches_in_doubt_are_shown_apart_with_what_is_known(shared: Shared) -> None:
    writer = Ledger.from_url(shared.url)
    job_id, _ = stage_and_submit_unsent(writer, TICKETS, "manual__in_doubt", ["d1", "d2"])
    writer.mark_job_in_doubt(
        job_id, "create call timed out after the upload; look-up by key found nothing yet"
    )
    writer.engine.dispose()

    body = shared.client("admin").get("/api/review", params={"workload": TICKETS}).json()
    assert [(j["job_id"], j["lines"]) for j in body["in_doubt"]] == [(job_id, 2)]
    assert "timed out" in body["in_doubt"][0]["reason"]
    page = shared.client("admin").get("/review", params={"workload": TICKETS}).text
    assert "Batches in doubt (1)" in page and job_id in page
    assert shared.client("admin").get("/api/review", params={"workload": WL}).json()["in_doubt"] == []


def stage_and_submit_unsent(
    ledger: Ledger, workload: str, run_id: str, app_ids: list[str]
) -> tuple[str, dict[str, str]]:
    """A staged job of a new run whose create call never confirmed (no batch id)."""
    ledger.start_run(workload, run_id, "openai", MODEL, dag_id=TICKETS_DAG)
    ledger.upsert_items(workload, run_id, [prep(a) for a in app_ids])
    job_id = f"{workload}:{run_id}:r1:c00000"
    cids = {a: make_custom_id(item_key(a), 1, 0) for a in app_ids}
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": workload,
            "run_id": run_id,
            "round": 1,
            "chunk_index": 0,
            "provider": "openai",
            "model": MODEL,
            "idempotency_key": f"key-{job_id}",
            "staged_path": f"/secret-bucket/{job_id}.jsonl",
            "input_sha256": "0" * 64,
            "lines": len(app_ids),
            "size_bytes": 100,
        },
        [(item_key(a), "v1", cids[a], 1) for a in app_ids],
    )
    return job_id, cids


def test_each_batch_links_to_its_console_page_at_the_provider(seeded: Seeded) -> None:
    body = client_for(seeded.url).get(f"/api/runs/{WL}/{quote(RUN, safe='')}").json()
    assert [j["console_url"] for j in body["jobs"]] == [
        "https://platform.openai.com/batches/batch_round1_abc",
        "https://platform.openai.com/batches/batch_round2_def",
    ]
    page = client_for(seeded.url).get("/run", params={"workload": WL, "run_id": RUN}).text
    assert 'href="https://platform.openai.com/batches/batch_round1_abc" rel="noopener noreferrer"' in page


def test_a_redrive_can_go_to_a_run_triggered_now_by_the_user(shared: Shared) -> None:
    editor = shared.client("feedback_editor")
    form = review_form(editor, WL)
    assert "trigger a run of nightly_feedback now" in editor.get("/review", params={"workload": WL}).text

    resp = editor.post(
        "/review/action",
        data={
            **form,
            "action": "redrive",
            "reason": "fixed",
            "item_key": item_key("c09"),
            "trigger_now": "1",
        },
        follow_redirects=False,
    )

    assert resp.status_code == 303
    assert shared.triggered == [(DAG, "feedback_editor", "re-drive of 1 review item(s): fixed")]
    assert item_state(shared.url, WL, "c09") == ("pending", 0)
    page = editor.get(resp.headers["location"].removeprefix("http://testserver")).text
    assert 'Triggered run <span class="mono">manual__1</span> of nightly_feedback' in page


def test_a_user_who_may_not_trigger_gets_nothing_moved(shared: Shared) -> None:
    user = shared.client("no_trigger")
    form = review_form(user, WL)
    assert "trigger a run of" not in user.get("/review", params={"workload": WL}).text

    resp = user.post(
        "/review/action",
        data={**form, "action": "redrive", "reason": "x", "item_key": item_key("c09"), "trigger_now": "1"},
        follow_redirects=False,
    )

    assert resp.status_code == 403
    assert shared.triggered == []
    assert item_state(shared.url, WL, "c09") == ("review", 1)
    # without the trigger the same user may re-drive
    plain = user.post(
        "/review/action",
        data={**form, "action": "redrive", "reason": "x", "item_key": item_key("c09")},
        follow_redirects=False,
    )
    assert plain.status_code == 303
    assert item_state(shared.url, WL, "c09") == ("pending", 0)


def test_a_workload_without_one_recorded_dag_cannot_trigger_and_moves_nothing(shared: Shared) -> None:
    admin = shared.client("admin")
    form = review_form(admin, LEGACY)

    resp = admin.post(
        "/review/action",
        data={**form, "action": "redrive", "reason": "x", "item_key": item_key("c09"), "trigger_now": "1"},
    )

    assert resp.status_code == 409
    assert "trigger the run you want yourself" in resp.text
    assert "trigger a run of" not in admin.get("/review", params={"workload": LEGACY}).text
    assert shared.triggered == []
    assert item_state(shared.url, LEGACY, "c09") == ("review", 1)
    only_redrive = admin.post(
        "/review/action",
        data={**form, "action": "skip", "reason": "x", "item_key": item_key("c09"), "trigger_now": "1"},
    )
    assert only_redrive.status_code == 409


def test_a_failed_trigger_keeps_the_redrive_and_says_so(sqlite_url: str) -> None:
    writer = Ledger.from_url(sqlite_url)
    seed_finished_run(writer, workload="fragile", dag_id="broken")
    writer.engine.dispose()
    shared = Shared(sqlite_url)
    admin = shared.client("admin")
    form = review_form(admin, "fragile")

    resp = admin.post(
        "/review/action",
        data={**form, "action": "redrive", "reason": "x", "item_key": item_key("c09"), "trigger_now": "1"},
    )

    assert resp.status_code == 200
    assert "could not be triggered (ConnectionError)" in resp.text
    assert item_state(sqlite_url, "fragile", "c09") == ("pending", 0)
    open_for_actions.cache_clear()
