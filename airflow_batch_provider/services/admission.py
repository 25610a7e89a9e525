"""Admission of batch jobs under a provider's enqueued-token limit, in waves, across every workload of a connection.

Providers cap the input tokens a project may have in batches that have not ended, per model
(OpenAI answers a create over it with a batch that fails, "Enqueued token limit reached"). A
connection states that limit in its extra ``enqueued_token_limit``: one number for every model,
or a JSON object of model -> number (``"*"`` for the others). Before a staged job is created,
:func:`admit` asks the ledger (:class:`~airflow_batch_provider.ledger.quota.EnqueuedQuotaStore`,
shared by every workload and process on the connection's quota key) whether the job's estimated
input tokens fit under the limit with those of the jobs already admitted and not ended:

- the estimate is the staged chunk's: :func:`~airflow_batch_provider.core.tokens.estimate_request_tokens`
  of every item placed on the job, which errs high (bytes / 4 plus message overheads);
- a job's tokens are held until its batch ends: the ledger shows it (a terminal ``batch_state``,
  or the job downloaded or reconciled), or, when a job is refused, a status read of the batches
  holding the quota finds them ended;
- a job alone larger than the limit is admitted when nothing else is enqueued (it could never
  fit; the provider decides);
- a refused job is not created: the submit task gives its worker slot back and asks again
  after :func:`retry_in_s` (it defers on a timer), so a round of 50 chunks under a limit of 10
  goes out in waves of about 10 instead of failing 40 batches and resubmitting them.

No Airflow import: the submit operator makes the one call and defers on a refusal.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.states import NOT_CREATED_JOB_STATES
from airflow_batch_provider.core.tokens import estimate_request_tokens
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.quota import EnqueuedQuotaStore
from airflow_batch_provider.ledger.records import JobRow, OpenItem
from airflow_batch_provider.services.harvest import read_status

log = logging.getLogger(__name__)

#: Connection extra: the provider's enqueued-token limit (a number, or JSON model -> number).
LIMIT_EXTRA: Final = "enqueued_token_limit"
#: Connection extra: seconds a refused submit waits before it asks again.
RETRY_EXTRA: Final = "admission_retry_s"
#: Seconds a refused submit waits when the connection says nothing.
DEFAULT_RETRY_S: Final = 60.0
#: The most batches whose status one refused admission reads (the oldest admitted first).
MAX_STATUS_READS: Final = 20


@dataclass(frozen=True)
class Decision:
    """Whether a job may be created now.

    :param admitted: create it now
    :param retry_in_s: when refused, seconds before asking again
    :param reason: what was decided, in words (for the task log)
    """

    admitted: bool
    retry_in_s: float = 0.0
    reason: str = ""


def enqueued_limit(extras: Mapping[str, Any], model: str) -> int | None:
    """The connection's enqueued-token limit for ``model`` (``None``: none stated).

    :param extras: the connection's extras
    :param model: the model the batch runs on
    """
    raw = extras.get(LIMIT_EXTRA)
    if isinstance(raw, str) and raw.strip().startswith("{"):
        raw = json.loads(raw)
    if isinstance(raw, Mapping):
        raw = raw.get(model, raw.get("*"))
    if raw in (None, ""):
        return None
    try:
        limit = int(raw)
    except (TypeError, ValueError):
        limit = 0
    if limit < 1:
        raise ConfigurationError(
            f"connection extra {LIMIT_EXTRA}={extras.get(LIMIT_EXTRA)!r} gives {raw!r} for model {model!r}: give a "
            'positive number of tokens, or a JSON object such as {"gpt-4o-mini": 2000000, "*": 90000}.'
        )
    return limit


def retry_in_s(extras: Mapping[str, Any]) -> float:
    """Seconds a refused submit waits before asking again (extra ``admission_retry_s``, default 60).

    :param extras: the connection's extras
    """
    return float(extras.get(RETRY_EXTRA) or DEFAULT_RETRY_S)


def job_tokens(ledger: Ledger, job: JobRow) -> int:
    """The estimated input tokens of the items staged on ``job``.

    :param ledger: the ledger
    :param job: the job
    """
    return sum(
        estimate_request_tokens(CanonicalRequest.from_dict(json.loads(row.request_json))).input
        for row in ledger.iter_item_rows(job.workload, job.run_id, shape=OpenItem, job_id=job.job_id)
    )


def admit(
    ledger: Ledger, adapter: BatchAdapter, job: JobRow, conn_id: str, now: float | None = None
) -> Decision:
    """Admit a staged job under its connection's enqueued-token limit, or say when to ask again.

    A job that has a batch or has moved past ``staged``/``uploaded`` (a retried submit) is let through: it is
    enqueued already, or its create is in doubt, and :func:`~airflow_batch_provider.services.submit.submit_job`
    re-attaches to it.

    :param ledger: the ledger
    :param adapter: the provider adapter (its connection's extras; status reads)
    :param job: the job about to be created
    :param conn_id: the connection id: the quota key, unless the extra ``quota_key`` names another
    :param now: epoch seconds (default: now)
    """
    extras = adapter.settings.extra
    limit = enqueued_limit(extras, job.model)
    if limit is None or job.batch_id or job.state not in NOT_CREATED_JOB_STATES:
        return Decision(True)
    key = str(extras.get("quota_key") or conn_id)
    store = EnqueuedQuotaStore(ledger.engine, key)
    tokens = job_tokens(ledger, job)
    got = store.admit(job.job_id, job.model, tokens, limit, time.time() if now is None else now)
    if not got.admitted:
        ended = [
            h.job_id
            for h in got.holders[:MAX_STATUS_READS]
            if h.batch_id is not None and _ended(adapter, h.batch_id)
        ]
        if ended:
            log.info("%d batches holding %s's enqueued tokens have ended: released", len(ended), key)
            now = time.time() if now is None else now
            store.release(ended, now)
            got = store.admit(job.job_id, job.model, tokens, limit, now)
    if got.admitted:
        log.info(
            "job %s admitted under %s's enqueued-token limit for %s: %d + %d of %d tokens",
            job.job_id,
            key,
            job.model,
            got.enqueued,
            tokens,
            limit,
        )
        return Decision(True, reason=f"admitted: {got.enqueued} + {tokens} of {limit} enqueued tokens")
    wait = retry_in_s(extras)
    return Decision(
        False,
        wait,
        f"job {job.job_id} waits for admission: its {tokens:,} estimated input tokens do not fit under the "
        f"enqueued-token limit of {limit:,} for {job.model} on {key!r}, where {len(got.holders)} batches hold "
        f"{got.enqueued:,}; asking again in {wait:g}s, without holding a worker slot (raise the connection's "
        f"{LIMIT_EXTRA} if the provider's limit is higher)",
    )


def _ended(adapter: BatchAdapter, batch_id: str) -> bool:
    """Whether a batch has ended at the provider (an unreadable status counts as not ended)."""
    status, _ = read_status(adapter, BatchRef(adapter.name, batch_id, ""))
    return status is not None and status.terminal
