from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator

import httpx
import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from airflow_batch_provider.emulator import EmulatorConfig, FaultConfig, create_app, run_emulator
from airflow_batch_provider.emulator.store import Clock, EmulatorState

from .helpers import chat_lines


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(
        create_app(EmulatorConfig(faults=FaultConfig(rate_500=0.1)), clock=Clock(lambda: 1e9))
    ) as c:
        yield c


def test_the_config_endpoint_shows_and_partially_updates_the_settings(client: TestClient) -> None:
    config = client.get("/_emulator/config").json()
    assert config["faults"]["rate_500"] == 0.1
    assert config["timings"]["in_progress_s"] == 10.0
    updated = client.put("/_emulator/config", json={"faults": {"rate_429": 0.2}, "time_scale": 0.5}).json()
    assert (updated["faults"]["rate_500"], updated["faults"]["rate_429"]) == (0.1, 0.2)
    assert updated["time_scale"] == 0.5
    assert client.get("/_emulator/config").json() == updated


@pytest.mark.parametrize(
    "body", [{"faults": {"rate_500": 2}}, {"faults": {"bogus": 1}}, {"host": "0.0.0.0"}, [1, 2], "not json"]
)
def test_a_bad_config_update_is_refused_and_changes_nothing(client: TestClient, body: object) -> None:
    before = client.get("/_emulator/config").json()
    content = body if isinstance(body, str) else json.dumps(body)
    response = client.put("/_emulator/config", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"]
    assert client.get("/_emulator/config").json() == before


def _upload_and_create(client: TestClient) -> str:
    text = "\n".join(json.dumps(line) for line in chat_lines(4))
    file_id = client.post("/v1/files", files={"file": ("in.jsonl", text)}, data={"purpose": "batch"}).json()[
        "id"
    ]
    batch = client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()
    return str(batch["id"])


def test_stats_count_batches_files_and_sync_requests(client: TestClient) -> None:
    batch_id = _upload_and_create(client)
    client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    client.post("/v1/embeddings", json={"model": "e", "input": "hi"})
    stats = client.get("/_emulator/stats").json()
    assert (stats["batches_created"], stats["files_uploaded"], stats["sync_requests"]) == (1, 1, 2)
    assert stats["counters"]["openai.sync_requests.chat"] == 1
    assert stats["batches"][batch_id] == {
        "provider": "openai",
        "creation_index": 0,
        "status": "validating",
        "total": 0,
        "completed": 0,
        "failed": 0,
    }
    client.post("/_emulator/clock", json={"advance_s": 30})
    assert client.get("/_emulator/stats").json()["batches"][batch_id]["total"] == 4


def test_reset_forgets_everything_and_restores_the_start_config(client: TestClient) -> None:
    _upload_and_create(client)
    client.put("/_emulator/config", json={"faults": {"rate_500": 0.9}})
    assert client.post("/_emulator/reset").json() == {"reset": True}
    stats = client.get("/_emulator/stats").json()
    assert stats["batches"] == {} and stats["batches_created"] == 0
    assert client.get("/v1/files").json()["data"] == []
    assert client.get("/_emulator/config").json()["faults"]["rate_500"] == 0.1


def test_the_clock_endpoint_moves_time_forward_only(client: TestClient) -> None:
    assert client.post("/_emulator/clock", json={"advance_s": 60}).json() == {"now": 1e9 + 60}
    assert client.post("/_emulator/clock", json={"advance_s": -1}).status_code == 400


def test_unknown_routes_answer_json_errors(client: TestClient) -> None:
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_url"
    assert client.put("/v1/batches").status_code == 405
    assert client.get("/_emulator/health").json() == {"status": "ok"}


def test_routers_are_composed_from_a_list() -> None:
    def extra(state: EmulatorState) -> APIRouter:
        router = APIRouter(prefix="/extra")

        @router.get("/seed")
        def seed() -> dict[str, int]:
            return {"seed": state.config.seed}

        return router

    app = create_app(EmulatorConfig(seed=9), routers=[extra])
    with TestClient(app) as c:
        assert c.get("/extra/seed").json() == {"seed": 9}
        assert c.get("/v1/files").status_code == 404, "only the listed routers are mounted"


def test_the_package_imports_no_provider_sdk() -> None:
    code = (
        "import sys, airflow_batch_provider.emulator as e, airflow_batch_provider.emulator.testing;"
        "e.create_app(e.EmulatorConfig());"
        "bad = [m for m in ('openai', 'anthropic', 'google.genai', 'boto3', 'botocore') if m in sys.modules];"
        "print(','.join(bad))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_run_emulator_serves_on_a_free_loopback_port_and_stops_cleanly() -> None:
    with run_emulator(EmulatorConfig(port=1)) as url:
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        assert port != 1
        assert httpx.get(url + "/_emulator/health").json() == {"status": "ok"}
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "the port is closed after the block"


def test_run_emulator_also_serves_on_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 is not configured on this machine")
    with run_emulator(EmulatorConfig(host="[::1]")) as url:
        assert url.startswith("http://[::1]:")
        assert httpx.get(url + "/_emulator/health").json() == {"status": "ok"}
