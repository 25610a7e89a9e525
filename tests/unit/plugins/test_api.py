"""The LLM batch page over a real ledger: SQLite files (and PostgreSQL) written through the Ledger API.

The review queue's pages and actions are tested in ``test_review.py``; the seeded ledger and the
users are in ``seeding.py`` and ``conftest.py``.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from airflow_batch_provider.core.results import ItemResult
from airflow_batch_provider.core.states import ITEM_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.plugins.api import create_app, open_readonly, readonly_url
from airflow_batch_provider.plugins.view import STATE_COLORS, STATE_ORDER, bar_segments, money, share
from tests.unit.plugins.seeding import (
    DAG,
    HOSTILE_WL,
    LEGACY,
    MODEL,
    RUN,
    TICKETS,
    TICKETS_DAG,
    USAGE,
    WL,
    Seeded,
    Shared,
    client_for,
    cost_of,
    prep,
    seed_finished_run,
    stage_and_submit,
)

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
