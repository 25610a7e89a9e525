"""Value types of a provider batch that every layer shares: its limits and its normalised status.

They live in ``core`` so the chunker and the poll policy need nothing from ``adapters``;
:mod:`airflow_batch_provider.adapters.base` re-exports them for the adapters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from airflow_batch_provider.core.states import TERMINAL_BATCH_STATES, BatchState

#: Why a whole batch ended ``failed``, normalised across providers (:func:`failure_code`).
BatchErrorCode = Literal["token_limit_exceeded", "quota_exceeded", "invalid_file", "provider_error"]
BATCH_ERROR_CODES: Final[tuple[str, ...]] = get_args(BatchErrorCode)


def failure_code(*words: object) -> BatchErrorCode:
    """Normalise a provider's words on a failed batch (codes, statuses, messages) to one code.

    ``token_limit_exceeded``: OpenAI's enqueued-token limit (send smaller chunks, or later);
    ``quota_exceeded``: a quota, billing or resource-exhausted refusal; ``invalid_file``: the
    input failed validation; ``provider_error``: anything else.

    :param words: the provider's error code(s), status and message, in any order
    """
    text = " ".join(str(w) for w in words if w is not None).lower()
    if "token_limit" in text or "enqueued token" in text:
        return "token_limit_exceeded"
    if any(w in text for w in ("quota", "billing", "resource_exhausted", "insufficient", "exceeded your")):
        return "quota_exceeded"
    if any(w in text for w in ("invalid", "validation", "malformed", "parse", "empty_file", "line ")):
        return "invalid_file"
    return "provider_error"


@dataclass(frozen=True)
class Limits:
    """What one provider job accepts.

    :param max_requests: most request lines in one job
    :param max_bytes: most bytes in one input file (or request body)
    :param custom_id_pattern: the regular expression a custom id must match
    :param min_requests: fewest request lines a job accepts (Bedrock has a floor)
    :param headroom: fraction of ``max_bytes`` actually filled, to leave room for envelopes
    """

    max_requests: int
    max_bytes: int
    custom_id_pattern: str = r"^[A-Za-z0-9_-]{1,64}$"
    min_requests: int = 1
    headroom: float = 0.95

    @property
    def usable_bytes(self) -> int:
        """Bytes the chunker fills at most."""
        return int(self.max_bytes * self.headroom)


@dataclass(frozen=True)
class BatchStatus:
    """A provider's batch state, normalised.

    :param state: one of :data:`BATCH_STATES`
    :param total: requests in the job (0 while unknown)
    :param completed: requests that succeeded so far
    :param failed: requests that failed so far
    :param reason: provider's words on why it failed or expired, if any
    :param raw_state: the provider's own state string, for logs
    :param error_code: for a batch that ended ``failed``, why, normalised
        (:data:`BatchErrorCode`: ``token_limit_exceeded``, ``quota_exceeded``, ``invalid_file``,
        ``provider_error``); ``None`` otherwise
    :param error_message: the provider's message for ``error_code``
    """

    state: BatchState
    total: int = 0
    completed: int = 0
    failed: int = 0
    reason: str | None = None
    raw_state: str | None = None
    error_code: BatchErrorCode | None = None
    error_message: str | None = None

    @property
    def terminal(self) -> bool:
        """True when the provider will do nothing more with the job."""
        return self.state in TERMINAL_BATCH_STATES

    def to_dict(self) -> dict[str, Any]:
        """Return an XCom- and trigger-event-safe dict."""
        return {
            "state": self.state,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "reason": self.reason,
            "raw_state": self.raw_state,
            "error_code": self.error_code,
            "error_message": self.error_message,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchStatus:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(
            state=data["state"],
            total=int(data.get("total") or 0),
            completed=int(data.get("completed") or 0),
            failed=int(data.get("failed") or 0),
            reason=data.get("reason"),
            raw_state=data.get("raw_state"),
            error_code=data.get("error_code"),
            error_message=data.get("error_message"),
        )
