"""A workload's deadline and its policy for what is not done by then. Pure: no Airflow.

A DAG says WHEN (a time of day in a named timezone, or an offset from the run's start) and WHAT
happens to items still open at that moment. There is no default policy: a DAG that gives a
deadline without a policy (or a policy without a deadline) is refused when it is parsed, because
each policy spends money or delivers less in a different way and nobody should get one silently.

- ``sync_fallback``: send what is left to the provider's real-time API, at full price;
- ``publish_pending``: publish what is done, and report the rest as ``pending``;
- ``skip``: publish what is done, and report the rest as ``skipped``.

Forms of ``when``::

    "06:30 Europe/Berlin"     next 06:30 in Berlin after the run's logical date (DST-aware)
    "06:30:15 UTC"            seconds allowed; the timezone is required (an IANA name or UTC)
    "PT4H", "PT90S"           ISO 8601 duration after the run's start
    timedelta(hours=4)        the same, as a timedelta or pendulum Duration

A time-of-day deadline is a commitment on the clock ("results by 06:30"), so it is anchored to
the run's logical date (when the run was due), and a run that starts late finds it sooner, or
already passed. An offset is a budget of time, so it is anchored to when the run actually started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any, Final, Literal, get_args

from airflow_batch_provider.exceptions import ConfigurationError

DeadlinePolicy = Literal["sync_fallback", "publish_pending", "skip"]
DEADLINE_POLICIES: Final[tuple[str, ...]] = get_args(DeadlinePolicy)

_TIME_OF_DAY: Final = re.compile(r"^\s*(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}))?\s+(?P<tz>\S+)\s*$")


def check_policy(policy: str | None, deadline_given: bool) -> DeadlinePolicy | None:
    """Check that a deadline and its policy come together, and that the policy is known.

    :param policy: the DAG's ``deadline_policy``
    :param deadline_given: whether the DAG gave a deadline
    :raises ConfigurationError: one without the other, or an unknown policy
    """
    if policy is None and not deadline_given:
        return None
    if policy is None:
        raise ConfigurationError(
            "a deadline was given without deadline_policy; say what happens to items not done by then: "
            f"deadline_policy={list(DEADLINE_POLICIES)} (there is no default on purpose)."
        )
    if policy not in DEADLINE_POLICIES:
        raise ConfigurationError(
            f"deadline_policy={policy!r} is not one of {list(DEADLINE_POLICIES)}; pick one of them."
        )
    if not deadline_given:
        raise ConfigurationError(
            f"deadline_policy={policy!r} was given without a deadline; add deadline= "
            "(e.g. '06:30 Europe/Berlin' or 'PT4H'), or remove deadline_policy."
        )
    return policy  # type: ignore[return-value]


@dataclass(frozen=True)
class DeadlineSpec:
    """When a workload's waiting ends, and what then happens to the items still open.

    Exactly one of ``time_of_day`` and ``offset`` is set; build it with :meth:`parse`.

    :param policy: ``sync_fallback``, ``publish_pending`` or ``skip``
    :param time_of_day: the wall-clock time of the deadline in ``timezone``
    :param timezone: IANA timezone name of ``time_of_day``
    :param offset: the deadline as a duration after the run's start
    :param margin_s: seconds before the deadline at which waiting stops, to leave time to
        cancel, harvest and (for ``sync_fallback``) send the rest
    """

    policy: DeadlinePolicy
    time_of_day: time | None = None
    timezone: str | None = None
    offset: timedelta | None = None
    margin_s: float = 0.0

    def __post_init__(self) -> None:
        check_policy(self.policy, True)
        if (self.time_of_day is None) == (self.offset is None):
            raise ConfigurationError(
                "DeadlineSpec needs exactly one of time_of_day (with timezone) and offset; "
                "build it with DeadlineSpec.parse('06:30 Europe/Berlin' or 'PT4H', policy)."
            )
        if self.time_of_day is not None and not self.timezone:
            raise ConfigurationError(
                "DeadlineSpec.time_of_day needs a timezone, e.g. 'Europe/Berlin' or 'UTC'."
            )
        if self.offset is not None and self.offset <= timedelta(0):
            raise ConfigurationError(
                f"deadline offset {self.offset} is not positive; give a duration after the start."
            )
        if self.margin_s < 0:
            raise ConfigurationError(f"deadline margin {self.margin_s}s is negative; give 0 or more seconds.")

    @classmethod
    def parse(
        cls, when: str | timedelta | DeadlineSpec, policy: str | None, margin_s: float = 0.0
    ) -> DeadlineSpec:
        """Build a spec from the forms a DAG writes (see the module docstring).

        :param when: ``"HH:MM[:SS] <timezone>"``, an ISO 8601 duration, a timedelta, or a spec
            (returned as is when ``policy`` is ``None`` or the same)
        :param policy: ``sync_fallback``, ``publish_pending`` or ``skip``; required
        :param margin_s: seconds before the deadline at which waiting stops
        :raises ConfigurationError: the value cannot be read, or the policy is missing or unknown
        """
        if isinstance(when, DeadlineSpec):
            if policy is not None and policy != when.policy:
                raise ConfigurationError(
                    f"deadline spec says policy {when.policy!r} but deadline_policy={policy!r}; give one."
                )
            return when
        checked = check_policy(policy, True)
        assert checked is not None
        if isinstance(when, timedelta):
            return cls(checked, offset=when, margin_s=margin_s)
        if not isinstance(when, str) or not when.strip():
            raise ConfigurationError(
                f"deadline {when!r} cannot be read; give '06:30 Europe/Berlin', an ISO 8601 duration "
                "such as 'PT4H', or a timedelta."
            )
        text = when.strip()
        match = _TIME_OF_DAY.match(text)
        if match:
            hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"] or 0)
            if hour > 23 or minute > 59 or second > 59:
                raise ConfigurationError(
                    f"deadline {when!r}: {hour:02d}:{minute:02d}:{second:02d} is not a time of day."
                )
            zone = match["tz"]
            _zone(zone, when)
            return cls(checked, time_of_day=time(hour, minute, second), timezone=zone, margin_s=margin_s)
        if text.upper().startswith("P"):
            import pendulum

            try:
                parsed = pendulum.parse(text)
            except Exception as exc:  # pendulum raises its own ParserError
                raise ConfigurationError(
                    f"deadline {when!r} is not an ISO 8601 duration ({exc}); e.g. 'PT4H'."
                ) from exc
            if not isinstance(parsed, timedelta):
                raise ConfigurationError(f"deadline {when!r} is not a duration; e.g. 'PT4H' or 'PT30M'.")
            return cls(checked, offset=timedelta(seconds=parsed.total_seconds()), margin_s=margin_s)
        raise ConfigurationError(
            f"deadline {when!r} cannot be read; give a time of day with its timezone ('06:30 Europe/Berlin', "
            "'23:00 UTC') or an ISO 8601 duration after the run's start ('PT4H')."
        )

    def resolve(self, run_start: datetime, logical_date: datetime | None = None) -> datetime:
        """Return the deadline of one run as an aware datetime (UTC).

        :param run_start: when the run started (aware); anchors an offset
        :param logical_date: when the run was due (aware); anchors a time of day (default
            ``run_start``)
        :raises ConfigurationError: a naive datetime was given
        """
        for name, value in (("run_start", run_start), ("logical_date", logical_date)):
            if value is not None and value.tzinfo is None:
                raise ConfigurationError(
                    f"DeadlineSpec.resolve: {name}={value} is naive; pass an aware datetime."
                )
        import pendulum

        if self.offset is not None:
            return pendulum.instance(run_start).in_tz("UTC") + self.offset
        assert self.time_of_day is not None and self.timezone is not None
        anchor = pendulum.instance(logical_date or run_start).in_tz(self.timezone)
        t = self.time_of_day
        candidate = anchor.set(hour=t.hour, minute=t.minute, second=t.second, microsecond=0)
        if candidate <= anchor:
            candidate = candidate.add(days=1).set(hour=t.hour, minute=t.minute, second=t.second)
        return candidate.in_tz("UTC")

    def stop_at(self, deadline: datetime) -> datetime:
        """Return when waiting stops: ``deadline`` minus the margin.

        :param deadline: the resolved deadline
        """
        return deadline - timedelta(seconds=self.margin_s)

    def describe(self) -> str:
        """Words for logs and the Airflow UI."""
        if self.offset is not None:
            when = f"{self.offset} after the run's start"
        else:
            assert self.time_of_day is not None
            when = f"{self.time_of_day.isoformat()} {self.timezone}"
        margin = f" (stop waiting {self.margin_s:g}s before)" if self.margin_s else ""
        return f"deadline {when}{margin}, then {self.policy}"

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (for operator arguments and XCom)."""
        return {
            "policy": self.policy,
            "time_of_day": self.time_of_day.isoformat() if self.time_of_day else None,
            "timezone": self.timezone,
            "offset_s": self.offset.total_seconds() if self.offset is not None else None,
            "margin_s": self.margin_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeadlineSpec:
        """Rebuild from :meth:`to_dict`.

        :param data: the dict
        """
        return cls(
            policy=data["policy"],
            time_of_day=time.fromisoformat(data["time_of_day"]) if data.get("time_of_day") else None,
            timezone=data.get("timezone"),
            offset=timedelta(seconds=float(data["offset_s"])) if data.get("offset_s") is not None else None,
            margin_s=float(data.get("margin_s") or 0.0),
        )


def _zone(name: str, when: str) -> None:
    import pendulum

    try:
        pendulum.timezone(name)
    except Exception as exc:  # pendulum raises InvalidTimezone / ZoneInfoNotFoundError
        raise ConfigurationError(
            f"deadline {when!r}: unknown timezone {name!r}; use an IANA name such as 'Europe/Berlin' or 'UTC'."
        ) from exc


def deadline_passed(deadline: datetime | str | None, margin_s: float, now: datetime) -> bool:
    """Say whether waiting should have stopped by ``now``.

    :param deadline: the resolved deadline (aware datetime or ISO string); ``None``: never
    :param margin_s: seconds before the deadline at which waiting stops
    :param now: the current time (aware)
    """
    if deadline is None or deadline == "":
        return False
    if isinstance(deadline, str):
        deadline = datetime.fromisoformat(deadline)
    return now >= deadline - timedelta(seconds=margin_s)
