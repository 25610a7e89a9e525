"""The plugin: discovered by Airflow, mounted by Airflow's own API server app, behind its login."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_batch_provider.plugins.batch_progress import (
    URL_PREFIX,
    BatchProgressPlugin,
    LazyBatchApp,
    batch_app,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def _airflow() -> list[str]:
    candidate = Path(sys.executable).parent / "airflow"
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "airflow"]


def test_airflow_discovers_the_plugin_with_its_app_and_views(airflow_home: dict[str, str]) -> None:
    result = subprocess.run(
        [*_airflow(), "plugins", "--output", "json"],
        env=airflow_home,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(result.stdout)}

    plugin = plugins["llm_batch"]
    assert "airflow_batch_provider.plugins.batch_progress:BatchProgressPlugin" in plugin["source"]
    assert [(a["name"], a["url_prefix"]) for a in plugin["fastapi_apps"]] == [("LLM batch", "/llm-batch")]
    views = {v["destination"]: v for v in plugin["external_views"]}
    assert views["nav"]["href"] == "/llm-batch/"
    assert views["dag_run"]["href"] == "/llm-batch/dag-run?dag_id={DAG_ID}&run_id={RUN_ID}"


def test_the_views_and_app_are_what_the_airflow_ui_accepts() -> None:
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse, FastAPIAppResponse

    for view in BatchProgressPlugin.external_views:
        parsed = ExternalViewResponse.model_validate(view)
        assert parsed.url_route and parsed.href.startswith(URL_PREFIX + "/")
    routes = [v["url_route"] for v in BatchProgressPlugin.external_views]
    assert len(set(routes)) == len(routes)
    for app in BatchProgressPlugin.fastapi_apps:
        FastAPIAppResponse.model_validate({**app, "app": str(app["app"])})
        assert app["app"] is batch_app


def test_loading_the_plugin_builds_no_app_and_imports_no_web_stack() -> None:
    code = textwrap.dedent(
        """
        import sys
        from airflow_batch_provider.plugins import batch_progress
        assert batch_progress.batch_app._app is None
        heavy = [m for m in ("airflow_batch_provider.plugins.api", "airflow.api_fastapi.core_api.security")
                 if m in sys.modules]
        print(heavy)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_page_refuses_a_request_without_an_airflow_login() -> None:
    client = TestClient(LazyBatchApp())

    for path in (
        "/",
        "/run?workload=w&run_id=r",
        "/dag-run?dag_id=d&run_id=r",
        "/review?workload=w",
        "/review/export?workload=w",
        "/api/runs",
        "/api/runs/w/r",
        "/api/review?workload=w",
        "/api/trend?workload=w",
        "/static/trend.js",
    ):
        assert client.get(path).status_code == 401, path
    assert client.post("/review/action", data={"workload": "w"}).status_code == 401


API_SERVER_CHECK = """
import json, os, sys
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app

client = TestClient(create_app("core"))
out = {}
for path in ("/llm-batch/", "/llm-batch/api/runs"):
    resp = client.get(path)
    out[path] = [resp.status_code, resp.text]
print(json.dumps(out))
"""


@pytest.mark.parametrize("all_admins", [True, False], ids=["logged-in", "anonymous"])
def test_the_airflow_api_server_mounts_the_page_behind_its_login(
    airflow_home: dict[str, str], tmp_path: Path, all_admins: bool
) -> None:
    from airflow_batch_provider.ledger import Ledger

    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    writer = Ledger.from_url(ledger_url)
    writer.start_run("nightly_reviews", "manual__2026-11-29T01:00:00+00:00", "openai", "gpt-4o-mini")
    writer.engine.dispose()
    env = {
        **airflow_home,
        "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": ledger_url,
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(all_admins),
        "AIRFLOW__API_AUTH__JWT_SECRET": "test-only-secret-" + "x" * 32,
    }
    result = subprocess.run(
        [sys.executable, "-c", API_SERVER_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])

    if all_admins:
        status, page = out["/llm-batch/"]
        assert status == 200
        assert "nightly_reviews" in page
        assert 'href="/llm-batch/run?workload=nightly_reviews' in page
        status, body = out["/llm-batch/api/runs"]
        assert status == 200
        assert [r["workload"] for r in json.loads(body)["runs"]] == ["nightly_reviews"]
    else:
        assert out["/llm-batch/"][0] == 401
        assert out["/llm-batch/api/runs"][0] == 401
        assert "nightly_reviews" not in out["/llm-batch/api/runs"][1]


# ------------------------------------------------------------------------------------------ permissions
#
# Through Airflow's own API server app, its login (POST /auth/token with the generated passwords)
# and its auth manager: SimpleAuthManager's roles, plus per-DAG scopes (dag_scoped_auth.py) for
# the user "alice", who may reach DAG dag_a only.

PERMISSION_CHECK = """
import json, os, re, sys
from urllib.parse import quote
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app
from airflow_batch_provider.plugins.review import form_token, server_secret
from airflow_batch_provider.core.custom_ids import item_key

client = TestClient(create_app("core"))
passwords = json.load(open(os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]))
run = os.environ["ABP_TEST_RUN"]
secret = server_secret()
routes = {}
for wl, dag in (("wl_a", "dag_a"), ("wl_b", "dag_b")):
    side = wl[-1]
    routes[f"run_{side}"] = ("GET", "/llm-batch/run", {"workload": wl, "run_id": run})
    routes[f"api_run_{side}"] = ("GET", f"/llm-batch/api/runs/{wl}/{quote(run, safe='')}", {})
    routes[f"tab_{side}"] = ("GET", "/llm-batch/dag-run", {"dag_id": dag, "run_id": run})
    routes[f"review_{side}"] = ("GET", "/llm-batch/review", {"workload": wl})
    routes[f"export_{side}"] = ("GET", "/llm-batch/review/export", {"workload": wl, "format": "jsonl"})
    routes[f"api_review_{side}"] = ("GET", "/llm-batch/api/review", {"workload": wl})
    routes[f"trend_{side}"] = ("GET", "/llm-batch/api/trend", {"workload": wl})
    routes[f"action_{side}"] = ("POST", "/llm-batch/review/action", {"workload": wl})
    routes[f"trigger_{side}"] = ("POST", "/llm-batch/review/action", {"workload": wl, "trigger_now": "1"})
routes["index"] = ("GET", "/llm-batch/", {})
routes["runs"] = ("GET", "/llm-batch/api/runs", {})
out = {}
for user in ("anonymous", "viv", "ursula", "alice"):
    headers = {}
    if user != "anonymous":
        resp = client.post("/auth/token", json={"username": user, "password": passwords[user]})
        assert resp.status_code == 201, resp.text
        headers = {"Authorization": "Bearer " + resp.json()["access_token"]}
    seen = {}
    for name, (method, path, params) in routes.items():
        if method == "GET":
            resp = client.get(path, params=params, headers=headers)
        else:
            item = "c07" if "trigger_now" in params else "c08" if user == "alice" else "c09"
            data = {**params, "token": form_token(secret, user, params["workload"]), "action": "redrive",
                    "reason": f"{user} re-drives", "item_key": item_key(item)}
            resp = client.post(path, data=data, headers=headers, follow_redirects=False)
        body = resp.text if name in ("runs", "index") else resp.headers.get("location", "")
        seen[name] = [resp.status_code, body]
    out[user] = seen
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def permission_matrix(
    airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    from airflow_batch_provider.ledger import Ledger
    from tests.unit.plugins.test_api import RUN, seed_finished_run

    tmp_path = tmp_path_factory.mktemp("permissions")
    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    writer = Ledger.from_url(ledger_url)
    seed_finished_run(writer, workload="wl_a", dag_id="dag_a")
    seed_finished_run(writer, workload="wl_b", dag_id="dag_b")
    seed_finished_run(writer, workload="wl_legacy", dag_id=None)
    writer.engine.dispose()
    env = {
        **airflow_home,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": ledger_url,
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.unit.plugins.dag_scoped_auth.DagScopedSimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "viv:viewer,ursula:user,alice:user",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(tmp_path / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": "test-only-secret-" + "y" * 32,
        "ABP_TEST_DAG_SCOPES": json.dumps({"alice": ["dag_a"]}),
        "ABP_TEST_RUN": RUN,
    }
    result = subprocess.run(
        [sys.executable, "-c", PERMISSION_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    matrix: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    writer = Ledger.from_url(ledger_url)
    matrix["audit"] = [(a.actor, a.workload, a.item_count) for a in writer.audit_log(None)]
    writer.engine.dispose()
    return matrix


def statuses(matrix: dict[str, Any], user: str) -> dict[str, int]:
    return {name: seen[0] for name, seen in matrix[user].items()}


def test_without_a_login_every_route_is_refused(permission_matrix: dict[str, Any]) -> None:
    assert set(statuses(permission_matrix, "anonymous").values()) == {401}


def test_a_viewer_reads_every_dag_and_may_not_act(permission_matrix: dict[str, Any]) -> None:
    seen = statuses(permission_matrix, "viv")
    reads = [k for k in seen if not k.startswith(("action", "trigger"))]

    assert {k: seen[k] for k in reads} == dict.fromkeys(reads, 200)
    assert [seen[k] for k in ("action_a", "action_b", "trigger_a", "trigger_b")] == [403] * 4
    runs = json.loads(permission_matrix["viv"]["runs"][1])["runs"]
    assert {r["workload"] for r in runs} == {"wl_a", "wl_b", "wl_legacy"}


def test_a_user_role_may_act_on_every_dag(permission_matrix: dict[str, Any]) -> None:
    seen = statuses(permission_matrix, "ursula")

    assert (seen["action_a"], seen["action_b"]) == (303, 303)
    assert ("ursula", "wl_b", 1) in permission_matrix["audit"]
    # allowed to trigger; this Airflow has no such DAG, so the re-drive stands and the page says why
    assert seen["trigger_a"] == 303
    assert "trigger_failed=DagNotFound" in permission_matrix["ursula"]["trigger_a"][1]


def test_a_user_scoped_to_one_dag_sees_and_acts_on_that_dag_only(permission_matrix: dict[str, Any]) -> None:
    seen = statuses(permission_matrix, "alice")

    assert {k: v for k, v in seen.items() if k.endswith("_a")} == {
        "run_a": 200,
        "api_run_a": 200,
        "tab_a": 200,
        "review_a": 200,
        "export_a": 200,
        "api_review_a": 200,
        "trend_a": 200,
        "action_a": 303,
        "trigger_a": 303,
    }
    assert {k: v for k, v in seen.items() if k.endswith("_b")} == dict.fromkeys(
        [
            "run_b",
            "api_run_b",
            "tab_b",
            "review_b",
            "export_b",
            "api_review_b",
            "trend_b",
            "action_b",
            "trigger_b",
        ],
        403,
    )
    runs = json.loads(permission_matrix["alice"]["runs"][1])["runs"]
    assert [r["workload"] for r in runs] == ["wl_a"]
    index = permission_matrix["alice"]["index"][1]
    assert "wl_a" in index and "wl_b" not in index and "wl_legacy" not in index
    # alice's re-drive went through, with her name in the audit table; none of hers on wl_b
    assert ("alice", "wl_a", 1) in permission_matrix["audit"]
    assert not [a for a in permission_matrix["audit"] if a[0] == "alice" and a[1] == "wl_b"]
