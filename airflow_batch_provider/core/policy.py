"""One polling decision, shared by the trigger (async) and the sensor's blocking path.

The clock is passed in, so the decision is a pure function and testable without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from airflow_batch_provider.core.batch import BatchStatus

Action = Literal["wait", "done", "deadline", "timeout", "give_up"]


@dataclass(frozen=True)
class PollPolicy:
    """How to poll a batch.

    :param initial_interval: seconds before the second poll
    :param factor: multiplier applied after every poll without progress
    :param max_interval: cap on the interval
    :param max_consecutive_errors: transient status errors tolerated in a row
    :param timeout: seconds from submission after which polling gives up (provider window + slack)
    :param deadline: epoch seconds at which polling stops for the deadline branch, or ``None``
    :param deadline_margin: seconds before ``deadline`` at which to stop, leaving time to harvest
    """

    initial_interval: float = 30.0
    factor: float = 1.5
    max_interval: float = 600.0
    max_consecutive_errors: int = 5
    timeout: float = 26 * 3600.0
    deadline: float | None = None
    deadline_margin: float = 0.0

    def __post_init__(self) -> None:
        if self.initial_interval <= 0 or self.factor < 1 or self.max_interval < self.initial_interval:
            raise ValueError(
                f"poll policy initial_interval={self.initial_interval}, factor={self.factor}, "
                f"max_interval={self.max_interval}: need initial > 0, factor >= 1 and max >= initial."
            )

    def to_dict(self) -> dict[str, Any]:
        """Return primitives for trigger serialisation."""
        return {
            "initial_interval": self.initial_interval,
            "factor": self.factor,
            "max_interval": self.max_interval,
            "max_consecutive_errors": self.max_consecutive_errors,
            "timeout": self.timeout,
            "deadline": self.deadline,
            "deadline_margin": self.deadline_margin,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PollPolicy:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(**data)

    @property
    def stop_at(self) -> float | None:
        """Epoch seconds at which the deadline branch takes over, if any."""
        return None if self.deadline is None else self.deadline - self.deadline_margin


@dataclass(frozen=True)
class PollState:
    """What the poller remembers between polls (primitives only).

    :param started_at: epoch seconds of the submission
    :param interval: current interval in seconds
    :param consecutive_errors: transient errors in a row
    :param last_progress: completed + failed at the last poll
    :param polls: polls made
    """

    started_at: float
    interval: float
    consecutive_errors: int = 0
    last_progress: int = -1
    polls: int = 0


@dataclass(frozen=True)
class PollDecision:
    """What to do after one poll.

    :param action: ``wait`` to poll again after ``delay``; the others end polling
    :param delay: seconds to wait before the next poll
    :param state: the state to carry to the next poll
    :param reason: words for the log and the task's error
    """

    action: Action
    delay: float
    state: PollState
    reason: str = ""


def start(policy: PollPolicy, submitted_at: float) -> PollState:
    """Return the state before the first poll.

    :param policy: the policy
    :param submitted_at: epoch seconds of the submission
    """
    return PollState(started_at=submitted_at, interval=policy.initial_interval)


def decide(
    policy: PollPolicy,
    state: PollState,
    now: float,
    status: BatchStatus | None = None,
    error: str | None = None,
) -> PollDecision:
    """Decide what follows one poll.

    A terminal status ends polling (``done``). Otherwise the deadline (``deadline``), then the
    timeout (``timeout``) are checked. A transient error counts against
    ``max_consecutive_errors`` (``give_up`` when exceeded). The interval grows by ``factor`` after
    every poll up to ``max_interval`` (a 24-hour batch costs a few hundred polls, not thousands).
    The delay never passes the deadline's stop time, so the deadline is met on time.

    :param policy: the policy
    :param state: the state carried from the previous poll
    :param now: epoch seconds now
    :param status: the status read, or ``None`` when the poll failed
    :param error: the error text when the poll failed
    """
    polls = state.polls + 1
    if status is not None and status.terminal:
        return PollDecision("done", 0.0, replace(state, polls=polls), f"batch is {status.state}")
    stop_at = policy.stop_at
    if stop_at is not None and now >= stop_at:
        return PollDecision("deadline", 0.0, replace(state, polls=polls), "deadline reached")
    if now - state.started_at >= policy.timeout:
        return PollDecision(
            "timeout",
            0.0,
            replace(state, polls=polls),
            f"no terminal state {now - state.started_at:.0f}s after submission (timeout {policy.timeout:.0f}s); "
            "raise the timeout or set a deadline policy",
        )
    grown = min(state.interval * policy.factor, policy.max_interval)
    if status is None:
        errors = state.consecutive_errors + 1
        if errors > policy.max_consecutive_errors:
            return PollDecision(
                "give_up",
                0.0,
                replace(state, polls=polls, consecutive_errors=errors),
                f"{errors} status errors in a row (limit {policy.max_consecutive_errors}); last: {error}",
            )
        new_state = replace(state, polls=polls, consecutive_errors=errors, interval=grown)
    else:
        progress = status.completed + status.failed
        new_state = replace(state, polls=polls, consecutive_errors=0, interval=grown, last_progress=progress)
    delay = state.interval
    if stop_at is not None:
        delay = max(0.0, min(delay, stop_at - now))
    return PollDecision("wait", delay, new_state, "")
