from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from batch_emulator.common import (
    BEARER,
    InputScan,
    InputWords,
    ResultWriter,
    injected_error,
    key_accepted,
    key_given,
    output_file,
    result_file,
    retrieve_fails,
    settle,
    stable_id,
)
from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.faults import FaultConfig, ItemDecision
from batch_emulator.lifecycle import Job, JobItem
from batch_emulator.store import Clock, EmulatorState, FileStore, StoredFile

WORDS = InputWords(too_many="more than {limit} in {name}", bad_json="line {number} of {name} is not JSON")


def request(headers: dict[str, str] | None = None, query: str = "") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request(
        {"type": "http", "method": "GET", "path": "/", "headers": raw, "query_string": query.encode()}
    )


def test_a_stable_id_depends_on_every_part_and_nothing_else() -> None:
    assert stable_id("req_", "job", "a") == stable_id("req_", "job", "a")
    assert stable_id("req_", "job", "a") != stable_id("req_", "job", "b")
    assert stable_id("req_", "jo", "ba") != stable_id("req_", "job", "a"), "parts are separated"
    assert len(stable_id("batch_req_", "x", length=32)) == len("batch_req_") + 32


def test_a_result_file_cuts_a_malformed_line_doubles_a_duplicate_and_adds_foreign_lines(
    tmp_path: Path,
) -> None:
    state = EmulatorState(EmulatorConfig(data_dir=tmp_path))
    with result_file(state, "custom_id") as out:
        out.write({"custom_id": "bad", "v": "x" * 40}, ItemDecision(malformed=True))
        out.write({"custom_id": "twice", "v": 1}, ItemDecision(duplicate=True))
        out.write({"custom_id": "plain", "v": 2})
        out.write_foreign(2, "job-1")
        meta = output_file(state, "openai", "file-", "out.jsonl", 60)
        out.keep(meta)
    raw = b"".join(state.files.iter_bytes(meta.id)).splitlines()
    assert out.lines == len(raw) == 6
    with pytest.raises(ValueError):
        json.loads(raw[0])
    parsed = [json.loads(line) for line in raw[1:]]
    assert [p["custom_id"] for p in parsed[:3]] == ["twice", "twice", "plain"]
    # the foreign lines copy the first whole line under ids nobody sent, the same in every rerun
    assert all(p["custom_id"].startswith("unknown-") and p["v"] == 1 for p in parsed[3:])
    assert parsed[3]["custom_id"] != parsed[4]["custom_id"]
    assert meta.bytes == sum(len(line) + 1 for line in raw) and meta.expires_at == meta.created_at + 60


def test_a_result_file_that_is_never_kept_leaves_nothing_in_the_data_directory(tmp_path: Path) -> None:
    store = FileStore(tmp_path, threading.RLock())
    with store.writer() as sink:
        ResultWriter(sink, "key").write({"key": "a"})
    assert store.list() == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), store.writer() as sink:
        sink.keep(StoredFile(id="f", filename="f", purpose="batch", bytes=0, created_at=0, sha256=""))
        sink.write(b"half")
        raise RuntimeError("the writer fails")
    assert store.get("f") is None and list(tmp_path.iterdir()) == []


def test_the_input_scan_skips_blanks_counts_lines_records_bad_json_and_stops_at_the_limit() -> None:
    issues: list[Any] = []
    scan = InputScan(WORDS, issues, max_requests=3, name="in.jsonl")
    good = list(scan.lines([b'{"a": 1}\n', b"\n", b"{nope\n", b'{"a": 2}\n', b'{"a": 3}\n', b'{"a": 4}\n']))
    assert good == [(1, {"a": 1}), (4, {"a": 2})]
    assert [(i.code, i.message, i.line) for i in issues] == [
        ("invalid_json_line", "line 3 of in.jsonl is not JSON", 3),
        ("too_many_requests", "more than 3 in in.jsonl", 5),
    ]
    assert scan.count == 4


def test_the_input_scan_stops_reading_once_it_knows_enough_problems() -> None:
    issues: list[Any] = []
    scan = InputScan(WORDS, issues, max_requests=100, max_issues=2)
    assert list(scan.lines([b"x\n"] * 10 + [b'{"late": true}\n'])) == []
    assert len(issues) == 2 and scan.count == 2


def test_an_api_key_is_found_where_the_provider_reads_it() -> None:
    assert key_given(request({"Authorization": "Bearer k1"}), (BEARER,)) == ["k1"]
    assert key_given(request({"Authorization": "Basic k1"}), (BEARER,)) == []
    assert key_given(request({"x-api-key": "k2", "Authorization": "Bearer k3"}), ("x-api-key", BEARER)) == [
        "k2",
        "k3",
    ]
    assert key_given(request(query="key=k4"), ("x-goog-api-key", "?key")) == ["k4"]
    open_state = EmulatorState(EmulatorConfig())
    locked = EmulatorState(EmulatorConfig(api_key="k2"))
    assert key_accepted(open_state, request(), (BEARER,))
    assert not key_accepted(locked, request({"Authorization": "Bearer wrong"}), (BEARER,))
    assert key_accepted(
        locked, request({"Authorization": "Bearer wrong", "x-api-key": "k2"}), ("x-api-key", BEARER)
    )


def test_an_injected_fault_becomes_the_error_its_table_names_and_no_fault_none() -> None:
    table = {"server_error": {"status": 500}}
    assert injected_error(JobItem("a", 1, {}, ItemDecision("server_error")), table) == {"status": 500}
    assert injected_error(JobItem("a", 1, {}, ItemDecision("missing")), table) is None
    assert injected_error(JobItem("a", 1, {}), table) is None


def test_a_job_is_rendered_once_the_first_time_it_is_seen_ended(tmp_path: Path) -> None:
    state = EmulatorState(
        EmulatorConfig(data_dir=tmp_path, timings=Timings(validating_s=1, in_progress_s=1, finalizing_s=1)),
        Clock(lambda: 1000.0),
    )
    job = state.create_job("test", "job", [JobItem("a", 1, {})], [], state.config, {})
    renders: list[str] = []

    def render(j: Job, now: float, status: str) -> dict[str, Any]:
        renders.append(status)
        return {"n": len(renders)}

    assert settle(state, job, 1000.5, render).status == "validating" and job.results is None
    assert settle(state, job, 1010, render).status == "completed"
    assert settle(state, job, 1020, render).status == "completed"
    assert renders == ["completed"] and job.results == {"n": 1}


def test_a_status_read_fails_on_the_seeded_schedule_and_is_counted() -> None:
    state = EmulatorState(EmulatorConfig(faults=FaultConfig(retrieve_5xx_rate=0.5)))
    fails = [retrieve_fails(state, "openai") for _ in range(40)]
    again = EmulatorState(EmulatorConfig(faults=FaultConfig(retrieve_5xx_rate=0.5)))
    assert fails == [retrieve_fails(again, "openai") for _ in range(40)]
    assert 0 < sum(fails) < 40
    assert state.counters["openai.retrieve_requests"] == 40
    assert state.counters["openai.retrieve_5xx"] == sum(fails)
