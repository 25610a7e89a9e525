"""The options of a batch workload, grouped: chunking, deadline, fallback limits, budget and pricing.

``batch_inference_group`` takes one frozen object of each kind and hands every task the ones it
uses, as one object each, instead of threading a dozen keywords through the group::

    batch_inference_group(
        ...,
        chunking=ChunkOptions(max_requests=1000),
        deadline=DeadlineOptions("06:30 Europe/Berlin", "sync_fallback", margin_s=600),
        fallback=FallbackLimits(rpm=500, tpm=200_000, concurrency=16),
        budget=BudgetOptions(budget_usd=5, pricing_override="prices.yaml"),
    )

Each object checks its values when it is built (when the DAG file is parsed), with an error that
names the option, the value and the fix. ``to_dict`` gives JSON-safe primitives (XCom, the
serialised DAG, logs) and ``from_dict`` rebuilds the object. Pure: no Airflow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Literal, get_args

from airflow_batch_provider.core.deadline import DeadlinePolicy, DeadlineSpec, check_policy
from airflow_batch_provider.core.names import is_templated
from airflow_batch_provider.exceptions import ConfigurationError

#: Which lane ``batch_inference_group`` builds: ``provider`` (upload, submit and wait at a batch
#: API), ``pod`` (one ``vllm run-batch`` pod per chunk), or ``auto`` (a literal connection id is
#: read when the DAG is parsed and its adapter decides; a templated one means ``provider``).
Lane = Literal["auto", "provider", "pod"]
LANES: Final[tuple[str, ...]] = get_args(Lane)
#: The lane a group was built with, which the first task that reads the connection checks.
BuiltLane = Literal["provider", "pod"]


def check_lane(lane: object) -> Lane:
    """Return ``lane`` if it is one of :data:`LANES`, else raise with the choices.

    :param lane: the ``lane`` given to ``batch_inference_group``
    :raises ConfigurationError: an unknown lane
    """
    if lane not in LANES:
        raise ConfigurationError(
            f"lane={lane!r} is not one of {list(LANES)}: 'pod' for a vllm_kubernetes connection (it may "
            "then be templated), 'provider' for a batch API's, 'auto' to read a literal connection id "
            "when the DAG is parsed."
        )
    return lane  # type: ignore[return-value]


#: Default seconds the harvest waits for a batch cancelled at the deadline to reach its terminal
#: state: OpenAI documents up to 10 minutes for a cancel to complete.
HARVEST_TIMEOUT_S: Final = 600.0


def _positive_int(owner: str, name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{owner}({name}={value!r}): give a whole number of 1 or more, or leave it unset."
        )


def _share(owner: str, name: str, value: float, *, low_open: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > 1 or value < 0 or (low_open and value == 0):
        bound = "above 0" if low_open else "0"
        raise ConfigurationError(
            f"{owner}({name}={value!r}): give a share from {bound} to 1 (e.g. 0.1 for 10%)."
        )


def _seconds(owner: str, name: str, value: float, *, zero_ok: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (not zero_ok and value == 0):
        floor = "0 or more" if zero_ok else "more than 0"
        raise ConfigurationError(f"{owner}({name}={value!r}): give {floor} seconds.")


@dataclass(frozen=True)
class ChunkOptions:
    """How prepare and resubmit cut a round into provider jobs, and how much bad input is tolerated.

    :param max_requests: requests per job, tighter than the provider's limit (spreads the work
        over more jobs); ``None``: the provider's limit. A template (``"{{ var.value.get('chunk',
        '20') }}"``) is rendered by prepare and resubmit when they run (:meth:`rendered`)
    :param max_bytes: bytes per staged file, tighter than the provider's limit
    :param max_reject_ratio: the largest share of bad input records (0 to 1) before prepare fails
    """

    max_requests: int | str | None = None
    max_bytes: int | None = None
    max_reject_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not (isinstance(self.max_requests, str) and is_templated(self.max_requests)):
            _positive_int("ChunkOptions", "max_requests", self.max_requests)  # type: ignore[arg-type]
        _positive_int("ChunkOptions", "max_bytes", self.max_bytes)
        _share("ChunkOptions", "max_reject_ratio", self.max_reject_ratio, low_open=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe primitives."""
        return {
            "max_requests": self.max_requests,
            "max_bytes": self.max_bytes,
            "max_reject_ratio": self.max_reject_ratio,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChunkOptions:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(**dict(data))

    @property
    def request_limit(self) -> int | None:
        """``max_requests`` as a number (``None``: the provider's limit).

        :raises ConfigurationError: it is still a template: render it first (:meth:`rendered`)
        """
        if isinstance(self.max_requests, str):
            raise ConfigurationError(
                f"ChunkOptions(max_requests={self.max_requests!r}) is a template: the task renders it "
                "when it runs (ChunkOptions.rendered); prepare and resubmit do this."
            )
        return self.max_requests

    def rendered(self, text: object) -> ChunkOptions:
        """The same options with ``max_requests`` as its template rendered for this run.

        :param text: what the template rendered to: a whole number of 1 or more; empty means the
            provider's limit
        :raises ConfigurationError: anything else, naming the template and what it rendered to
        """
        value = text.strip() if isinstance(text, str) else text
        if value is None or value == "":
            return replace(self, max_requests=None)
        try:
            number = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or number < 1:
            raise ConfigurationError(
                f"ChunkOptions(max_requests={self.max_requests!r}) rendered to {text!r} for this run; "
                "it must render to a whole number of 1 or more (or to nothing, for the provider's "
                "limit): fix the Variable or the template it reads."
            )
        return replace(self, max_requests=number)


@dataclass(frozen=True)
class DeadlineOptions:
    """When waiting stops, what then happens to the items still open, and how long a cancel may take.

    :param when: a time of day with its timezone (``"06:30 Europe/Berlin"``), an offset from the
        run's start (``"PT4H"``, a timedelta), a :class:`~airflow_batch_provider.core.deadline.DeadlineSpec`,
        or an absolute (templated) datetime (a datetime, an ISO string, a ``"{{ ... }}"`` template).
        ``batch_inference_group`` has a template rendered once per run by its ``deadline`` task,
        which also takes a rule, or nothing for no deadline that run (e.g. from a Variable)
    :param policy: what happens to items not done by then: ``sync_fallback``, ``publish_pending``
        or ``skip`` (required: each spends money or delivers less in its own way)
    :param margin_s: seconds before the deadline at which waiting stops
    :param harvest_timeout_s: seconds to wait for a batch cancelled at the deadline to reach its
        terminal state (default 600: OpenAI documents up to 10 minutes for a cancel)
    :param over_budget: what ``sync_fallback`` does when its real-time sends would pass
        ``BudgetOptions(budget_usd=...)``: ``refuse`` (default: a budget is a budget; the items go
        to ``skipped`` with error ``over_budget``) or ``send`` (the deadline wins; the overrun is
        in the task's summary and log)
    """

    when: datetime | str | timedelta | DeadlineSpec
    policy: DeadlinePolicy
    margin_s: float = 0.0
    harvest_timeout_s: float = HARVEST_TIMEOUT_S
    over_budget: str = "refuse"
    _spec: DeadlineSpec | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_policy(self.policy, True)
        _seconds("DeadlineOptions", "margin_s", self.margin_s, zero_ok=True)
        _seconds("DeadlineOptions", "harvest_timeout_s", self.harvest_timeout_s, zero_ok=False)
        if self.over_budget not in ("refuse", "send"):
            raise ConfigurationError(
                f"DeadlineOptions(over_budget={self.over_budget!r}): give 'refuse' (a budget is a budget) "
                "or 'send' (the deadline wins over the budget)."
            )
        if isinstance(self.when, str) and not self.when.strip():
            raise ConfigurationError(
                "DeadlineOptions(when=''): give '06:30 Europe/Berlin', 'PT4H' or a datetime."
            )
        if not self.is_absolute:
            spec = DeadlineSpec.parse(self.when, self.policy, margin_s=self.margin_s)  # type: ignore[arg-type]
            object.__setattr__(self, "_spec", spec)  # derived once, here: the object stays frozen

    @property
    def is_absolute(self) -> bool:
        """Whether ``when`` is a moment (a datetime, an ISO datetime, a template), not a rule."""
        when = self.when
        if isinstance(when, datetime):
            return True
        if not isinstance(when, str):
            return False
        if "{{" in when:
            return True
        try:
            datetime.fromisoformat(when.strip())
        except ValueError:
            return False
        return True

    @property
    def spec(self) -> DeadlineSpec | None:
        """The rule the ``deadline`` task resolves for each run (``None`` for an absolute deadline)."""
        return self._spec

    def resolved_by(self, task_id: str) -> DeadlineOptions:
        """The same options with ``when`` read from the ``deadline`` task's XCom at run time.

        :param task_id: the full id of the :class:`~airflow_batch_provider.operators.deadline.BatchDeadlineOperator`
        """
        return replace(self, when="{{ ti.xcom_pull(task_ids='" + task_id + "')['deadline'] }}")

    def at(self) -> str:
        """The deadline as a (templated) string for a task's template field.

        :raises ConfigurationError: ``when`` is a rule: resolve it first (:meth:`resolved_by`)
        """
        if not self.is_absolute:
            raise ConfigurationError(
                f"deadline {self.when!r} is a rule, not a moment: a task reads the run's deadline from the "
                "deadline task (DeadlineOptions.resolved_by); batch_inference_group does this."
            )
        return self.when.isoformat() if isinstance(self.when, datetime) else str(self.when)

    def describe(self) -> str:
        """Words for logs and the Airflow UI."""
        if self._spec is not None:
            return self._spec.describe()
        return f"deadline {self.when} (stop waiting {self.margin_s:g}s before), then {self.policy}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe primitives (a timedelta as seconds, a spec as its dict)."""
        when: Any = self.when
        if isinstance(when, datetime):
            when = when.isoformat()
        elif isinstance(when, timedelta):
            when = {"offset_s": when.total_seconds()}
        elif isinstance(when, DeadlineSpec):
            when = {"spec": when.to_dict()}
        return {
            "when": when,
            "policy": self.policy,
            "margin_s": self.margin_s,
            "harvest_timeout_s": self.harvest_timeout_s,
            "over_budget": self.over_budget,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeadlineOptions:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        when: Any = data["when"]
        if isinstance(when, Mapping):
            when = (
                DeadlineSpec.from_dict(dict(when["spec"]))
                if "spec" in when
                else timedelta(seconds=float(when["offset_s"]))
            )
        return cls(
            when,
            data["policy"],
            margin_s=float(data.get("margin_s") or 0.0),
            harvest_timeout_s=float(data.get("harvest_timeout_s") or HARVEST_TIMEOUT_S),
            over_budget=str(data.get("over_budget") or "refuse"),
        )


@dataclass(frozen=True)
class FallbackLimits:
    """Rate limits of the real-time API sends (the deadline fallback, ``exhausted='sync'``, small chunks).

    ``None`` takes the ``[batch_provider]`` config (``fallback_rpm`` 500, ``fallback_tpm`` 200000,
    ``fallback_concurrency`` 16) when the task runs.

    :param rpm: requests per minute
    :param tpm: tokens per minute
    :param concurrency: requests in flight
    :param headroom: the share of ``rpm``/``tpm`` used, above 0 to 1 (e.g. 0.8 leaves a fifth
        for other clients of the same key; ``None``: the connection's ``rate_headroom``, else
        ``[batch_provider] fallback_headroom``, 1.0)
    :param attempts: tries of one item's real-time request, the first included, before it goes
        to review with the provider's error code (429s, 5xx, timeouts; ``None``: the task's retry
        policy, 5)
    """

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    headroom: float | None = None
    attempts: int | None = None

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "concurrency", "attempts"):
            _positive_int("FallbackLimits", name, getattr(self, name))
        if self.headroom is not None:
            _share("FallbackLimits", "headroom", self.headroom, low_open=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe primitives."""
        return {
            "rpm": self.rpm,
            "tpm": self.tpm,
            "concurrency": self.concurrency,
            "headroom": self.headroom,
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FallbackLimits:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(**dict(data))


@dataclass(frozen=True)
class BudgetOptions:
    """The run's budget, and the prices that estimate and report its cost.

    :param budget_usd: the run's budget in USD (a number or a decimal string): prepare stops
        before any submit when the estimate exceeds it; a resubmission round, or the real-time
        sends of ``exhausted='sync'``, that would pass it are not started and their items go to
        review. ``None``: no budget
    :param pricing_override: prices merged over the shipped table: the path of a pricing file,
        or a dict in its format (JSON-safe)
    """

    budget_usd: Decimal | float | int | str | None = None
    pricing_override: str | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.budget_usd is not None:
            try:
                amount = Decimal(str(self.budget_usd))
            except InvalidOperation:
                amount = Decimal("NaN")
            if isinstance(self.budget_usd, bool) or not amount.is_finite() or amount < 0:
                raise ConfigurationError(
                    f"BudgetOptions(budget_usd={self.budget_usd!r}): give an amount in USD of 0 or more "
                    "(e.g. 5 or '12.50'), or leave it unset for no budget."
                )
            object.__setattr__(self, "budget_usd", amount)  # normalised once, here
        override = self.pricing_override
        if override is None:
            return
        if isinstance(override, str):
            if not override.strip():
                raise ConfigurationError(
                    "BudgetOptions(pricing_override=''): give a pricing file path or a dict."
                )
            return
        if not isinstance(override, Mapping):
            raise ConfigurationError(
                f"BudgetOptions(pricing_override={type(override).__name__}): give a pricing file path or a dict."
            )
        try:
            copied = json.loads(json.dumps(override))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"BudgetOptions(pricing_override=...) is not JSON-safe ({exc}); give prices as numbers or strings."
            ) from exc
        object.__setattr__(self, "pricing_override", copied)  # a copy: nobody can change it later

    @property
    def budget(self) -> Decimal | None:
        """The budget as a Decimal (``None``: no budget)."""
        return None if self.budget_usd is None else Decimal(str(self.budget_usd))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe primitives (the budget as a decimal string)."""
        return {
            "budget_usd": None if self.budget_usd is None else str(self.budget_usd),
            "pricing_override": self.pricing_override,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BudgetOptions:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(data.get("budget_usd"), data.get("pricing_override"))


#: The flat keywords ``batch_inference_group`` took before the options were grouped, and where
#: each went (a DAG written for them is refused with this hint, not silently misread).
MOVED_KEYWORDS: Final[Mapping[str, str]] = {
    "max_requests_per_chunk": "chunking=ChunkOptions(max_requests=...)",
    "max_bytes_per_chunk": "chunking=ChunkOptions(max_bytes=...)",
    "max_reject_ratio": "chunking=ChunkOptions(max_reject_ratio=...)",
    "deadline_policy": "deadline=DeadlineOptions(when, policy)",
    "deadline_margin": "deadline=DeadlineOptions(..., margin_s=...)",
    "harvest_timeout": "deadline=DeadlineOptions(..., harvest_timeout_s=...)",
    "fallback_rpm": "fallback=FallbackLimits(rpm=...)",
    "fallback_tpm": "fallback=FallbackLimits(tpm=...)",
    "fallback_concurrency": "fallback=FallbackLimits(concurrency=...)",
    "budget_usd": "budget=BudgetOptions(budget_usd=...)",
    "pricing_override": "budget=BudgetOptions(pricing_override=...)",
}


def refuse_moved(where: str, given: Mapping[str, Any]) -> None:
    """Refuse keywords that are not taken any more, naming the option object each moved to.

    :param where: who was called (for the message)
    :param given: the unexpected keywords
    :raises ConfigurationError: always, when ``given`` is not empty
    """
    if not given:
        return
    hints = [f"{k}= -> {MOVED_KEYWORDS[k]}" for k in sorted(given) if k in MOVED_KEYWORDS]
    unknown = sorted(k for k in given if k not in MOVED_KEYWORDS)
    parts = []
    if hints:
        parts.append(
            "these options are grouped now (airflow_batch_provider.core.options): " + "; ".join(hints)
        )
    if unknown:
        parts.append(f"unknown keyword(s): {', '.join(unknown)}")
    raise ConfigurationError(f"{where}: " + ". ".join(parts) + ".")
