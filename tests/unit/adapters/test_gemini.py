"""The Gemini adapter's contract, through the real ``google-genai`` SDK over HTTP to the emulator.

The emulator runs with the real clock at scale 1.0; tests move its clock forward
(``POST /_emulator/clock``) instead of sleeping. Every response the adapter sees went through the
SDK's own types, so a shape the SDK cannot parse fails here.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest

from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef, InputRef
from airflow_batch_provider.adapters.gemini import GeminiBatchAdapter, rest_request
from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import BatchInDoubtError, ConfigurationError
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.store import Clock
from batch_emulator.testing import run_emulator
from tests.support.gcs import start_gcs, vertex_connections
from tests.unit.adapters.test_contract import FrozenTime

from .faults import FAST_CREATE, arm, batches

pytest.importorskip("google.genai")

MODEL = "gemini-2.5-flash"
EMBED_MODEL = "gemini-embedding-001"
SYSTEM = "Classify the sentiment and topic of the customer comment. Answer as JSON."
FINISH_S = 30.0


class Emu:
    """A running emulator and helpers to drive it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def advance(self, seconds: float) -> None:
        httpx.post(f"{self.base_url}/_emulator/clock", json={"advance_s": seconds}).raise_for_status()

    def configure(self, faults: dict[str, Any]) -> None:
        httpx.put(f"{self.base_url}/_emulator/config", json={"faults": faults}).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.base_url}/_emulator/stats").json())

    def adapter(self, **extra: Any) -> GeminiBatchAdapter:
        return GeminiBatchAdapter(AdapterSettings(api_key="test-key", base_url=self.base_url, extra=extra))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # a frozen clock: a batch moves on only through ``Emu.advance``, never because the machine is slow
    with run_emulator(EmulatorConfig(seed=3), clock=Clock(FrozenTime())) as base_url:
        yield base_url


@pytest.fixture
def emu(server: str) -> Emu:
    httpx.post(f"{server}/_emulator/reset").raise_for_status()
    return Emu(server)


def chat(i: int, text: str | None = None, **params: Any) -> CanonicalRequest:
    return CanonicalRequest(
        app_id=f"c{i}",
        prompt_version="v1",
        model=MODEL,
        system=SYSTEM,
        messages=({"role": "user", "content": text or f"The app is great and fast, thanks! #{i}"},),
        params=params,
    )


def embedding(i: int, **params: Any) -> CanonicalRequest:
    return CanonicalRequest(
        app_id=f"e{i}",
        prompt_version="v1",
        model=EMBED_MODEL,
        kind="embedding",
        messages=({"role": "user", "content": f"late delivery, broken package {i}"},),
        params=params,
    )


def chunk(adapter: GeminiBatchAdapter, requests: Sequence[CanonicalRequest]) -> bytes:
    return b"".join(adapter.format_line(r, f"id-{r.app_id}") + b"\n" for r in requests)


def submit(
    adapter: GeminiBatchAdapter, requests: Sequence[CanonicalRequest], key: str = "abp-key-1"
) -> BatchRef:
    data = chunk(adapter, requests)
    ref = adapter.stage(io.BytesIO(data), f"{key}.jsonl", len(data))
    return adapter.submit(ref, key, {"workload": "w"}, kind=requests[0].kind)


def results(adapter: GeminiBatchAdapter, ref: BatchRef) -> list[ItemResult | MalformedLine]:
    return list(adapter.iter_results(ref))


def by_id(items: Sequence[ItemResult | MalformedLine]) -> dict[str, ItemResult]:
    return {r.custom_id: r for r in items if isinstance(r, ItemResult)}


# -- limits and formatting -----------------------------------------------------------------------


def test_the_registry_finds_the_adapter_by_connection_type_with_batch_mode_limits() -> None:
    cls = adapter_class("gemini_batch")
    assert cls is GeminiBatchAdapter
    assert (cls.name, cls.conn_type) == ("gemini", "gemini_batch")
    assert cls.limits.max_requests == 50_000
    assert cls.limits.max_bytes == 2 * 1024**3
    assert cls.limits.usable_bytes < cls.limits.max_bytes


def test_an_embedding_line_maps_dimensions_and_refuses_a_parameter_gemini_does_not_know() -> None:
    body = rest_request(embedding(1, dimensions=64, task_type="RETRIEVAL_DOCUMENT"))
    assert body == {
        "model": f"models/{EMBED_MODEL}",
        "content": {"parts": [{"text": "late delivery, broken package 1"}]},
        "outputDimensionality": 64,
        "taskType": "RETRIEVAL_DOCUMENT",
    }
    with pytest.raises(ConfigurationError, match="encoding_format"):
        rest_request(embedding(1, encoding_format="base64"))


# -- submit and idempotency ------------------------------------------------------------------------


def test_a_second_submit_with_the_same_key_returns_the_same_batch_without_a_second_upload(emu: Emu) -> None:
    adapter = emu.adapter()
    first = submit(adapter, [chat(i) for i in range(3)])
    again = submit(emu.adapter(), [chat(i) for i in range(3)])
    assert again == first
    assert first.batch_id.startswith("batches/")
    assert emu.adapter().find("abp-key-1") == first
    assert emu.adapter().find("abp-never-submitted") is None
    stats = emu.stats()["counters"]
    assert stats["gemini.batches_created"] == 1
    assert stats["gemini.files_uploaded"] == 1  # the retry reused the upload of the same name and size


def test_the_batch_model_comes_from_the_lines_and_a_missing_one_is_explained(emu: Emu) -> None:
    adapter = emu.adapter()
    with pytest.raises(ConfigurationError, match="no model known"):
        adapter.submit(InputRef("file", "files/unknown"), "abp-k", {})
    ref = submit(adapter, [chat(1)])
    job = adapter.client.batches.get(name=ref.batch_id)
    assert job.model == f"models/{MODEL}"
    assert job.display_name == "abp-key-1"


def test_a_chunk_that_is_not_seekable_is_spooled_and_uploaded(emu: Emu) -> None:
    adapter = emu.adapter()
    data = chunk(adapter, [chat(1), chat(2)])

    class OneWay(io.RawIOBase):
        def __init__(self) -> None:
            self._inner = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            piece = self._inner.read(len(b))
            b[: len(piece)] = piece
            return len(piece)

    ref = adapter.stage(io.BufferedReader(OneWay()), "abp-spooled.jsonl", len(data))
    assert ref.kind == "file"
    batch = adapter.submit(ref, "abp-spooled", {})
    emu.advance(FINISH_S)
    assert {r.custom_id for r in results(adapter, batch)} == {"id-c1", "id-c2"}


# -- status ----------------------------------------------------------------------------------


def test_a_batch_walks_from_pending_through_running_to_succeeded(emu: Emu) -> None:
    adapter = emu.adapter()
    ref = submit(adapter, [chat(i) for i in range(4)])
    status = adapter.status(ref)
    assert (status.state, status.raw_state, status.terminal) == ("validating", "JOB_STATE_PENDING", False)
    emu.advance(5)
    assert adapter.status(ref).state == "in_progress"
    emu.advance(FINISH_S)
    status = adapter.status(ref)
    assert (status.state, status.raw_state, status.terminal) == ("completed", "JOB_STATE_SUCCEEDED", True)


def test_a_batch_that_fails_validation_is_failed_with_a_reason(emu: Emu) -> None:
    emu.configure({"fail_validation": 1})
    adapter = emu.adapter()
    ref = submit(adapter, [chat(1)])
    emu.advance(FINISH_S)
    status = adapter.status(ref)
    assert status.state == "failed"
    # The SDK's BatchJob drops the Developer API's operation error, so the code is the catch-all.
    assert status.error_code == "provider_error" and status.error_message
    assert status.raw_state == "JOB_STATE_FAILED"
    assert status.reason and "JOB_STATE_FAILED" in status.reason
    assert results(adapter, ref) == []


async def test_the_async_status_client_reads_the_state_through_the_sdks_aio_client(emu: Emu) -> None:
    adapter = emu.adapter()
    ref = submit(adapter, [chat(1)])
    client = adapter.async_client()
    try:
        assert (await client.status(ref)).state == "validating"
        emu.advance(FINISH_S)
        assert (await client.status(ref)).state == "completed"
    finally:
        await client.close()


# -- results ---------------------------------------------------------------------------------


def test_results_of_every_emulated_fault_map_to_the_neutral_outcomes(emu: Emu) -> None:
    faults = {
        "rate_500": 0.1,
        "rate_429": 0.1,
        "rate_400": 0.1,
        "rate_context_length": 0.05,
        "rate_missing": 0.05,
        "rate_duplicate": 0.1,
        "rate_malformed": 0.05,
    }
    emu.configure(faults)
    adapter = emu.adapter()
    requests = [chat(i) for i in range(120)]
    ref = submit(adapter, requests)
    emu.advance(FINISH_S)
    assert adapter.status(ref).state == "completed"
    parsed = results(adapter, ref)
    config = FaultConfig.from_mapping(faults)
    expected = {"server_error": "failed_retryable", "rate_limited": "failed_retryable"}
    expected |= {"invalid_request": "failed_permanent", "context_length": "failed_permanent"}
    counts: dict[str, int] = {}
    for r in parsed:
        if isinstance(r, ItemResult):
            counts[r.custom_id] = counts.get(r.custom_id, 0) + 1
    got = by_id(parsed)
    malformed = [r for r in parsed if isinstance(r, MalformedLine)]
    seen_kinds = set()
    for request in requests:
        cid = f"id-{request.app_id}"
        decision = config.decide_item(3, cid)
        if decision.fault == "missing" or decision.malformed:
            assert cid not in got
            seen_kinds.add("missing" if decision.fault == "missing" else "malformed")
            continue
        result = got[cid]
        if decision.fault == "none":
            assert result.outcome == "succeeded"
            assert json.loads(result.output)["sentiment"] == "positive"
            assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
            assert result.raw["finish_reason"] == "STOP"
            assert counts[cid] == (2 if decision.duplicate else 1)
            seen_kinds.add("duplicate" if decision.duplicate else "none")
        else:
            assert result.outcome == expected[decision.fault], (cid, decision, result)
            assert result.error_code in ("INTERNAL", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT")
            assert result.error_message
            seen_kinds.add(decision.fault)
    assert len(malformed) == sum(config.decide_item(3, f"id-{r.app_id}").malformed for r in requests)
    assert seen_kinds == {"none", "duplicate", "missing", "malformed", *expected}


def test_the_shared_system_prompt_is_reported_as_implicitly_cached_after_its_first_use(emu: Emu) -> None:
    long_system = SYSTEM + " Be careful with sarcasm." * 300
    requests = [
        CanonicalRequest(
            f"c{i}", "v1", MODEL, system=long_system, messages=({"role": "user", "content": f"ok {i}"},)
        )
        for i in range(5)
    ]
    adapter = emu.adapter()
    ref = submit(adapter, requests)
    emu.advance(FINISH_S)
    usages = [r.usage for r in results(adapter, ref) if isinstance(r, ItemResult)]
    assert len(usages) == 5
    cached = sorted(u.cached_input_tokens for u in usages)
    assert cached[0] == 0 and cached[1] > 1000  # the first one wrote the cache, the others read it
    assert all(u.input_tokens < 20 for u in usages if u.cached_input_tokens)


def test_a_line_that_is_not_json_or_has_no_key_is_malformed_and_never_stops_the_stream() -> None:
    adapter = GeminiBatchAdapter(AdapterSettings(api_key="k"))
    data = b'{"key": "a", "response": {"candidates": []}\n{"response": {}}\n\n{"key": 7}\n{"key": "b", "error": {"code": 429}}\n'
    parsed = list(adapter.parse_results(io.BytesIO(data)))
    assert [type(p).__name__ for p in parsed] == [
        "MalformedLine",
        "MalformedLine",
        "MalformedLine",
        "ItemResult",
    ]
    assert [p.line_number for p in parsed if isinstance(p, MalformedLine)] == [1, 2, 4]
    assert parsed[-1].outcome == "failed_retryable"  # type: ignore[union-attr]


def test_an_expired_batch_keeps_what_it_finished_and_marks_the_rest_expired(emu: Emu) -> None:
    emu.configure({"expire_batches": [0], "expire_after_fraction": 0.5})
    adapter = emu.adapter()
    ref = submit(adapter, [chat(i) for i in range(10)])
    emu.advance(FINISH_S)
    status = adapter.status(ref)
    assert (status.state, status.raw_state) == ("expired", "JOB_STATE_EXPIRED")
    outcomes = [r.outcome for r in results(adapter, ref) if isinstance(r, ItemResult)]
    assert sorted(outcomes) == ["expired"] * 5 + ["succeeded"] * 5


def test_cancel_stops_the_batch_and_its_unrun_items_come_back_cancelled(emu: Emu) -> None:
    adapter = emu.adapter()
    ref = submit(adapter, [chat(i) for i in range(10)])
    emu.advance(2.0 + 10 * 0.3)  # validating 2 s, then 3 of 10 seconds of work
    adapter.cancel(ref)
    assert adapter.status(ref).state == "in_progress"  # Gemini has no CANCELLING; still RUNNING
    emu.advance(FINISH_S)
    status = adapter.status(ref)
    assert (status.state, status.raw_state) == ("cancelled", "JOB_STATE_CANCELLED")
    outcomes = sorted(r.outcome for r in results(adapter, ref) if isinstance(r, ItemResult))
    assert outcomes == ["cancelled"] * 7 + ["succeeded"] * 3
    adapter.cancel(ref)  # a finished batch: nothing to do, no error


def test_a_small_chat_chunk_goes_inline_and_its_responses_come_back_as_keyed_lines(emu: Emu) -> None:
    adapter = emu.adapter(inline_max_bytes=1_000_000)
    ref = submit(adapter, [chat(i) for i in range(4)])
    emu.advance(FINISH_S)
    got = by_id(results(adapter, ref))
    assert set(got) == {f"id-c{i}" for i in range(4)}
    assert all(r.outcome == "succeeded" and r.usage.input_tokens > 0 for r in got.values())
    assert emu.stats()["counters"].get("gemini.files_uploaded", 0) == 0
    with pytest.raises(ConfigurationError, match="20 MB"):
        _ = emu.adapter(inline_max_bytes=30 * 1024 * 1024).inline_max_bytes


def test_an_embedding_batch_returns_a_vector_of_the_requested_dimension_per_item(emu: Emu) -> None:
    adapter = emu.adapter(inline_max_bytes=1_000_000)  # embeddings always go by file
    ref = submit(adapter, [embedding(i, dimensions=32) for i in range(6)])
    emu.advance(FINISH_S)
    got = by_id(results(adapter, ref))
    assert len(got) == 6
    for result in got.values():
        assert result.outcome == "succeeded"
        assert len(result.output) == 32
        assert result.usage.input_tokens > 0
    assert emu.stats()["counters"]["gemini.files_uploaded"] == 1


# -- real-time -------------------------------------------------------------------------------


async def test_realtime_answers_a_chat_request_with_usage(emu: Emu) -> None:
    client = emu.adapter().realtime_client()
    try:
        reply = await client.complete(chat(1, max_tokens=200), "rt-1")
    finally:
        await client.close()
    assert reply.retry_after is None
    assert reply.result.custom_id == "rt-1"
    assert reply.result.outcome == "succeeded"
    assert json.loads(reply.result.output)["sentiment"] == "positive"
    (answer,) = httpx.get(f"{emu.base_url}/_emulator/record").json()["realtime"]["gemini"]
    assert answer["custom_id"] == "rt-1"
    assert answer["usage"]["output_tokens"] == reply.result.usage.output_tokens
    assert reply.result.usage.input_tokens > 0 and reply.result.usage.output_tokens > 0


async def test_realtime_reports_a_429_as_retryable_with_the_retry_after_it_was_given(emu: Emu) -> None:
    emu.configure({"sync_429_rate": 1.0, "sync_retry_after_s": 3})
    client = emu.adapter().realtime_client()
    try:
        reply = await client.complete(chat(1), "rt-2")
    finally:
        await client.close()
    assert reply.result.outcome == "failed_retryable"
    assert reply.result.error_code == "RESOURCE_EXHAUSTED"
    assert reply.retry_after == 3.0


async def test_realtime_embeds_through_the_sdk(emu: Emu) -> None:
    client = emu.adapter().realtime_client()
    try:
        reply = await client.complete(embedding(1, dimensions=16), "rt-3")
    finally:
        await client.close()
    assert reply.result.outcome == "succeeded"
    assert len(reply.result.output) == 16


# -- Vertex AI request building -------------------------------


# -- the create rule under faults -----------------------------------------------------------------


@pytest.mark.parametrize("fault", ["500_after", "drop_after", "slow_after"])
def test_a_lost_create_reply_is_found_by_its_display_name_and_not_created_again(emu: Emu, fault: str) -> None:
    adapter = emu.adapter(**FAST_CREATE)
    data = chunk(adapter, [chat(1)])
    staged = adapter.stage(io.BytesIO(data), "abp-lost.jsonl", len(data))
    arm(emu.base_url, f"create:{fault}")
    ref = adapter.submit(staged, "abp-lost", {})
    (batch,) = batches(emu.base_url, "gemini")
    assert ref.batch_id == f"batches/{batch['id']}"
    assert batch["keys"] == {"display_name": "abp-lost"}


@pytest.mark.parametrize("fault", ["500_after", "drop_after"])
def test_a_lost_upload_reply_is_found_by_name_and_not_uploaded_again(emu: Emu, fault: str) -> None:
    adapter = emu.adapter(**FAST_CREATE)
    arm(emu.base_url, f"upload:{fault}")
    data = chunk(adapter, [chat(1)])
    staged = adapter.stage(io.BytesIO(data), "abp-up.jsonl", len(data))
    assert emu.stats()["files_uploaded"] == 1
    assert staged.value.startswith("files/")


def test_a_create_refused_with_429_before_acting_is_sent_again(emu: Emu) -> None:
    adapter = emu.adapter(**FAST_CREATE)
    arm(emu.base_url, "create:429", create_retry_after_s=0)
    ref = submit(adapter, [chat(1)], key="abp-429")
    assert [f"batches/{b['id']}" for b in batches(emu.base_url, "gemini")] == [ref.batch_id]


def test_a_create_that_fails_ambiguously_on_every_try_ends_in_doubt(emu: Emu) -> None:
    adapter = emu.adapter(create_attempts=2, **FAST_CREATE)
    data = chunk(adapter, [chat(1)])
    staged = adapter.stage(io.BytesIO(data), "abp-doubt.jsonl", len(data))
    arm(emu.base_url, "create:500", "create:500")
    with pytest.raises(BatchInDoubtError, match="abp-doubt"):
        adapter.submit(staged, "abp-doubt", {})
    assert batches(emu.base_url, "gemini") == []


def test_find_pages_through_every_batch(emu: Emu) -> None:
    adapter = emu.adapter()
    first = submit(adapter, [chat(1)], key="abp-first")
    for n in range(120):
        submit(adapter, [chat(1)], key=f"abp-other-{n}")
    assert adapter.find("abp-first") == first
    assert adapter.resolve_in_doubt("abp-first", datetime.now(timezone.utc), 1) == first


# -- kinds and tools -------------------------------------------------------------------------------


def test_a_function_call_answer_is_the_calls_arguments() -> None:
    line = {
        "key": "t1",
        "response": {
            "candidates": [
                {"content": {"parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}]}}
            ],
            "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4, "thoughtsTokenCount": 6},
        },
    }
    (result,) = GeminiBatchAdapter(AdapterSettings()).parse_results(io.BytesIO(json.dumps(line).encode()))
    assert isinstance(result, ItemResult) and result.output == {"city": "Oslo"}
    assert (result.usage.output_tokens, result.usage.reasoning_tokens) == (10, 6)


@pytest.mark.parametrize("kind", ["response", "moderation"])
def test_a_kind_gemini_does_not_accept_is_refused_naming_the_alternative(kind: str) -> None:
    request = CanonicalRequest(
        "r1", "v1", "gemini-2.5-flash", kind=kind, messages=({"role": "user", "content": "x"},)
    )  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError,
        match=rf"provider 'gemini' accepts only \['chat', 'embedding'\].*accept '{kind}': openai",
    ):
        GeminiBatchAdapter(AdapterSettings()).format_line(request, "r1")


# -- progress counts (batchStats) ------------------------------------------------------------------


def test_progress_counts_come_from_the_rest_batch_stats_that_the_sdk_drops(emu: Emu) -> None:
    adapter = emu.adapter()
    ref = submit(adapter, [chat(i) for i in range(6)], key="abp-stats")
    assert adapter.status(ref).total == 6
    seen = set()
    for _ in range(40):
        emu.advance(1)
        status = adapter.status(ref)
        seen.add(status.completed)
        assert status.completed + status.failed <= status.total == 6
        if status.terminal:
            break
    assert (status.state, status.total, status.completed, status.failed) == ("completed", 6, 6, 0)
    assert len(seen) > 2, f"counts should grow while the batch runs, saw {sorted(seen)}"


async def test_the_async_status_reads_the_same_progress_counts(emu: Emu) -> None:
    adapter = emu.adapter()
    ref = submit(adapter, [chat(i) for i in range(3)], key="abp-stats-async")
    emu.advance(FINISH_S)
    client = adapter.async_client()
    try:
        status = await client.status(ref)
    finally:
        await client.close()
    assert (status.state, status.total, status.completed) == ("completed", 3, 3)
    assert status == adapter.status(ref)


# -- Vertex AI end to end: the hook, a service-account key, the emulator's Vertex routes, GCS ------


@dataclass
class Vertex:
    emu: Emu
    gcs: Any
    bucket: str

    def adapter(self) -> GeminiBatchAdapter:
        from airflow_batch_provider.hooks.batch import BatchHook

        adapter = BatchHook("abp_vertex").get_adapter()
        assert isinstance(adapter, GeminiBatchAdapter)
        return adapter


@pytest.fixture(scope="module")
def gcs_server() -> Iterator[Any]:
    pytest.importorskip("gcp_storage_emulator")
    pytest.importorskip("gcsfs")
    with start_gcs() as server:
        yield server


@pytest.fixture
def vertex(gcs_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Vertex]:
    bucket = "abp-" + uuid.uuid4().hex[:10]
    gcs_server.create_bucket(bucket)
    with run_emulator(EmulatorConfig(seed=3, gcs_endpoint=gcs_server.endpoint_url)) as base_url:
        gcp, gemini = vertex_connections(base_url, gcs_server.endpoint_url, f"gs://{bucket}/llm-batch")
        gemini["extra"]["max_retries"] = 0
        monkeypatch.setenv("AIRFLOW_CONN_ABP_GCP", json.dumps(gcp))
        monkeypatch.setenv("AIRFLOW_CONN_ABP_VERTEX", json.dumps(gemini))
        yield Vertex(Emu(base_url), gcs_server, bucket)


def test_a_vertex_batch_runs_end_to_end_through_gcs_on_the_connections_credentials(vertex: Vertex) -> None:
    adapter = vertex.adapter()
    # the project came from the key file, the credentials from the gcp connection
    assert adapter.settings.extra["project"] == "abp-project"
    requests = [chat(i) for i in range(3)]
    ref = submit(adapter, requests, key="abp-vertex-1")
    assert ref.batch_id.startswith("projects/abp-project/locations/us-central1/batchPredictionJobs/")
    staged = f"{vertex.bucket}/llm-batch/input/abp-vertex-1.jsonl"
    assert adapter.gcs.cat(staged) == chunk(adapter, requests)  # the input really is in GCS
    assert adapter.status(ref).state in ("validating", "in_progress")
    vertex.emu.advance(FINISH_S)
    status = adapter.status(ref)
    assert (status.state, status.completed, status.failed) == ("completed", 3, 0)
    got = by_id(results(adapter, ref))
    assert set(got) == {f"id-c{i}" for i in range(3)}
    assert all(r.outcome == "succeeded" and r.output for r in got.values())
    outputs = adapter.gcs.glob(f"{vertex.bucket}/llm-batch/output/abp-vertex-1/**/predictions.jsonl")
    assert len(outputs) == 1  # the emulator wrote the predictions to GCS, the adapter read them there
    counters = vertex.emu.stats()["counters"]
    assert counters["vertex.tokens_issued"] >= 1 and counters["vertex.outputs_written"] == 1
    # a second submit of the same key finds the job instead of creating another
    assert adapter.submit(InputRef("uri", f"gs://{staged}"), "abp-vertex-1", {"model": MODEL}) == ref
    assert counters["vertex.batches_created"] == 1


async def test_the_triggers_async_client_polls_vertex_with_the_connections_credentials(
    vertex: Vertex,
) -> None:
    from airflow_batch_provider.hooks.batch import BatchHook

    ref = submit(vertex.adapter(), [chat(1)], key="abp-vertex-async")
    adapter = await BatchHook.aget_adapter("abp_vertex")
    client = adapter.async_client()
    try:
        status = await client.status(ref)
    finally:
        await client.close()
    assert status.state in ("validating", "in_progress")


def test_vertex_refuses_a_call_without_a_token_it_issued(vertex: Vertex) -> None:
    answer = httpx.get(
        f"{vertex.emu.base_url}/v1beta1/projects/p/locations/l/batchPredictionJobs",
        headers={"Authorization": "Bearer made-up"},
    )
    assert answer.status_code == 401


def test_the_test_button_checks_vertex_and_its_bucket(
    vertex: Vertex, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.models.connection import Connection

    ok, message = Connection.get_connection_from_secrets("abp_vertex").test_connection()
    assert ok, message
    assert f"GCS bucket {vertex.bucket} is readable" in message
    anonymous = {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True}}
    monkeypatch.setenv("AIRFLOW_CONN_ABP_GCP", json.dumps(anonymous))
    ok, message = Connection.get_connection_from_secrets("abp_vertex").test_connection()
    assert not ok, message
    assert "abp_vertex" in message and "failed" in message
