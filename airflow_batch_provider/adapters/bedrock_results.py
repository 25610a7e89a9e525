"""Bedrock's answers: job states, and each record's output or error (the manifest line set apart), as neutral values.

Split from :mod:`airflow_batch_provider.adapters.bedrock`, which re-exports every public name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from airflow_batch_provider.adapters.base import (
    BatchState,
    BatchStatus,
    failure_code,
)
from airflow_batch_provider.adapters.claude import (
    claude_result,
    claude_usage,
)
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.core.results import ItemResult, Usage

#: Bedrock job status -> neutral state.
STATES: Final[Mapping[str, BatchState]] = {
    "Submitted": "validating",
    "Validating": "validating",
    "Scheduled": "validating",
    "InProgress": "in_progress",
    "Stopping": "cancelling",
    "Stopped": "cancelled",
    "Completed": "completed",
    "PartiallyCompleted": "expired",
    "Failed": "failed",
    "Expired": "expired",
}

_REGION_PREFIXES: Final = ("us.", "eu.", "apac.", "global.", "us-gov.", "jp.", "au.", "ca.")


def model_family(model_id: str) -> str | None:
    """Return ``anthropic``, ``nova`` or ``titan-embed`` for a Bedrock model id, else ``None``.

    :param model_id: e.g. ``anthropic.claude-3-5-haiku-20241022-v1:0``, ``us.amazon.nova-lite-v1:0``
    """
    name = model_id.rsplit("/", 1)[-1]
    for prefix in _REGION_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if name.startswith("anthropic."):
        return "anthropic"
    if name.startswith("amazon.nova-"):
        return "nova"
    if name.startswith("amazon.titan-embed"):
        return "titan-embed"
    return None


def _status(job: Mapping[str, Any]) -> BatchStatus:
    raw = str(job.get("status") or "Submitted")
    state = STATES.get(raw, "in_progress")
    message = job.get("message") or None
    return BatchStatus(
        state=state,
        total=int(job.get("totalRecordCount") or 0),
        completed=int(job.get("successRecordCount") or 0),
        failed=int(job.get("errorRecordCount") or 0),
        reason=message,
        raw_state=raw,
        error_code=failure_code(message) if state == "failed" else None,
        error_message=message if state == "failed" else None,
    )


def _usage(family: str | None, output: Mapping[str, Any]) -> Usage:
    usage = output.get("usage")
    if isinstance(usage, Mapping) and "input_tokens" in usage:  # Claude Messages
        return claude_usage(usage)
    if isinstance(usage, Mapping):  # Nova / Converse
        return Usage(
            input_tokens=int(usage.get("inputTokens") or 0),
            output_tokens=int(usage.get("outputTokens") or 0),
            cached_input_tokens=int(usage.get("cacheReadInputTokenCount") or 0),
            cache_write_tokens=int(usage.get("cacheWriteInputTokenCount") or 0),
        )
    del family
    return Usage(input_tokens=int(output.get("inputTextTokenCount") or 0))


def output_result(custom_id: str, output: Mapping[str, Any]) -> ItemResult:
    """Turn one ``InvokeModel`` response body (a ``modelOutput``) into a neutral result.

    :param custom_id: the record's id
    :param output: the response body
    """
    if "embedding" in output:
        return ItemResult(custom_id, "succeeded", output=output.get("embedding"), usage=_usage(None, output))
    if output.get("type") == "message" or "content" in output:  # Claude Messages
        return claude_result(custom_id, output)
    if "output" in output:  # Nova messages-v1
        message = (output.get("output") or {}).get("message") or {}
        text = "".join(str(b.get("text", "")) for b in message.get("content") or [] if isinstance(b, Mapping))
        return ItemResult(
            custom_id,
            "succeeded",
            output=text,
            usage=_usage("nova", output),
            raw={"finish_reason": output.get("stopReason")},
        )
    if "results" in output:  # Titan text
        results = output.get("results") or [{}]
        return ItemResult(
            custom_id,
            "succeeded",
            output=results[0].get("outputText"),
            usage=Usage(
                input_tokens=int(output.get("inputTextTokenCount") or 0),
                output_tokens=int(results[0].get("tokenCount") or 0),
            ),
            raw={"finish_reason": results[0].get("completionReason")},
        )
    raise ValueError(f"modelOutput has no shape this adapter knows (keys {sorted(output)[:8]})")


def error_result(custom_id: str, error: Mapping[str, Any]) -> ItemResult:
    """Turn a batch line's ``error`` (``errorCode``, ``errorMessage``) into a neutral result.

    :param custom_id: the record's id
    :param error: the error object
    """
    code = error.get("errorCode")
    status: int | None = None
    try:
        status = int(code) if code is not None else None
    except (TypeError, ValueError):
        status = None
    message = error.get("errorMessage")
    outcome = classify_outcome(status, code if isinstance(code, str) else None)
    return ItemResult(
        custom_id,
        outcome,
        error_code=str(code) if code is not None else "error",
        error_message=str(message) if message is not None else None,
    )


def _is_manifest(line: Mapping[str, Any]) -> bool:
    return "recordId" not in line and "totalRecordCount" in line


def _line_result(custom_id: str, line: Mapping[str, Any]) -> ItemResult:
    error = line.get("error")
    if error is not None:
        if not isinstance(error, Mapping):
            error = {"errorCode": None, "errorMessage": str(error)}
        return error_result(custom_id, error)
    output = line["modelOutput"]
    if not isinstance(output, Mapping):
        raise TypeError("modelOutput is not an object")
    return output_result(custom_id, output)
