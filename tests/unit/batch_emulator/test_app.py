from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Iterator

import httpx
import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from batch_emulator import EmulatorConfig, FaultConfig, create_app, run_emulator
from batch_emulator.store import Clock, EmulatorState

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


def _create_answer(client: TestClient) -> httpx.Response:
    text = "\n".join(json.dumps(line) for line in chat_lines(4))
    file_id = client.post("/v1/files", files={"file": ("in.jsonl", text)}, data={"purpose": "batch"}).json()[
        "id"
    ]
    return client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    )


def _upload_and_create(client: TestClient) -> str:
    return str(_create_answer(client).json()["id"])


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
        "import sys, batch_emulator as e, batch_emulator.testing;"
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


def _script(client: TestClient, *entries: str) -> None:
    client.put("/_emulator/config", json={"faults": {"create_script": list(entries), "rate_500": 0}})


def _batches(client: TestClient) -> list[dict[str, object]]:
    return list(client.get("/_emulator/record").json()["batches"].get("openai", []))


@pytest.mark.parametrize("fault,status", [("429", 429), ("500", 500)])
def test_a_create_refused_before_acting_creates_nothing(client: TestClient, fault: str, status: int) -> None:
    _script(client, f"create:{fault}")
    assert _create_answer(client).status_code == status
    assert _batches(client) == []
    _upload_and_create(client)
    assert len(_batches(client)) == 1, "the script entry is consumed; the next create succeeds"


def test_a_refused_create_says_when_to_come_back(client: TestClient) -> None:
    _script(client, "create:429")
    answer = _create_answer(client)
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"


def test_a_create_that_fails_after_acting_leaves_the_batch_behind(client: TestClient) -> None:
    _script(client, "create:500_after")
    assert _create_answer(client).status_code == 500
    assert len(_batches(client)) == 1, "the client saw a 500, but the batch exists"


def test_an_upload_fault_applies_to_uploads_only(client: TestClient) -> None:
    _script(client, "upload:500_after")
    answer = client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert answer.status_code == 500
    assert len(client.get("/v1/files").json()["data"]) == 1, "the file was stored before the 500"
    assert client.get("/_emulator/stats").json()["counters"]["openai.create_faults.500_after"] == 1


def test_a_dropped_or_slow_create_reply_still_creates_the_batch() -> None:
    import openai

    faults = FaultConfig(create_script=("create:drop_after", "create:slow_after"), create_slow_s=1.0)
    with run_emulator(EmulatorConfig(faults=faults)) as url:
        sdk = openai.OpenAI(api_key="k", base_url=url + "/v1", max_retries=0, timeout=0.3)
        upload = sdk.files.create(file=("in.jsonl", json.dumps(chat_lines(1)[0]).encode()), purpose="batch")
        for _ in range(2):
            with pytest.raises(openai.APIConnectionError):
                sdk.batches.create(
                    input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
        record = httpx.get(url + "/_emulator/record").json()
    assert len(record["batches"]["openai"]) == 2


def test_create_faults_roll_the_same_way_for_the_same_seed() -> None:
    def outcomes() -> list[int]:
        faults = FaultConfig(create_429_rate=0.3, create_500_rate=0.3)
        with TestClient(create_app(EmulatorConfig(seed=7, faults=faults), clock=Clock(lambda: 1e9))) as c:
            body = {
                "input_file_id": "missing",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            return [c.post("/v1/batches", json=body).status_code for _ in range(12)]

    first = outcomes()
    assert first == outcomes()
    assert {429, 500, 404} <= set(first), "both faults and the plain answer (no such file) occur"


def test_the_record_lists_every_batch_with_its_keys_ids_and_billed_tokens(client: TestClient) -> None:
    client.put("/_emulator/config", json={"faults": {"rate_500": 0}})
    lines = "\n".join(json.dumps(line) for line in chat_lines(3))
    file_id = client.post(
        "/v1/files", files={"file": ("in.jsonl", lines.encode())}, data={"purpose": "batch"}
    ).json()["id"]
    client.post(
        "/v1/batches",
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"abp_idempotency_key": "job-1"},
        },
    )
    client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-abp-custom-id": "rt-1"},
    )
    (entry,) = _batches(client)
    assert entry["keys"] == {"metadata": {"abp_idempotency_key": "job-1"}}
    assert entry["request_count"] == 3 and entry["custom_ids"] == [
        line["custom_id"] for line in chat_lines(3)
    ]
    assert entry["billed"] is None, "nothing is billed before the batch ends"
    client.post("/_emulator/clock", json={"advance_s": 60})
    record = client.get("/_emulator/record").json()
    billed = record["batches"]["openai"][0]["billed"]
    assert set(billed) == set(entry["custom_ids"])  # type: ignore[arg-type]
    assert all(usage["input_tokens"] > 0 and usage["output_tokens"] > 0 for usage in billed.values())
    (answer,) = record["realtime"]["openai"]
    assert answer["custom_id"] == "rt-1" and answer["usage"]["output_tokens"] > 0


def test_the_record_names_each_billed_item_whose_output_line_was_truncated_once(client: TestClient) -> None:
    faults = {"rate_500": 0, "rate_malformed": 0.3, "rate_duplicate": 0.3}
    client.put("/_emulator/config", json={"faults": faults})
    text = "\n".join(json.dumps(line) for line in chat_lines(40))
    file_id = client.post("/v1/files", files={"file": ("in.jsonl", text)}, data={"purpose": "batch"}).json()[
        "id"
    ]
    batch_id = client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()["id"]
    assert _batches(client)[0]["truncated"] is None, "nothing is written before the batch ends"
    client.post("/_emulator/clock", json={"advance_s": 60})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    raw = client.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
    broken = []
    for line in raw:
        try:
            json.loads(line)
        except json.JSONDecodeError:
            broken.append(re.search(r'"custom_id": ?"([^"]+)"', line).group(1))  # type: ignore[union-attr]
    (entry,) = _batches(client)
    assert broken and len(set(broken)) < len(broken), "some truncated line was also written twice"
    assert sorted(entry["truncated"]) == sorted(set(broken))  # type: ignore[arg-type]
    assert set(broken) <= set(entry["billed"])  # type: ignore[arg-type]


def test_unknown_result_lines_carry_ids_nobody_sent(client: TestClient) -> None:
    client.put("/_emulator/config", json={"faults": {"rate_500": 0, "unknown_result_lines": 2}})
    batch_id = _upload_and_create(client)
    client.post("/_emulator/clock", json={"advance_s": 60})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    text = client.get(f"/v1/files/{batch['output_file_id']}/content").text
    ids = [json.loads(line)["custom_id"] for line in text.splitlines() if line.strip()]
    unknown = [i for i in ids if i.startswith("unknown-")]
    assert len(unknown) == 2 and len(ids) == 6


def test_a_token_limit_failure_ends_the_batch_failed_with_openais_code(client: TestClient) -> None:
    client.put("/_emulator/config", json={"faults": {"fail_token_limit": 1}})
    batch_id = _upload_and_create(client)
    client.post("/_emulator/clock", json={"advance_s": 60})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "failed"
    (error,) = batch["errors"]["data"]
    assert error["code"] == "token_limit_exceeded"
    assert error["message"].startswith("Enqueued token limit reached for gpt-4o-mini in organization ")
    assert client.get(f"/v1/batches/{_upload_and_create(client)}").json()["status"] == "validating"


def test_a_stuck_batch_stays_in_progress_until_cancelled(client: TestClient) -> None:
    client.put("/_emulator/config", json={"faults": {"stuck_batches": [0]}})
    batch_id = _upload_and_create(client)
    client.post("/_emulator/clock", json={"advance_s": 86_000})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "in_progress" and batch["request_counts"]["completed"] == 0
    client.post(f"/v1/batches/{batch_id}/cancel")
    assert client.get(f"/v1/batches/{batch_id}").json()["status"] == "cancelling"
    client.post("/_emulator/clock", json={"advance_s": 60})
    assert client.get(f"/v1/batches/{batch_id}").json()["status"] == "cancelled"


def test_a_stuck_batch_with_a_fraction_finishes_that_share_of_its_items_and_then_stalls(
    client: TestClient,
) -> None:
    client.put(
        "/_emulator/config",
        json={"faults": {"stuck_batches": [0], "stuck_after_fraction": 0.5, "rate_500": 0}},
    )
    batch_id = _upload_and_create(client)
    client.post("/_emulator/clock", json={"advance_s": 86_000})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "in_progress" and batch["request_counts"]["completed"] == 2
    client.post(f"/v1/batches/{batch_id}/cancel")
    client.post("/_emulator/clock", json={"advance_s": 60})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "cancelled"
    assert len(client.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()) == 2


def test_a_cancel_takes_the_configured_time_and_keeps_the_finished_lines(client: TestClient) -> None:
    client.put("/_emulator/config", json={"faults": {"rate_500": 0}, "timings": {"cancelling_s": 600}})
    batch_id = _upload_and_create(client)
    client.post("/_emulator/clock", json={"advance_s": 2 + 5})  # validating 2 s, then half of 10 s
    client.post(f"/v1/batches/{batch_id}/cancel")
    client.post("/_emulator/clock", json={"advance_s": 599})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "cancelling" and "output_file_id" not in batch
    client.post("/_emulator/clock", json={"advance_s": 1})
    batch = client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "cancelled"
    done = client.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
    cancelled = client.get(f"/v1/files/{batch['error_file_id']}/content").text.splitlines()
    assert len(done) == 2 and len(cancelled) == 2
    (entry,) = client.get("/_emulator/record").json()["batches"]["openai"]
    assert sorted(entry["billed"]) == sorted(json.loads(line)["custom_id"] for line in done)
