"""The plugin: discovered by Airflow, mounted by Airflow's own API server app, behind its login."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

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

    for path in ("/", "/run?workload=w&run_id=r", "/dag-run?run_id=r", "/api/runs", "/api/runs/w/r"):
        assert client.get(path).status_code == 401, path


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
