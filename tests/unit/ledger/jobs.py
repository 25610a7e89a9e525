"""The job row the chunker records, for tests that stage a job in the ledger by hand."""

from __future__ import annotations

from typing import Any


def job_row(
    workload: str,
    run_id: str,
    lines: int,
    *,
    round_: int = 1,
    chunk: int = 0,
    job_id: str | None = None,
    size_bytes: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A job of ``lines`` lines for chunk ``chunk`` of round ``round_`` on OpenAI's ``gpt-4o-mini``.

    Its id is the chunker's (``<workload>:<run_id>:r<round>:c<chunk>``) unless ``job_id`` names one;
    its idempotency key and staged path follow from the id.

    :param workload: the workload
    :param run_id: the run
    :param lines: how many lines the job holds
    :param round_: the round
    :param chunk: the chunk index
    :param job_id: the job's id, where it is not the chunker's
    :param size_bytes: the staged file's size (100 bytes a line by default)
    :param fields: columns to set otherwise (``idempotency_key``, ``staged_path``, ...)
    """
    job_id = job_id or f"{workload}:{run_id}:r{round_}:c{chunk:05d}"
    return {
        "job_id": job_id,
        "workload": workload,
        "run_id": run_id,
        "round": round_,
        "chunk_index": chunk,
        "provider": "openai",
        "model": "gpt-4o-mini",
        "idempotency_key": f"key-{job_id}",
        "staged_path": f"/staging/{job_id}.jsonl",
        "input_sha256": "0" * 64,
        "lines": lines,
        "size_bytes": 100 * lines if size_bytes is None else size_bytes,
        **fields,
    }
