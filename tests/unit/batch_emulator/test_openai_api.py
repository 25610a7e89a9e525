"""The OpenAI-compatible API, driven with the real ``openai`` SDK over HTTP.

Every response the SDK receives is validated against the official OpenAPI description by the
``emulator_factory`` fixture; a test fails at exit when one does not conform.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from batch_emulator import FaultConfig
from batch_emulator.model import cached_tokens, message_tokens

from .conftest import Emulator, EmulatorFactory, SpecChecker
from .helpers import chat_line, chat_lines

openai = pytest.importorskip("openai")

TERMINAL = {"completed", "failed", "expired", "cancelled"}
LONG_SYSTEM = "Classify the sentiment and topic of the review and answer as JSON. " * 80  # ~5,400 bytes


def finish(emu: Emulator, batch_id: str, seconds: float = 20.0) -> Any:
    emu.advance(seconds)
    return emu.client.batches.retrieve(batch_id)


def expected_decisions(lines: list[dict[str, Any]], faults: FaultConfig, seed: int = 0) -> dict[str, str]:
    return {line["custom_id"]: faults.decide_item(seed, line["custom_id"]).fault for line in lines}


# -- lifecycle -------------------------------------------------------------------------------


def test_a_batch_walks_from_validating_through_in_progress_and_finalizing_to_completed(emu: Emulator) -> None:
    lines = chat_lines(10)
    batch = emu.create_batch(lines, metadata={"run": "r1"})
    assert batch.status == "validating"
    assert batch.request_counts.total == 0
    assert batch.metadata == {"run": "r1"}
    assert batch.expires_at == batch.created_at + 86_400
    assert batch.model == "gpt-4o-mini"

    emu.advance(2.0)
    batch = emu.client.batches.retrieve(batch.id)
    assert batch.status == "in_progress"
    assert batch.in_progress_at == batch.created_at + 2
    assert batch.request_counts.total == 10

    emu.advance(10.0)
    batch = emu.client.batches.retrieve(batch.id)
    assert batch.status == "finalizing"
    assert batch.finalizing_at == batch.created_at + 12
    assert batch.output_file_id is None

    emu.advance(2.0)
    batch = emu.client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    assert batch.completed_at == batch.created_at + 14
    assert (batch.request_counts.completed, batch.request_counts.failed) == (10, 0)
    assert batch.output_file_id is not None
    assert batch.error_file_id is None
    assert batch.usage is not None and batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    output = emu.client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output"
    assert output.filename == f"batch_{batch.id}_output.jsonl"


def test_request_counts_grow_while_the_batch_is_in_progress(emu: Emulator) -> None:
    batch = emu.create_batch(chat_lines(20))
    emu.advance(2.0)
    seen = []
    for _ in range(5):
        emu.advance(2.0)
        counts = emu.client.batches.retrieve(batch.id).request_counts
        seen.append(counts.completed + counts.failed)
    assert seen == [4, 8, 12, 16, 20]


def test_a_batch_finishes_in_under_a_second_at_time_scale_0_05(emulator_factory: EmulatorFactory) -> None:
    with emulator_factory(real_clock=True, time_scale=0.05) as emu:
        batch = emu.create_batch(chat_lines(5))
        while batch.status not in TERMINAL:
            time.sleep(0.05)
            batch = emu.client.batches.retrieve(batch.id)
        assert batch.status == "completed"
        # the batch's own timestamps come from its schedule, not from when it was read: unscaled,
        # validating + in progress + finalizing last over 12 s; scaled by 0.05, under one
        assert batch.completed_at is not None
        assert batch.completed_at - batch.created_at <= 1
        assert len(emu.lines(batch.output_file_id)) == 5


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


# -- batch faults ------------------------------------------------------------------------------


def test_an_expired_batch_keeps_the_results_it_finished(emulator_factory: EmulatorFactory) -> None:
    with emulator_factory(faults=FaultConfig(expire_batches=(1,), expire_after_fraction=0.25)) as emu:
        normal = emu.create_batch(chat_lines(4))
        expiring = emu.create_batch(chat_lines(20))
        emu.advance(2 + 10 * 0.25 - 0.01)
        assert emu.client.batches.retrieve(expiring.id).status == "in_progress"
        emu.advance(20)
        assert emu.client.batches.retrieve(normal.id).status == "completed"
        batch = emu.client.batches.retrieve(expiring.id)
        assert batch.status == "expired"
        assert batch.expired_at == batch.in_progress_at + 2
        assert batch.completed_at is None
        done = emu.lines(batch.output_file_id)
        rest = emu.lines(batch.error_file_id)
    assert len(done) == 5 == batch.request_counts.completed
    assert len(rest) == 15
    for line in rest:
        assert line["response"] is None
        assert line["error"]["code"] == "batch_expired"
    assert {line["custom_id"] for line in done + rest} == {line["custom_id"] for line in chat_lines(20)}


def test_expire_rate_picks_expiring_batches_by_creation_index(emulator_factory: EmulatorFactory) -> None:
    faults = FaultConfig(expire_rate=0.5)
    expected = [faults.batch_expires(0, i) for i in range(8)]
    assert any(expected) and not all(expected)
    with emulator_factory(faults=faults) as emu:
        ids = [emu.create_batch(chat_lines(2)).id for _ in range(8)]
        emu.advance(20)
        statuses = [emu.client.batches.retrieve(i).status for i in ids]
    assert statuses == ["expired" if e else "completed" for e in expected]


def test_fail_validation_fails_the_next_batches_and_then_stops(emu: Emulator) -> None:
    emu.config(faults={"fail_validation": 2})
    batches = [emu.create_batch(chat_lines(3)) for _ in range(3)]
    assert emu.http.get("/_emulator/config").json()["faults"]["fail_validation"] == 0
    emu.advance(2)
    statuses = [emu.client.batches.retrieve(b.id) for b in batches]
    assert [b.status for b in statuses] == ["failed", "failed", "in_progress"]
    assert statuses[0].errors.data[0].code == "emulated_validation_failure"
    assert statuses[0].failed_at == statuses[0].created_at + 2
    assert statuses[0].output_file_id is None and statuses[0].error_file_id is None


def test_retrieve_answers_transient_500s_on_a_deterministic_schedule_that_the_sdk_retries(
    emulator_factory: EmulatorFactory,
) -> None:
    faults = FaultConfig(retrieve_5xx_rate=0.5)
    predicted = ["500" if faults.request_fails(0, "retrieve", n, 0.5) else "ok" for n in range(40)]
    with emulator_factory(faults=faults) as emu:
        batch = emu.create_batch(chat_lines(2))
        outcomes = []
        for _ in range(20):
            try:
                emu.client.batches.retrieve(batch.id)
                outcomes.append("ok")
            except openai.InternalServerError as exc:
                assert exc.body["type"] == "server_error"
                outcomes.append("500")
        assert outcomes == predicted[:20]
        assert "ok" in outcomes and "500" in outcomes
        # the next request that fails once and then succeeds: the SDK's own retry recovers it
        n = next(i for i in range(20, 39) if predicted[i : i + 2] == ["500", "ok"])
        for _ in range(20, n):
            with contextlib.suppress(openai.InternalServerError):
                emu.client.batches.retrieve(batch.id)
        assert emu.sdk(max_retries=2).batches.retrieve(batch.id).id == batch.id
        assert emu.stats()["counters"]["openai.retrieve_5xx"] == predicted[: n + 1].count("500")


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


def test_a_batch_request_with_bad_arguments_is_refused_at_once(emu: Emulator) -> None:
    upload = emu.upload_jsonl([_valid()])
    other = emu.client.files.create(file=("notes.txt", b"hello"), purpose="user_data")
    with pytest.raises(openai.BadRequestError) as bad_endpoint:
        emu.client.batches.create(
            input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
        )
    assert bad_endpoint.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError):
        emu.client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="48h"
        )  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        emu.client.batches.create(
            input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        emu.client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={f"k{i}": "v" for i in range(17)},
        )
    with pytest.raises(openai.NotFoundError):
        emu.client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert emu.stats()["batches_created"] == 0


def test_items_whose_prompt_exceeds_the_context_window_fail_on_their_own(
    emulator_factory: EmulatorFactory,
) -> None:
    with emulator_factory(context_window_tokens=200) as emu:
        lines = [chat_line("short", user="fine"), chat_line("long", user="x" * 4000)]
        batch = finish(emu, emu.create_batch(lines).id)
        errors = emu.lines(batch.error_file_id)
        assert [line["custom_id"] for line in errors] == ["long"]
        assert errors[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as exc:
            emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 4000}])
        assert exc.value.code == "context_length_exceeded"


# -- listing, files, cancel --------------------------------------------------------------------


def test_listing_batches_pages_newest_first(emu: Emulator) -> None:
    ids = []
    for _ in range(5):
        ids.append(emu.create_batch(chat_lines(1)).id)
        emu.advance(1)
    newest_first = ids[::-1]
    page = emu.client.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2]
    assert page.has_more is True
    assert (page.first_id, page.last_id) == (newest_first[0], newest_first[1])
    page = emu.client.batches.list(limit=2, after=page.last_id)
    assert [b.id for b in page.data] == newest_first[2:4]
    last = emu.client.batches.list(limit=2, after=page.last_id)
    assert [b.id for b in last.data] == newest_first[4:]
    assert last.has_more is False
    assert [b.id for b in emu.client.batches.list(limit=2)] == newest_first  # the SDK pages by itself


def test_an_empty_batch_list_has_no_cursors(emu: Emulator) -> None:
    page = emu.client.batches.list()
    assert page.data == [] and page.has_more is False


def test_a_file_can_be_uploaded_listed_downloaded_and_deleted(emu: Emulator) -> None:
    content = b'{"a": 1}\n{"b": 2}\n'
    first = emu.client.files.create(file=("one.jsonl", content), purpose="batch")
    emu.advance(1)
    second = emu.client.files.create(file=("two.txt", b"x"), purpose="user_data")
    assert (first.bytes, first.filename, first.purpose, first.status) == (
        len(content),
        "one.jsonl",
        "batch",
        "processed",
    )
    assert emu.client.files.retrieve(first.id).id == first.id
    assert emu.client.files.content(first.id).content == content
    assert [f.id for f in emu.client.files.list()] == [second.id, first.id]
    assert [f.id for f in emu.client.files.list(order="asc")] == [first.id, second.id]
    assert [f.id for f in emu.client.files.list(purpose="batch")] == [first.id]
    page = emu.client.files.list(limit=1)
    assert [f.id for f in page.data] == [second.id] and page.has_more
    deleted = emu.client.files.delete(first.id)
    assert (deleted.id, deleted.deleted) == (first.id, True)
    with pytest.raises(openai.NotFoundError):
        emu.client.files.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        emu.client.files.content(first.id)
    emu.client.files.delete(second.id)
    assert emu.client.files.list().data == []


def test_unknown_ids_answer_404_in_the_documented_error_shape(emu: Emulator) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        emu.client.batches.retrieve("batch_nope")
    assert exc.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        emu.client.batches.cancel("batch_nope")
    with pytest.raises(openai.NotFoundError):
        emu.client.files.delete("file-nope")


def test_cancelling_a_running_batch_keeps_finished_items_and_marks_the_rest_cancelled(emu: Emulator) -> None:
    lines = chat_lines(10)
    batch = emu.create_batch(lines)
    emu.advance(2 + 4)  # 4 of 10 done
    cancelling = emu.client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    assert cancelling.cancelling_at == cancelling.created_at + 6
    emu.advance(1)
    assert emu.client.batches.retrieve(batch.id).status == "cancelling"
    emu.advance(1)
    batch = emu.client.batches.retrieve(batch.id)
    assert batch.status == "cancelled"
    assert batch.cancelled_at == batch.cancelling_at + 2
    done = emu.lines(batch.output_file_id)
    rest = emu.lines(batch.error_file_id)
    assert len(done) == 4 == batch.request_counts.completed
    assert len(rest) == 6
    assert {line["error"]["code"] for line in rest} == {"batch_cancelled"}
    assert all(line["response"] is None for line in rest)
    assert emu.client.batches.cancel(batch.id).status == "cancelled"  # cancelling twice is harmless


def test_cancelling_during_validation_cancels_every_item(emu: Emulator) -> None:
    batch = emu.create_batch(chat_lines(3))
    emu.client.batches.cancel(batch.id)
    batch = finish(emu, batch.id)
    assert batch.status == "cancelled"
    assert batch.in_progress_at is None
    assert batch.request_counts.total == 0
    assert batch.output_file_id is None
    assert len(emu.lines(batch.error_file_id)) == 3


def test_cancelling_a_finished_batch_is_refused(emu: Emulator) -> None:
    batch = finish(emu, emu.create_batch(chat_lines(2)).id)
    with pytest.raises(openai.ConflictError):
        emu.client.batches.cancel(batch.id)


# -- prompt caching ----------------------------------------------------------------------------


def test_a_shared_system_prompt_counts_as_cached_after_its_first_use(emu: Emulator) -> None:
    lines = [chat_line(f"c{i}", user=f"review {i}", system=LONG_SYSTEM) for i in range(6)]
    lines.append(chat_line("short", user="review", system="Classify sentiment."))
    batch = finish(emu, emu.create_batch(lines).id)
    out = emu.lines(batch.output_file_id)
    prefix = message_tokens(LONG_SYSTEM)
    assert prefix >= 1024
    cached = {
        line["custom_id"]: line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        for line in out
    }
    first_long = next(line["custom_id"] for line in out if line["custom_id"] != "short")
    assert cached.pop("short") == 0, "a prefix under 1024 tokens is never cached"
    assert cached.pop(first_long) == 0, "the first use of a prefix is not cached"
    assert set(cached.values()) == {prefix // 128 * 128}
    assert batch.usage.input_tokens_details.cached_tokens == 5 * (prefix // 128 * 128)
    assert cached_tokens(prefix, True) == prefix // 128 * 128


# -- synchronous endpoints ---------------------------------------------------------------------


def test_a_chat_completion_classifies_sentiment_and_reports_usage(emu: Emulator) -> None:
    messages = [
        {"role": "system", "content": "Return the sentiment and topic as JSON."},
        {"role": "user", "content": "The app keeps crashing after the update, terrible experience."},
    ]
    reply = emu.client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    answer = json.loads(reply.choices[0].message.content)
    assert answer["sentiment"] == "negative"
    assert answer["topic"] == "app_experience"
    assert 0.5 <= answer["confidence"] <= 0.99
    assert reply.choices[0].finish_reason == "stop"
    usage = reply.usage
    assert usage.prompt_tokens == sum(message_tokens(m["content"]) for m in messages)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_a_chat_completion_cut_at_max_tokens_ends_with_finish_reason_length(emu: Emulator) -> None:
    reply = emu.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "word " * 40}], max_completion_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens <= 3


def test_repeated_sync_requests_with_a_long_system_prompt_report_cached_tokens(emu: Emulator) -> None:
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "great service"}]
    first = emu.client.chat.completions.create(model="m", messages=messages)
    second = emu.client.chat.completions.create(model="m", messages=messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == message_tokens(LONG_SYSTEM) // 128 * 128


def test_embeddings_are_normalised_vectors_of_the_requested_dimension(emu: Emulator) -> None:
    default = emu.client.embeddings.create(
        model="text-embedding-3-small", input=["good parcel", "bad parcel"]
    )
    assert [len(d.embedding) for d in default.data] == [256, 256]  # the SDK asks for base64 and decodes it
    floats = emu.client.embeddings.create(
        model="e", input="good parcel", dimensions=32, encoding_format="float"
    )
    vector = floats.data[0].embedding
    assert len(vector) == 32
    assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-6)
    assert default.usage.prompt_tokens == default.usage.total_tokens == 6
    with pytest.raises(openai.BadRequestError):
        emu.client.embeddings.create(model="e", input=[])


def test_an_injected_429_carries_retry_after_and_the_sdk_retries_it(
    emulator_factory: EmulatorFactory,
) -> None:
    with emulator_factory(faults=FaultConfig(sync_429_rate=1.0, sync_retry_after_s=0.05)) as emu:
        with pytest.raises(openai.RateLimitError) as exc:
            emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        headers = exc.value.response.headers
        assert headers["retry-after"] == "1"
        assert headers["retry-after-ms"] == "50"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-reset-requests"] == "0.050s"
        assert exc.value.code == "rate_limit_exceeded"
        emu.config(faults={"sync_429_rate": 0.5})
        patient = emu.sdk(max_retries=10)
        for _ in range(5):
            assert patient.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            ).choices
        assert emu.stats()["counters"]["openai.sync_429"] >= 2


def test_the_rpm_limit_answers_429_until_the_window_moves_on(emulator_factory: EmulatorFactory) -> None:
    with emulator_factory(faults=FaultConfig(rpm_limit=2)) as emu:
        raw = emu.client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "a"}]
        )
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
        assert raw.headers["x-ratelimit-remaining-requests"] == "1"
        emu.advance(10)
        emu.client.embeddings.create(model="e", input="b")
        with pytest.raises(openai.RateLimitError) as exc:
            emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "c"}])
        assert exc.value.response.headers["retry-after"] == "50"
        assert exc.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        emu.advance(50)
        assert emu.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "d"}]
        ).choices


def test_the_tpm_limit_refuses_requests_that_would_exceed_the_token_budget(
    emulator_factory: EmulatorFactory,
) -> None:
    with emulator_factory(faults=FaultConfig(tpm_limit=100)) as emu:
        emu.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 200}]
        )  # 54 tokens
        with pytest.raises(openai.RateLimitError) as exc:
            emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y" * 200}])
        assert exc.value.response.headers["x-ratelimit-limit-tokens"] == "100"
        assert int(exc.value.response.headers["retry-after"]) == 60
        emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "tiny"}])


def test_the_api_key_is_checked_when_one_is_configured(emulator_factory: EmulatorFactory) -> None:
    with emulator_factory(api_key="sk-right") as emu:
        with pytest.raises(openai.AuthenticationError):
            emu.client.files.list()
        assert emu.sdk(api_key="sk-right").files.list().data == []


def test_file_bytes_stay_on_disk_with_a_data_dir(emulator_factory: EmulatorFactory, tmp_path: Any) -> None:
    with emulator_factory(data_dir=tmp_path) as emu:
        batch = finish(emu, emu.create_batch(chat_lines(3)).id)
        stored = {p.name for p in tmp_path.iterdir()}
        assert {batch.input_file_id, batch.output_file_id} <= stored
        assert len(emu.lines(batch.output_file_id)) == 3
        emu.client.files.delete(batch.input_file_id)
        assert batch.input_file_id not in {p.name for p in tmp_path.iterdir()}


# -- the checks themselves ---------------------------------------------------------------------


def test_every_response_the_sdk_receives_is_checked_against_the_openapi_description(emu: Emulator) -> None:
    batch = finish(emu, emu.create_batch(chat_lines(2)).id)
    emu.client.batches.list()
    emu.client.files.list()
    emu.client.files.delete(batch.input_file_id)
    emu.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    emu.client.embeddings.create(model="e", input="hi")
    emu.lines(batch.output_file_id)
    with pytest.raises(openai.NotFoundError):
        emu.client.files.retrieve("file-nope")
    assert set(emu.checked) >= {
        "BatchRequestOutput",
        "OpenAIFile",
        "Batch",
        "ListBatchesResponse",
        "ListFilesResponse",
        "DeleteFileResponse",
        "CreateChatCompletionResponse",
        "CreateEmbeddingResponse",
        "ErrorResponse",
    }


def test_the_spec_check_rejects_what_the_live_api_sends_but_the_description_forbids(
    spec: SpecChecker,
) -> None:
    batch = {
        "id": "batch_1",
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-1",
        "completion_window": "24h",
        "status": "validating",
        "created_at": 1,
    }
    assert spec.errors("Batch", batch) == []
    assert spec.errors("Batch", {**batch, "output_file_id": None}), "null in a string field must be caught"
    assert spec.errors("Batch", {**batch, "status": "done"}), "an unknown status must be caught"


def test_the_spec_check_rejects_a_result_line_without_its_custom_id(spec: SpecChecker) -> None:
    line = {
        "id": "batch_req_1",
        "custom_id": "c1",
        "response": {"status_code": 200, "request_id": "req_1", "body": {}},
        "error": None,
    }
    assert spec.errors("BatchRequestOutput", line) == []
    assert (
        spec.errors("BatchRequestOutput", {**line, "error": {"code": "x", "message": "y"}, "response": None})
        == []
    )
    without_id = {k: v for k, v in line.items() if k != "custom_id"}
    assert spec.errors("BatchRequestOutput", without_id), "a line without custom_id must be caught"
    assert spec.errors("BatchRequestOutput", {**line, "response": {"status_code": "200"}})


def test_the_openai_adapter_writes_input_lines_of_the_documented_format(spec: SpecChecker) -> None:
    from airflow_batch_provider.adapters.base import AdapterSettings
    from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
    from airflow_batch_provider.core.requests import CanonicalRequest

    adapter = OpenAIBatchAdapter(AdapterSettings(api_key="sk-test", base_url="http://127.0.0.1:9/v1"))
    chat = CanonicalRequest.from_dict(
        {
            "app_id": "a1",
            "prompt_version": "v1",
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    embedding = CanonicalRequest.from_dict(
        {
            "app_id": "a2",
            "prompt_version": "v1",
            "model": "text-embedding-3-small",
            "kind": "embedding",
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    for request in (chat, embedding):
        line = json.loads(adapter.format_line(request, "a__a1c0"))
        assert spec.errors("BatchRequestInput", line) == [], line
    assert spec.errors(
        "BatchRequestInput", {"custom_id": "x", "method": "GET", "url": "/v1/embeddings", "body": {}}
    )


def test_the_bundled_schemas_say_which_description_they_were_copied_from() -> None:
    from .conftest import SCHEMA_DIR

    document = json.loads((SCHEMA_DIR / "openai-components.json").read_text(encoding="utf-8"))
    assert document["openapi_version"]
    assert {"Batch", "OpenAIFile", "ErrorResponse", "CreateChatCompletionResponse"} <= set(
        document["components"]["schemas"]
    )
    refs = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    refs.add(value.rsplit("/", 1)[1])
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    assert refs <= set(document["components"]["schemas"]), "every reference resolves inside the file"


@pytest.mark.skipif(
    not __import__("os").environ.get("OPENAI_OPENAPI_SPEC"),
    reason="OPENAI_OPENAPI_SPEC names no full description",
)
def test_the_bundled_schemas_equal_those_of_the_full_description_when_one_is_given() -> None:
    from .conftest import bundled_components, full_description_components

    full = full_description_components()
    assert full is not None
    bundled = bundled_components()["schemas"]
    for name, schema in bundled.items():
        if name.startswith("BatchRequest"):
            continue  # written here from the Batch guide: the description has no component for them
        assert schema == full["schemas"][name], f"{name} differs: rerun scripts/extract_openai_schemas.py"


# -- Responses API and moderations -----------------------------------------------------------

LABEL_SCHEMA = {
    "type": "object",
    "properties": {"sentiment": {"type": "string"}},
    "required": ["sentiment"],
    "additionalProperties": False,
}


def response_line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": "o4-mini",
            "instructions": "Label the sentiment.",
            "input": [{"role": "user", "content": f"review {i}: I love it"}],
            "text": {
                "format": {"type": "json_schema", "name": "label", "schema": LABEL_SCHEMA, "strict": True}
            },
            **body,
        },
    }


def test_a_responses_batch_answers_response_objects_with_reasoning_usage(
    emu: Emulator, spec: SpecChecker
) -> None:
    lines = [
        response_line(0),
        response_line(1, reasoning={"effort": "high"}),
        response_line(2, reasoning={"effort": "minimal"}),
    ]
    for line in lines:
        spec.validate("CreateResponse", line["body"])
    batch = finish(emu, emu.create_batch(lines, endpoint="/v1/responses").id)
    assert batch.status == "completed"
    bodies = {line["custom_id"]: line["response"]["body"] for line in emu.lines(batch.output_file_id)}
    for body in bodies.values():
        spec.validate("Response", body)
        (message,) = [item for item in body["output"] if item["type"] == "message"]
        assert json.loads(message["content"][0]["text"])["sentiment"] == "positive"
    reasoning = {cid: b["usage"]["output_tokens_details"]["reasoning_tokens"] for cid, b in bodies.items()}
    assert reasoning == {"r0": 64, "r1": 256, "r2": 0}
    assert all(
        b["usage"]["output_tokens"] > b["usage"]["output_tokens_details"]["reasoning_tokens"]
        for b in bodies.values()
    )
    assert batch.usage is not None and batch.usage.output_tokens_details.reasoning_tokens == 320


def test_the_same_responses_batch_answers_the_same_twice(emulator_factory: EmulatorFactory) -> None:
    answers = []
    for _ in range(2):
        with emulator_factory() as emu:
            batch = finish(
                emu, emu.create_batch([response_line(0), response_line(1)], endpoint="/v1/responses").id
            )
            answers.append(
                sorted(
                    json.dumps(line["response"]["body"]["output"]) for line in emu.lines(batch.output_file_id)
                )
            )
    assert answers[0] == answers[1]


def test_a_responses_line_with_chat_parameters_fails_on_its_own(emu: Emulator) -> None:
    bad = response_line(1, messages=[{"role": "user", "content": "x"}])
    batch = finish(emu, emu.create_batch([response_line(0), bad], endpoint="/v1/responses").id)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
    (error,) = emu.lines(batch.error_file_id)
    assert error["custom_id"] == "r1" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["code"] == "unknown_parameter"


def test_a_realtime_response_is_a_valid_response_object(emu: Emulator) -> None:
    body = response_line(0)["body"]
    answer = emu.client.responses.create(**body)
    assert answer.status == "completed"
    assert json.loads(answer.output_text)["sentiment"] == "positive"
    assert answer.usage is not None and answer.usage.output_tokens_details.reasoning_tokens == 64
    assert emu.checked.count("Response") == 1


def test_a_realtime_response_without_input_is_refused_with_an_error_response(emu: Emulator) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        emu.client.responses.create(model="o4-mini", input=[])
    assert caught.value.status_code == 400


def test_moderations_flag_by_word_deterministically_in_batch_and_in_real_time(
    emu: Emulator, spec: SpecChecker
) -> None:
    texts = {"m0": "I will attack you", "m1": "what lovely weather", "m2": "you idiot"}
    lines = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/moderations",
            "body": {"model": "omni-moderation-latest", "input": text},
        }
        for cid, text in texts.items()
    ]
    batch = finish(emu, emu.create_batch(lines, endpoint="/v1/moderations").id)
    out = {line["custom_id"]: line["response"]["body"] for line in emu.lines(batch.output_file_id)}
    for body in out.values():
        spec.validate("CreateModerationResponse", body)
    flagged = {cid: body["results"][0]["flagged"] for cid, body in out.items()}
    assert flagged == {"m0": True, "m1": False, "m2": True}
    assert out["m0"]["results"][0]["categories"]["violence"] is True
    assert out["m2"]["results"][0]["categories"]["harassment"] is True
    live = emu.client.moderations.create(model="omni-moderation-latest", input="I will attack you")
    assert (
        live.results[0].model_dump(by_alias=True)["category_scores"]
        == out["m0"]["results"][0]["category_scores"]
    )


@pytest.mark.parametrize(("tpm_output", "second_fits"), [("ceiling", False), ("actual", True)])
def test_the_tpm_limit_counts_the_output_ceiling_or_the_output_used_as_configured(
    emulator_factory: EmulatorFactory, tpm_output: str, second_fits: bool
) -> None:
    with emulator_factory(faults=FaultConfig(tpm_limit=120, tpm_output=tpm_output)) as emu:
        ask = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 60}
        first = emu.client.chat.completions.create(**ask)  # 14 prompt tokens + a ceiling of 60
        assert first.usage is not None and first.usage.completion_tokens < 30
        if second_fits:
            emu.client.chat.completions.create(**ask)
        else:
            with pytest.raises(openai.RateLimitError):
                emu.client.chat.completions.create(**ask)


def test_a_batch_over_the_enqueued_token_limit_fails_and_the_peak_is_counted(
    emulator_factory: EmulatorFactory,
) -> None:
    with emulator_factory(faults=FaultConfig(enqueued_token_limit=40)) as emu:
        held = emu.create_batch(chat_lines(3))  # three short prompts, well under 40 tokens
        over = emu.create_batch(chat_lines(3))
        assert finish(emu, over.id).status == "failed"
        assert finish(emu, over.id).errors.data[0].code == "token_limit_exceeded"
        assert finish(emu, held.id).status == "completed"
        after = emu.create_batch(chat_lines(3))  # the first one ended: room again
        assert finish(emu, after.id).status == "completed"
        counters = emu.stats()["counters"]
        assert 0 < counters["openai.enqueued_tokens_peak"] <= 40
        assert counters["openai.enqueued_limit_refused"] == 1
