"""The answers a delivery reads: a run's published final answers, a page at a time, with the sink's record.

The answers are the run's rows of ``abp_results`` (states ``succeeded`` and ``unchanged``); each
comes with what the sink was last given for it (its ``abp_deliveries`` row's state and digest),
so that the delivery leaves out what the sink holds already.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import text

from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import keys_by_version
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

    Both reads are plain SQL on the driver's own markers: a page's thousand keys rendered and
    bound by SQLAlchemy cost more than the rest of the read.

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's name
    :param run_id: the run whose published answers are delivered
    :param page: answers per page
    """
    mark = "?" if ledger.engine.dialect.paramstyle == "qmark" else "%s"
    usable = ", ".join(f"'{state}'" for state in sorted(USABLE_STATES))
    answers = (
        f"SELECT item_key, prompt_version, app_id, state, output_json FROM {s.published.name} "
        f"WHERE workload = {mark} AND run_id = {mark} AND state IN ({usable}){{after}} "
        f"ORDER BY item_key, prompt_version LIMIT {int(page)}"
    )
    first, later = (
        answers.format(after=""),
        answers.format(after=f" AND (item_key, prompt_version) > ({mark}, {mark})"),
    )
    records = (
        f"SELECT app_id, prompt_version, state, result_sha256 FROM {s.deliveries.name} "
        f"WHERE workload = {mark} AND sink = {mark} AND ({{pairs}})"
    )
    after: tuple[str, str] | None = None
    read, analyzed, table_rows = 0, -1, 0
    while True:
        if ledger.engine.dialect.name == "postgresql" and (
            analyzed < 0 or read - analyzed >= max(page, table_rows)
        ):
            table_rows, analyzed = _analyze(ledger), read
        with ledger.engine.connect() as conn:
            if after is None:
                rows = conn.exec_driver_sql(first, (workload, run_id)).all()
            else:
                rows = conn.exec_driver_sql(later, (workload, run_id, *after)).all()
            if not rows:
                return
            # pair_filter's shape (version = v AND app_id IN (...) per version), on the driver's markers
            by_version = keys_by_version((app_id, version) for _, version, app_id, _, _ in rows)
            pairs = " OR ".join(
                f"(prompt_version = {mark} AND app_id IN ({', '.join([mark] * len(ids))}))"
                for ids in by_version.values()
            )
            params: list[str] = [workload, sink]
            for version, ids in by_version.items():
                params.append(version)
                params.extend(ids)
            found = conn.exec_driver_sql(records.format(pairs=pairs), tuple(params))
            held = {(app_id, version): (state, sha) for app_id, version, state, sha in found}
        yield [
            Candidate(
                key,
                app_id,
                version,
                state,
                _parsed(out) if out else None,
                *held.get((app_id, version), (None, None)),
            )
            for key, version, app_id, state, out in rows
        ]
        if len(rows) < page:
            return
        read += len(rows)
        after = (rows[-1][0], rows[-1][1])


#: The C scanner of the standard JSON decoder: a stored answer (compact JSON, as the package
#: writes it) parsed without ``json.loads``' whitespace checks around it.
_SCAN: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # (typeshed: the class)


def _parsed(text_: str) -> Any:
    """A stored answer's JSON, parsed (``json.loads`` where it is not compact JSON from the first character)."""
    try:
        value, end = _SCAN(text_, 0)
    except StopIteration:
        return json.loads(text_)
    return value if end == len(text_) else json.loads(text_)


def _analyze(ledger: Ledger) -> int:
    """PostgreSQL: refresh the planner's statistics on ``abp_deliveries``; return its rows as counted."""
    with ledger.engine.begin() as conn:
        conn.execute(text(f"ANALYZE {s.deliveries.name}"))
        found = conn.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = CAST(:name AS regclass)"),
            {"name": s.deliveries.name},
        ).scalar()
    return max(0, int(found or 0))
