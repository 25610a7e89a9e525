"""Gemini's answers: batch states and counts, per-item errors and result lines, as neutral values.

Split from :mod:`airflow_batch_provider.adapters.gemini`, which re-exports every public name.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Final

from airflow_batch_provider.adapters.base import (
    BatchState,
    BatchStatus,
    failure_code,
)
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.core.results import ItemResult, Outcome, Usage

log = logging.getLogger("airflow_batch_provider.adapters.gemini")

_RPC_CODES: Final = {3: "INVALID_ARGUMENT", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 13: "INTERNAL"}

#: Provider state (``JOB_STATE_*`` or ``BATCH_STATE_*`` suffix) -> neutral state.
STATE_MAP: Final[dict[str, BatchState]] = {
    "UNSPECIFIED": "validating",
    "QUEUED": "validating",
    "PENDING": "validating",
    "RUNNING": "in_progress",
    "UPDATING": "in_progress",
    "PAUSED": "in_progress",
    "SUCCEEDED": "completed",
    "PARTIALLY_SUCCEEDED": "completed",
    "FAILED": "failed",
    "CANCELLING": "cancelling",
    "CANCELLED": "cancelled",
    "EXPIRED": "expired",
}


#: ``google.rpc.Code`` number -> HTTP status.
GRPC_TO_HTTP: Final[dict[int, int]] = {
    1: 499,
    2: 500,
    3: 400,
    4: 504,
    5: 404,
    6: 409,
    7: 403,
    8: 429,
    9: 400,
    10: 409,
    11: 400,
    12: 501,
    13: 500,
    14: 503,
    15: 500,
    16: 401,
}


_BLOCKED_FINISH: Final = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)


def state_of(raw: str) -> BatchState:
    """Map a provider state (``JOB_STATE_*`` or ``BATCH_STATE_*``) to the neutral state.

    Unknown states count as ``in_progress`` (the trigger keeps polling and logs the raw state).

    :param raw: the provider's state
    """
    suffix = re.sub(r"^(JOB|BATCH)_STATE_", "", raw.upper())
    return STATE_MAP.get(suffix, "in_progress")


def batch_stats(body: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    """Read ``(successful, failed, pending)`` from a Developer API batch's REST answer.

    ``GET /v1beta/batches/{id}`` answers an operation whose ``metadata`` (the batch) holds
    ``batchStats`` (``requestCount``, ``successfulRequestCount``, ``failedRequestCount``,
    ``pendingRequestCount``; int64 values written as strings), which the SDK's ``BatchJob`` drops.

    :param body: the parsed answer (the operation, or the batch itself)
    :return: the counts, or ``None`` when the answer carries none
    """
    if not isinstance(body, Mapping):
        return None
    metadata = body.get("metadata")
    batch: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else body
    stats = batch.get("batchStats")
    if not isinstance(stats, Mapping):
        return None
    try:
        total = int(stats.get("requestCount") or 0)
        succeeded = int(stats.get("successfulRequestCount") or 0)
        failed = int(stats.get("failedRequestCount") or 0)
        pending = int(stats.get("pendingRequestCount") or max(0, total - succeeded - failed))
    except (TypeError, ValueError):
        return None
    return succeeded, failed, pending


def _batch_path(batch_id: str) -> str:
    return batch_id if batch_id.startswith("batches/") else f"batches/{batch_id}"


def _rest_stats(client: Any, batch_id: str) -> tuple[int, int, int] | None:
    """The batch's ``batchStats``, read by a GET through the SDK's own API client.

    The client brings its base URL, API version, credentials and retries. ``None`` on Vertex (the
    SDK reports ``completion_stats`` there) or when the answer cannot be read (counts stay unknown).
    """
    api = getattr(client, "_api_client", None)
    if api is None or getattr(api, "vertexai", False):
        return None
    try:
        response = api.request("get", _batch_path(batch_id), {}, None)
        return batch_stats(json.loads(response.body or "{}"))
    except Exception as exc:  # counts are progress only: never fail a status read for them
        log.info(
            "could not read batchStats of %s (%s: %s); counts stay unknown", batch_id, type(exc).__name__, exc
        )
        return None


async def _rest_stats_async(client: Any, batch_id: str) -> tuple[int, int, int] | None:
    """:func:`_rest_stats` on the SDK's async transport."""
    api = getattr(client, "_api_client", None)
    if api is None or getattr(api, "vertexai", False):
        return None
    try:
        response = await api.async_request("get", _batch_path(batch_id), {}, None)
        return batch_stats(json.loads(response.body or "{}"))
    except Exception as exc:  # counts are progress only: never fail a status read for them
        log.info(
            "could not read batchStats of %s (%s: %s); counts stay unknown", batch_id, type(exc).__name__, exc
        )
        return None


def _status(job: Any, rest_stats: tuple[int, int, int] | None = None) -> BatchStatus:
    state = job.state
    raw = str(getattr(state, "value", state) or "JOB_STATE_UNSPECIFIED")
    neutral = state_of(raw)
    stats = getattr(job, "completion_stats", None)
    completed = int(getattr(stats, "successful_count", 0) or 0) if stats else 0
    failed = int(getattr(stats, "failed_count", 0) or 0) if stats else 0
    incomplete = int(getattr(stats, "incomplete_count", 0) or 0) if stats else 0
    if stats is None and rest_stats is not None:
        completed, failed, incomplete = rest_stats
    error = getattr(job, "error", None)
    reason = None
    error_code = error_message = None
    if error is not None and (error.message or error.code):
        reason = f"{error.code}: {error.message}" if error.code else str(error.message)
    elif neutral in ("failed", "expired"):
        reason = f"Gemini reported {raw} for {job.name} without an error message"
    if neutral == "failed":
        code = getattr(error, "code", None)
        error_message = getattr(error, "message", None) or reason
        error_code = failure_code(_RPC_CODES.get(code) if isinstance(code, int) else code, error_message)
    return BatchStatus(
        state=neutral,
        total=completed + failed + max(incomplete, 0),
        completed=completed,
        failed=failed,
        reason=reason,
        raw_state=raw,
        error_code=error_code,
        error_message=error_message,
    )


def _usage(meta: Mapping[str, Any] | None, fallback_prompt: int = 0) -> Usage:
    meta = meta or {}
    prompt = int(meta.get("promptTokenCount") or fallback_prompt or 0)
    cached = int(meta.get("cachedContentTokenCount") or 0)
    thoughts = int(meta.get("thoughtsTokenCount") or 0)
    output = int(meta.get("candidatesTokenCount") or 0) + thoughts
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=output,
        cached_input_tokens=cached,
        reasoning_tokens=thoughts,
    )


def classify_error(code: Any, status: str | None) -> Outcome:
    """Map a per-item error (HTTP or gRPC ``code``, ``google.rpc.Code`` name) to an outcome.

    :param code: the error's ``code`` (HTTP status or gRPC number)
    :param status: the error's ``status`` name, if any
    """
    name = (status or "").upper()
    try:
        number = int(code) if code is not None else None
    except (TypeError, ValueError):
        number = None
    http = GRPC_TO_HTTP.get(number, number) if number is not None and number < 100 else number
    if name == "CANCELLED" or http == 499:
        return "cancelled"
    if name == "DEADLINE_EXCEEDED":
        return "expired"
    return classify_outcome(http, name or None)


def result_from_line(custom_id: str, line: Mapping[str, Any]) -> ItemResult:
    """Turn one parsed result line (``response`` or ``error``/``status``) into a neutral result.

    :param custom_id: the line's key
    :param line: the parsed line
    """
    error = line.get("error")
    status = line.get("status")
    if not error and isinstance(status, Mapping) and status:
        error = status
    if not error and isinstance(status, str) and status:  # Vertex: a non-empty status string
        error = {"message": status}
    if error:
        err = error if isinstance(error, Mapping) else {"message": str(error)}
        code = err.get("code")
        name = err.get("status")
        return ItemResult(
            custom_id,
            classify_error(code, name),
            error_code=str(name or code or "error"),
            error_message=err.get("message"),
            raw={"code": code},
        )
    response = line.get("response")
    if not isinstance(response, Mapping):
        return ItemResult(
            custom_id,
            "failed_retryable",
            error_code="no_response",
            error_message="line has neither response nor error",
        )
    if "embedding" in response or "embeddings" in response:
        emb = response.get("embedding") or (response.get("embeddings") or [{}])[0]
        values = emb.get("values") if isinstance(emb, Mapping) else None
        tokens = int(response.get("tokenCount") or 0)
        return ItemResult(
            custom_id, "succeeded", output=values, usage=_usage(response.get("usageMetadata"), tokens)
        )
    usage = _usage(response.get("usageMetadata"))
    candidates = response.get("candidates") or []
    feedback = response.get("promptFeedback") or {}
    if not candidates:
        reason = feedback.get("blockReason") or "NO_CANDIDATES"
        return ItemResult(
            custom_id,
            "failed_permanent",
            usage=usage,
            error_code=f"blocked:{reason}",
            error_message=f"the prompt was blocked ({reason}); change the input or the safety settings",
        )
    first = candidates[0]
    parts = (first.get("content") or {}).get("parts") or []
    text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and not p.get("thought"))
    calls: list[Mapping[str, Any]] = [
        p["functionCall"]
        for p in parts
        if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
    ]
    output: Any = text
    if not text and calls:
        args = [c.get("args") if isinstance(c, Mapping) else c for c in calls]
        output = (
            args[0]
            if len(args) == 1
            else [{"name": c.get("name"), "arguments": c.get("args")} for c in calls]
        )
    finish = first.get("finishReason")
    if finish in _BLOCKED_FINISH and not text:
        return ItemResult(
            custom_id,
            "failed_permanent",
            usage=usage,
            error_code=f"finish:{finish}",
            error_message=f"generation stopped ({finish}) without output",
        )
    return ItemResult(
        custom_id,
        "succeeded",
        output=output,
        usage=usage,
        raw={
            "finish_reason": finish,
            "response_id": response.get("responseId"),
            "model_version": response.get("modelVersion"),
        },
    )
