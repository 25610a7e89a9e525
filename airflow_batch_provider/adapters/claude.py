"""One Claude Messages body for every provider that serves Claude (Anthropic, Amazon Bedrock).

Anthropic's Message Batches (``params``) and Bedrock's ``InvokeModel`` for ``anthropic.*`` models
(``modelInput``) take the same Messages body; they differ only in the envelope: Anthropic names
the ``model`` in the body, Bedrock names it on the job and wants ``anthropic_version`` instead,
and Bedrock refuses the Anthropic-API-only fields (:data:`ANTHROPIC_API_ONLY`). Everything else
is built here, once, from the connection's settings, so a prompt moved from one provider to the
other keeps its JSON output mode, its cache marker, its tools and its stop sequences:

- the shared system prompt (and any ``system``/``developer`` messages) becomes one system text
  block, marked ``"cache_control": {"type": "ephemeral"}`` unless the setting
  :data:`CACHE_SETTING` (``prompt_caching``, default true) is false. The old Bedrock name
  ``cache_system_prompt`` is still read, with a :class:`DeprecationWarning`;
- ``max_tokens`` (or ``max_completion_tokens``) passes through; Claude requires it, so a request
  without one gets ``default_max_tokens`` (setting, 1024);
- ``response_format`` (OpenAI's JSON mode) becomes an instruction appended to the system block
  ("answer with one JSON object only", plus the JSON Schema), or, with the setting
  ``json_output: "output_config"``, Anthropic's native ``output_config.format``;
- ``stop`` becomes ``stop_sequences``; ``tools``/``tool_choice`` are translated from any form
  :func:`~airflow_batch_provider.core.requests.canonical_tools` reads to Claude's
  (``name``/``description``/``input_schema``; ``{"type": "auto" | "any" | "none" | "tool"}``);
- OpenAI-only knobs (:data:`DROPPED_PARAMS`) are dropped; anything else passes through.

Results: :func:`claude_result` reads a ``Message`` (text blocks joined; a lone tool call's input
when there is no text) and its usage, for both providers.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final, Literal

from airflow_batch_provider.core.requests import (
    CanonicalRequest,
    canonical_tool_choice,
    canonical_tools,
)
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.exceptions import ConfigurationError

ClaudeTarget = Literal["anthropic", "bedrock"]
DEFAULT_MAX_TOKENS: Final = 1024
#: The connection setting that marks the system block for prompt caching (both providers).
CACHE_SETTING: Final = "prompt_caching"
#: Its former Bedrock name, read with a deprecation warning.
DEPRECATED_CACHE_SETTING: Final = "cache_system_prompt"
#: Bedrock's ``anthropic_version`` of the Messages body.
BEDROCK_ANTHROPIC_VERSION: Final = "bedrock-2023-05-31"
#: Fields only Anthropic's own API takes; dropped from a Bedrock body.
ANTHROPIC_API_ONLY: Final[frozenset[str]] = frozenset(
    {"model", "metadata", "service_tier", "container", "mcp_servers", "context_management"}
)
#: OpenAI-only params with no Claude counterpart, dropped so one prompt serves every provider.
DROPPED_PARAMS: Final[frozenset[str]] = frozenset(
    {
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "store",
        "parallel_tool_calls",
        "reasoning_effort",
        "modalities",
        "prediction",
        "stream_options",
    }
)
_FALSE: Final = (False, "false", "False", 0, "0")


def prompt_caching(settings: Mapping[str, Any]) -> bool:
    """Return whether the system block is marked for prompt caching (default true).

    :param settings: the connection extras
    """
    if CACHE_SETTING in settings:
        return settings[CACHE_SETTING] not in _FALSE
    if DEPRECATED_CACHE_SETTING in settings:
        warnings.warn(
            f"the connection extra {DEPRECATED_CACHE_SETTING!r} is deprecated; name it {CACHE_SETTING!r} "
            "(the same setting for Anthropic and Bedrock).",
            DeprecationWarning,
            stacklevel=3,
        )
        return settings[DEPRECATED_CACHE_SETTING] not in _FALSE
    return True


@lru_cache(maxsize=32)
def json_instruction(schema_json: str | None) -> str:
    """The system-prompt instruction that asks for one JSON object (and its schema).

    :param schema_json: the JSON Schema, serialised canonically, or ``None``
    """
    text = (
        "Answer with exactly one JSON object and nothing else: no prose before or after it, "
        "no markdown code fences."
    )
    if schema_json:
        text += f" The object must validate against this JSON Schema:\n{schema_json}"
    return text


def json_request(response_format: Any) -> tuple[bool, dict[str, Any] | None]:
    """Return (JSON requested, schema or ``None``) for an OpenAI-style ``response_format``.

    :param response_format: the prompt's ``response_format`` param
    """
    if not isinstance(response_format, Mapping):
        return False, None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return True, dict(schema) if isinstance(schema, Mapping) else None
    return kind == "json_object", None


def claude_tools(tools: Any) -> list[dict[str, Any]]:
    """Claude's ``tools`` for any tool form the canonical reader accepts.

    :param tools: the prompt's ``tools`` param
    """
    out: list[dict[str, Any]] = []
    for tool in canonical_tools(tools):
        entry: dict[str, Any] = {"name": tool.name, "input_schema": dict(tool.parameters)}
        if tool.description:
            entry["description"] = tool.description
        out.append(entry)
    return out


def claude_tool_choice(choice: Any) -> dict[str, Any] | None:
    """Claude's ``tool_choice`` for a canonical one (``auto``, ``none``, ``required``, a tool name).

    :param choice: the prompt's ``tool_choice`` param
    """
    value = canonical_tool_choice(choice)
    if value is None:
        return None
    if value in ("auto", "none"):
        return {"type": value}
    if value == "required":
        return {"type": "any"}
    return {"type": "tool", "name": value}


def claude_body(
    request: CanonicalRequest, settings: Mapping[str, Any], target: ClaudeTarget
) -> dict[str, Any]:
    """Return the Claude Messages body of a canonical request, for Anthropic or Bedrock.

    :param request: the canonical request (kind ``chat``)
    :param settings: the connection extras (``prompt_caching``, ``json_output``, ``default_max_tokens``)
    :param target: ``anthropic`` (``model`` in the body) or ``bedrock`` (``anthropic_version``,
        no Anthropic-API-only fields)
    :raises ConfigurationError: the request is not a chat request
    """
    if request.kind != "chat":
        raise ConfigurationError(
            f"item {request.app_id!r} is a {request.kind!r} request; Claude takes chat requests only. "
            "Point this workload at a provider that accepts that kind."
        )
    source = dict(request.params)
    max_tokens = source.pop("max_tokens", None) or source.pop("max_completion_tokens", None)
    source.pop("max_completion_tokens", None)
    wants_json, schema = json_request(source.pop("response_format", None))
    body: dict[str, Any] = (
        {"model": request.model}
        if target == "anthropic"
        else {"anthropic_version": BEDROCK_ANTHROPIC_VERSION}
    )
    body["max_tokens"] = int(max_tokens or settings.get("default_max_tokens", DEFAULT_MAX_TOKENS))
    system_parts = [request.system] if request.system else []
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        if message.get("role") in ("system", "developer"):
            system_parts.append(str(message.get("content") or ""))
        else:
            messages.append(dict(message))
    native = settings.get("json_output", "instruct") == "output_config"
    if wants_json and native and schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    elif wants_json:
        schema_json = json.dumps(schema, sort_keys=True, separators=(",", ":")) if schema else None
        system_parts.append(json_instruction(schema_json))
    if system_parts:
        block: dict[str, Any] = {"type": "text", "text": "\n\n".join(p for p in system_parts if p)}
        if prompt_caching(settings):
            block["cache_control"] = {"type": "ephemeral"}
        body["system"] = [block]
    body["messages"] = messages
    if "stop" in source:
        stop = source.pop("stop")
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop or [])
    if "tools" in source:
        body["tools"] = claude_tools(source.pop("tools"))
    if "tool_choice" in source:
        choice = claude_tool_choice(source.pop("tool_choice"))
        if choice is not None:
            body["tool_choice"] = choice
    # Anything else (an Anthropic-only parameter the prompt names on purpose) passes through.
    body.update({k: v for k, v in source.items() if k not in DROPPED_PARAMS})
    if target == "bedrock":
        for name in ANTHROPIC_API_ONLY:
            body.pop(name, None)
    return body


def claude_usage(usage: Mapping[str, Any] | None) -> Usage:
    """The usage of a Claude ``Message``.

    :param usage: the message's ``usage`` object
    """
    usage = usage or {}
    return Usage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cached_input_tokens=int(usage.get("cache_read_input_tokens") or 0),
        cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
    )


def claude_output(message: Mapping[str, Any]) -> Any:
    """The text of a message (text blocks joined); a lone tool call's input when there is no text.

    :param message: the ``Message`` as a dict
    """
    blocks = [b for b in message.get("content") or [] if isinstance(b, Mapping)]
    texts = [str(b.get("text") or "") for b in blocks if b.get("type") == "text"]
    if texts:
        return "".join(texts)
    tools = [b.get("input") for b in blocks if b.get("type") == "tool_use"]
    if len(tools) == 1:
        return tools[0]
    return tools or None


def claude_result(custom_id: str, message: Mapping[str, Any]) -> ItemResult:
    """Return the neutral result of a Claude ``Message`` (from either provider).

    :param custom_id: the item's custom id
    :param message: the ``Message`` object as a dict
    """
    return ItemResult(
        custom_id,
        "succeeded",
        output=claude_output(message),
        usage=claude_usage(message.get("usage")),
        raw={
            "finish_reason": message.get("stop_reason"),
            "stop_reason": message.get("stop_reason"),
            "message_id": message.get("id"),
            "request_id": message.get("id"),
        },
    )
