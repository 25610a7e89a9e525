"""Billed result lines beyond an item's one answer (table ``abp_extra_lines``, schema version 4).

The attempts table holds one line per item and job: the answer the item keeps. A provider bills
lines besides it: a second copy with another answer, an error line with usage for an item whose
success is kept, a damaged line whose usage cannot be read. Reconcile records them here so that
the report prices every billed line (see :mod:`airflow_batch_provider.services.result_lines`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal

from sqlalchemy import RowMapping, delete, select

from airflow_batch_provider.core.money import from_nusd, to_nusd
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import Ledger

ExtraKind = Literal["duplicate", "superseded", "unreadable"]
EXTRA_KINDS: Final[tuple[str, ...]] = ("duplicate", "superseded", "unreadable")


@dataclass(frozen=True)
class ExtraLine:
    """One billed line beyond the item's answer.

    :param ordinal: the line's 0-based number in the job's files, in reading order
    :param custom_id: the custom id, when it could be read
    :param kind: ``duplicate``, ``superseded`` or ``unreadable``
    :param usage: its tokens (an estimate when ``estimated``)
    :param cost: its price at the batch rate
    :param estimated: the tokens are an estimate from the item's request (the line's own usage was
        unreadable)
    """

    ordinal: int
    custom_id: str | None
    kind: ExtraKind
    usage: Usage
    cost: Decimal
    estimated: bool = False


def record_extra_lines(ledger: Ledger, job_id: str, lines: Sequence[ExtraLine]) -> None:
    """Replace a job's extra lines with ``lines`` (one transaction; a rerun writes the same rows).

    :param ledger: the ledger
    :param job_id: the job whose files were read
    :param lines: every extra line of the job's files
    """
    job = ledger.get_job(job_id)
    rows = [
        {
            "job_id": job_id,
            "ordinal": line.ordinal,
            "workload": job.workload,
            "run_id": job.run_id,
            "custom_id": line.custom_id,
            "kind": line.kind,
            "estimated": line.estimated,
            "input_tokens": line.usage.input_tokens,
            "output_tokens": line.usage.output_tokens,
            "cached_input_tokens": line.usage.cached_input_tokens,
            "cache_write_tokens": line.usage.cache_write_tokens,
            "cost_nusd": to_nusd(line.cost),
        }
        for line in lines
    ]
    with ledger.engine.begin() as conn:
        conn.execute(delete(s.extra_lines).where(s.extra_lines.c.job_id == job_id))
        if rows:
            conn.execute(s.extra_lines.insert(), rows)


def iter_extra_lines(ledger: Ledger, workload: str, run_id: str) -> Iterator[dict[str, Any]]:
    """Yield the run's extra lines with their job's provider and model, in job and line order.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    x, j = s.extra_lines, s.jobs
    query = (
        select(x, j.c.provider, j.c.model)
        .join(j, j.c.job_id == x.c.job_id)
        .where(x.c.workload == workload, x.c.run_id == run_id)
        .order_by(x.c.job_id, x.c.ordinal)
    )
    with ledger.engine.connect() as conn:
        for row in conn.execute(query).mappings():
            yield {
                **_row(row),
                "provider": row["provider"],
                "model": row["model"],
            }


def _row(row: RowMapping) -> dict[str, Any]:
    return {
        "job_id": row["job_id"],
        "ordinal": row["ordinal"],
        "custom_id": row["custom_id"],
        "kind": row["kind"],
        "estimated": bool(row["estimated"]),
        "usage": Usage(
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            cached_input_tokens=int(row["cached_input_tokens"]),
            cache_write_tokens=int(row["cache_write_tokens"]),
        ),
        "cost": from_nusd(int(row["cost_nusd"])),
    }


def request_json_of(ledger: Ledger, job_id: str, custom_ids: Sequence[str] | None) -> dict[str, str]:
    """The recorded request (JSON text) of the job's lines, by custom id.

    :param ledger: the ledger
    :param job_id: the job
    :param custom_ids: the lines wanted (``None``: every line of the job)
    """
    a, i = s.attempts, s.items
    query = (
        select(a.c.custom_id, i.c.request_json)
        .join(
            i,
            (i.c.workload == a.c.workload)
            & (i.c.item_key == a.c.item_key)
            & (i.c.prompt_version == a.c.prompt_version),
        )
        .where(a.c.job_id == job_id)
    )
    if custom_ids is not None:
        query = query.where(a.c.custom_id.in_(list(custom_ids)))
    with ledger.engine.connect() as conn:
        return {str(cid): str(req) for cid, req in conn.execute(query)}
