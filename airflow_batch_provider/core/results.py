"""Provider-neutral results: what one result line says about one item."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from airflow_batch_provider.core.ratelimit import RETRYABLE_STATUS, TRANSPORT_ERRORS, is_retryable

Outcome = Literal[
    "succeeded",
    "failed_retryable",
    "failed_permanent",
    "expired",
    "cancelled",
    "invalid_output",
    "missing",
]
OUTCOMES: Final[tuple[str, ...]] = get_args(Outcome)

#: HTTP status codes in a per-item error that are worth another attempt (the one table).
RETRYABLE_HTTP: Final[frozenset[int]] = RETRYABLE_STATUS


@dataclass(frozen=True)
class Usage:
    """Token usage of one request.

    :param input_tokens: prompt tokens billed at the normal input rate (cache reads excluded)
    :param output_tokens: completion tokens
    :param cached_input_tokens: prompt tokens read from the provider's prompt cache
    :param cache_write_tokens: prompt tokens written to the prompt cache
    :param reasoning_tokens: the part of ``output_tokens`` the model spent reasoning (OpenAI's
        ``output_tokens_details.reasoning_tokens``, Gemini's ``thoughtsTokenCount``); already
        counted in ``output_tokens`` and priced as output, reported for insight only
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    @property
    def total_tokens(self) -> int:
        """All tokens, however billed."""
        return self.input_tokens + self.output_tokens + self.cached_input_tokens + self.cache_write_tokens


@dataclass(frozen=True)
class ItemResult:
    """One item's outcome in one job.

    :param custom_id: the id the line carried
    :param outcome: the neutral outcome
    :param output: the parsed output (message text or JSON object, embedding vector), if any
    :param usage: tokens billed for this line
    :param error_code: provider error code or HTTP status, when it failed
    :param error_message: provider error message, when it failed
    :param raw: provider-specific extras worth keeping (finish reason, request id)
    """

    custom_id: str
    outcome: Outcome
    output: Any = None
    usage: Usage = field(default_factory=Usage)
    error_code: str | None = None
    error_message: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def classify_http_error(
    status: int | None, code: str | None = None, words: frozenset[str] = TRANSPORT_ERRORS
) -> Outcome:
    """Map an HTTP status and error code to retryable or permanent, for every provider.

    Retryable: the statuses of the one rule and the error words passed in
    (:func:`~airflow_batch_provider.core.ratelimit.is_retryable`).

    :param status: HTTP status code of the item's response, if any
    :param code: provider error code or type, if any
    :param words: the retryable error words (the adapters pass the registry's union of every
        provider's declared words)
    """
    if code == "batch_expired":
        return "expired"
    if code == "batch_cancelled":
        return "cancelled"
    return "failed_retryable" if is_retryable(status, code, words) else "failed_permanent"


@dataclass(frozen=True)
class MalformedLine:
    """A result line that could not be parsed; counted and logged, never fatal.

    :param line_number: 1-based line number in the downloaded file
    :param reason: why it was rejected
    :param excerpt: the first characters of the line
    :param custom_id: the custom id, when it could still be read from the line
    """

    line_number: int
    reason: str
    excerpt: str
    custom_id: str | None = None
