"""Bedrock request checks and answers: how one ``InvokeModel`` body is answered, in a job's record or in real time.

Model families understood in ``modelInput`` (the ``InvokeModel`` body of each): ``anthropic.*``
(Messages: ``anthropic_version``, ``max_tokens``, ``system``, ``messages``; output a ``message``
with ``usage``, and prompt caching reported for ``cache_control`` system blocks),
``amazon.nova-*`` (``messages-v1``: ``system``, ``messages``, ``inferenceConfig``) and
``amazon.titan-embed-*`` (``inputText``; output ``embedding``). A region prefix (``us.``,
``eu.``, ``apac.``, ``global.``) is accepted.

An item fault becomes one of :data:`INJECTED_ERRORS` (an ``errorCode`` and ``errorMessage``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from batch_emulator import model
from batch_emulator.common import ErrorTable
from batch_emulator.config import EmulatorConfig

PROVIDER: Final = "bedrock"
#: Bedrock's model ids by family, as the service documents them: an optional cross-region
#: inference-profile prefix (``us.``, ``eu.`` ...) or a full ARN before the base model id. The
#: emulator keeps its own copy of this rule so that a mistake in the adapter's is caught.
_FAMILIES: Final = (
    ("anthropic", re.compile(r"anthropic\.")),
    ("nova", re.compile(r"amazon\.nova-")),
    ("titan-embed", re.compile(r"amazon\.titan-embed")),
)
_PROFILE: Final = re.compile(r"^(?:us|eu|apac|global|us-gov|jp|au|ca)\.")


def model_family(model_id: str) -> str | None:
    """Return the family Bedrock serves a model id with (``anthropic``, ``nova``, ``titan-embed``).

    :param model_id: a base model id, an inference profile id or an ARN ending in either
    """
    base = _PROFILE.sub("", model_id.rsplit("/", 1)[-1], count=1)
    return next((family for family, pattern in _FAMILIES if pattern.match(base)), None)


def _block_texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                out.append(block["text"])
            elif isinstance(block, str):
                out.append(block)
    return out


class Prompt:
    """A ``modelInput``, digested for the stand-in model, whatever its family.

    :param family: the model family
    :param body: the ``modelInput``
    """

    def __init__(self, family: str, body: Mapping[str, Any]) -> None:
        self.family = family
        self.system = ""
        self.user = ""
        self.input_tokens = 0
        self.prefix_tokens = 0
        self.prefix_key: str | None = None
        self.cache_marked = False
        self.max_tokens: int | None = None
        if family == "titan-embed":
            text = body.get("inputText")
            self.user = text if isinstance(text, str) else ""
            self.input_tokens = model.count_tokens(self.user)
            return
        system = body.get("system")
        system_texts = _block_texts(system)
        if isinstance(system, list):
            self.cache_marked = any(isinstance(b, Mapping) and b.get("cache_control") for b in system)
        messages = body.get("messages")
        user_texts: list[str] = []
        all_texts = list(system_texts)
        if isinstance(messages, list):
            for message in messages:
                if not isinstance(message, Mapping):
                    continue
                texts = _block_texts(message.get("content"))
                all_texts.extend(texts)
                if message.get("role") == "user":
                    user_texts.extend(texts)
        self.system = model.join_texts(system_texts)
        self.user = model.join_texts(user_texts)
        self.input_tokens = sum(model.message_tokens(t) for t in all_texts)
        self.prefix_tokens = sum(model.message_tokens(t) for t in system_texts)
        self.prefix_key = model.prefix_key(system_texts) if system_texts else None
        limit = (
            body.get("max_tokens")
            if family == "anthropic"
            else (body.get("inferenceConfig") or {}).get("maxTokens")
            if isinstance(body.get("inferenceConfig"), Mapping)
            else None
        )
        self.max_tokens = limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def request_error(family: str | None, body: Any, config: EmulatorConfig) -> dict[str, Any] | None:
    """Return the error a ``modelInput`` causes by itself (``status``, ``code``, ``message``), or ``None``.

    :param family: the model family (``None``: unknown model)
    :param body: the ``modelInput``
    :param config: emulator settings (context window)
    """
    if family is None:
        return _natural(400, "ValidationException", "The provided model identifier is invalid.")
    if not isinstance(body, Mapping):
        return _natural(400, "ValidationException", "Malformed input request: modelInput must be an object.")
    if family == "titan-embed":
        if not isinstance(body.get("inputText"), str) or not body["inputText"]:
            return _natural(
                400, "ValidationException", "Malformed input request: #: required key [inputText] not found"
            )
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _natural(
                400, "ValidationException", "Malformed input request: #: required key [messages] not found"
            )
        if family == "anthropic":
            if not isinstance(body.get("anthropic_version"), str):
                return _natural(
                    400,
                    "ValidationException",
                    "Malformed input request: #: required key [anthropic_version] not found",
                )
            if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
                return _natural(
                    400,
                    "ValidationException",
                    "Malformed input request: #: required key [max_tokens] not found",
                )
            for i, message in enumerate(messages):
                if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
                    return _natural(
                        400,
                        "ValidationException",
                        f"messages.{i}.role: Input should be 'user' or 'assistant'",
                    )
    if Prompt(family, body).input_tokens > config.context_window_tokens:
        return _natural(400, "ValidationException", "Input is too long for requested model.")
    return None


def _natural(status: int, code: str, message: str) -> dict[str, Any]:
    return {"status": status, "code": code, "message": message}


def model_output(
    family: str, model_id: str, body: Mapping[str, Any], *, message_id: str, cache: tuple[int, int]
) -> tuple[dict[str, Any], int, int]:
    """Answer a valid ``modelInput`` as the model family's ``InvokeModel`` response body.

    :param family: the model family
    :param model_id: the model id (echoed by Anthropic answers)
    :param body: the ``modelInput``
    :param message_id: the Anthropic message id
    :param cache: ``(cache read, cache write)`` prompt tokens to report
    :return: the body, input tokens (all of them) and output tokens
    """
    prompt = Prompt(family, body)
    if family == "titan-embed":
        dims = body.get("dimensions")
        vector = model.embed(prompt.user, dims if isinstance(dims, int) else 1024)
        return {"embedding": vector, "inputTextTokenCount": prompt.input_tokens}, prompt.input_tokens, 0
    reply = model.respond(prompt.system or None, prompt.user, max_output_tokens=prompt.max_tokens)
    read, write = cache
    if family == "anthropic":
        usage: dict[str, Any] = {
            "input_tokens": prompt.input_tokens - read - write,
            "output_tokens": reply.output_tokens,
        }
        if prompt.cache_marked:
            usage["cache_read_input_tokens"] = read
            usage["cache_creation_input_tokens"] = write
        out: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model_id.rsplit("/", 1)[-1].split(".", 1)[-1].split(":")[0],
            "content": [{"type": "text", "text": reply.text}],
            "stop_reason": "max_tokens" if reply.truncated else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        return out, prompt.input_tokens, reply.output_tokens
    out = {
        "output": {"message": {"role": "assistant", "content": [{"text": reply.text}]}},
        "stopReason": "max_tokens" if reply.truncated else "end_turn",
        "usage": {
            "inputTokens": prompt.input_tokens - read,
            "outputTokens": reply.output_tokens,
            "totalTokens": prompt.input_tokens + reply.output_tokens,
            "cacheReadInputTokenCount": read,
            "cacheWriteInputTokenCount": 0,
        },
    }
    return out, prompt.input_tokens, reply.output_tokens


def invoke_billed(used_in: int, used_out: int, cache: tuple[int, int]) -> dict[str, int]:
    """Return the record's billed tokens of one answer.

    :param used_in: input tokens, all of them
    :param used_out: output tokens
    :param cache: ``(cache read, cache write)`` input tokens
    """
    read, write = cache
    return {
        "input_tokens": used_in - read - write,
        "cached_input_tokens": read,
        "cache_write_tokens": write,
        "output_tokens": used_out,
    }


def cache_for(prompt: Prompt, seen: set[str], config: EmulatorConfig) -> tuple[int, int]:
    """Return ``(cache read, cache write)`` tokens: only ``cache_control``-marked Anthropic prefixes.

    :param prompt: the request's prompt
    :param seen: prefixes met before (a job's records, or the emulator's life for InvokeModel); the
        prompt's is added the first time, as a cache write
    :param config: the emulator's configuration (the smallest prefix cached)
    """
    if not prompt.cache_marked or prompt.prefix_key is None or prompt.prefix_tokens < config.cache_min_tokens:
        return 0, 0
    if prompt.prefix_key in seen:
        return prompt.prefix_tokens, 0
    seen.add(prompt.prefix_key)
    return 0, prompt.prefix_tokens


#: item fault -> the error record it becomes
INJECTED_ERRORS: Final[ErrorTable] = {
    "server_error": _natural(
        500, "InternalServerException", "Internal server error (emulated fault rate_500)."
    ),
    "rate_limited": _natural(
        429, "ThrottlingException", "Too many requests, please wait (emulated fault rate_429)."
    ),
    "invalid_request": _natural(
        400, "ValidationException", "Malformed input request (emulated fault rate_400)."
    ),
    "context_length": _natural(
        400,
        "ValidationException",
        "Input is too long for requested model (emulated fault rate_context_length).",
    ),
}
