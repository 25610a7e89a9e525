"""OpenAI request checks and response bodies: how one chat, embeddings, Responses or moderations request is answered.

The same functions answer a real-time request (:mod:`batch_emulator.openai_api`) and a batch
line (:mod:`batch_emulator.openai_lines`). Objects follow the official OpenAPI description
(``CreateChatCompletionResponse``, ``CreateEmbeddingResponse``, ``ErrorResponse`` ...). A request
the live API would refuse gets its error (status, type, message, param, code) from the check of
its endpoint (:data:`REQUEST_CHECKS`); an injected item fault gets one of :data:`INJECTED_ERRORS`.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping
from typing import Any, Final

from batch_emulator import model
from batch_emulator.common import ErrorTable, stable_id
from batch_emulator.config import EmulatorConfig

PROVIDER: Final = "openai"
SERVER_ERROR: Final = "The server had an error while processing your request. Sorry about that!"


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


def embedding_inputs(body: Mapping[str, Any]) -> list[tuple[str, int]] | None:
    """Return ``(text, tokens)`` per input, or ``None`` when ``input`` is malformed.

    :param body: an embeddings request (``input``: a string, strings, or token arrays)
    """
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
    inputs = embedding_inputs(body)
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
    inputs = embedding_inputs(body) or []
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


def input_tokens(endpoint: str, body: Mapping[str, Any]) -> int:
    """Input tokens of one batch request, as the enqueued-token limit counts them.

    :param endpoint: the batch's endpoint
    :param body: the request line's body
    """
    if endpoint in ("/v1/chat/completions", "/v1/responses"):
        return ChatPrompt(body if endpoint == "/v1/chat/completions" else chat_view(body)).prompt_tokens
    return sum(t for _, t in embedding_inputs(body) or []) if endpoint == "/v1/embeddings" else 0


#: The request check of each batch endpoint.
REQUEST_CHECKS: Final = {
    "/v1/chat/completions": chat_request_error,
    "/v1/embeddings": embedding_request_error,
    "/v1/responses": response_request_error,
    "/v1/moderations": moderation_request_error,
}


#: item fault -> the error line it becomes (status, type, message, param, code)
INJECTED_ERRORS: Final[ErrorTable] = {
    "server_error": _natural(500, SERVER_ERROR, None, None, "server_error"),
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
