"""What a run keeps (its prompt) and what it owns against the other runs of its workload.

A run keeps what it started with: prepare records its connection (``abp_runs.batch_conn_id``)
and its prompt (``abp_runs.prompt_version`` and ``prompt_sha256``, the content's digest); a later
task of the run that renders another one refuses. A finished run (publish recorded its report,
``abp_runs.finished_at``) that a later run followed is history, and an item a newer run owns is
never taken back by an older run's rerun; the workload's newest run, its prepare cleared, is
reopened (:func:`reopen_newest_run`). SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, select

from airflow_batch_provider.ledger import schema as s

if TYPE_CHECKING:
    from airflow_batch_provider.ledger.store import Ledger


@dataclass(frozen=True)
class RunPrompt:
    """The prompt a run started with.

    :param version: the prompt's version
    :param sha256: the digest of the prompt's content (:attr:`PromptTemplate.fingerprint`)
    """

    version: str
    sha256: str


def _key(workload: str, run_id: str) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    return (s.runs.c.workload == workload, s.runs.c.run_id == run_id)


def record_run_prompt(ledger: Ledger, workload: str, run_id: str, prompt: RunPrompt) -> RunPrompt | None:
    """Record the prompt a run starts with, once; return the one it started with.

    The first call records ``prompt``; a later one never changes it. ``None``: the run was not
    started (:meth:`Ledger.start_run` records it first).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param prompt: the prompt as this task renders it
    """
    c = s.runs.c
    with ledger.engine.begin() as conn:
        conn.execute(
            s.runs.update()
            .where(*_key(workload, run_id), c.prompt_sha256.is_(None))
            .values(prompt_version=prompt.version, prompt_sha256=prompt.sha256)
        )
    return run_prompt(ledger, workload, run_id)  # the first one recorded, by this call or another


def run_prompt(ledger: Ledger, workload: str, run_id: str) -> RunPrompt | None:
    """The prompt a run started with (``None``: no such run, or none recorded).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    c = s.runs.c
    with ledger.engine.connect() as conn:
        found = conn.execute(select(c.prompt_version, c.prompt_sha256).where(*_key(workload, run_id))).first()
    if found is None or found.prompt_sha256 is None:
        return None
    return RunPrompt(str(found.prompt_version), str(found.prompt_sha256))


@dataclass(frozen=True)
class FinishedRun:
    """A run publish finished: when, and the report it recorded.

    :param finished_at: when publish recorded the report
    :param report: the report (JSON-safe)
    """

    finished_at: datetime
    report: Mapping[str, Any]


def finished_run(ledger: Ledger, workload: str, run_id: str) -> FinishedRun | None:
    """The run as publish finished it (``None``: the run is not finished).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    c = s.runs.c
    with ledger.engine.connect() as conn:
        found = conn.execute(
            select(c.finished_at, c.report_json).where(*_key(workload, run_id), c.report_json.is_not(None))
        ).first()
    if found is None or found.finished_at is None:
        return None
    return FinishedRun(found.finished_at, json.loads(found.report_json))


def reopen_newest_run(ledger: Ledger, workload: str, run_id: str) -> bool:
    """Take a finished run back to unfinished when no run of the workload started after it.

    Airflow's clear of a run's prepare starts the run again: when it is the workload's newest
    run, its cleared prepare re-reads the input (a record fixed after its review is prepared
    again) and its publish writes the report again (the one it recorded stays until then). A
    finished run that a later run followed is history and stays finished. One statement, so two
    prepares of runs of the workload agree on which is newest.

    ``True``: the run was finished and is now unfinished.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    c = s.runs.c
    later = s.runs.alias("later")
    followed = (
        select(later.c.run_id).where(later.c.workload == workload, later.c.started_at > c.started_at).exists()
    )
    with ledger.engine.begin() as conn:
        moved = conn.execute(
            s.runs.update()
            .where(*_key(workload, run_id), c.finished_at.is_not(None), ~followed)
            .values(finished_at=None)
        )
    return bool(moved.rowcount == 1)


def newer_runs(conn: Connection, workload: str, run_id: str, others: Collection[str]) -> set[str]:
    """Of ``others``, the runs of the workload that started after ``run_id`` did.

    An item such a run owns is not taken by ``run_id`` (a rerun of an older run). ``run_id`` not
    recorded: none (it is the newest).

    :param conn: an open connection
    :param workload: workload name
    :param run_id: the run asking
    :param others: run ids owning items the run asks about
    """
    wanted = sorted(set(others) - {run_id})
    if not wanted:
        return set()
    c = s.runs.c
    started = conn.execute(select(c.started_at).where(*_key(workload, run_id))).scalar()
    if started is None:
        return set()
    q = select(c.run_id).where(c.workload == workload, c.run_id.in_(wanted), c.started_at > started)
    return {str(r) for r in conn.execute(q).scalars()}
