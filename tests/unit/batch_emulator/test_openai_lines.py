"""OpenAI batch files (``batch_emulator.openai_lines``): input lines checked, result lines written, through the real ``openai`` SDK.

Every response the SDK receives is validated against the official OpenAPI description by the
``emulator_factory`` fixture; a test fails at exit when one does not conform.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from batch_emulator import FaultConfig
from batch_emulator.model import message_tokens

from .conftest import Emulator, EmulatorFactory, SpecChecker
from .helpers import chat_line, chat_lines, expected_decisions, finish

openai = pytest.importorskip("openai")

# -- result lines --------------------------------------------------------------------------


def test_output_lines_follow_the_documented_format_and_come_out_of_order(
    emulator_factory: EmulatorFactory, spec: SpecChecker
) -> None:
    lines = chat_lines(30)
    orders = []
    for seed in (0, 0, 1):
        with emulator_factory(seed=seed) as emu:
            batch = finish(emu, emu.create_batch(lines).id)
            out = emu.lines(batch.output_file_id)
            for line in out:
                assert set(line) == {"id", "custom_id", "response", "error"}
                assert line["id"].startswith("batch_req_")
                assert line["error"] is None
                assert line["response"]["status_code"] == 200
                assert line["response"]["request_id"]
                spec.validate("CreateChatCompletionResponse", line["response"]["body"])
                assert line["response"]["body"]["usage"]["total_tokens"] > 0
            orders.append([line["custom_id"] for line in out])
    input_order = [line["custom_id"] for line in lines]
    assert sorted(orders[0]) == input_order
    assert orders[0] != input_order, "output must not come back in input order"
    assert orders[0] == orders[1], "the same seed must give the same order"
    assert orders[0] != orders[2], "another seed must give another order"


def test_an_embeddings_batch_answers_embedding_lists(emu: Emulator, spec: SpecChecker) -> None:
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": f"text number {i}", "dimensions": 64},
        }
        for i in range(4)
    ]
    batch = finish(emu, emu.create_batch(lines, endpoint="/v1/embeddings").id)
    assert batch.status == "completed"
    out = emu.lines(batch.output_file_id)
    assert len(out) == 4
    for line in out:
        body = line["response"]["body"]
        spec.validate("CreateEmbeddingResponse", body)
        vector = body["data"][0]["embedding"]
        assert len(vector) == 64
        assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-6)


# -- per-item faults -------------------------------------------------------------------------


def test_failed_items_go_to_the_error_file_with_their_status_and_error_body(
    emulator_factory: EmulatorFactory,
) -> None:
    faults = FaultConfig(rate_500=0.15, rate_429=0.15, rate_400=0.15, rate_context_length=0.15)
    lines = chat_lines(60)
    expected = expected_decisions(lines, faults)
    with emulator_factory(faults=faults) as emu:
        batch = finish(emu, emu.create_batch(lines).id)
        errors = {line["custom_id"]: line for line in emu.lines(batch.error_file_id)}
        outputs = {line["custom_id"] for line in emu.lines(batch.output_file_id)}

    statuses = {"server_error": 500, "rate_limited": 429, "invalid_request": 400, "context_length": 400}
    failing = {cid for cid, fault in expected.items() if fault != "none"}
    assert all(fault in statuses for fault in expected.values() if fault != "none")
    assert 8 <= len(failing) <= 52, "the rates should fail some items but not all"
    assert set(errors) == failing
    assert outputs == set(expected) - failing
    assert (batch.request_counts.completed, batch.request_counts.failed) == (60 - len(failing), len(failing))
    for cid, line in errors.items():
        assert line["error"] is None
        assert line["response"]["status_code"] == statuses[expected[cid]]
        error = line["response"]["body"]["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if expected[cid] == "context_length":
            assert error["code"] == "context_length_exceeded"
        if expected[cid] == "invalid_request":
            assert error["type"] == "invalid_request_error"


def test_missing_items_are_in_neither_file_but_count_as_completed(emulator_factory: EmulatorFactory) -> None:
    faults = FaultConfig(rate_missing=0.3)
    lines = chat_lines(40)
    missing = {cid for cid, fault in expected_decisions(lines, faults).items() if fault == "missing"}
    assert missing
    with emulator_factory(faults=faults) as emu:
        batch = finish(emu, emu.create_batch(lines).id)
        seen = {line["custom_id"] for line in emu.lines(batch.output_file_id)}
        assert batch.error_file_id is None
    assert seen == {line["custom_id"] for line in lines} - missing
    assert batch.request_counts.completed == 40


def test_duplicated_lines_are_written_twice_and_malformed_lines_do_not_parse(
    emulator_factory: EmulatorFactory,
) -> None:
    faults = FaultConfig(rate_duplicate=0.2, rate_malformed=0.2)
    lines = chat_lines(50)
    decisions = {line["custom_id"]: faults.decide_item(0, line["custom_id"]) for line in lines}
    duplicated = {cid for cid, d in decisions.items() if d.duplicate}
    malformed = {cid for cid, d in decisions.items() if d.malformed}
    assert duplicated and malformed
    with emulator_factory(faults=faults) as emu:
        batch = finish(emu, emu.create_batch(lines).id)
        raw = emu.raw_lines(batch.output_file_id)
    parsed: list[str] = []
    broken = 0
    for text in raw:
        try:
            parsed.append(json.loads(text)["custom_id"])
        except json.JSONDecodeError:
            broken += 1
    assert broken == sum(1 + (cid in duplicated) for cid in malformed)
    twice = {cid for cid in parsed if parsed.count(cid) == 2}
    assert twice == duplicated - malformed
    assert set(parsed) == set(decisions) - malformed


def test_the_same_custom_id_fails_the_same_way_and_a_resubmitted_one_rolls_again(
    emulator_factory: EmulatorFactory,
) -> None:
    faults = FaultConfig(rate_500=0.5)
    with emulator_factory(faults=faults) as emu:
        first = finish(emu, emu.create_batch(chat_lines(40, attempt=1)).id)
        again = finish(emu, emu.create_batch(chat_lines(40, attempt=1)).id)
        retry = finish(emu, emu.create_batch(chat_lines(40, attempt=2)).id)

        def failed_keys(batch: Any) -> set[str]:
            return {line["custom_id"].split("__")[0] for line in emu.lines(batch.error_file_id)}

        assert failed_keys(first) == failed_keys(again)
        assert failed_keys(first) != failed_keys(retry)


def test_faults_changed_at_runtime_apply_only_to_batches_created_afterwards(emu: Emulator) -> None:
    before = emu.create_batch(chat_lines(10))
    emu.config(faults={"rate_500": 1.0})
    after = emu.create_batch(chat_lines(10, attempt=2))
    emu.advance(20)
    before = emu.client.batches.retrieve(before.id)
    after = emu.client.batches.retrieve(after.id)
    assert (before.request_counts.completed, before.request_counts.failed) == (10, 0)
    assert (after.request_counts.completed, after.request_counts.failed) == (0, 10)
    assert len(emu.lines(after.output_file_id)) == 0
    assert all(line["response"]["status_code"] == 500 for line in emu.lines(after.error_file_id))


# -- validation --------------------------------------------------------------------------------


def _valid(i: int = 0) -> dict[str, Any]:
    return chat_line(f"c{i}")


@pytest.mark.parametrize(
    ("lines", "code", "line", "param"),
    [
        pytest.param([json.dumps(_valid(0)), "{not json"], "invalid_json_line", 2, None, id="invalid-json"),
        pytest.param(
            [{**_valid(0), "custom_id": None}], "missing_required_parameter", 1, "custom_id", id="no-id"
        ),
        pytest.param([_valid(0), {**_valid(1), "method": "GET"}], "invalid_method", 2, "method", id="method"),
        pytest.param([{**_valid(0), "url": "/v1/embeddings"}], "invalid_url", 1, "url", id="url"),
        pytest.param(
            [_valid(0), _valid(1), _valid(0)], "duplicate_custom_id", 3, "custom_id", id="duplicate"
        ),
        pytest.param(
            [_valid(0), chat_line("c1", model="gpt-4o")], "mismatched_model", 2, "body.model", id="models"
        ),
        pytest.param(
            [{k: v for k, v in _valid(0).items() if k != "body"}],
            "missing_required_parameter",
            1,
            "body",
            id="no-body",
        ),
        pytest.param(["", "  "], "empty_file", None, None, id="empty"),
        pytest.param([_valid(i) for i in range(4)], "too_many_requests", 4, None, id="too-many"),
    ],
)
def test_an_invalid_input_file_fails_validation_with_the_line_and_the_reason(
    emulator_factory: EmulatorFactory, lines: list[Any], code: str, line: int | None, param: str | None
) -> None:
    with emulator_factory(max_batch_requests=3) as emu:
        batch = emu.create_batch(lines)
        assert batch.status == "validating"
        batch = finish(emu, batch.id)
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.object == "list"
    first = batch.errors.data[0]
    assert (first.code, first.line, first.param) == (code, line, param)
    assert first.message
    assert batch.request_counts.total == 0


def test_the_data_directory_holds_a_large_upload_and_the_batch_is_answered_from_disk(
    emulator_factory: EmulatorFactory, tmp_path: Path
) -> None:
    # 4,000 lines of about 1 KB: the upload, the job's items and the output all sit on disk
    lines = [
        chat_line(
            f"big{i:05d}",
            user=f"Review {i}: " + "great fast delivery, love it. " * 33,
            system="Classify the sentiment.",
        )
        for i in range(4000)
    ]
    data = tmp_path / "data"
    with emulator_factory(data_dir=data) as emu:
        upload = emu.upload_jsonl(lines)
        sent = ("\n".join(json.dumps(line) for line in lines) + "\n").encode()
        assert upload.bytes == len(sent) > 4_000_000
        assert (data / upload.id).read_bytes() == sent, "the upload is a file of the data directory"
        batch = emu.client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        spools = list((data / "jobs").glob("items-*.jsonl"))
        assert len(spools) == 1, "the job's items are spooled beside the files"
        assert [json.loads(raw)["c"] for raw in spools[0].read_bytes().splitlines()] == [
            line["custom_id"] for line in lines
        ]
        batch = finish(emu, batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == 4000
        assert (data / batch.output_file_id).stat().st_size > 0
        out = emu.lines(batch.output_file_id)
        emu.http.post("/_emulator/reset").raise_for_status()
        assert list((data / "jobs").iterdir()) == [], "a reset removes the spools"
    by_id = {line["custom_id"]: line for line in out}
    assert sorted(by_id) == [line["custom_id"] for line in lines] and len(out) == 4000
    for line in lines[:50]:
        answer = json.loads(by_id[line["custom_id"]]["response"]["body"]["choices"][0]["message"]["content"])
        assert answer["sentiment"] == "positive", "each answer is its own item's, read back from disk"
    usage = by_id[lines[0]["custom_id"]]["response"]["body"]["usage"]
    assert usage["prompt_tokens"] == sum(message_tokens(m["content"]) for m in lines[0]["body"]["messages"])


def test_an_input_file_over_the_byte_limit_fails_validation(emulator_factory: EmulatorFactory) -> None:
    with emulator_factory(max_batch_bytes=200) as emu:
        batch = finish(emu, emu.create_batch(chat_lines(5)).id)
    assert batch.status == "failed"
    assert batch.errors.data[0].code == "file_too_large"
