"""Fetching a result file until it is one: a download that is not a valid result file is fetched again.

A provider (or a proxy in front of it) can answer a file download with HTTP 200 and something
else: an HTML sign-in page, an API error document. Read as JSONL, such a file yields no result
line, and every item of the batch would look ``missing`` (retried, hence paid again, while their
answers sit in the real file). So each downloaded file is checked against its provider's format
(:meth:`~airflow_batch_provider.adapters.base.BatchAdapter.result_file_problem`) and fetched again
when it is not a result file; if it still is not after :data:`FETCH_TRIES` fetches, the download
is incomplete: the job is not marked downloaded, its items stay open, and the report lists it.

A file checked at download can be replaced in staging before reconcile reads it (a sync tool or
a person copying a page over it, a disk that kept half a write): a complete download is kept only
while its staged files are still result files (:func:`staged_file_problem`); otherwise reconcile
fetches them again rather than read the page as "every item missing".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import IO, Any, Final, Literal

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef
from airflow_batch_provider.staging import Staging

log = logging.getLogger(__name__)

#: Fetches of one file before a download that is not a result file leaves the job incomplete.
FETCH_TRIES: Final = 3
#: The prefix of the job's ``error`` note when its files never came as result files.
INVALID_FILE: Final = "result_file_invalid"


def fetch_result_file(
    adapter: BatchAdapter,
    staging: Staging,
    ref: BatchRef,
    kind: Literal["output", "errors"],
    target: Any,
    wrap: Callable[[IO[bytes]], IO[bytes]] = lambda sink: sink,
    tries: int = FETCH_TRIES,
) -> str | None:
    """Download one result file into ``target`` until it is a valid result file.

    :param adapter: the provider adapter (it defines the valid file)
    :param staging: the staging area
    :param ref: the batch
    :param kind: which file
    :param target: the staged path written (overwritten on every fetch)
    :param wrap: wraps the staging sink (the harvest's fail point)
    :param tries: fetches before giving up
    :return: ``None`` when the file is valid, else why the last fetch was not a result file
    """
    problem: str | None = None
    for attempt in range(1, max(1, tries) + 1):
        with staging.writer(target) as sink:
            size = adapter.download(ref, kind, wrap(sink))
        with target.open("rb") as fh:
            problem = adapter.result_file_problem(fh)
        if problem is None:
            log.info("downloaded %s file of batch %s: %d bytes", kind, ref.batch_id, size)
            return None
        log.warning(
            "the %s file of batch %s (fetch %d of %d, %d bytes) is not a result file: %s; %s",
            kind,
            ref.batch_id,
            attempt,
            tries,
            size,
            problem,
            "fetching it again" if attempt < tries else "the download stays incomplete",
        )
    return problem


def staged_file_problem(
    adapter: BatchAdapter, staging: Staging, paths: Iterable[str | None], check: bool = True
) -> str | None:
    """Say why one of a job's staged result files is gone or no longer a result file, or ``None``.

    :param adapter: the provider adapter (it defines the valid file)
    :param staging: the staging area
    :param paths: the staged URLs (``None`` where a file was not fetched)
    :param check: also check each file's format (``False``: only that it exists)
    """
    for path in paths:
        if path is None:
            continue
        staged = staging.at(path)
        if not staged.exists():
            return f"{path} is gone"
        if not check:
            continue
        with staged.open("rb") as fh:
            problem = adapter.result_file_problem(fh)
        if problem is not None:
            return f"{path}: {problem}"
    return None


def invalid_file_note(kind: str, ref: BatchRef, problem: str, tries: int = FETCH_TRIES) -> str:
    """The job's ``error`` note for a file that never came as a result file (named in the report).

    :param kind: which file
    :param ref: the batch
    :param problem: what the last fetch was
    :param tries: fetches made
    """
    return (
        f"{INVALID_FILE}: the {kind} file of batch {ref.batch_id} was not a result file on each of "
        f"{tries} fetches ({problem}); its items stay open: reconcile again once the provider serves "
        "the file, or resolve the job by hand"
    )
