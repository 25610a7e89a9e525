"""A workload's published answers, read by another workload (``WorkloadSource``, chaining).

Which answers: those the workload's newest finished run published. Publish copies every item of
its run into ``abp_results`` (a row per item and prompt version, its ``run_id`` the run's), and a
finished run's report marks the copy complete (``abp_runs.finished_at``). So the rows of the newest
finished run are the latest published answer of every item of its input, under the prompt version
it ran with: an item that left the input keeps an older run's row and is not read, nor is an
answer of an older prompt version. Of those rows only the answers (``succeeded``, ``unchanged``)
are read; an item in review, failed or left pending has none.

A run that started after it and has rows in the table without being finished is publishing now
(or its publish stopped part-way, or it was reopened): the newest finished run's rows are then
partly replaced, and :func:`runs_publishing_after` names it so that the reader refuses rather
than read half of each. SQLite and PostgreSQL alike; no Airflow here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import and_, func, select

from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import keyset_pages
from airflow_batch_provider.ledger.store import Ledger

#: Answers per query (a keyset page on the run's results index).
PAGE: Final = 1000


@dataclass(frozen=True)
class PublishedRun:
    """The run whose published answers a chained workload reads.

    :param workload: the workload
    :param run_id: the run
    :param prompt_version: the prompt version it ran with (``None``: not recorded)
    :param started_at: when its prepare started it
    :param finished_at: when its publish finished it
    """

    workload: str
    run_id: str
    prompt_version: str | None
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class Answer:
    """One published answer.

    :param item_key: the item's ledger key
    :param app_id: its application id
    :param prompt_version: the prompt version that answered
    :param state: ``succeeded`` or ``unchanged`` (an earlier success kept)
    :param output: the parsed answer
    """

    item_key: str
    app_id: str
    prompt_version: str
    state: str
    output: Any


def latest_published_run(ledger: Ledger, workload: str) -> PublishedRun | None:
    """The workload's newest finished run (by start), or ``None`` when none has finished.

    :param ledger: the ledger
    :param workload: the workload
    """
    r = s.runs.c
    q = (
        select(r.run_id, r.prompt_version, r.started_at, r.finished_at)
        .where(r.workload == workload, r.finished_at.is_not(None), r.report_json.is_not(None))
        .order_by(r.started_at.desc(), r.run_id.desc())
        .limit(1)
    )
    with ledger.engine.connect() as conn:
        row = conn.execute(q).first()
    if row is None:
        return None
    return PublishedRun(workload, str(row.run_id), row.prompt_version, row.started_at, row.finished_at)


def runs_publishing_after(ledger: Ledger, run: PublishedRun) -> list[str]:
    """Runs of the workload that started after ``run``, are not finished and have published rows.

    :param ledger: the ledger
    :param run: the newest finished run
    """
    r, p = s.runs.c, s.published.c
    has_rows = select(p.run_id).where(and_(p.workload == r.workload, p.run_id == r.run_id)).limit(1).exists()
    q = (
        select(r.run_id)
        .where(r.workload == run.workload, r.finished_at.is_(None), r.started_at > run.started_at, has_rows)
        .order_by(r.started_at)
    )
    with ledger.engine.connect() as conn:
        return [str(v) for v in conn.execute(q).scalars()]


def workloads_with_answers(ledger: Ledger, limit: int = 20) -> list[str]:
    """Workloads that have a finished run, by name (for a message that names what could be read).

    :param ledger: the ledger
    :param limit: at most this many
    """
    r = s.runs.c
    q = select(r.workload).where(r.finished_at.is_not(None)).distinct().order_by(r.workload).limit(limit)
    with ledger.engine.connect() as conn:
        return [str(v) for v in conn.execute(q).scalars()]


def published_states(ledger: Ledger, run: PublishedRun) -> dict[str, int]:
    """How many of the run's published rows are in each state.

    :param ledger: the ledger
    :param run: the run
    """
    p = s.published.c
    q = (
        select(p.state, func.count())
        .where(p.workload == run.workload, p.run_id == run.run_id)
        .group_by(p.state)
    )
    with ledger.engine.connect() as conn:
        return {str(state): int(n) for state, n in conn.execute(q)}


def iter_answers(ledger: Ledger, run: PublishedRun, page: int = PAGE) -> Iterator[Answer]:
    """Yield the run's published answers in item key order, ``page`` rows per query (keyset).

    Each page is its own short read: the reader holds one page, never the whole run.

    :param ledger: the ledger
    :param run: the run whose answers are read
    :param page: rows per query
    """
    p = s.published.c
    query = select(p.item_key, p.prompt_version, p.app_id, p.state, p.output_json).where(
        p.workload == run.workload, p.run_id == run.run_id, p.state.in_(sorted(USABLE_STATES))
    )
    for rows in keyset_pages(ledger.engine, query, (p.item_key, p.prompt_version), page):
        for key, version, app_id, state, output_json in rows:
            output = json.loads(output_json) if output_json else None
            yield Answer(str(key), str(app_id), str(version), str(state), output)
