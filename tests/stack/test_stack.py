"""``make stack`` for real: a workload triggered through Airflow's REST API, run by the real
scheduler (LocalExecutor) and triggerer, survives a triggerer crash while its batches are deferred.

Every other end-to-end test uses ``airflow dags test``, which runs triggers inline in one process;
this one runs Airflow's api-server, scheduler, dag-processor and triggerer as separate processes on
PostgreSQL, with the emulator as the provider. The triggerer is SIGKILLed (with the trigger
runner it started) while a batch task is deferred; the stack's supervisor starts a new one, which
takes the trigger over. The run must still succeed with every item final, no batch created twice
and no item paid twice. Then the review queue is worked through the page: the viewer is refused,
the admin re-drives an item into a run triggered now. The stack is always stopped, even when the
test fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from airflow_batch_provider.core.states import OPEN_STATES
from airflow_batch_provider.ledger import Ledger

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "stack_feedback"
WORKLOAD = "stack_feedback"
ITEMS = 600
_T = TypeVar("_T")


def wait_for(what: str, probe: Callable[[], _T | None], timeout: float, every: float = 2.0) -> _T:
    """Call ``probe`` until it returns something; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("stack")
    base.chmod(0o755)  # PostgreSQL runs as an unprivileged user when the tests run as root
    env = {
        **os.environ,
        "ABP_STACK_DIR": str(base),
        "ABP_STACK_DAGS_FOLDER": str(REPO / "tests" / "stack" / "dags"),
        # batches take ~14 s (not ~1 s): long enough to find one deferred and crash the triggerer
        "ABP_STACK_EMULATOR_TIME_SCALE": "1.0",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    script = [str(REPO / "scripts" / "stack.sh")]
    try:
        up = subprocess.run(
            ["bash", *script, "up"], env=env, capture_output=True, text=True, timeout=1200, check=False
        )
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        state = json.loads((base / "state.json").read_text(encoding="utf-8"))
        state["base"] = base
        yield state
    finally:
        down = subprocess.run(
            ["bash", *script, "down"], env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert down.returncode == 0, down.stdout + down.stderr


def login(state: dict[str, Any], user: str) -> httpx.Client:
    passwords = json.loads(Path(state["passwords_file"]).read_text(encoding="utf-8"))
    client = httpx.Client(base_url=state["api_url"], timeout=60)
    resp = client.post("/auth/token", json={"username": user, "password": passwords[user]})
    assert resp.status_code == 201, resp.text
    client.headers["Authorization"] = f"Bearer {resp.json()['access_token']}"
    return client


def component_pid(state: dict[str, Any], name: str) -> tuple[int, int]:
    current = json.loads((state["base"] / "state.json").read_text(encoding="utf-8"))
    info = current["components"][name]
    return int(info["pid"]), int(info["restarts"])


def deferral_events_received(state: dict[str, Any], run_id: str, admin: httpx.Client) -> bool:
    """Whether the scheduler has logged the executor's event for every deferred wait task of the run."""
    tis = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    keys = [
        f"TaskInstanceKey(dag_id='{DAG_ID}', task_id='{ti['task_id']}', run_id='{run_id}',"
        f" try_number={ti['try_number']}, map_index={ti['map_index']})"
        for ti in tis
        if ti["task_id"].endswith(".wait") and ti["state"] == "deferred"
    ]
    log = (state["base"] / "logs" / "scheduler.log").read_text(encoding="utf-8", errors="replace")
    received = set(
        re.findall(
            r"Received executor event with state \w+ for task instance (TaskInstanceKey\([^)]*\))", log
        )
    )
    return bool(keys) and all(key in received for key in keys)


#: Seconds of emulated work each batch of the crashed run holds until the triggerer is restarted
#: (at the stack's time scale, far longer than any machine takes to defer and restart).
HELD_S = 20_000.0
#: The tasks of a chunk that end before its wait task defers.
UPSTREAM_OF_WAIT = ("lease", "prepare", "upload", "submit")


@pytest.fixture(scope="module")
def finished_run(stack: dict[str, Any]) -> dict[str, Any]:
    """One run of the workload, triggered through the REST API, with the triggerer crashed under it."""
    admin = login(stack, "admin")

    # 2% of the items fail for good (HTTP 400): they end in the review queue, worked below
    # and the run's batches stay in progress (HELD_S of emulated work) until the triggerer has been
    # killed and restarted: the emulator's clock, not the machine's speed, decides that the crash
    # comes mid-poll (a trigger firing as the triggerer dies is Airflow's race, not this test's)
    faults = httpx.put(
        f"{stack['emulator_url']}/_emulator/config",
        json={"faults": {"rate_400": 0.02}, "timings": {"in_progress_s": HELD_S}},
        timeout=30,
    )
    assert faults.status_code == 200, faults.text
    wait_for(
        "the DAG to be parsed", lambda: admin.get(f"/api/v2/dags/{DAG_ID}").status_code == 200 or None, 600
    )
    assert admin.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
    created = admin.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {}})
    assert created.status_code == 200, created.text
    run_id = created.json()["dag_run_id"]

    def deferred() -> list[str] | None:
        """Every wait task of the run, once all of them are deferred (its batches are held)."""
        tis = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        waits = [ti for ti in tis if ti["task_id"].endswith(".wait")]
        upstream_done = all(
            ti["state"] == "success" for ti in tis if ti["task_id"].rsplit(".", 1)[-1] in UPSTREAM_OF_WAIT
        )
        ready = waits and upstream_done and all(ti["state"] == "deferred" for ti in waits)
        return [f"{ti['task_id']}[{ti['map_index']}]" for ti in waits] if ready else None

    waiting = wait_for("every batch task to defer", deferred, 600, every=0.5)
    # a wait task is "deferred" once its worker said so; the scheduler learns that the worker has
    # exited only later, from the executor. Releasing the batches before then lets a trigger resume
    # the task first, and the late event of the deferral fails the resumed try (Airflow's race, seen
    # here after 5 s under load): release them only once the scheduler has had every such event
    wait_for(
        "the scheduler to receive every deferral's executor event",
        lambda: deferral_events_received(stack, run_id, admin) or None,
        600,
        every=0.5,
    )
    old_pid, restarts = component_pid(stack, "triggerer")
    os.killpg(old_pid, signal.SIGKILL)  # the triggerer and the trigger runner it started, mid-poll
    new_pid, _ = wait_for(
        "the supervisor to start a new triggerer",
        lambda: (lambda p: p if p[1] > restarts else None)(component_pid(stack, "triggerer")),
        120,
    )
    assert new_pid != old_pid
    released = httpx.put(
        f"{stack['emulator_url']}/_emulator/config", json={"timings": {"in_progress_s": 10.0}}, timeout=30
    )
    assert released.status_code == 200, released.text
    # the held batches finish at the emulator's clock: move it past their work (no batch expires by
    # the clock: expiry is a fault, and none is set)
    advanced = httpx.post(f"{stack['emulator_url']}/_emulator/clock", json={"advance_s": HELD_S}, timeout=30)
    assert advanced.status_code == 200, advanced.text

    def finished() -> str | None:
        state = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    assert wait_for("the run to finish", finished, 900, every=3.0) == "success", waiting
    return {"run_id": run_id, "restarted_triggerer": new_pid != old_pid}


def test_a_run_survives_a_triggerer_crash_and_pays_for_nothing_twice(
    stack: dict[str, Any], finished_run: dict[str, Any]
) -> None:
    run_id = finished_run["run_id"]
    assert finished_run["restarted_triggerer"]

    ledger = Ledger.from_url(stack["postgres"]["ledger_url"])
    try:
        states = ledger.count_states(WORKLOAD, run_id)
        assert sum(states.values()) == ITEMS
        assert not {s: n for s, n in states.items() if s in OPEN_STATES}, states
        with ledger.engine.connect() as conn:
            from sqlalchemy import text

            paid_twice = conn.execute(
                text(
                    "SELECT item_key, COUNT(*) FROM abp_attempts WHERE workload = :w AND outcome = 'succeeded'"
                    " AND NOT discarded GROUP BY item_key HAVING COUNT(*) > 1"
                ),
                {"w": WORKLOAD},
            ).all()
            batches = conn.execute(
                text("SELECT COUNT(*) FROM abp_jobs WHERE workload = :w AND batch_id IS NOT NULL"),
                {"w": WORKLOAD},
            ).scalar_one()
    finally:
        ledger.engine.dispose()
    assert paid_twice == []
    stats = httpx.get(f"{stack['emulator_url']}/_emulator/stats", timeout=30).json()
    assert stats["batches_created"] == batches, stats


def test_the_review_queue_is_worked_through_the_page(
    stack: dict[str, Any], finished_run: dict[str, Any]
) -> None:
    run_id = finished_run["run_id"]
    admin = login(stack, "admin")
    ledger = Ledger.from_url(stack["postgres"]["ledger_url"])
    try:
        states = ledger.count_states(WORKLOAD, run_id)
    finally:
        ledger.engine.dispose()

    # the page shows the finished run to a viewer, with every item accounted for
    viewer = login(stack, "viewer")
    runs = viewer.get("/llm-batch/api/runs", params={"workload": WORKLOAD}).json()["runs"]
    assert [(r["run_id"], r["dag_id"], r["finished"], r["items"]) for r in runs] == [
        (run_id, DAG_ID, True, ITEMS)
    ]
    queue = viewer.get("/llm-batch/api/review", params={"workload": WORKLOAD}).json()
    assert queue["total"] == states.get("review", 0) > 0
    first = queue["items"][0]["item_key"]

    # the viewer may not act; the admin re-drives one item into a run triggered now
    page = admin.get("/llm-batch/review", params={"workload": WORKLOAD}).text
    token = re.search(r'name="token" value="([0-9a-f]+)"', page)
    assert token and "trigger a run of stack_feedback now" in page
    form = {
        "workload": WORKLOAD,
        "token": token.group(1),
        "action": "redrive",
        "reason": "stack test",
        "item_key": first,
        "trigger_now": "1",
    }
    assert viewer.post("/llm-batch/review/action", data=form).status_code == 403
    done = admin.post("/llm-batch/review/action", data=form)
    assert done.status_code == 303, done.text
    location = parse_qs(urlsplit(done.headers["location"]).query)
    assert location["moved"] == ["1"]
    new_run = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{location['triggered'][0]}")
    assert new_run.status_code == 200
    assert new_run.json()["triggering_user_name"] == "admin"
    audit = admin.get("/llm-batch/review", params={"workload": WORKLOAD}).text.split("Audit trail", 1)[1]
    assert "admin" in audit and "stack test" in audit


CHROMIUM = Path(os.environ.get("ABP_CHROMIUM", "/usr/bin/chromium"))


def test_each_role_uses_the_page_in_a_real_browser(
    stack: dict[str, Any], finished_run: dict[str, Any]
) -> None:
    """Debian's chromium, driven by Playwright (no browser download): log in through Airflow's own
    login form as each role, read the page inside the Airflow UI, re-drive an item as the admin,
    follow a batch's console link. Screenshots go to ``$ABP_SCREENSHOTS_DIR`` (``docs/`` keeps them)."""
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install chromium (or set ABP_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api")
    shots = Path(os.environ.get("ABP_SCREENSHOTS_DIR") or stack["base"] / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    passwords = json.loads(Path(stack["passwords_file"]).read_text(encoding="utf-8"))
    api = stack["api_url"]
    review_url = f"{api}/llm-batch/review?workload={WORKLOAD}"

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        try:
            for user in ("viewer", "admin"):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.set_default_timeout(120_000)
                try:
                    # Airflow's own login form (SimpleAuthManager), then the plugin inside the UI
                    page.goto(f"{api}/plugin/llm-batch")
                    page.locator('input[type="password"]').wait_for()
                    page.locator('input:not([type="password"])').first.fill(user)
                    page.locator('input[type="password"]').fill(passwords[user])
                    page.get_by_role("button", name="Sign in").click()
                    # the login page sends the browser on to where it was going
                    page.wait_for_url(lambda url: "/auth/" not in url)
                    if "/plugin/llm-batch" not in page.url:
                        page.goto(f"{api}/plugin/llm-batch")
                    frame = page.frame_locator("iframe").first
                    frame.get_by_text("Recent runs").wait_for()
                    assert frame.get_by_text(finished_run["run_id"]).first.is_visible()
                    page.screenshot(path=str(shots / f"ui-{user}.png"))

                    page.goto(review_url)
                    page.get_by_text("In review").first.wait_for()
                    if user == "viewer":
                        assert page.get_by_role("button", name="Re-drive").count() == 0
                        assert page.get_by_text("needs edit permission").is_visible()
                        continue
                    page.locator('input[name="item_key"]').first.check()
                    page.locator('textarea[name="reason"]').fill("checked by hand in the browser test")
                    page.get_by_role("button", name="Re-drive").click()
                    page.get_by_text("Re-driven: 1 item(s)").wait_for()
                    assert "checked by hand in the browser test" in page.locator("body").inner_text()
                    page.screenshot(path=str(shots / "ui-review.png"), full_page=True)

                    # the workload's trend, drawn by the page's own script from /api/trend with the
                    # Airflow login's cookie (the page's CSP allows that script and nothing else)
                    page.goto(f"{api}/llm-batch/?workload={WORKLOAD}")
                    page.locator('[data-chart="drawn"]').wait_for()
                    nights = page.evaluate(
                        "[...document.querySelectorAll('svg[data-metric=\"states\"] g.night')]"
                        ".map(g => g.dataset.runId)"
                    )
                    assert finished_run["run_id"] in nights, nights

                    # a provider batch's console link (the stack points them at the emulator)
                    link = page.locator('a[rel="noopener noreferrer"]').first
                    batch_id = link.inner_text()
                    with context.expect_page() as opened:
                        link.click()
                    console = opened.value
                    console.wait_for_load_state()
                    assert batch_id in console.content()
                except Exception:
                    page.screenshot(path=str(shots / f"failure-{user}.png"), full_page=True)
                    raise
                finally:
                    context.close()
        finally:
            browser.close()
