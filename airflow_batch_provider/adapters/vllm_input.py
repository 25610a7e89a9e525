"""What ``vllm run-batch`` accepts as an input line, checked before a pod starts.

vLLM validates the whole input file with pydantic (``BatchRequestInput``, the body chosen by the
line's ``url``) and one invalid line fails the whole file: exit status 1, no output at all (0.32
after the engine started, 0.33 before it loads the model, ``Invalid request on line N``). So the
lane checks each line the way the engine will while it formats it, and a line the engine would
refuse is rejected as its own item instead of failing every item of its chunk.

The checks are the engine's, not stricter: pydantic's lax JSON mode (a numeric string is a
number, ``true`` is an integer) is followed, and a field the engine does not type-check here is
left to it. The message keeps pydantic's words and field path (``body.messages``: ``Input should
be a valid array``), so the rejection reads as the engine's. The lane's test environment checks
these rules against the engine's own models (``tests/vllm_engine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

CHAT_URL: Final = "/v1/chat/completions"
EMBEDDINGS_URL: Final = "/v1/embeddings"
#: The ``url`` values ``vllm run-batch`` serves, exactly (0.32 and 0.33).
EXACT_ENDPOINTS: Final = frozenset(
    {CHAT_URL, EMBEDDINGS_URL, "/v1/audio/transcriptions", "/v1/audio/translations"}
)
#: The ``url`` suffixes it serves (``/score``, ``/v1/score``, ``/rerank`` ...).
SUFFIX_ENDPOINTS: Final = ("/score", "/rerank")

_INT_FIELDS: Final = ("max_tokens", "max_completion_tokens", "n", "seed", "top_k")
_NUMBER_FIELDS: Final = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                         "repetition_penalty")  # fmt: skip
_BOOL_FIELDS: Final = ("stream", "logprobs", "echo", "add_generation_prompt")


def served_endpoint(url: str) -> bool:
    """Whether ``vllm run-batch`` serves ``url`` (otherwise the line gets a 400 or fails the file).

    :param url: the line's ``url``
    """
    return url in EXACT_ENDPOINTS or url.endswith(SUFFIX_ENDPOINTS)


def _error(loc: str, message: str, value: Any) -> str:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return (
        f"1 validation error for BatchRequestInput\n{loc}\n  {message} "
        f"[input_value={shown}, input_type={type(value).__name__}]"
    )


def _as_int(value: Any) -> bool:
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        try:
            int(value.strip())
        except ValueError:
            return False
        return True
    return False


def _as_number(value: Any) -> bool:
    if isinstance(value, bool | int | float):
        return True
    if isinstance(value, str):
        try:
            float(value.strip())
        except ValueError:
            return False
        return True
    return False


def _scalars(body: Mapping[str, Any]) -> str | None:
    for name in _INT_FIELDS:
        value = body.get(name)
        if value is not None and not _as_int(value):
            return _error(f"body.{name}", "Input should be a valid integer", value)
    for name in _NUMBER_FIELDS:
        value = body.get(name)
        if value is not None and not _as_number(value):
            return _error(f"body.{name}", "Input should be a valid number", value)
    for name in _BOOL_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool | int) and value not in ("true", "false"):
            return _error(f"body.{name}", "Input should be a valid boolean", value)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return _error("body.model", "Input should be a valid string", model)
    return None


def _chat(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages")
    if "messages" not in body:
        return _error("body.messages", "Field required", dict(body))
    if not isinstance(messages, list):
        return _error("body.messages", "Input should be a valid array", messages)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return _error(f"body.messages.{index}", "Input should be a valid dictionary", message)
        if not isinstance(message.get("role"), str):
            return _error(f"body.messages.{index}.role", "Field required", dict(message))
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return _error(f"body.messages.{index}.content", "Input should be a valid string", content)
    return _scalars(body)


def _embedding_input(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if not isinstance(value, list):
        return False
    if all(isinstance(x, str) for x in value):
        return True
    if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return True
    return all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in value)


def _embeddings(body: Mapping[str, Any]) -> str | None:
    if "messages" in body and "input" not in body:
        return _chat(body)  # the chat-shaped embedding request
    if "input" not in body:
        return _error("body.input", "Field required", dict(body))
    value = body["input"]
    if not _embedding_input(value):
        return _error(
            "body.input", "Input should be a valid string or a list of strings or of token ids", value
        )
    return _scalars(body)


def engine_refusal(line: Any) -> str | None:
    """Why ``vllm run-batch`` would refuse this input line (failing its whole file), or ``None``.

    :param line: the parsed input line
    """
    if not isinstance(line, Mapping):
        return _error("", "Input should be a valid dictionary", line).replace("\n\n", "\n")
    for name in ("custom_id", "method", "url"):
        if name not in line:
            return _error(name, "Field required", dict(line))
        if not isinstance(line[name], str):
            return _error(name, "Input should be a valid string", line[name])
    body = line.get("body")
    if "body" not in line:
        return _error("body", "Field required", dict(line))
    if not isinstance(body, Mapping):
        return _error("body", "Input should be a valid dictionary", body)
    url = str(line["url"])
    if url == CHAT_URL:
        return _chat(body)
    if url == EMBEDDINGS_URL:
        return _embeddings(body)
    if url.endswith(SUFFIX_ENDPOINTS) or url in EXACT_ENDPOINTS:
        return None  # score, rerank, audio: the lane does not write them; the engine checks them
    # any other url: the engine tries every body model, and refuses the file if none fits
    if "messages" in body:
        return _chat(body)
    if "input" in body:
        return _embeddings(body)
    return _error("body.messages", "Field required", dict(body))


def unserved_reason(line: Mapping[str, Any]) -> str | None:
    """The engine's per-line 400 for a url it does not serve (the file goes on), or ``None``.

    :param line: a valid input line
    """
    url = str(line.get("url"))
    if served_endpoint(url):
        return None
    return (
        f"URL {url} was used. Supported endpoints: /v1/chat/completions, /v1/embeddings, "
        "/v1/audio/transcriptions, /v1/audio/translations, /score,  /rerank."
    )
