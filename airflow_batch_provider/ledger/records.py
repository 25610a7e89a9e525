"""Typed, frozen rows the ledger hands out, and the job-id rule.

The Airflow glue reads these instead of raw ``RowMapping`` objects: a misspelt column is a type
error, not a ``KeyError`` at 3 a.m. Every datetime is timezone-aware UTC.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from airflow_batch_provider.core.requests import RequestKind

#: Length of the ``job_id`` columns (``abp_jobs``, ``abp_items``, ``abp_attempts``).
JOB_ID_MAX: Final = 250
_HASH_LEN: Final = 16

_R = TypeVar("_R")


def _fit(text: str, budget: int) -> str:
    """``text`` when it fits ``budget``; else a readable prefix, ``~`` and 16 hex of its SHA-256."""
    if len(text) <= budget:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HASH_LEN]
    keep = budget - _HASH_LEN - 1
    return f"{text[:keep]}~{digest}" if keep > 0 else digest[:budget]


def job_id_for(workload: str, run_id: str, round_: int, chunk: int) -> str:
    """The id of one chunk's job: ``<workload>:<run id>:r<round>:c<chunk, 5 digits>``.

    Never longer than 250 characters: when the run id (or, past 120 characters, the workload)
    does not fit, its tail is replaced by ``~`` and 16 hex digits of its SHA-256, so the id stays
    deterministic and distinct per run while its start stays readable.

    :param workload: workload name
    :param run_id: the Airflow run id
    :param round_: the submission round (1 for the first)
    :param chunk: the chunk's index within the round
    """
    return _compose(workload, run_id, f"r{round_}:c{chunk:05d}")


def _compose(workload: str, run_id: str, suffix: str) -> str:
    full = f"{workload}:{run_id}:{suffix}"
    if len(full) <= JOB_ID_MAX:
        return full
    wl = workload if len(workload) + len(suffix) + 2 + _HASH_LEN + 1 <= JOB_ID_MAX else _fit(workload, 120)
    return f"{wl}:{_fit(run_id, JOB_ID_MAX - len(wl) - len(suffix) - 2)}:{suffix}"


def sync_job_id(workload: str, run_id: str) -> str:
    """The job id under which a run's synchronous fallback attempts are recorded (<= 250 chars).

    :param workload: workload name
    :param run_id: the Airflow run id
    """
    return _compose(workload, run_id, "sync")


def _from_mapping(cls: type[_R], row: Mapping[Any, Any]) -> _R:
    return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class JobRow:
    """One row of ``abp_jobs``: a staged chunk and what became of it at the provider.

    ``state`` is one of ``staged``, ``submitting``, ``uploaded``, ``in_doubt``, ``submitted``,
    ``sync``, ``downloaded``, ``reconciled`` (the operators add their own steps). ``claim_*``
    describe the compare-and-set claim for the upload and create calls; ``in_doubt_*`` why a
    create's outcome is unknown; ``input_kind`` and ``input_ref`` what the upload task staged at
    the provider (``None`` until it did).
    """

    job_id: str
    workload: str
    run_id: str
    round: int
    chunk_index: int
    provider: str
    model: str
    kind: RequestKind
    idempotency_key: str
    state: str
    staged_path: str
    input_sha256: str
    lines: int
    size_bytes: int
    input_ref: str | None
    batch_id: str | None
    batch_state: str | None
    output_path: str | None
    error_path: str | None
    result_lines: int
    malformed_lines: int
    duplicate_lines: int
    unknown_lines: int
    missing: int
    error: str | None
    created_at: datetime
    submitted_at: datetime | None
    finished_at: datetime | None
    reconciled_at: datetime | None
    claim_owner: str | None
    claim_count: int
    claim_expires_at: datetime | None
    in_doubt_reason: str | None
    in_doubt_at: datetime | None
    input_kind: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobRow:
        """Build from a mapping with (at least) every column of ``abp_jobs``.

        :param row: a database row
        """
        return _from_mapping(cls, row)

    @property
    def in_doubt(self) -> bool:
        """Whether a create call's outcome is unknown (nothing may be created for it)."""
        return self.state == "in_doubt"


@dataclass(frozen=True)
class ItemRow:
    """One row of ``abp_items``: an input record's current state and last answer."""

    workload: str
    item_key: str
    prompt_version: str
    app_id: str
    model: str
    input_hash: str
    request_json: str
    state: str
    attempts: int
    run_id: str
    job_id: str | None
    custom_id: str | None
    route: str | None
    output_json: str | None
    error_code: str | None
    error_message: str | None
    succeeded_hash: str | None
    review_action: str | None
    review_note: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ItemRow:
        """Build from a mapping with (at least) every column of ``abp_items``.

        :param row: a database row
        """
        return _from_mapping(cls, row)


@dataclass(frozen=True)
class OpenItem:
    """The columns of an ``abp_items`` row that sending it needs (staging, budget, real-time path).

    Read with ``Ledger.iter_item_rows(..., shape=OpenItem)``: only these columns travel.
    """

    item_key: str
    prompt_version: str
    app_id: str
    state: str
    attempts: int
    job_id: str | None
    custom_id: str | None
    error_code: str | None
    request_json: str


@dataclass(frozen=True)
class ItemRef:
    """Which job and line an ``abp_items`` row is on, without its bodies (cheap to stream)."""

    item_key: str
    prompt_version: str
    app_id: str
    state: str
    job_id: str | None
    custom_id: str | None
    error_code: str | None


@dataclass(frozen=True)
class ItemOutcome:
    """What became of an ``abp_items`` row: the columns a run's results file carries."""

    item_key: str
    prompt_version: str
    app_id: str
    state: str
    route: str | None
    output_json: str | None
    error_code: str | None
    error_message: str | None


#: The shapes ``Ledger.iter_item_rows`` reads items as; each one's fields are columns of ``abp_items``.
ITEM_SHAPES: Final = (ItemRow, OpenItem, ItemRef, ItemOutcome)


@dataclass(frozen=True)
class JobClaim:
    """A won claim on a job's create call.

    :param job_id: the job
    :param owner: who holds it (e.g. ``<dag>/<run>/<task>/<try>/<pid>``)
    :param claim_count: how many claims this job has seen, this one included (1: the first)
    :param expires_at: when another owner may take it over
    """

    job_id: str
    owner: str
    claim_count: int
    expires_at: datetime


@dataclass(frozen=True)
class WorkloadLease:
    """The run that holds a workload.

    :param workload: workload name
    :param run_id: the holding Airflow run id
    :param dag_id: its DAG, when known
    :param owner: the task attempt that acquired it
    :param acquired_at: since when this run holds it
    :param taken_over_from: the run it was taken from, when acquired with ``takeover``
    """

    workload: str
    run_id: str
    dag_id: str | None
    owner: str
    acquired_at: datetime
    taken_over_from: str | None = None


@dataclass(frozen=True)
class AuditRow:
    """One person's (or run's) action on the ledger, as kept in ``abp_audit``.

    :param id: sequence number
    :param at: when
    :param actor: who
    :param action: ``redrive``, ``resolve_review``, ``skip_review``, ``resolve_job``,
        ``release_lease``, ``takeover_lease``
    :param workload: workload name
    :param item_count: how many items it moved
    :param target: what it addressed: item keys, a filter, a job id or a run id (JSON)
    :param reason: the reason or note given
    """

    id: int
    at: datetime
    actor: str
    action: str
    workload: str
    item_count: int
    target: str
    reason: str

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> AuditRow:
        """Build from an ``abp_audit`` row.

        :param row: a database row
        """
        return _from_mapping(cls, row)
