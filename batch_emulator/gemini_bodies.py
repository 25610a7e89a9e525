"""Gemini request checks and answers: how one ``generateContent`` or ``embedContent`` request is answered.

The same functions answer a synchronous call (:mod:`batch_emulator.gemini_api`) and a batch
request (:mod:`batch_emulator.gemini_lines`). Errors are Google API error bodies
(``{"error": {"code", "message", "status", "details"}}``); an injected item fault becomes one of
:data:`INJECTED_ERRORS`. Implicit prompt caching: a system instruction seen before is reported as
``cachedContentTokenCount`` under OpenAI's size rule. Token counts come from
:mod:`~batch_emulator.model`; embedding vectors default to
:data:`~batch_emulator.model.DEFAULT_EMBEDDING_DIMENSIONS` values (the live
``gemini-embedding-001`` default is 3072) unless ``outputDimensionality`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from batch_emulator import model
from batch_emulator.common import (
    ErrorTable,
)
from batch_emulator.config import EmulatorConfig

PROVIDER: Final = "gemini"

#: HTTP status -> ``google.rpc.Code`` name, as the REST error body spells it.
STATUS_NAMES: Final[dict[int, str]] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
INTERNAL: Final = "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"


def error_body(
    code: int, message: str, status: str | None = None, details: list[Any] | None = None
) -> dict[str, Any]:
    """Return a Google API error body.

    :param code: HTTP status
    :param message: what went wrong and how to fix it
    :param status: the ``google.rpc.Code`` name (default: from ``code``)
    :param details: ``google.rpc`` detail objects
    """
    err: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": status or STATUS_NAMES.get(code, "UNKNOWN"),
    }
    if details:
        err["details"] = details
    return {"error": err}


def model_resource(raw: str) -> str:
    """A model named as a resource (``models/...``), from its bare name or its resource name.

    :param raw: ``gemini-2.5-flash`` or ``models/gemini-2.5-flash``
    """
    return raw if raw.startswith(("models/", "tunedModels/")) else f"models/{raw}"


# -- request content ---------------------------------------------------------------------------


def parts_text(content: Any) -> list[str]:
    """The text of each part of a ``Content`` (a bare string is one part).

    :param content: a ``Content`` object or a string
    """
    if isinstance(content, str):
        return [content]
    if not isinstance(content, Mapping):
        return []
    parts = content.get("parts")
    if not isinstance(parts, list):
        return []
    return [str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and p.get("text")]


class GeminiPrompt:
    """A ``GenerateContentRequest`` digested for the stand-in model and the token counts.

    :param body: the request
    """

    def __init__(self, body: Mapping[str, Any]) -> None:
        system = body.get("systemInstruction", body.get("system_instruction"))
        self.system = model.join_texts(parts_text(system))
        contents = body.get("contents")
        self.contents: list[Any] = contents if isinstance(contents, list) else []
        user_texts: list[str] = []
        all_texts: list[str] = []
        for content in self.contents:
            texts = parts_text(content)
            all_texts.extend(texts)
            if not isinstance(content, Mapping) or content.get("role", "user") == "user":
                user_texts.extend(texts)
        self.user = model.join_texts(user_texts)
        self.prefix_tokens = model.count_tokens(self.system) if self.system else 0
        self.prefix_key = model.prefix_key([self.system]) if self.system else None
        self.prompt_tokens = self.prefix_tokens + sum(model.count_tokens(t) for t in all_texts)
        config = body.get("generationConfig", body.get("generation_config"))
        config = config if isinstance(config, Mapping) else {}
        mime = config.get("responseMimeType", config.get("response_mime_type"))
        self.json_mode = mime == "application/json"
        limit = config.get("maxOutputTokens", config.get("max_output_tokens"))
        self.max_output_tokens = (
            int(limit) if isinstance(limit, int) and not isinstance(limit, bool) else None
        )


def status_error(code: int, message: str) -> dict[str, Any]:
    """An item's error entry: ``code``, ``message`` and its ``google.rpc.Code`` name.

    :param code: HTTP status
    :param message: what went wrong
    """
    return {"code": code, "message": message, "status": STATUS_NAMES.get(code, "UNKNOWN")}


def generate_request_error(body: Mapping[str, Any], config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error (``code``/``message``/``status``) a ``GenerateContentRequest`` causes, or ``None``.

    :param body: the request
    :param config: emulator settings (context window)
    """
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return status_error(400, "* GenerateContentRequest.contents: contents is not specified")
    for i, content in enumerate(contents):
        if not isinstance(content, Mapping) or content.get("role", "user") not in (
            "user",
            "model",
            "function",
        ):
            return status_error(
                400, f"* GenerateContentRequest.contents[{i}].role: Please use a valid role: user, model."
            )
        if not parts_text(content):
            return status_error(
                400, f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
    tokens = GeminiPrompt(body).prompt_tokens
    if tokens > config.context_window_tokens:
        return _context_error(tokens, config.context_window_tokens)
    return None


def _context_error(tokens: int, window: int) -> dict[str, Any]:
    return status_error(
        400,
        f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window}). "
        "Shorten the request.",
    )


def embed_request_error(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the error an ``EmbedContentRequest`` causes, or ``None``.

    :param body: the request
    """
    texts = parts_text(body.get("content"))
    if not texts:
        return status_error(400, "* EmbedContentRequest.content: content is not specified")
    dims = body.get("outputDimensionality", body.get("output_dimensionality"))
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= 3072):
        return status_error(400, "* EmbedContentRequest.output_dimensionality: must be from 1 to 3072.")
    tokens = sum(model.count_tokens(t) for t in texts)
    if tokens > 2048:
        return status_error(
            400, f"The input token count ({tokens}) exceeds the maximum number of tokens allowed (2048)."
        )
    return None


# -- response bodies -------------------------------------------------------------------------


def generate_response(
    body: Mapping[str, Any], *, model_name: str, response_id: str, cached: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """Answer a valid request with a ``GenerateContentResponse``.

    :param body: the request
    :param model_name: the model (``models/...``)
    :param response_id: the response id
    :param cached: prompt tokens to report as cached (implicit caching)
    :return: the object and its usage as ``input``/``cached``/``output`` token counts
    """
    prompt = GeminiPrompt(body)
    reply = model.respond(
        prompt.system or None,
        prompt.user,
        json_mode=prompt.json_mode,
        max_output_tokens=prompt.max_output_tokens,
    )
    usage: dict[str, Any] = {
        "promptTokenCount": prompt.prompt_tokens,
        "candidatesTokenCount": reply.output_tokens,
        "totalTokenCount": prompt.prompt_tokens + reply.output_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt.prompt_tokens}],
    }
    if cached:
        usage["cachedContentTokenCount"] = cached
        usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    obj = {
        "candidates": [
            {
                "content": {"parts": [{"text": reply.text}], "role": "model"},
                "finishReason": "MAX_TOKENS" if reply.truncated else "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": usage,
        "modelVersion": model_name.removeprefix("models/"),
        "responseId": response_id,
    }
    return obj, {"input": prompt.prompt_tokens, "cached": cached, "output": reply.output_tokens}


def embed_response(body: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Answer a valid ``EmbedContentRequest`` with ``{"embedding": {"values"}}`` and usage.

    :param body: the request
    :return: the object and its prompt tokens
    """
    text = model.join_texts(parts_text(body.get("content")))
    dims = (
        body.get("outputDimensionality", body.get("output_dimensionality"))
        or model.DEFAULT_EMBEDDING_DIMENSIONS
    )
    tokens = model.count_tokens(text)
    obj = {
        "embedding": {"values": model.embed(text, int(dims))},
        "usageMetadata": {"promptTokenCount": tokens, "totalTokenCount": tokens},
    }
    return obj, tokens


def generate_billed(used: Mapping[str, int]) -> dict[str, int]:
    """Return the record's billed tokens of a :func:`generate_response` usage.

    :param used: ``input``/``cached``/``output`` token counts
    """
    return {
        "input_tokens": used["input"] - used["cached"],
        "cached_input_tokens": used["cached"],
        "output_tokens": used["output"],
    }


#: item fault -> the error entry it becomes
INJECTED_ERRORS: Final[ErrorTable] = {
    "server_error": status_error(500, INTERNAL),
    "rate_limited": status_error(
        429, "Resource has been exhausted (e.g. check quota). (emulated fault rate_429)"
    ),
    "invalid_request": status_error(400, "Request contains an invalid argument. (emulated fault rate_400)"),
    "context_length": status_error(
        400,
        "The input token count exceeds the maximum number of tokens allowed. "
        "(emulated fault rate_context_length)",
    ),
}
