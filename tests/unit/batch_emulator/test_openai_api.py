"""The OpenAI-compatible API (files, batches, limits, the spec check), driven with the real ``openai`` SDK over HTTP.

Every response the SDK receives is validated against the official OpenAPI description by the
``emulator_factory`` fixture; a test fails at exit when one does not conform.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest

from batch_emulator import FaultConfig

from .conftest import Emulator, EmulatorFactory, SpecChecker
from .helpers import TERMINAL, chat_line, chat_lines, finish

openai = pytest.importorskip("openai")

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


def test_a_batch_request_with_bad_arguments_is_refused_at_once(emu: Emulator) -> None:
    upload = emu.upload_jsonl([chat_line("c0")])
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
