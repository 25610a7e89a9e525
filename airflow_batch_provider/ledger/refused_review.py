"""Rows a sink refused, as entries of the review queue's listing (``airflow-batch review list``).

The item of a refused row stays ``succeeded`` (its answer is fine, and a finished run must not
change), so the review queue's items do not hold it; the listing adds it with the error code
:data:`SINK_REFUSED` and the sink's message, as the review page and ``/api/review`` show it, until
a later delivery writes the row (:func:`~airflow_batch_provider.ledger.deliveries.refused_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from airflow_batch_provider.ledger.deliveries import refused_rows
from airflow_batch_provider.ledger.store import Ledger

#: The error code a refused row is listed under (``review list --error-code sink_refused``).
SINK_REFUSED: Final = "sink_refused"


@dataclass(frozen=True)
class RefusedRow:
    """One row a sink refused, listed beside the review queue's items.

    :param item_key: the item's ledger key
    :param prompt_version: the prompt version of the refused answer
    :param app_id: the application id
    :param error_code: :data:`SINK_REFUSED`
    :param run_id: the run whose delivery was refused
    :param sink: the sink's name
    :param error_message: the sink's message
    :param since: when the sink refused it
    """

    item_key: str
    prompt_version: str
    app_id: str
    error_code: str
    run_id: str
    sink: str
    error_message: str
    since: datetime


def refused_review_rows(
    ledger: Ledger, workload: str, error_code: str | None = None, limit: int = 100
) -> list[RefusedRow]:
    """The rows a sink refused that no later delivery wrote, newest first.

    :param ledger: the ledger
    :param workload: workload name
    :param error_code: only rows listed under this code (anything but :data:`SINK_REFUSED`: none)
    :param limit: at most this many
    """
    if error_code not in (None, SINK_REFUSED):
        return []
    return [
        RefusedRow(
            item_key=r["item_key"],
            prompt_version=r["prompt_version"],
            app_id=r["app_id"],
            error_code=SINK_REFUSED,
            run_id=r["run_id"],
            sink=r["sink"],
            error_message=r["error"] or "",
            since=r["delivered_at"],
        )
        for r in refused_rows(ledger, workload, limit)
    ]
