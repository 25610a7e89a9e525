"""The review queue of the LLM batch page (``plugins.review``): its pages, exports and actions, through the page's routes over a real ledger."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from urllib.parse import quote

from fastapi.testclient import TestClient
from sqlalchemy import text

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.plugins.api import open_for_actions
from tests.unit.ledger.jobs import job_row
from tests.unit.plugins.seeding import (
    DAG,
    LEGACY,
    RUN,
    SECRET,
    TICKETS,
    WL,
    Seeded,
    Shared,
    client_for,
    prep,
    seed_finished_run,
    stage_and_submit_unsent,
)

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
    from airflow_batch_provider.plugins.review import form_token

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
    from airflow_batch_provider.plugins.review import form_token

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
            job_row(WL, "doubt-run", 1, provider="anthropic"),
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
