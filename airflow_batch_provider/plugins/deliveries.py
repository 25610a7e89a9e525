"""What the pages show of deliveries: per sink counts of a run, and the rows a sink refused (JSON-safe).

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


def delivery_table(report: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A run's deliveries per sink from its report: delivered, unchanged, refused (sinks by name).

    :param report: the run's stored report (``None``: not published)
    """
    found = (report or {}).get("deliveries")
    if not isinstance(found, Mapping):
        return []
    return [
        {
            "sink": str(sink),
            "delivered": int(c.get("delivered", 0)),
            "unchanged": int(c.get("unchanged", 0)),
            "refused": int(c.get("refused", 0)),
        }
        for sink, c in sorted(found.items())
        if isinstance(c, Mapping)
    ]
