"""What the pages show of deliveries: per sink and consumer counts of a run, and the rows a sink refused.

Kept apart from :mod:`airflow_batch_provider.plugins.view` (the run and review figures); the
templates show them through ``deliveries.html``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_batch_provider.plugins.view import iso


def refused_delivery_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The refused rows of :func:`~airflow_batch_provider.ledger.deliveries.refused_rows`, JSON-safe.

    :param rows: the ledger's rows
    """
    return [
        {
            "sink": r["sink"],
            "app_id": r["app_id"],
            "prompt_version": r["prompt_version"],
            "error": r["error"],
            "run_id": r["run_id"],
            "since": iso(r["delivered_at"]),
        }
        for r in rows
    ]


def _entries(report: Mapping[str, Any] | None, consumers: bool) -> list[tuple[str, Mapping[str, Any]]]:
    found = (report or {}).get("deliveries")
    if not isinstance(found, Mapping):
        return []
    return [
        (str(name), c)
        for name, c in sorted(found.items())
        if isinstance(c, Mapping) and (c.get("kind") == "consumer") == consumers
    ]


def delivery_table(report: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A run's deliveries per sink from its report: delivered, unchanged, refused (sinks by name).

    :param report: the run's stored report (``None``: not published)
    """
    return [
        {
            "sink": sink,
            "delivered": int(c.get("delivered", 0)),
            "unchanged": int(c.get("unchanged", 0)),
            "refused": int(c.get("refused", 0)),
        }
        for sink, c in _entries(report, consumers=False)
    ]


def consumer_table(report: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A run's hand-offs per consumer from its report: acted, already acknowledged, left out, failed.

    :param report: the run's stored report (``None``: not published)
    """
    return [
        {
            "consumer": name,
            "acted": int(c.get("acted", 0)),
            "already_acknowledged": int(c.get("already_acknowledged", 0)),
            "left_out": int(c.get("left_out", 0)),
            "failed": int(c.get("failed", 0)),
        }
        for name, c in _entries(report, consumers=True)
    ]
