"""Staging one round: write a run's items into chunk files and record one job per chunk (the intent).

No Airflow context here: the operators pass the ledger, the adapter, the staging area and the ids.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.core.chunking import Chunker, ChunkInfo, Placed
from airflow_batch_provider.core.hashing import short_hash
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.exceptions import ItemError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow, OpenItem, job_id_for
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)

#: The error code an item gets when its batch failed for the provider's enqueued-token limit.
TOKEN_LIMIT = "token_limit_exceeded"


def job_manifest(job: JobRow) -> dict[str, Any]:
    """The small dict that travels through XCom for one job.

    :param job: a ledger job row
    """
    return {"job_id": job.job_id, "round": job.round, "chunk": job.chunk_index, "lines": job.lines}


def stage_round(
    *,
    ledger: Ledger,
    adapter: BatchAdapter,
    staging: Staging,
    workload: str,
    run_id: str,
    round_: int,
    items: Iterable[OpenItem],
    max_requests: int | None = None,
    max_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Write ``items`` (ledger rows) into this round's chunks and record one job per chunk.

    Continues an interrupted round: chunks already recorded are kept, and new chunks start after
    them. Items whose line alone exceeds the byte limit go to ``review``. Returns one
    :func:`job_manifest` per job of the round, in chunk order.

    :param ledger: the ledger
    :param adapter: the provider adapter (limits, line format)
    :param staging: the staging area
    :param workload: workload name
    :param run_id: the Airflow run id
    :param round_: round number (1 for the first submission)
    :param items: the items to stage (streamed: ``Ledger.iter_item_rows(..., shape=OpenItem)``)
    :param max_requests: a tighter per-chunk request limit
    :param max_bytes: a tighter per-chunk byte limit
    """
    existing = ledger.get_jobs(workload, run_id, round_)
    folder = staging.run_dir(workload, run_id) / f"round-{round_}"
    first = max((j.chunk_index for j in existing), default=-1) + 1
    versions: dict[str, str] = {}  # item key -> prompt version, for the items of the open chunk
    rejected: list[tuple[PreparedItem | None, str, str, str]] = []
    model = ""
    kind = "chat"

    def on_close(info: ChunkInfo, placed: list[Placed]) -> None:
        key = "abp-" + short_hash(workload, run_id, str(round_), str(info.index), info.sha256, length=32)
        ledger.record_job(
            {
                "job_id": job_id_for(workload, run_id, round_, info.index),
                "workload": workload,
                "run_id": run_id,
                "round": round_,
                "chunk_index": info.index,
                "provider": adapter.name,
                "model": model,
                "idempotency_key": key,
                "staged_path": str(folder / info.name),
                "input_sha256": info.sha256,
                "lines": info.lines,
                "size_bytes": info.size,
                "kind": kind,
            },
            [(p.key, versions[p.key], p.custom_id, p.attempt) for p in placed],
        )
        # Only the open chunk's versions are kept: a dict of every item of the round took
        # ~130 MB of the prepare task at a million items.
        for p in placed:
            versions.pop(p.key, None)
        log.info(
            "staged chunk %s: %d lines, %d bytes, sha256 %s", info.name, info.lines, info.size, info.sha256
        )

    with Chunker(
        adapter.limits,
        lambda name: staging.writer(folder / name),
        on_close=on_close,
        max_requests=max_requests,
        max_bytes=max_bytes,
        first_index=first,
    ) as chunker:
        for row in items:
            request = CanonicalRequest.from_dict(json.loads(row.request_json))
            model, kind = request.model, request.kind
            versions[row.item_key] = row.prompt_version
            try:
                chunker.add(
                    row.item_key,
                    row.app_id,
                    row.attempts + 1,
                    lambda cid, r=request: adapter.format_line(r, cid),  # type: ignore[misc]
                )
            except ItemError as exc:
                log.error("%s", exc)
                rejected.append((PreparedItem(row.item_key, request), row.app_id, exc.code, str(exc)))
    if rejected:
        ledger.reject_items(workload, run_id, rejected)
    jobs = ledger.get_jobs(workload, run_id, round_)
    manifest = {
        "workload": workload,
        "run_id": run_id,
        "round": round_,
        "provider": adapter.name,
        "chunks": [
            {
                "name": j.staged_path.rsplit("/", 1)[-1],
                "job_id": j.job_id,
                "idempotency_key": j.idempotency_key,
                "sha256": j.input_sha256,
                "lines": j.lines,
                "bytes": j.size_bytes,
            }
            for j in jobs
        ],
    }
    with staging.writer(folder / "manifest.json") as fh:
        fh.write(json.dumps(manifest, indent=2).encode("utf-8"))
    return [job_manifest(j) for j in jobs]


def retry_chunk_limit(
    ledger: Ledger,
    workload: str,
    run_id: str,
    round_: int,
    rows: Iterable[OpenItem],
    configured: int | None,
) -> int | None:
    """The per-chunk request limit of a resubmission round: halved after a token-limit failure.

    When any item going out again failed because its batch hit the provider's enqueued-token
    limit (error code :data:`TOKEN_LIMIT`), the round's chunks hold at most half the lines of the
    largest job of the previous round (and never more than ``configured``).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param round_: the round being staged
    :param rows: the items going out again (with ``error_code``)
    :param configured: the DAG's ``ChunkOptions.max_requests``
    """
    if not any(r.error_code == TOKEN_LIMIT for r in rows):
        return configured
    previous = ledger.get_jobs(workload, run_id, round_ - 1)
    largest = max((j.lines for j in previous), default=0)
    if largest <= 1:
        return configured
    halved = max(1, largest // 2)
    limit = halved if configured is None else min(configured, halved)
    log.warning(
        "round %d: the provider refused a batch over its enqueued-token limit; chunks hold at most %d "
        "requests this round (half of %d)",
        round_,
        limit,
        largest,
    )
    return limit
