"""Bedrock's answers read as neutral values (``adapters.bedrock_results``): job states, and every shape of an output file's line.

The jobs behind them, driven through boto3 against the emulator, are in ``test_bedrock.py``.
"""

from __future__ import annotations

import io
import json
from typing import Any

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.bedrock import BedrockBatchAdapter
from airflow_batch_provider.adapters.bedrock_results import STATES, _status
from airflow_batch_provider.core.results import ItemResult, MalformedLine


def parse(lines: list[Any]) -> list[ItemResult | MalformedLine]:
    """Parse ``lines`` (objects, or raw bytes for a damaged line) as one output file, offline."""
    data = b"\n".join(line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines)
    return list(BedrockBatchAdapter(AdapterSettings()).parse_results(io.BytesIO(data)))


def test_every_bedrock_status_maps_to_a_neutral_state() -> None:
    import botocore.session

    model = botocore.session.get_session().get_service_model("bedrock")
    enum = model.shape_for("ModelInvocationJobStatus").enum
    assert set(enum) == set(STATES)
    expected = {
        "Submitted": ("validating", False),
        "Validating": ("validating", False),
        "Scheduled": ("validating", False),
        "InProgress": ("in_progress", False),
        "Stopping": ("cancelling", False),
        "Stopped": ("cancelled", True),
        "Completed": ("completed", True),
        "PartiallyCompleted": ("expired", True),
        "Failed": ("failed", True),
        "Expired": ("expired", True),
    }
    for raw, (state, terminal) in expected.items():
        status = _status(
            {
                "status": raw,
                "totalRecordCount": 10,
                "successRecordCount": 7,
                "errorRecordCount": 1,
                "message": "why",
            }
        )
        assert (status.state, status.terminal, status.raw_state) == (state, terminal, raw)
        assert (status.total, status.completed, status.failed, status.reason) == (10, 7, 1, "why")


def test_every_line_shape_is_parsed() -> None:
    results = parse(
        [
            {
                "recordId": "a__a1c0",
                "modelInput": {},
                "modelOutput": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "hi"}],
                    "stop_reason": "end_turn",
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 3,
                        "cache_read_input_tokens": 1024,
                        "cache_creation_input_tokens": 0,
                    },
                },
            },
            {
                "recordId": "b__a1c0",
                "modelInput": {},
                "modelOutput": {
                    "output": {"message": {"role": "assistant", "content": [{"text": "nova"}]}},
                    "stopReason": "max_tokens",
                    "usage": {
                        "inputTokens": 8,
                        "outputTokens": 2,
                        "totalTokens": 10,
                        "cacheReadInputTokenCount": 4,
                    },
                },
            },
            {
                "recordId": "c__a1c0",
                "modelInput": {},
                "modelOutput": {"embedding": [0.1, 0.2], "inputTextTokenCount": 5},
            },
            {
                "recordId": "d__a1c0",
                "modelInput": {},
                "modelOutput": {
                    "inputTextTokenCount": 3,
                    "results": [{"outputText": "t", "tokenCount": 1, "completionReason": "FINISH"}],
                },
            },
            {
                "recordId": "e__a1c0",
                "modelInput": {},
                "error": {"errorCode": 400, "errorMessage": "bad request"},
            },
            {
                "recordId": "f__a1c0",
                "modelInput": {},
                "error": {"errorCode": 503, "errorMessage": "unavailable"},
            },
            {
                "recordId": "g__a1c0",
                "modelInput": {},
                "error": {"errorCode": "ThrottlingException", "errorMessage": "slow down"},
            },
            {
                "totalRecordCount": 7,
                "processedRecordCount": 7,
                "successRecordCount": 4,
                "errorRecordCount": 3,
            },
            b'{"recordId": "h__a1c0", "modelOutput": {"con',
            {"modelInput": {}, "modelOutput": {}},
            {"recordId": "i__a1c0", "modelInput": {}, "modelOutput": {"unknown": True}},
        ]
    )
    ok = {r.custom_id: r for r in results if isinstance(r, ItemResult)}
    assert ok["a__a1c0"].output == "hi" and ok["a__a1c0"].usage.cached_input_tokens == 1024
    assert (ok["a__a1c0"].usage.input_tokens, ok["a__a1c0"].usage.output_tokens) == (10, 3)
    assert ok["b__a1c0"].output == "nova" and ok["b__a1c0"].raw["finish_reason"] == "max_tokens"
    assert ok["b__a1c0"].usage.cached_input_tokens == 4
    assert ok["c__a1c0"].output == [0.1, 0.2] and ok["c__a1c0"].usage.input_tokens == 5
    assert ok["d__a1c0"].output == "t" and ok["d__a1c0"].usage.output_tokens == 1
    assert (ok["e__a1c0"].outcome, ok["e__a1c0"].error_code, ok["e__a1c0"].error_message) == (
        "failed_permanent",
        "400",
        "bad request",
    )
    assert ok["f__a1c0"].outcome == "failed_retryable"
    assert ok["g__a1c0"].outcome == "failed_retryable"
    bad = [r for r in results if isinstance(r, MalformedLine)]
    assert [b.line_number for b in bad] == [9, 10, 11]
    assert bad[2].custom_id == "i__a1c0"
    assert len(ok) == 7  # the manifest line is skipped, not reported
