"""A deterministic token ESTIMATE of a request, made before it is sent.

No tokenizer is downloaded (workers may have no internet, and every provider tokenizes
differently), so the count is a heuristic, good for budgets and chunk sizing, not for billing.
Billing always uses the usage the provider reports.

Heuristic:

- text costs ``ceil(UTF-8 bytes / 4)`` tokens: about 4 characters a token for English, as the
  providers' own rule of thumb says; counting bytes rather than characters errs high for other
  scripts (CJK text runs nearer 1 token a character than 1 per 4);
- every chat message adds :data:`MESSAGE_OVERHEAD` tokens (role and separators), the system
  prompt counts as one message, and a chat adds :data:`REPLY_PRIMING` tokens for the assistant
  turn;
- ``tools`` and ``response_format`` in the params count as their canonical JSON text, since the
  provider puts the schema in front of the model;
- a non-text content part (an image) counts :data:`NON_TEXT_PART_TOKENS`;
- embeddings and moderations count their text only, and produce no output tokens.

The maximum output is the request's ``max_tokens``, ``max_completion_tokens`` or
``max_output_tokens`` (the first present), else :data:`DEFAULT_MAX_OUTPUT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from airflow_batch_provider.core.hashing import canonical_json
from airflow_batch_provider.core.requests import CanonicalRequest

BYTES_PER_TOKEN: Final = 4
MESSAGE_OVERHEAD: Final = 4
REPLY_PRIMING: Final = 3
NON_TEXT_PART_TOKENS: Final = 85
#: Output ceiling assumed when a request names none.
DEFAULT_MAX_OUTPUT: Final = 1024
MAX_OUTPUT_PARAMS: Final[tuple[str, ...]] = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_SCHEMA_PARAMS: Final[tuple[str, ...]] = ("tools", "response_format")


@dataclass(frozen=True)
class TokenEstimate:
    """Estimated tokens of one request.

    :param input: estimated prompt tokens, system prompt included
    :param max_output: the most output tokens the request allows
    :param cacheable: the part of ``input`` that is the shared system prompt, which a provider
        may serve from its prompt cache
    """

    input: int
    max_output: int
    cacheable: int = 0

    def __add__(self, other: TokenEstimate) -> TokenEstimate:
        return TokenEstimate(
            self.input + other.input, self.max_output + other.max_output, self.cacheable + other.cacheable
        )


def estimate_text_tokens(text: str) -> int:
    """Return ``ceil(UTF-8 bytes / 4)``: the estimated tokens of plain text.

    :param text: the text
    """
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_text_tokens(content)
    if isinstance(content, (list, tuple)):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += estimate_text_tokens(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                total += estimate_text_tokens(part["text"])
            else:
                total += NON_TEXT_PART_TOKENS
        return total
    return estimate_text_tokens(canonical_json(content))


def max_output_tokens(params: Mapping[str, Any], default: int = DEFAULT_MAX_OUTPUT) -> int:
    """Return the output ceiling the params name, else ``default``.

    :param params: the request's generation parameters
    :param default: the ceiling assumed when none is named
    """
    for name in MAX_OUTPUT_PARAMS:
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return default


def estimate_request_tokens(
    request: CanonicalRequest, default_max_output: int = DEFAULT_MAX_OUTPUT
) -> TokenEstimate:
    """Estimate a request's input tokens and its output ceiling (see the module docstring).

    :param request: the canonical request
    :param default_max_output: output ceiling assumed when the params name none
    """
    if request.kind in ("embedding", "moderation"):
        text = request.text
        return TokenEstimate(input=estimate_text_tokens(text), max_output=0, cacheable=0)
    system = 0
    if request.system:
        system = estimate_text_tokens(request.system) + MESSAGE_OVERHEAD
    total = system + REPLY_PRIMING
    for message in request.messages:
        total += MESSAGE_OVERHEAD + _content_tokens(message.get("content"))
    for name in _SCHEMA_PARAMS:
        if request.params.get(name) is not None:
            total += estimate_text_tokens(canonical_json(request.params[name]))
    return TokenEstimate(
        input=total,
        max_output=max_output_tokens(request.params, default_max_output),
        cacheable=system,
    )
