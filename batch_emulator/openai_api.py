"""OpenAI-compatible Files, Batch, Chat Completions and Embeddings endpoints under ``/v1``.

Objects follow the official OpenAPI description (``OpenAIFile``, ``Batch``, ``ListBatchesResponse``,
``ListFilesResponse``, ``DeleteFileResponse``, ``CreateChatCompletionResponse``,
``CreateEmbeddingResponse``, ``ErrorResponse``). Where the description types a field as a plain
string but the live API sends ``null`` (``output_file_id`` of a running batch ...), the emulator
leaves the field out, which both the description and the SDK accept. The one exception is an
empty ``GET /v1/files`` page, whose required ``first_id``/``last_id`` are ``null`` as in the live API.

Batch result files use the documented line formats::

    {"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
     "body": {...chat.completion or embedding list...}}, "error": null}

Items that fail with a non-2xx status go to the *error* file with the same shape (the body holds
``{"error": {...}}``); items a batch never ran (expired, cancelled) go to the error file with
``"response": null`` and ``"error": {"code": "batch_expired" | "batch_cancelled", "message": ...}``.
Lines are written in processing order, which is a seeded shuffle of the input order.

Input validation (the batch becomes ``failed`` with ``errors.data[]`` entries of ``code``,
``message``, ``line``, ``param``) uses these codes: ``empty_file``, ``file_too_large``,
``too_many_requests``, ``invalid_json_line``, ``missing_required_parameter``, ``invalid_method``,
``invalid_url``, ``duplicate_custom_id``, ``mismatched_model``, ``emulated_validation_failure``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.responses import Response

from batch_emulator import model
from batch_emulator.app import CUSTOM_ID_HEADER, ApiError, guard_create
from batch_emulator.common import (
    BEARER,
    ErrorTable,
    InputScan,
    InputWords,
    ResultWriter,
    another_answer,
    html_page_instead,
    injected_error,
    key_accepted,
    output_file,
    result_file,
    retrieve_fails,
    settle,
    stable_id,
)
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import RateDecision, retry_after_header
from batch_emulator.lifecycle import ItemLog, Job, JobItem, ValidationIssue
from batch_emulator.store import EmulatorState, FileTooLargeError, StoredFile

PROVIDER: Final = "openai"
SUPPORTED_ENDPOINTS: Final = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations")
FILE_PURPOSES: Final = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
OUTPUT_FILE_TTL_S: Final = 30 * 86_400
MAX_ISSUES: Final = 100
_SERVER_ERROR: Final = "The server had an error while processing your request. Sorry about that!"
INPUT_WORDS: Final = InputWords(
    too_many="The input file has more than {limit} requests; split it into smaller batches.",
    bad_json="This line is not parseable as valid JSON.",
)


def error_body(
    message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Return an OpenAI ``ErrorResponse`` body.

    :param message: what went wrong
    :param type_: the error type (``invalid_request_error``, ``server_error`` ...)
    :param param: the offending parameter
    :param code: machine-readable code
    """
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _fail(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    return ApiError(status, error_body(message, type_, param, code), headers)


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


# -- request content ---------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    """Return the text of a message ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping):
                texts.append(str(part.get("text") or part.get("refusal") or ""))
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(t for t in texts if t)
    return str(content)


class ChatPrompt:
    """A chat request's prompt, digested for the stand-in model and the token counts.

    :param body: the request body
    """

    def __init__(self, body: Mapping[str, Any]) -> None:
        messages = body.get("messages")
        self.messages: list[Mapping[str, Any]] = (
            [m for m in messages if isinstance(m, Mapping)] if isinstance(messages, list) else []
        )
        texts = [_content_text(m.get("content")) for m in self.messages]
        roles = [str(m.get("role", "")) for m in self.messages]
        self.prompt_tokens = sum(model.message_tokens(t) for t in texts)
        prefix: list[str] = []
        for role, text in zip(roles, texts, strict=True):
            if role not in ("system", "developer"):
                break
            prefix.append(text)
        self.prefix_tokens = sum(model.message_tokens(t) for t in prefix)
        self.prefix_key = model.prefix_key(prefix) if prefix else None
        self.system = model.join_texts(
            [t for r, t in zip(roles, texts, strict=True) if r in ("system", "developer")]
        )
        self.user = model.join_texts([t for r, t in zip(roles, texts, strict=True) if r == "user"])
        fmt = body.get("response_format")
        self.json_mode = isinstance(fmt, Mapping) and fmt.get("type") in ("json_object", "json_schema")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        self.max_output_tokens = (
            int(limit) if isinstance(limit, int) and not isinstance(limit, bool) else None
        )
        n = body.get("n", 1)
        self.n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 8 else 1


def chat_request_error(body: Mapping[str, Any], config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error a chat request causes by itself (as ``status``/``type``/``code``/...), or ``None``.

    :param body: the request body
    :param config: emulator settings (context window)
    """
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _natural(400, "you must provide a model parameter", "model", "missing_required_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _natural(
            400, "'messages' must be a non-empty array of message objects.", "messages", "invalid_value"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
            "function",
        ):
            return _natural(
                400,
                f"Invalid value for 'messages[{i}]': each message needs a valid 'role'.",
                f"messages[{i}].role",
                "invalid_value",
            )
    if body.get("stream"):
        return _natural(
            400, "The emulator does not stream; send stream=false.", "stream", "unsupported_value"
        )
    tokens = ChatPrompt(body).prompt_tokens
    if tokens > config.context_window_tokens:
        return _context_error(tokens, config.context_window_tokens)
    return None


def _natural(
    status: int, message: str, param: str | None, code: str | None, type_: str = "invalid_request_error"
) -> dict[str, Any]:
    return {"status": status, "type": type_, "message": message, "param": param, "code": code}


def _context_error(tokens: int, window: int) -> dict[str, Any]:
    return _natural(
        400,
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages.",
        "messages",
        "context_length_exceeded",
    )


def _embedding_inputs(body: Mapping[str, Any]) -> list[tuple[str, int]] | None:
    """Return ``(text, tokens)`` per input, or ``None`` when ``input`` is malformed."""
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        return None
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        raw = [raw]
    out: list[tuple[str, int]] = []
    for value in raw:
        if isinstance(value, str) and value:
            out.append((value, model.count_tokens(value)))
        elif isinstance(value, list) and value and all(isinstance(x, int) for x in value):
            out.append((" ".join(f"t{x}" for x in value), len(value)))
        else:
            return None
    return out


def embedding_request_error(body: Mapping[str, Any], config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error an embeddings request causes by itself, or ``None``.

    :param body: the request body
    :param config: emulator settings
    """
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _natural(400, "you must provide a model parameter", "model", "missing_required_parameter")
    inputs = _embedding_inputs(body)
    if inputs is None:
        return _natural(
            400,
            "'input' must be a non-empty string or array of non-empty strings or token arrays.",
            "input",
            "invalid_value",
        )
    if len(inputs) > 2048:
        return _natural(400, "'input' holds more than 2048 items.", "input", "invalid_value")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= 3072):
        return _natural(400, "'dimensions' must be an integer from 1 to 3072.", "dimensions", "invalid_value")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        return _natural(
            400, "'encoding_format' must be 'float' or 'base64'.", "encoding_format", "invalid_value"
        )
    for text, tokens in inputs:
        if tokens > 8192:
            return _natural(
                400,
                f"This model's maximum context length is 8192 tokens, however you requested {tokens} tokens.",
                "input",
                "context_length_exceeded",
            )
        del text
    return None


# -- response bodies -------------------------------------------------------------------------


def chat_completion(
    body: Mapping[str, Any], *, completion_id: str, created: int, cached: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer a valid chat request with a ``chat.completion`` object.

    :param body: the request body
    :param completion_id: the ``chatcmpl-...`` id
    :param created: unix seconds
    :param cached: prompt tokens to report as cached
    :return: the object and its usage as ``input``/``cached``/``output`` token counts
    """
    prompt = ChatPrompt(body)
    reply = model.respond(
        prompt.system or None,
        prompt.user,
        json_mode=prompt.json_mode,
        max_output_tokens=prompt.max_output_tokens,
    )
    output_tokens = reply.output_tokens * prompt.n
    choices: list[dict[str, Any]] = [
        {
            "index": i,
            "message": {"role": "assistant", "content": reply.text, "refusal": None, "annotations": []},
            "logprobs": None,
            "finish_reason": "length" if reply.truncated else "stop",
        }
        for i in range(prompt.n)
    ]
    usage = {
        "prompt_tokens": prompt.prompt_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": prompt.prompt_tokens + output_tokens,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    obj = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": str(body["model"]),
        "choices": choices,
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": "fp_emulator",
    }
    return obj, {"input": prompt.prompt_tokens, "cached": cached, "output": output_tokens}


def embedding_list(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer a valid embeddings request with a ``list`` of ``embedding`` objects.

    :param body: the request body
    :return: the object and its usage as ``input``/``cached``/``output`` token counts
    """
    inputs = _embedding_inputs(body) or []
    dims = body.get("dimensions") or model.DEFAULT_EMBEDDING_DIMENSIONS
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for i, (text, _) in enumerate(inputs):
        vector = model.embed(text, int(dims))
        value: Any = (
            base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if as_base64 else vector
        )
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(t for _, t in inputs)
    obj = {
        "object": "list",
        "data": data,
        "model": str(body["model"]),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return obj, {"input": tokens, "cached": 0, "output": 0}


# -- Responses API ---------------------------------------------------------------------------

#: Reasoning tokens a reasoning model spends per ``reasoning.effort`` (deterministic stand-in).
REASONING_TOKENS: Final = {"minimal": 0, "low": 16, "medium": 64, "high": 256}
_REASONING_MODEL_PREFIXES: Final = ("o1", "o3", "o4", "gpt-5")


def _input_messages(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A Responses ``input`` (a string, or message items) as chat messages; ``None`` when malformed."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}] if raw else None
    if not isinstance(raw, list) or not raw:
        return None
    out: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, Mapping):
            return None
        if item.get("type", "message") == "message" and "role" in item:
            out.append({"role": item["role"], "content": item.get("content")})
        elif item.get("type") == "function_call_output":
            out.append({"role": "tool", "content": str(item.get("output") or "")})
    return out or None


def chat_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses request seen as a chat request, so that one stand-in model answers both.

    :param body: the ``CreateResponse`` body
    """
    messages = list(_input_messages(body) or [])
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, {"role": "developer", "content": body["instructions"]})
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), Mapping) else None
    view: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if isinstance(fmt, Mapping) and fmt.get("type") in ("json_object", "json_schema"):
        view["response_format"] = {"type": fmt["type"]}
    if body.get("max_output_tokens") is not None:
        view["max_completion_tokens"] = body["max_output_tokens"]
    return view


def reasoning_tokens(body: Mapping[str, Any]) -> int:
    """Reasoning tokens a Responses request spends: by ``reasoning.effort`` on a reasoning model.

    :param body: the ``CreateResponse`` body
    """
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, Mapping) else None
    if effort is None and str(body.get("model") or "").startswith(_REASONING_MODEL_PREFIXES):
        effort = "medium"
    return REASONING_TOKENS.get(str(effort), 0) if effort is not None else 0


def response_request_error(body: Mapping[str, Any], config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error a Responses request causes by itself, or ``None``.

    :param body: the ``CreateResponse`` body
    :param config: emulator settings (context window)
    """
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _natural(400, "you must provide a model parameter", "model", "missing_required_parameter")
    if _input_messages(body) is None:
        return _natural(
            400, "'input' must be a non-empty string or array of input items.", "input", "invalid_value"
        )
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if fmt is not None and (
        not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "json_object", "json_schema")
    ):
        return _natural(
            400,
            "Invalid 'text.format': give type text, json_object or json_schema.",
            "text.format",
            "invalid_value",
        )
    if (
        isinstance(fmt, Mapping)
        and fmt.get("type") == "json_schema"
        and (not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), Mapping))
    ):
        return _natural(
            400,
            "'text.format' of type json_schema needs 'name' and 'schema'.",
            "text.format",
            "missing_required_parameter",
        )
    for name in ("messages", "response_format", "max_tokens", "stop"):
        if name in body:
            return _natural(
                400,
                f"Unsupported parameter: '{name}' (a Chat Completions parameter).",
                name,
                "unknown_parameter",
            )
    return chat_request_error(chat_view(body), config)


def response_object(
    body: Mapping[str, Any], *, response_id: str, created: int, cached: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer a valid Responses request with a ``response`` object.

    :param body: the ``CreateResponse`` body
    :param response_id: the ``resp_...`` id
    :param created: unix seconds
    :param cached: input tokens to report as cached
    :return: the object and its usage as ``input``/``cached``/``output``/``reasoning`` token counts
    """
    prompt = ChatPrompt(chat_view(body))
    reply = model.respond(
        prompt.system or None,
        prompt.user,
        json_mode=prompt.json_mode,
        max_output_tokens=prompt.max_output_tokens,
    )
    reasoning = reasoning_tokens(body)
    output_tokens = reply.output_tokens + reasoning
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append({"id": stable_id("rs_", response_id), "type": "reasoning", "summary": []})
    output.append(
        {
            "id": stable_id("msg_", response_id),
            "type": "message",
            "role": "assistant",
            "status": "incomplete" if reply.truncated else "completed",
            "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}],
        }
    )
    text = body.get("text") if isinstance(body.get("text"), Mapping) else {}
    obj: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "completed_at": created,
        "status": "incomplete" if reply.truncated else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if reply.truncated else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": str(body["model"]),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": None,
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "store": bool(body.get("store", True)),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": (text or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt.prompt_tokens + output_tokens,
        },
        "metadata": dict(body.get("metadata") or {}),
    }
    used = {"input": prompt.prompt_tokens, "cached": cached, "output": output_tokens, "reasoning": reasoning}
    return obj, used


# -- moderations -----------------------------------------------------------------------------

#: Moderation categories and the words that make the stand-in classifier flag them.
MODERATION_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "hate": ("hate", "hateful"),
    "hate/threatening": (),
    "harassment": ("idiot", "stupid", "loser"),
    "harassment/threatening": (),
    "illicit": ("shoplift", "counterfeit"),
    "illicit/violent": (),
    "self-harm": (),
    "self-harm/intent": (),
    "self-harm/instructions": (),
    "sexual": (),
    "sexual/minors": (),
    "violence": ("kill", "attack", "bomb"),
    "violence/graphic": (),
}


def _moderation_inputs(body: Mapping[str, Any]) -> list[str] | None:
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        return None
    texts: list[str] = []
    for value in raw:
        if isinstance(value, str):
            texts.append(value)
        elif (
            isinstance(value, Mapping) and value.get("type") == "text" and isinstance(value.get("text"), str)
        ):
            texts.append(value["text"])
        else:
            return None
    return texts


def moderation_request_error(body: Mapping[str, Any], config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error a moderations request causes by itself, or ``None``.

    :param body: the ``CreateModerationRequest`` body
    :param config: emulator settings (unused: moderations have no context window here)
    """
    del config
    if "model" in body and not isinstance(body.get("model"), str):
        return _natural(400, "'model' must be a string.", "model", "invalid_value")
    if _moderation_inputs(body) is None:
        return _natural(
            400, "'input' must be a string, an array of strings or of text items.", "input", "invalid_value"
        )
    return None


def moderation_object(
    body: Mapping[str, Any], *, moderation_id: str
) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer a valid moderations request: a word-driven, deterministic classification.

    :param body: the ``CreateModerationRequest`` body
    :param moderation_id: the ``modr-...`` id
    :return: the object and its usage (moderations are free: all zero)
    """
    results = []
    for text in _moderation_inputs(body) or []:
        words = set(model._words(text))
        scores = {
            category: (
                0.9
                if words & set(hits)
                else round(
                    int(hashlib.sha256(f"{category}|{text}".encode()).hexdigest()[:4], 16) / 65536 * 0.05, 6
                )
            )
            for category, hits in MODERATION_WORDS.items()
        }
        categories = {c: score >= 0.5 for c, score in scores.items()}
        results.append(
            {
                "flagged": any(categories.values()),
                "categories": categories,
                "category_scores": scores,
                "category_applied_input_types": {c: ["text"] for c in MODERATION_WORDS},
            }
        )
    obj = {
        "id": moderation_id,
        "model": str(body.get("model") or "omni-moderation-latest"),
        "results": results,
    }
    return obj, {"input": 0, "cached": 0, "output": 0}


# -- router ----------------------------------------------------------------------------------


def build_router(state: EmulatorState) -> APIRouter:
    """Return the ``/v1`` router bound to the emulator state.

    :param state: the shared state
    """
    api = OpenAIEmulator(state)
    state.finalizers[PROVIDER] = api.batch_json

    def check_auth(request: Request) -> None:
        if not key_accepted(state, request, (BEARER,)):
            raise _fail(401, "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key")

    router = APIRouter(prefix="/v1", dependencies=[Depends(check_auth)])
    router.add_api_route("/files", api.upload_file, methods=["POST"])
    router.add_api_route("/files", api.list_files, methods=["GET"])
    router.add_api_route("/files/{file_id}", api.retrieve_file, methods=["GET"])
    router.add_api_route("/files/{file_id}", api.delete_file, methods=["DELETE"])
    router.add_api_route("/files/{file_id}/content", api.file_content, methods=["GET"])
    router.add_api_route("/batches", api.create_batch, methods=["POST"])
    router.add_api_route("/batches", api.list_batches, methods=["GET"])
    router.add_api_route("/batches/{batch_id}", api.retrieve_batch, methods=["GET"])
    router.add_api_route("/batches/{batch_id}/cancel", api.cancel_batch, methods=["POST"])
    router.add_api_route("/chat/completions", api.chat_completions, methods=["POST"])
    router.add_api_route("/embeddings", api.embeddings, methods=["POST"])
    router.add_api_route("/responses", api.responses, methods=["POST"])
    router.add_api_route("/moderations", api.moderations, methods=["POST"])
    return router


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise _fail(400, f"We could not parse the JSON body of your request: {exc}.") from exc
    if not isinstance(body, dict):
        raise _fail(400, "The request body must be a JSON object.")
    return body


def _int_param(value: str | None, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError as exc:
        raise _fail(400, f"Invalid '{name}': expected an integer.", param=name, code="invalid_value") from exc
    if not low <= number <= high:
        raise _fail(
            400, f"Invalid '{name}': must be between {low} and {high}.", param=name, code="invalid_value"
        )
    return number


def _page(ids: Sequence[str], after: str | None, limit: int) -> tuple[int, int]:
    """Return the slice ``[start, end)`` of a page that follows the cursor ``after``."""
    start = 0
    if after:
        try:
            start = list(ids).index(after) + 1
        except ValueError as exc:
            raise _fail(
                400, f"Invalid 'after': no object with id {after!r}.", param="after", code="invalid_value"
            ) from exc
    return start, min(len(ids), start + limit)


class OpenAIEmulator:
    """The endpoint handlers, bound to the shared state.

    :param state: the shared state
    """

    def __init__(self, state: EmulatorState) -> None:
        self.state = state

    # -- files -----------------------------------------------------------------------------

    @staticmethod
    def file_json(meta: StoredFile) -> dict[str, Any]:
        """Return the ``OpenAIFile`` object of a stored file.

        :param meta: the stored file
        """
        return _drop_none(
            {
                "id": meta.id,
                "object": "file",
                "bytes": meta.bytes,
                "created_at": meta.created_at,
                "expires_at": meta.expires_at,
                "filename": meta.filename,
                "purpose": meta.purpose,
                "status": "processed",
            }
        )

    def _file(self, file_id: str) -> StoredFile:
        meta = self.state.files.get(file_id)
        if meta is None or meta.provider != PROVIDER:
            raise _fail(404, f"No such File object: {file_id}", param="id", code=None)
        return meta

    async def upload_file(self, request: Request) -> Any:
        """``POST /v1/files`` (multipart: ``file``, ``purpose``), under the create faults."""
        return await guard_create(self.state, PROVIDER, "upload", lambda: self._upload_file(request), _refuse)

    async def _upload_file(self, request: Request) -> dict[str, Any]:
        form = await request.form()
        try:
            upload = form.get("file")
            purpose = form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise _fail(
                    400,
                    "Missing required parameter: 'file'.",
                    param="file",
                    code="missing_required_parameter",
                )
            if not isinstance(purpose, str) or purpose not in FILE_PURPOSES:
                raise _fail(
                    400,
                    f"Invalid value for 'purpose': {purpose!r}; expected one of {sorted(FILE_PURPOSES)}.",
                    param="purpose",
                    code="invalid_value",
                )
            config = self.state.config
            meta = StoredFile(
                id=self.state.new_id("file-"),
                filename=upload.filename or "upload.jsonl",
                purpose=purpose,
                bytes=0,
                created_at=int(self.state.now()),
                sha256="",
                provider=PROVIDER,
            )
            try:
                await run_in_threadpool(self.state.files.put, meta, upload.file, config.max_file_bytes)
            except FileTooLargeError as exc:
                raise _fail(
                    413,
                    f"File is larger than the {config.max_file_bytes} byte limit.",
                    param="file",
                    code="file_too_large",
                ) from exc
        finally:
            await form.close()
        self.state.bump(PROVIDER, "files_uploaded")
        return self.file_json(meta)

    def list_files(self, request: Request) -> dict[str, Any]:
        """``GET /v1/files?purpose=&limit=&order=&after=``."""
        q = request.query_params
        limit = _int_param(q.get("limit"), "limit", 10_000, 1, 10_000)
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise _fail(
                400, "Invalid 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value"
            )
        files = [f for f in self.state.files.list(PROVIDER) if q.get("purpose") in (None, f.purpose)]
        if order == "desc":
            files.reverse()
        start, end = _page([f.id for f in files], q.get("after"), limit)
        page = files[start:end]
        return {
            "object": "list",
            "data": [self.file_json(f) for f in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": end < len(files),
        }

    def retrieve_file(self, file_id: str) -> dict[str, Any]:
        """``GET /v1/files/{file_id}``."""
        return self.file_json(self._file(file_id))

    def delete_file(self, file_id: str) -> dict[str, Any]:
        """``DELETE /v1/files/{file_id}``."""
        self._file(file_id)
        self.state.files.delete(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    def file_content(self, file_id: str) -> Response:
        """``GET /v1/files/{file_id}/content``, streamed."""
        meta = self._file(file_id)
        page = html_page_instead(self.state, meta.purpose)
        if page is not None:
            return page
        return StreamingResponse(
            self.state.files.iter_bytes(file_id),
            media_type="application/octet-stream",
            headers={"content-length": str(meta.bytes)},
        )

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, request: Request) -> Any:
        """``POST /v1/batches``, under the create faults."""
        return await guard_create(
            self.state, PROVIDER, "create", lambda: self._create_batch(request), _refuse
        )

    async def _create_batch(self, request: Request) -> dict[str, Any]:
        body = await _json_body(request)
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise _fail(
                    400,
                    f"Missing required parameter: '{name}'.",
                    param=name,
                    code="missing_required_parameter",
                )
        endpoint = body["endpoint"]
        if endpoint not in SUPPORTED_ENDPOINTS:
            raise _fail(
                400,
                f"Invalid value for 'endpoint': {endpoint!r}; the emulator supports {list(SUPPORTED_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body["completion_window"] != "24h":
            raise _fail(
                400,
                "Invalid value for 'completion_window': only '24h' is supported.",
                param="completion_window",
                code="invalid_value",
            )
        metadata = body.get("metadata")
        if metadata is not None:
            _check_metadata(metadata)
        meta = self.state.files.get(body["input_file_id"])
        if meta is None or meta.provider != PROVIDER:
            raise _fail(404, f"No such File object: {body['input_file_id']}", param="input_file_id")
        if meta.purpose != "batch":
            raise _fail(
                400,
                f"File {meta.id} has purpose {meta.purpose!r}; batch input files need purpose 'batch'.",
                param="input_file_id",
                code="invalid_value",
            )

        state = self.state
        config = state.config
        forced_failure = state.consume_validation_failure()
        items, issues = await run_in_threadpool(self._parse_input, meta, endpoint, config)
        if forced_failure and not issues:
            issues = [
                ValidationIssue(
                    "emulated_validation_failure",
                    "The input file failed validation (emulator fault fail_validation).",
                )
            ]
        model_name = next((str(i.body.get("model")) for i in items if i.body.get("model")), None)
        if not issues and state.consume_countdown("fail_token_limit"):
            issues = [
                ValidationIssue(
                    "token_limit_exceeded",
                    f"Enqueued token limit reached for {model_name} in organization org-emulator. "
                    "Limit: 90,000 enqueued tokens. Please try again once some in_progress batches have "
                    "been completed.",
                )
            ]
        tokens = sum(_input_tokens(endpoint, i.body) for i in items)
        with state.lock:  # the check and the create are one step for concurrent creates
            limit = state.config.faults.enqueued_token_limit
            held = _enqueued_tokens(state, model_name)
            if not issues and limit is not None and held + tokens > limit:
                state.bump(PROVIDER, "enqueued_limit_refused")
                issues = [
                    ValidationIssue(
                        "token_limit_exceeded",
                        f"Enqueued token limit reached for {model_name} in organization org-emulator. "
                        f"Limit: {limit:,} enqueued tokens ({held:,} enqueued, this batch {tokens:,}). Please "
                        "try again once some in_progress batches have been completed.",
                    )
                ]
            job = state.create_job(
                PROVIDER,
                state.new_id("batch_", 32),
                items,
                issues,
                config,
                {
                    "endpoint": endpoint,
                    "input_file_id": meta.id,
                    "completion_window": "24h",
                    "metadata": metadata,
                    "model": model_name,
                    "enqueued_tokens": 0 if issues else tokens,
                },
            )
            peak = f"{PROVIDER}.enqueued_tokens_peak"
            state.counters[peak] = max(state.counters[peak], held + (0 if issues else tokens))
        return self.batch_json(job, state.now())

    def _parse_input(
        self, meta: StoredFile, endpoint: str, config: EmulatorConfig
    ) -> tuple[ItemLog | list[JobItem], list[ValidationIssue]]:
        issues: list[ValidationIssue] = []
        items = self.state.item_log()
        if meta.bytes > config.max_batch_bytes:
            return [], [
                ValidationIssue(
                    "file_too_large",
                    f"The input file is {meta.bytes} bytes; the limit is {config.max_batch_bytes} bytes. Split it into smaller batches.",
                )
            ]
        seen: set[str] = set()
        first_model: str | None = None
        check = REQUEST_CHECKS[endpoint]
        faults = config.faults
        scan = InputScan(INPUT_WORDS, issues, config.max_batch_requests, MAX_ISSUES)
        for number, line in scan.lines(self.state.files.iter_lines(meta.id)):
            if not isinstance(line, dict):
                issues.append(ValidationIssue("invalid_json_line", "This line is not a JSON object.", number))
                continue
            custom_id = line.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                issues.append(
                    ValidationIssue(
                        "missing_required_parameter",
                        "Missing required parameter: 'custom_id'.",
                        number,
                        "custom_id",
                    )
                )
                continue
            if line.get("method") != "POST":
                issues.append(
                    ValidationIssue(
                        "invalid_method", "The 'method' of every request must be 'POST'.", number, "method"
                    )
                )
            if line.get("url") != endpoint:
                issues.append(
                    ValidationIssue(
                        "invalid_url",
                        f"The 'url' {line.get('url')!r} does not match the batch endpoint {endpoint!r}.",
                        number,
                        "url",
                    )
                )
            body = line.get("body")
            if not isinstance(body, dict):
                issues.append(
                    ValidationIssue(
                        "missing_required_parameter", "Missing required parameter: 'body'.", number, "body"
                    )
                )
                continue
            if custom_id in seen:
                issues.append(
                    ValidationIssue(
                        "duplicate_custom_id",
                        f"The custom_id {custom_id!r} is used more than once; custom_id values must be unique.",
                        number,
                        "custom_id",
                    )
                )
            seen.add(custom_id)
            line_model = body.get("model")
            if isinstance(line_model, str):
                if first_model is None:
                    first_model = line_model
                elif line_model != first_model:
                    issues.append(
                        ValidationIssue(
                            "mismatched_model",
                            f"The model {line_model!r} differs from {first_model!r} on an earlier line; a batch input file may only use one model.",
                            number,
                            "body.model",
                        )
                    )
            items.append(
                JobItem(
                    custom_id=custom_id,
                    line=number,
                    body=body,
                    decision=faults.decide_item(config.seed, custom_id),
                    natural_error=check(body, config),
                )
            )
        if scan.count == 0 and not issues:
            issues.append(
                ValidationIssue("empty_file", "The input file is empty; it needs at least one request line.")
            )
        return items, issues

    def _job(self, batch_id: str) -> Job:
        job = self.state.jobs.get(batch_id, PROVIDER)
        if job is None:
            raise _fail(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return job

    def batch_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the ``Batch`` object at ``now``, writing result files on first terminal sight.

        :param job: the batch
        :param now: the current time
        """
        view = settle(self.state, job, now, self._write_results)
        results = job.results or {}
        usage = results.get("usage")
        data: dict[str, Any] = {
            "id": job.id,
            "object": "batch",
            "endpoint": job.attrs["endpoint"],
            "model": job.attrs.get("model"),
            "errors": {"object": "list", "data": [i.to_dict() for i in job.issues]} if job.issues else None,
            "input_file_id": job.attrs["input_file_id"],
            "completion_window": job.attrs["completion_window"],
            "status": view.status,
            "output_file_id": results.get("output_file_id"),
            "error_file_id": results.get("error_file_id"),
            "created_at": int(job.created),
            "expires_at": int(job.created + job.config.timings.completion_window_s),
            **view.times,
            "request_counts": {"total": view.total, "completed": view.completed, "failed": view.failed},
            "usage": usage,
        }
        out = _drop_none(data)
        out["metadata"] = job.attrs.get("metadata")
        return out

    def _write_results(self, job: Job, now: float, status: str) -> dict[str, Any]:
        """Render and store the output and error files of a job that just ended, a line at a time."""
        usage = {"input": 0, "cached": 0, "output": 0, "reasoning": 0}
        seen_prefixes: set[str] = set()
        created = int(job.view(now).times.get("finalizing_at", now))
        results: dict[str, Any] = {}
        with result_file(self.state, "custom_id") as out, result_file(self.state, "custom_id") as err:
            for outcome in job.outcomes(now):
                item = outcome.item
                line_id = stable_id("batch_req_", job.id, item.custom_id, length=32)
                request_id = stable_id("req_", job.id, item.custom_id, "request", length=32)
                if outcome.end != "processed":
                    code = "batch_expired" if outcome.end == "expired" else "batch_cancelled"
                    message = (
                        "This request could not be executed before the completion window expired."
                        if outcome.end == "expired"
                        else "This request was not executed because the batch was cancelled."
                    )
                    err.write(
                        {
                            "id": line_id,
                            "custom_id": item.custom_id,
                            "response": None,
                            "error": {"code": code, "message": message},
                        }
                    )
                    continue
                error = item.natural_error or injected_error(item, INJECTED_ERRORS)
                if error is not None:
                    response = {
                        "status_code": error["status"],
                        "request_id": request_id,
                        "body": error_body(error["message"], error["type"], error["param"], error["code"]),
                    }
                    err.write(
                        {"id": line_id, "custom_id": item.custom_id, "response": response, "error": None}
                    )
                    continue
                if item.decision.fault == "missing":
                    continue
                if item.decision.error_first:
                    first = INJECTED_ERRORS["server_error"]
                    response = {
                        "status_code": first["status"],
                        "request_id": request_id,
                        "body": error_body(first["message"], first["type"], first["param"], first["code"]),
                    }
                    err.write(
                        {"id": line_id, "custom_id": item.custom_id, "response": response, "error": None}
                    )
                body, used = self._answer_item(job, item, created, seen_prefixes)
                for key in usage:
                    usage[key] += used.get(key, 0)
                job.bill(
                    item.custom_id,
                    input_tokens=used["input"] - used["cached"],
                    cached_input_tokens=used["cached"],
                    output_tokens=used["output"],
                )
                out.write(
                    {
                        "id": line_id,
                        "custom_id": item.custom_id,
                        "response": {"status_code": 200, "request_id": request_id, "body": body},
                        "error": None,
                    },
                    item.decision,
                )
                if item.decision.other_answer and "choices" in body:
                    self._answer_again(job, item.custom_id, line_id, request_id, body, out)
            results["usage"] = {
                "input_tokens": usage["input"],
                "input_tokens_details": {"cached_tokens": usage["cached"]},
                "output_tokens": usage["output"],
                "output_tokens_details": {"reasoning_tokens": usage["reasoning"]},
                "total_tokens": usage["input"] + usage["output"],
            }
            if status == "failed":
                return results
            out.write_foreign(job.faults.unknown_result_lines, job.id)
            if out.lines or status == "completed":
                results["output_file_id"] = self._keep_result(job, "output", out)
            if err.lines:
                results["error_file_id"] = self._keep_result(job, "error", err)
        return results

    @staticmethod
    def _answer_again(
        job: Job, custom_id: str, line_id: str, request_id: str, body: Mapping[str, Any], out: ResultWriter
    ) -> None:
        """Write a second success line for a chat item with another answer, and bill it again."""
        again = json.loads(json.dumps(body))
        message = again["choices"][0]["message"]
        message["content"] = another_answer(message.get("content"))
        usage = again["usage"]
        usage["completion_tokens"] += 1
        usage["total_tokens"] += 1
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        job.bill_again(
            custom_id,
            input_tokens=usage["prompt_tokens"] - cached,
            cached_input_tokens=cached,
            output_tokens=usage["completion_tokens"],
        )
        response = {"status_code": 200, "request_id": request_id, "body": again}
        out.write({"id": line_id, "custom_id": custom_id, "response": response, "error": None})

    def _answer_item(
        self, job: Job, item: JobItem, created: int, seen_prefixes: set[str]
    ) -> tuple[dict[str, Any], dict[str, int]]:
        """Answer one batch item at its endpoint; prompt caching counts the prefixes seen in the batch."""
        config = job.config
        endpoint = job.attrs["endpoint"]
        if endpoint == "/v1/embeddings":
            return embedding_list(item.body)
        if endpoint == "/v1/moderations":
            return moderation_object(item.body, moderation_id=stable_id("modr-", job.id, item.custom_id))
        prompt = ChatPrompt(chat_view(item.body) if endpoint == "/v1/responses" else item.body)
        seen = prompt.prefix_key is not None and prompt.prefix_key in seen_prefixes
        cached = model.cached_tokens(
            prompt.prefix_tokens, seen, config.cache_min_tokens, config.cache_increment_tokens
        )
        if prompt.prefix_key is not None:
            seen_prefixes.add(prompt.prefix_key)
        if endpoint == "/v1/responses":
            return response_object(
                item.body,
                response_id=stable_id("resp_", job.id, item.custom_id),
                created=created,
                cached=cached,
            )
        return chat_completion(
            item.body,
            completion_id=stable_id("chatcmpl-", job.id, item.custom_id),
            created=created,
            cached=cached,
        )

    def _keep_result(self, job: Job, kind: str, writer: ResultWriter) -> str:
        meta = output_file(self.state, PROVIDER, "file-", f"batch_{job.id}_{kind}.jsonl", OUTPUT_FILE_TTL_S)
        writer.keep(meta)
        return meta.id

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{batch_id}``; may answer an injected transient 500."""
        state = self.state
        if retrieve_fails(state, PROVIDER):
            raise _fail(500, _SERVER_ERROR, "server_error")
        return self.batch_json(self._job(batch_id), state.now())

    def list_batches(self, request: Request) -> dict[str, Any]:
        """``GET /v1/batches?after=&limit=``, newest first."""
        q = request.query_params
        limit = _int_param(q.get("limit"), "limit", 20, 1, 100)
        jobs = self.state.jobs.list(PROVIDER)
        start, end = _page([j.id for j in jobs], q.get("after"), limit)
        now = self.state.now()
        page = [self.batch_json(j, now) for j in jobs[start:end]]
        out: dict[str, Any] = {"object": "list", "data": page, "has_more": end < len(jobs)}
        if page:
            out["first_id"] = page[0]["id"]
            out["last_id"] = page[-1]["id"]
        return out

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{batch_id}/cancel``."""
        job = self._job(batch_id)
        now = self.state.now()
        with self.state.lock:
            if not job.request_cancel(now):
                status = job.view(now).status
                raise _fail(
                    409, f"Cannot cancel a batch with status '{status}'.", code="batch_not_cancellable"
                )
        self.state.bump(PROVIDER, "batches_cancelled")
        return self.batch_json(job, now)

    # -- synchronous endpoints -------------------------------------------------------------

    def _admit(self, kind: str, tokens: int) -> tuple[dict[str, str], float]:
        """Apply request faults and the rate limiter; return the answer's rate-limit headers and its time."""
        state = self.state
        counter = state.bump(PROVIDER, "sync_requests")
        state.bump(PROVIDER, f"sync_requests.{kind}")
        config = state.config
        faults = config.faults
        request_id = state.new_id("req_", 32)
        headers = {"x-request-id": request_id}
        if faults.request_fails(config.seed, "sync429", counter, faults.sync_429_rate):
            state.bump(PROVIDER, "sync_429")
            wait = faults.sync_retry_after_s
            raise _fail(
                429,
                f"Rate limit reached (emulated). Please try again in {wait:.3f}s.",
                "requests",
                code="rate_limit_exceeded",
                headers={
                    **headers,
                    **_retry_headers(wait),
                    **({"x-ratelimit-limit-requests": str(faults.rpm_limit)} if faults.rpm_limit else {}),
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": _duration(wait),
                },
            )
        if faults.request_fails(config.seed, "sync500", counter, faults.sync_500_rate):
            state.bump(PROVIDER, "sync_500")
            raise _fail(500, _SERVER_ERROR, "server_error", headers=headers)
        window = config.scaled(config.timings.rate_window_s)
        with state.lock:
            now = state.now()
            decision = state.limiter.check(now, tokens, faults.rpm_limit, faults.tpm_limit, window)
        headers.update(_ratelimit_headers(decision))
        if not decision.allowed:
            state.bump(PROVIDER, "sync_429")
            which = "requests" if decision.remaining_requests == 0 else "tokens"
            raise _fail(
                429,
                f"Rate limit reached for {which} per window. Please try again in {decision.retry_after_s:.3f}s.",
                which,
                code="rate_limit_exceeded",
                headers={**headers, **_retry_headers(decision.retry_after_s)},
            )
        return headers, now

    async def chat_completions(self, request: Request) -> JSONResponse:
        """``POST /v1/chat/completions`` (non-streaming)."""
        body = await _json_body(request)
        problem = chat_request_error(body, self.state.config)  # before the prompt view, as the API checks
        return self._answer(
            request,
            "chat",
            ChatPrompt(body),
            problem,
            lambda cached: chat_completion(
                body,
                completion_id=self.state.new_id("chatcmpl-"),
                created=int(self.state.now()),
                cached=cached,
            ),
        )

    async def responses(self, request: Request) -> JSONResponse:
        """``POST /v1/responses`` (non-streaming, not stored: ``GET`` of a response is not served)."""
        body = await _json_body(request)
        problem = response_request_error(body, self.state.config)
        return self._answer(
            request,
            "responses",
            ChatPrompt(chat_view(body)),
            problem,
            lambda cached: response_object(
                body, response_id=self.state.new_id("resp_"), created=int(self.state.now()), cached=cached
            ),
        )

    def _answer(
        self,
        request: Request,
        kind: str,
        prompt: ChatPrompt,
        problem: dict[str, Any] | None,
        build: Callable[[int], tuple[dict[str, Any], dict[str, int]]],
    ) -> JSONResponse:
        """Admit a real-time generation, refuse it with its problem, or answer it and record its usage.

        :param request: the HTTP request (its custom-id header names the item in the record)
        :param kind: the rate-limit bucket (``chat``, ``responses``)
        :param prompt: the request's prompt view (tokens, cacheable prefix)
        :param problem: the validation problem of the body, if any
        :param build: makes the answer and its token usage from the cached-token count
        """
        config = self.state.config
        ceiling = prompt.prompt_tokens + (prompt.max_output_tokens or 0)
        headers, admitted_at = self._admit(kind, ceiling)
        if problem is not None:
            raise ApiError(
                problem["status"],
                error_body(problem["message"], problem["type"], problem["param"], problem["code"]),
                headers,
            )
        with self.state.lock:
            seen = prompt.prefix_key is not None and prompt.prefix_key in self.state.seen_prefixes
            if prompt.prefix_key is not None:
                self.state.seen_prefixes.add(prompt.prefix_key)
        cached = model.cached_tokens(
            prompt.prefix_tokens, seen, config.cache_min_tokens, config.cache_increment_tokens
        )
        obj, used = build(cached)
        if config.faults.tpm_output == "actual":
            with self.state.lock:
                self.state.limiter.recharge(admitted_at, ceiling, prompt.prompt_tokens + used["output"])
        self.state.record_realtime(
            PROVIDER,
            request.headers.get(CUSTOM_ID_HEADER),
            {
                "input_tokens": used["input"] - used["cached"],
                "cached_input_tokens": used["cached"],
                "output_tokens": used["output"],
            },
        )
        return JSONResponse(obj, headers=headers)

    async def moderations(self, request: Request) -> JSONResponse:
        """``POST /v1/moderations``."""
        body = await _json_body(request)
        problem = moderation_request_error(body, self.state.config)
        headers, _ = self._admit("moderations", 0)
        if problem is not None:
            raise ApiError(
                problem["status"],
                error_body(problem["message"], problem["type"], problem["param"], problem["code"]),
                headers,
            )
        obj, _ = moderation_object(body, moderation_id=self.state.new_id("modr-"))
        self.state.record_realtime(PROVIDER, request.headers.get(CUSTOM_ID_HEADER), {})
        return JSONResponse(obj, headers=headers)

    async def embeddings(self, request: Request) -> JSONResponse:
        """``POST /v1/embeddings``."""
        body = await _json_body(request)
        problem = embedding_request_error(body, self.state.config)
        tokens = sum(t for _, t in _embedding_inputs(body) or [])
        headers, _ = self._admit("embeddings", tokens)
        if problem is not None:
            raise ApiError(
                problem["status"],
                error_body(problem["message"], problem["type"], problem["param"], problem["code"]),
                headers,
            )
        obj, used = embedding_list(body)
        self.state.record_realtime(
            PROVIDER, request.headers.get(CUSTOM_ID_HEADER), {"input_tokens": used["input"]}
        )
        return JSONResponse(obj, headers=headers)


def _input_tokens(endpoint: str, body: Mapping[str, Any]) -> int:
    """Input tokens of one batch request, as the enqueued-token limit counts them.

    :param endpoint: the batch's endpoint
    :param body: the request line's body
    """
    if endpoint in ("/v1/chat/completions", "/v1/responses"):
        return ChatPrompt(body if endpoint == "/v1/chat/completions" else chat_view(body)).prompt_tokens
    return sum(t for _, t in _embedding_inputs(body) or []) if endpoint == "/v1/embeddings" else 0


def _enqueued_tokens(state: EmulatorState, model_name: str | None) -> int:
    """Input tokens of the organisation's batches for ``model_name`` that have not ended (lock held).

    :param state: the emulator state
    :param model_name: the model
    """
    now = state.now()
    return sum(
        int(job.attrs.get("enqueued_tokens", 0))
        for job in state.jobs.list()
        if job.provider == PROVIDER and job.attrs.get("model") == model_name and not job.view(now).terminal
    )


#: The request check of each batch endpoint.
REQUEST_CHECKS: Final = {
    "/v1/chat/completions": chat_request_error,
    "/v1/embeddings": embedding_request_error,
    "/v1/responses": response_request_error,
    "/v1/moderations": moderation_request_error,
}


def _refuse(status: int, headers: Mapping[str, str]) -> ApiError:
    """The answer of a create refused by an injected fault, before anything was created."""
    if status == 429:
        return _fail(
            429,
            "Rate limit reached for requests (emulated create fault). Please try again later.",
            "requests",
            code="rate_limit_exceeded",
            headers=headers,
        )
    return _fail(status, _SERVER_ERROR, "server_error", headers=headers)


#: item fault -> the error line it becomes (status, type, message, param, code)
INJECTED_ERRORS: Final[ErrorTable] = {
    "server_error": _natural(500, _SERVER_ERROR, None, None, "server_error"),
    "rate_limited": _natural(
        429,
        "Rate limit reached for requests (emulated fault rate_429).",
        None,
        "rate_limit_exceeded",
        "requests",
    ),
    "invalid_request": _natural(400, "Invalid request (emulated fault rate_400).", None, "invalid_value"),
    "context_length": _context_error(0, 0)
    | {
        "message": "This model's maximum context length was exceeded (emulated fault rate_context_length). Please reduce the length of the messages."
    },
}


def _check_metadata(metadata: Any) -> None:
    if not isinstance(metadata, Mapping):
        raise _fail(
            400,
            "Invalid 'metadata': expected an object of string keys and values.",
            param="metadata",
            code="invalid_value",
        )
    if len(metadata) > 16:
        raise _fail(400, "Invalid 'metadata': at most 16 keys.", param="metadata", code="invalid_value")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise _fail(
                400,
                f"Invalid 'metadata.{key}': keys are at most 64 characters, values strings of at most 512.",
                param="metadata",
                code="invalid_value",
            )


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.3f}s"


def _retry_headers(seconds: float) -> dict[str, str]:
    return {"retry-after": retry_after_header(seconds), "retry-after-ms": str(max(1, round(seconds * 1000)))}


def _ratelimit_headers(decision: RateDecision) -> dict[str, str]:
    headers: dict[str, str] = {}
    if decision.limit_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(decision.limit_requests)
        headers["x-ratelimit-remaining-requests"] = str(decision.remaining_requests or 0)
        headers["x-ratelimit-reset-requests"] = _duration(decision.reset_requests_s)
    if decision.limit_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(decision.limit_tokens)
        headers["x-ratelimit-remaining-tokens"] = str(decision.remaining_tokens or 0)
        headers["x-ratelimit-reset-tokens"] = _duration(decision.reset_tokens_s)
    return headers


def iter_jsonl(data: bytes) -> Iterator[str]:
    """Yield the non-empty lines of JSONL bytes as text (a helper for tests and tools).

    :param data: the bytes
    """
    for raw in data.splitlines():
        if raw.strip():
            yield raw.decode("utf-8", errors="replace")
