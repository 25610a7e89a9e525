"""The answers a delivery reads: a run's published final answers, a page at a time, with the sink's record.

The answers are the run's rows of ``abp_results`` (states ``succeeded`` and ``unchanged``); each
comes with what the sink was last given for it (its ``abp_deliveries`` row's state and digest),
so that the delivery leaves out what the sink holds already.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text, tuple_

from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import pair_filter
from airflow_batch_provider.ledger.store import Ledger

#: Answers per page, unless the caller says otherwise (a sink reads a page per batch).
PAGE = 1000


@dataclass(frozen=True)
class Candidate:
    """A published final answer of the run, with what the sink holds of it.

    :param item_key: the item's ledger key
    :param app_id: the application id
    :param prompt_version: the prompt version of the answer
    :param state: ``succeeded`` or ``unchanged``
    :param output: the parsed answer (``None`` when it has none)
    :param recorded_state: the delivery row's state (``None``: never delivered)
    :param recorded_sha256: the digest of the values the sink was last given
    """

    item_key: str
    app_id: str
    prompt_version: str
    state: str
    output: Any
    recorded_state: str | None
    recorded_sha256: str | None


def candidate_pages(
    ledger: Ledger, workload: str, sink: str, run_id: str, page: int = PAGE
) -> Iterator[list[Candidate]]:
    """Yield the run's published final answers in key order, ``page`` at a time, with the sink's record.

    Each page is two reads: the run's next answers (a keyset on ``ix_abp_results_run``), then the
    sink's records of those answers by their primary key. (One outer join reads the same, but
    PostgreSQL's planner, without statistics on ``abp_deliveries``, joins each answer through
    ``ix_abp_deliveries_run`` and walks every record of the sink for it.) On PostgreSQL the
    statistics are refreshed before the first page and each time the pages read since have
    doubled the table (a first delivery fills it faster than autovacuum looks), so that a page's
    records are read by their key, not by scanning the sink's.

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's name
    :param run_id: the run whose published answers are delivered
    :param page: answers per page
    """
    r, d = s.published.c, s.deliveries.c
    answers = (
        select(r.item_key, r.prompt_version, r.app_id, r.state, r.output_json)
        .where(r.workload == workload, r.run_id == run_id, r.state.in_(sorted(USABLE_STATES)))
        .order_by(r.item_key, r.prompt_version)
        .limit(page)
    )
    records = select(d.app_id, d.prompt_version, d.state, d.result_sha256).where(
        d.workload == workload, d.sink == sink
    )
    after: tuple[str, str] | None = None
    read, analyzed, table_rows = 0, -1, 0
    while True:
        if ledger.engine.dialect.name == "postgresql" and (
            analyzed < 0 or read - analyzed >= max(page, table_rows)
        ):
            table_rows, analyzed = _analyze(ledger), read
        q = answers if after is None else answers.where(tuple_(r.item_key, r.prompt_version) > tuple_(*after))
        with ledger.engine.connect() as conn:
            rows = conn.execute(q).all()
            if not rows:
                return
            pairs = [(app_id, version) for _, version, app_id, _, _ in rows]
            found = conn.execute(records.where(pair_filter(d.app_id, d.prompt_version, pairs)))
            held = {(app_id, version): (state, sha) for app_id, version, state, sha in found}
        yield [
            Candidate(
                key,
                app_id,
                version,
                state,
                json.loads(out) if out else None,
                *held.get((app_id, version), (None, None)),
            )
            for key, version, app_id, state, out in rows
        ]
        if len(rows) < page:
            return
        read += len(rows)
        after = (rows[-1][0], rows[-1][1])


def _analyze(ledger: Ledger) -> int:
    """PostgreSQL: refresh the planner's statistics on ``abp_deliveries``; return its rows as counted."""
    with ledger.engine.begin() as conn:
        conn.execute(text(f"ANALYZE {s.deliveries.name}"))
        found = conn.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = CAST(:name AS regclass)"),
            {"name": s.deliveries.name},
        ).scalar()
    return max(0, int(found or 0))
