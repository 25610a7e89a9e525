"""Metrics through Airflow's ``Stats`` (StatsD or OpenTelemetry, as ``[metrics]`` configures it).

Names start with ``batch_provider.``; the dimension that has a small, fixed vocabulary (a state, a
route, a token kind) is part of the name, so plain StatsD keeps it; the workload and provider go in
tags (DogStatsD, StatsD with InfluxDB tags, OpenTelemetry). Money is counted in micro-dollars
(StatsD counters are integers); per-run figures are gauges in dollars.

=============================================  =======  =============================================
name                                           type     when
=============================================  =======  =============================================
``batch_provider.items.<state>``               counter  a run publishes: its items by final state
``batch_provider.routes.<route>``              counter  a run publishes: items by route
``batch_provider.cost.micro_usd``              counter  a run publishes: what it paid
``batch_provider.tokens.<kind>``               counter  a run publishes: input, output, cached, cache write
``batch_provider.run.cost_per_usable_result``  gauge    a run publishes (USD)
``batch_provider.run.savings``                 gauge    a run publishes (USD)
``batch_provider.batches.<state>``             counter  a provider batch reaches a final state
``batch_provider.poll_errors``                 counter  a status poll fails (tag ``kind``)
``batch_provider.fallback.requests``           counter  a synchronous fallback request is sent
``batch_provider.fallback.rate_limited``       counter  one is answered 429
``batch_provider.alerts.<kind>``               counter  an alert event is raised (sent or not)
=============================================  =======  =============================================

A figure that is missing or not a number is left out, never raised: a metric must not fail a task.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

log = logging.getLogger(__name__)

PREFIX: Final = "batch_provider"
_NAME_PART = re.compile(r"[^a-z0-9_]+")
TOKEN_KINDS: Final = {
    "input_tokens": "input",
    "output_tokens": "output",
    "cached_input_tokens": "cached_input",
    "cache_write_tokens": "cache_write",
}


def _part(value: str) -> str:
    """A safe metric-name segment: lower case, ``[a-z0-9_]`` only."""
    return _NAME_PART.sub("_", value.lower()).strip("_") or "unknown"


def _tags(**tags: str | None) -> dict[str, str]:
    return {k: str(v) for k, v in tags.items() if v}


def _decimal(value: Any) -> Decimal | None:
    try:
        return None if value is None else Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _incr(name: str, count: int = 1, **tags: str | None) -> None:
    from airflow.sdk.observability import stats

    if count > 0:
        stats.incr(f"{PREFIX}.{name}", count, tags=_tags(**tags))


def _gauge(name: str, value: float, **tags: str | None) -> None:
    from airflow.sdk.observability import stats

    stats.gauge(f"{PREFIX}.{name}", value, tags=_tags(**tags))


def record_run(report: Mapping[str, Any], *, workload: str, provider: str | None) -> None:
    """Count a published run: items by final state and route, cost, tokens; gauge its unit cost.

    :param report: the cost report (``CostReport.to_dict()``)
    :param workload: the workload (a tag)
    :param provider: the provider (a tag)
    """
    for state, n in (report.get("items_by_state") or {}).items():
        _incr(f"items.{_part(state)}", _int(n), workload=workload, provider=provider)
    for route, n in (report.get("items_by_route") or {}).items():
        _incr(f"routes.{_part(route)}", _int(n), workload=workload, provider=provider)
    paid = _decimal(report.get("paid"))
    if paid is not None:
        _incr(
            "cost.micro_usd",
            int((paid * 1_000_000).to_integral_value()),
            workload=workload,
            provider=provider,
        )
    for key, kind in TOKEN_KINDS.items():
        _incr(
            f"tokens.{kind}",
            _int((report.get("usage") or {}).get(key)),
            workload=workload,
            provider=provider,
        )
    for key, name in (("cost_per_usable_result", "run.cost_per_usable_result"), ("savings", "run.savings")):
        value = _decimal(report.get(key))
        if value is not None:
            _gauge(name, float(value), workload=workload, provider=provider)


def record_batch(state: str, *, workload: str, provider: str) -> None:
    """Count a provider batch that reached a final state (``completed``, ``failed``, ``expired``...).

    :param state: the batch's final state
    :param workload: the workload (a tag)
    :param provider: the provider (a tag)
    """
    _incr(f"batches.{_part(state)}", workload=workload, provider=provider)


def record_poll_error(kind: str, *, workload: str, provider: str) -> None:
    """Count a failed status poll.

    :param kind: what failed (an exception class name or an HTTP status)
    :param workload: the workload (a tag)
    :param provider: the provider (a tag)
    """
    _incr("poll_errors", workload=workload, provider=provider, kind=_part(kind))


def record_fallback_request(status: int | None, *, workload: str, provider: str) -> None:
    """Count a synchronous fallback request, and a 429 among them.

    :param status: the HTTP status answered (``None``: no answer)
    :param workload: the workload (a tag)
    :param provider: the provider (a tag)
    """
    _incr("fallback.requests", workload=workload, provider=provider)
    if status == 429:
        _incr("fallback.rate_limited", workload=workload, provider=provider)


def record_alert(kind: str) -> None:
    """Count an alert event (whether or not a notifier is set).

    :param kind: the event's kind
    """
    _incr(f"alerts.{_part(kind)}")
