"""The vLLM lane's adapter: vLLM's output shapes, staging into the exchange volume, downloads."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.adapters.vllm import VllmKubernetesAdapter, output_name, parse_vllm_line
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import ConfigurationError, ItemError

OK_BODY = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
}
# The shapes vLLM 0.33 writes (vllm/entrypoints/launchers/run_batch.py): every field always present.
SUCCESS = {"id": "vllm-1", "custom_id": "a", "response": {"status_code": 200, "request_id": "r", "body": OK_BODY},
           "error": None}  # fmt: skip
HANDLER_ERROR = {
    "id": "vllm-2",
    "custom_id": "b",
    "response": {"status_code": 500, "request_id": "r", "body": None},
    "error": {"error": {"message": "CUDA error", "type": "InternalServerError", "param": None, "code": 500}},
}
ROUTING_ERROR = {"id": "vllm-3", "custom_id": "c", "response": {"status_code": 400, "request_id": "r", "body": None},
                 "error": "URL /v1/completions is not a supported endpoint"}  # fmt: skip
NULL_BODY_NO_ERROR = {"id": "vllm-4", "custom_id": "d", "response": {"status_code": 503, "request_id": "r", "body": None},
                      "error": None}  # fmt: skip


def adapter(tmp_path: Path) -> VllmKubernetesAdapter:
    return VllmKubernetesAdapter(AdapterSettings(extra={"exchange_path": str(tmp_path)}))


def parse(lines: list[dict[str, Any]]) -> list[ItemResult | MalformedLine]:
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    return list(VllmKubernetesAdapter(AdapterSettings()).parse_results(io.BytesIO(data)))


def test_the_connection_type_picks_the_vllm_adapter_which_declares_it_runs_in_a_pod() -> None:
    cls = adapter_class("vllm_kubernetes")
    assert cls is VllmKubernetesAdapter and cls.runs_in_pod


def test_a_success_line_gives_the_text_and_the_usage_with_cached_tokens_apart() -> None:
    [res] = parse([SUCCESS])
    assert isinstance(res, ItemResult) and res.outcome == "succeeded" and res.output == "hi"
    assert (res.usage.input_tokens, res.usage.cached_input_tokens, res.usage.output_tokens) == (8, 4, 3)


def test_a_handler_error_with_a_null_body_and_a_nested_error_object_is_retryable() -> None:
    [res] = parse([HANDLER_ERROR])
    assert isinstance(res, ItemResult)
    assert (res.outcome, res.error_code, res.error_message) == ("failed_retryable", "500", "CUDA error")


def test_a_routing_error_given_as_a_bare_string_is_permanent_and_keeps_its_words() -> None:
    [res] = parse([ROUTING_ERROR])
    assert isinstance(res, ItemResult)
    assert (res.outcome, res.error_code) == ("failed_permanent", "400")
    assert res.error_message == "URL /v1/completions is not a supported endpoint"


def test_a_non_2xx_status_without_an_error_field_is_a_failure_not_a_success() -> None:
    [res] = parse([NULL_BODY_NO_ERROR])
    assert isinstance(res, ItemResult) and res.outcome == "failed_retryable"


def test_the_openai_parser_cannot_read_vllm_string_errors_which_is_why_the_lane_has_its_own() -> None:
    data = json.dumps(ROUTING_ERROR).encode() + b"\n"
    [res] = list(OpenAIBatchAdapter(AdapterSettings(api_key="k")).parse_results(io.BytesIO(data)))
    assert isinstance(res, MalformedLine)
    assert parse_vllm_line("c", ROUTING_ERROR).outcome == "failed_permanent"


def test_lines_are_openai_batch_lines_that_vllm_run_batch_reads() -> None:
    request = CanonicalRequest(
        app_id="a", prompt_version="v1", model="m", messages=({"role": "user", "content": "x"},), system="s"
    )
    line = json.loads(VllmKubernetesAdapter(AdapterSettings()).format_line(request, "id1"))
    assert line["url"] == "/v1/chat/completions" and line["custom_id"] == "id1"
    assert line["body"]["messages"][0] == {"role": "system", "content": "s"}


def test_staging_copies_the_chunk_into_the_exchange_volume_once(tmp_path: Path) -> None:
    a = adapter(tmp_path)
    ref = a.stage(io.BytesIO(b"abc\n"), "k.jsonl", 4)
    assert ref.value == (tmp_path / "k.jsonl").as_uri() and (tmp_path / "k.jsonl").read_bytes() == b"abc\n"
    assert a.stage(io.BytesIO(b"zzz\n"), "k.jsonl", 4) == ref  # same name and size: reused
    assert not list(tmp_path.glob("*.part"))


def test_download_returns_what_the_pod_wrote_and_nothing_when_it_wrote_nothing(tmp_path: Path) -> None:
    a = adapter(tmp_path)
    ref = BatchRef("vllm", "pod:k", "k")
    sink = io.BytesIO()
    assert a.download(ref, "output", sink) == 0
    (tmp_path / output_name("k")).write_bytes(b"line\n")
    assert a.download(ref, "output", sink) == 5 and sink.getvalue() == b"line\n"
    assert a.download(ref, "errors", io.BytesIO()) == 0


def test_submit_is_refused_with_the_way_to_run_the_lane(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pod task"):
        adapter(tmp_path).submit(adapter(tmp_path).stage(io.BytesIO(b"x"), "k.jsonl", 1), "k", {})


def test_a_connection_without_an_exchange_path_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="exchange_path"):
        VllmKubernetesAdapter(AdapterSettings()).stage(io.BytesIO(b"x"), "k.jsonl", 1)


def test_the_deadline_fallback_needs_a_real_time_endpoint_at_the_connection_s_host() -> None:
    with pytest.raises(ConfigurationError, match="sync_fallback deadline policy needs"):
        VllmKubernetesAdapter(AdapterSettings()).realtime_client()
    client = VllmKubernetesAdapter(AdapterSettings(base_url="http://vllm-online:8000/v1")).realtime_client()
    assert str(client._client.base_url) == "http://vllm-online:8000/v1/"  # type: ignore[attr-defined]


def test_the_pods_output_file_is_a_valid_result_file_and_an_html_page_or_a_log_in_its_place_is_not() -> None:
    from batch_emulator.faults import HTML_PAGE

    lane = VllmKubernetesAdapter(AdapterSettings())
    lines = [SUCCESS, HANDLER_ERROR, ROUTING_ERROR, NULL_BODY_NO_ERROR]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    assert lane.result_file_problem(io.BytesIO(data)) is None
    assert lane.result_file_problem(io.BytesIO(data + data[: len(data) // 8])) is None  # a cut last line
    assert lane.result_file_problem(io.BytesIO(HTML_PAGE)) is not None
    log = b"INFO 12-01 run_batch.py:123] Reading batch from /exchange/in.jsonl\n"
    assert lane.result_file_problem(io.BytesIO(log)) is not None


def test_the_lane_declares_what_the_engine_serves_so_an_embeddings_workload_is_accepted() -> None:
    assert VllmKubernetesAdapter.kind_refusal("embedding", "backfill") is None
    assert VllmKubernetesAdapter.kind_refusal("chat") is None
    for unserved in ("response", "moderation"):  # the engine has no /v1/responses nor /v1/moderations
        assert "accepts only ['chat', 'embedding']" in str(VllmKubernetesAdapter.kind_refusal(unserved))


def test_an_embedding_request_becomes_an_embeddings_line_the_engine_accepts() -> None:
    request = CanonicalRequest(app_id="a", prompt_version="v1", model="m", kind="embedding", messages=(
        {"role": "user", "content": "vectors please"},))  # fmt: skip
    line = json.loads(VllmKubernetesAdapter(AdapterSettings()).format_line(request, "id1"))
    assert line == {"custom_id": "id1", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "m", "input": "vectors please"}}  # fmt: skip


def test_a_line_the_engine_would_refuse_is_rejected_as_its_item_with_the_engine_s_words() -> None:
    request = CanonicalRequest(app_id="bad", prompt_version="v1", model="m", messages=(
        {"role": "user", "content": "x"},), params={"max_tokens": "a few"})  # fmt: skip
    with pytest.raises(ItemError) as caught:
        VllmKubernetesAdapter(AdapterSettings()).format_line(request, "id9")
    assert caught.value.code == "engine_invalid_request" and caught.value.app_id == "bad"
    assert "body.max_tokens" in str(caught.value) and "Input should be a valid integer" in str(caught.value)
    assert "every line of the chunk" in str(caught.value) and "the other items go on" in str(caught.value)


def test_prepare_rejects_only_the_item_the_engine_would_refuse_and_stages_the_rest(tmp_path: Path) -> None:
    from airflow_batch_provider.core.custom_ids import item_key
    from airflow_batch_provider.ledger import Ledger
    from airflow_batch_provider.ledger.records import OpenItem
    from airflow_batch_provider.ledger.store import PreparedItem
    from airflow_batch_provider.services import round as rounds
    from airflow_batch_provider.staging import Staging

    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    run = "manual__2026-12-01T00:00:00+00:00"
    items = [
        PreparedItem(
            item_key(f"i{k}"),
            CanonicalRequest(
                app_id=f"i{k}",
                prompt_version="v1",
                model="m",
                messages=({"role": "user", "content": f"t{k}"},),
                params={"temperature": "warm" if k == 2 else 0.2},
            ),
        )
        for k in range(5)
    ]
    ledger.start_run("w", run, "vllm", "m")
    ledger.upsert_items("w", run, items)
    rounds.stage_round(
        ledger=ledger,
        adapter=adapter(tmp_path / "exchange"),
        staging=Staging(str(tmp_path / "staging")),
        workload="w",
        run_id=run,
        round_=1,
        items=ledger.iter_item_rows("w", run, states=["pending"], shape=OpenItem),
    )
    rows = {
        r["app_id"]: r
        for r in ledger.iter_items("w", run, columns=["app_id", "state", "error_code", "error_message"])
    }
    assert rows["i2"]["state"] == "review" and rows["i2"]["error_code"] == "engine_invalid_request"
    assert "body.temperature" in rows["i2"]["error_message"]
    [job] = ledger.get_jobs("w", run, 1)
    assert job.lines == 4 and {r["state"] for k, r in rows.items() if k != "i2"} == {"staged"}
