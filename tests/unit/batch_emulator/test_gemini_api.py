"""The Gemini Developer API routes: the wire protocol over raw HTTP, and the SDK's own types.

Raw ``httpx`` calls check what the live API documents (resumable upload headers, ``Operation``
objects with ``batchStats``, Google error bodies); the ``google-genai`` SDK, pointed at the
emulator, must parse every answer without error.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

pytest.importorskip("google.genai")
from google import genai
from google.genai import errors, types

V = "v1beta"
MODEL = "gemini-2.5-flash"


class Gem:
    """A served emulator with an httpx client and an SDK client."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url
        self.http = httpx.Client(base_url=base_url, headers={"x-goog-api-key": "k"})
        self.sdk = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=base_url, api_version=V))

    def advance(self, seconds: float) -> None:
        self.http.post("/_emulator/clock", json={"advance_s": seconds}).raise_for_status()

    def upload(self, data: bytes, name: str = "in.jsonl") -> str:
        file = self.sdk.files.upload(
            file=io.BytesIO(data), config={"mime_type": "jsonl", "display_name": name}
        )
        assert file.name
        return file.name

    def create(self, data: bytes, display_name: str = "job") -> str:
        job = self.sdk.batches.create(
            model=MODEL, src=self.upload(data), config={"display_name": display_name}
        )
        assert job.name
        return job.name


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with run_emulator(EmulatorConfig(seed=5, api_key="k")) as base_url:
        yield base_url


@pytest.fixture
def gem(server: str) -> Iterator[Gem]:
    client = Gem(server)
    client.http.post("/_emulator/reset").raise_for_status()
    yield client
    client.http.close()


def line(key: str, text: str = "The delivery was late and the box broken.", **request: Any) -> bytes:
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}], **request}
    return json.dumps({"key": key, "request": body}).encode() + b"\n"


def test_a_resumable_upload_takes_its_bytes_in_several_commands_and_checks_offsets(gem: Gem) -> None:
    start = gem.http.post(
        f"/upload/{V}/files",
        json={"file": {"displayName": "parts.jsonl"}},
        headers={
            "X-Goog-Upload-Protocol": "resumable",
            "X-Goog-Upload-Command": "start",
            "X-Goog-Upload-Header-Content-Length": "10",
            "X-Goog-Upload-Header-Content-Type": "application/jsonl",
        },
    )
    assert start.status_code == 200 and start.headers["x-goog-upload-status"] == "active"
    url = start.headers["x-goog-upload-url"]
    assert url.startswith(f"{gem.base}/upload/{V}/files?upload_id=")
    first = gem.http.post(
        url, content=b"01234", headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "0"}
    )
    assert first.headers["x-goog-upload-status"] == "active"
    wrong = gem.http.post(
        url, content=b"56789", headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "3"}
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["status"] == "INVALID_ARGUMENT"
    final = gem.http.post(
        url,
        content=b"56789",
        headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "5"},
    )
    assert final.headers["x-goog-upload-status"] == "final"
    file = types.File.model_validate(final.json()["file"])
    assert (file.display_name, file.size_bytes, file.mime_type, file.state) == (
        "parts.jsonl",
        10,
        "application/jsonl",
        types.FileState.ACTIVE,
    )
    assert gem.sdk.files.get(name=file.name or "").size_bytes == 10


def test_a_batch_is_an_operation_with_string_batch_stats_and_a_responses_file_when_done(gem: Gem) -> None:
    json_mode: dict[str, Any] = {"generationConfig": {"responseMimeType": "application/json"}}
    name = gem.create(line("a", **json_mode) + line("b", **json_mode) + line("c", **json_mode), "stats")
    raw = gem.http.get(f"/{V}/{name}").json()
    assert raw["name"] == name and raw["done"] is False
    meta = raw["metadata"]
    assert meta["@type"].endswith("GenerateContentBatch")
    assert (meta["state"], meta["displayName"], meta["model"]) == (
        "BATCH_STATE_PENDING",
        "stats",
        f"models/{MODEL}",
    )
    assert meta["batchStats"] == {
        "requestCount": "3",
        "successfulRequestCount": "0",
        "failedRequestCount": "0",
        "pendingRequestCount": "3",
    }
    gem.advance(7.0)  # 2 s validating + half of the 10 s of work
    meta = gem.http.get(f"/{V}/{name}").json()["metadata"]
    assert meta["state"] == "BATCH_STATE_RUNNING"
    stats = {k: int(v) for k, v in meta["batchStats"].items()}
    assert stats["requestCount"] == 3 and stats["successfulRequestCount"] + stats["pendingRequestCount"] == 3
    gem.advance(30.0)
    raw = gem.http.get(f"/{V}/{name}").json()
    assert raw["done"] is True and raw["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    responses = raw["metadata"]["output"]["responsesFile"]
    job = gem.sdk.batches.get(name=name)
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED
    assert job.dest is not None and job.dest.file_name == responses
    data = gem.sdk.files.download(file=responses)
    lines = [json.loads(x) for x in data.splitlines()]
    assert sorted(x["key"] for x in lines) == ["a", "b", "c"]
    for x in lines:
        response = types.GenerateContentResponse.model_validate(x["response"])
        assert json.loads(response.text or "")["sentiment"] == "negative"
        usage = response.usage_metadata
        assert usage is not None and usage.prompt_token_count and usage.candidates_token_count


def test_a_list_of_batches_pages_with_next_page_tokens_and_the_sdk_follows_them(gem: Gem) -> None:
    for i in range(3):
        gem.create(line(f"k{i}"), f"job-{i}")
    page = gem.http.get(f"/{V}/batches", params={"pageSize": 2}).json()
    assert len(page["operations"]) == 2 and page["nextPageToken"]
    names = [j.display_name for j in gem.sdk.batches.list(config={"page_size": 2})]
    assert names == ["job-2", "job-1", "job-0"]
    gem.sdk.batches.delete(name=gem.sdk.batches.list().page[0].name or "")
    assert [j.display_name for j in gem.sdk.batches.list()] == ["job-1", "job-0"]


def test_input_that_cannot_run_fails_the_batch_with_the_reasons(gem: Gem) -> None:
    bad = b'{"key": "a"}\nnot json\n' + line("dup") + line("dup") + line("m", model="models/other")
    name = gem.create(bad, "bad")
    gem.advance(30.0)
    raw = gem.http.get(f"/{V}/{name}").json()
    assert raw["metadata"]["state"] == "BATCH_STATE_FAILED"
    codes = [d["code"] for d in raw["error"]["details"]]
    assert codes == ["missing_request", "invalid_json_line", "duplicate_key", "mismatched_model"]
    assert gem.sdk.batches.get(name=name).state == types.JobState.JOB_STATE_FAILED


def test_a_request_that_is_invalid_by_itself_fails_alone_in_the_responses_file(gem: Gem) -> None:
    name = gem.create(line("ok") + json.dumps({"key": "empty", "request": {"contents": []}}).encode() + b"\n")
    gem.advance(30.0)
    job = gem.sdk.batches.get(name=name)
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.dest and job.dest.file_name
    lines = {
        x["key"]: x for x in map(json.loads, gem.sdk.files.download(file=job.dest.file_name).splitlines())
    }
    assert "response" in lines["ok"]
    assert lines["empty"]["error"] == {
        "code": 400,
        "message": "* GenerateContentRequest.contents: contents is not specified",
        "status": "INVALID_ARGUMENT",
    }


def test_inline_requests_come_back_inline_with_their_metadata(gem: Gem) -> None:
    job = gem.sdk.batches.create(
        model=MODEL,
        src=[
            types.InlinedRequest(contents="great, thanks", metadata={"key": "x1"}),
            types.InlinedRequest(contents="awful", metadata={"key": "x2"}),
        ],
        config={"display_name": "inline"},
    )
    gem.advance(30.0)
    done = gem.sdk.batches.get(name=job.name or "")
    assert done.dest is not None and done.dest.inlined_responses is not None
    keys = sorted((r.metadata or {}).get("key", "") for r in done.dest.inlined_responses)
    assert keys == ["x1", "x2"]
    assert all(r.response and r.response.usage_metadata for r in done.dest.inlined_responses)


def test_an_embedding_batch_answers_vectors_of_the_asked_dimension(gem: Gem) -> None:
    data = b"".join(
        json.dumps(
            {
                "key": f"e{i}",
                "request": {"content": {"parts": [{"text": f"text {i}"}]}, "outputDimensionality": 8},
            }
        ).encode()
        + b"\n"
        for i in range(3)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = gem.sdk.batches.create_embeddings(
            model="gemini-embedding-001", src={"file_name": gem.upload(data)}, config={"display_name": "emb"}
        )
    raw = gem.http.get(f"/{V}/{job.name}").json()
    assert raw["metadata"]["@type"].endswith("EmbedContentBatch")
    gem.advance(30.0)
    done = gem.sdk.batches.get(name=job.name or "")
    assert done.dest and done.dest.file_name
    lines = [json.loads(x) for x in gem.sdk.files.download(file=done.dest.file_name).splitlines()]
    assert sorted(x["key"] for x in lines) == ["e0", "e1", "e2"]
    assert all(len(x["response"]["embedding"]["values"]) == 8 for x in lines)


def test_cancel_answers_empty_and_a_finished_batch_cannot_be_cancelled(gem: Gem) -> None:
    name = gem.create(line("a"))
    assert gem.http.post(f"/{V}/{name}:cancel").json() == {}
    gem.advance(30.0)
    assert gem.sdk.batches.get(name=name).state == types.JobState.JOB_STATE_CANCELLED
    finished = gem.create(line("b"))
    gem.advance(30.0)
    with pytest.raises(errors.ClientError) as info:
        gem.sdk.batches.cancel(name=finished)
    assert (info.value.code, info.value.status) == (400, "FAILED_PRECONDITION")


def test_requests_without_the_api_key_are_refused_in_googles_error_format(gem: Gem) -> None:
    answer = httpx.get(f"{gem.base}/{V}/batches", headers={"x-goog-api-key": "wrong"})
    assert answer.status_code == 400
    assert answer.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert httpx.get(f"{gem.base}/{V}/batches", params={"key": "k"}).status_code == 200


def test_an_unknown_batch_or_file_is_not_found_and_an_unknown_method_is_refused(gem: Gem) -> None:
    with pytest.raises(errors.ClientError) as info:
        gem.sdk.batches.get(name="batches/nope")
    assert info.value.code == 404
    assert gem.http.get(f"/{V}/files/nope").status_code == 403
    assert gem.http.post(f"/{V}/models/{MODEL}:streamGenerateContent", json={}).status_code == 404


def test_the_synchronous_endpoints_answer_through_the_sdk_with_implicit_caching(gem: Gem) -> None:
    system = "You are a careful reviewer. " * 200
    config = types.GenerateContentConfig(system_instruction=system, max_output_tokens=5)
    first = gem.sdk.models.generate_content(model=MODEL, contents="great product", config=config)
    second = gem.sdk.models.generate_content(model=MODEL, contents="great product", config=config)
    assert first.usage_metadata and second.usage_metadata
    assert not first.usage_metadata.cached_content_token_count
    assert (second.usage_metadata.cached_content_token_count or 0) > 1000
    assert first.candidates and first.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    embedded = gem.sdk.models.embed_content(
        model="gemini-embedding-001", contents=["a b", "c d"], config={"output_dimensionality": 4}
    )
    assert embedded.embeddings and [len(e.values or []) for e in embedded.embeddings] == [4, 4]
    single = gem.http.post(
        f"/{V}/models/gemini-embedding-001:embedContent", json={"content": {"parts": [{"text": "x"}]}}
    )
    assert len(single.json()["embedding"]["values"]) == 256


def test_an_injected_429_carries_retry_info_and_a_retry_after_header(gem: Gem) -> None:
    gem.http.put(
        "/_emulator/config", json={"faults": {"sync_429_rate": 1.0, "sync_retry_after_s": 2}}
    ).raise_for_status()
    answer = gem.http.post(
        f"/{V}/models/{MODEL}:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert answer.status_code == 429 and answer.headers["retry-after"] == "2"
    error = answer.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2.000s"}]
    with pytest.raises(errors.ClientError) as info:
        gem.sdk.models.generate_content(model=MODEL, contents="hi")
    assert info.value.code == 429


def test_a_transient_retrieve_error_is_a_google_500(gem: Gem) -> None:
    name = gem.create(line("a"))
    gem.http.put("/_emulator/config", json={"faults": {"retrieve_5xx_rate": 1.0}}).raise_for_status()
    answer = gem.http.get(f"/{V}/{name}")
    assert answer.status_code == 500 and answer.json()["error"]["status"] == "INTERNAL"
