"""The status trigger: polls one provider batch on the triggerer's event loop.

It serialises primitives only (connection id, batch id, policy numbers), never a secret; it
reads the connection in the triggerer with the async connection API and polls with the SDK's
native async client, built off the loop once per connection and shared by the triggers of the
loop (:meth:`BatchHook.aget_status_client`), so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any, Final

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batch_provider.adapters.base import BatchRef, BatchStatus
from airflow_batch_provider.core.policy import PollPolicy, decide, start

log = logging.getLogger(__name__)

#: The ``status`` values of an event (the policy's actions other than ``wait``).
TRIGGER_STATUSES: Final[tuple[str, ...]] = ("done", "deadline", "timeout", "give_up", "recheck")


def first_poll_delay(batch_id: str, interval: float) -> float:
    """Seconds to wait before a trigger's first poll: a fixed share of ``interval`` per batch.

    Triggers of a round defer together (one mapped wait task per chunk): polling in step, they
    would all parse their replies in the same turn of the event loop and delay every other
    trigger by the whole burst. Spread over one poll interval by a hash of the batch id, they
    stay spread, and a trigger that is resumed polls on the same cadence as before.

    :param batch_id: the provider's batch id
    :param interval: the policy's first interval
    """
    return interval * (zlib.crc32(batch_id.encode()) % 1000) / 1000


def count_poll_error(error: str, workload: str, provider: str) -> None:
    """Count a failed status poll (``batch_provider.poll_errors``); never raises.

    ``Stats`` sends a UDP datagram (StatsD) or records in memory (OpenTelemetry): it does not
    wait on the network, so the triggerer's event loop is not blocked.

    :param error: ``"<ExceptionClass>: <message>"``
    :param workload: the workload (a tag)
    :param provider: the provider (a tag)
    """
    from airflow_batch_provider import metrics

    try:
        metrics.record_poll_error(error.partition(":")[0], workload=workload, provider=provider)
    except Exception as exc:
        log.warning("poll error metric not recorded: %s", exc)


class BatchStatusTrigger(BaseTrigger):
    """Poll a batch until it is terminal, the deadline comes, or polling gives up.

    The event's payload: ``status`` (``done``, ``deadline``, ``timeout``, ``give_up``),
    ``batch`` (the last normalised status or ``None``), ``reason``, ``polls``, ``job_id``,
    ``batch_id``.

    A job *in doubt* has no batch to poll: with ``recheck_at`` the trigger only waits, off the
    worker, until the time the poll policy gave for the next look-up, and fires ``recheck``; the
    sensor asks the provider once (:func:`~airflow_batch_provider.services.submit.resolve_in_doubt`)
    and defers again, attaches, or settles the job at the deadline.

    :param batch_conn_id: the provider connection id
    :param job_id: the ledger job id
    :param batch_id: the provider's batch id
    :param provider: adapter name
    :param idempotency_key: the job's idempotency key
    :param submitted_at: epoch seconds of the submission (the timeout counts from here)
    :param policy: :meth:`PollPolicy.to_dict` output
    :param workload: the workload (a metric tag)
    :param recheck_at: epoch seconds: fire ``recheck`` then, polling nothing (a job in doubt)
    """

    def __init__(
        self,
        batch_conn_id: str,
        job_id: str,
        batch_id: str,
        provider: str,
        idempotency_key: str,
        submitted_at: float,
        policy: dict[str, Any],
        workload: str = "",
        recheck_at: float | None = None,
    ) -> None:
        super().__init__()
        self.batch_conn_id = batch_conn_id
        self.job_id = job_id
        self.batch_id = batch_id
        self.provider = provider
        self.idempotency_key = idempotency_key
        self.submitted_at = submitted_at
        self.policy = policy
        self.workload = workload
        self.recheck_at = recheck_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "batch_conn_id": self.batch_conn_id,
                "job_id": self.job_id,
                "batch_id": self.batch_id,
                "provider": self.provider,
                "idempotency_key": self.idempotency_key,
                "submitted_at": self.submitted_at,
                "policy": self.policy,
                "workload": self.workload,
                "recheck_at": self.recheck_at,
            },
        )

    def _event(self, status: str, batch: BatchStatus | None, reason: str, polls: int) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "batch": batch.to_dict() if batch else None,
                "reason": reason,
                "polls": polls,
                "job_id": self.job_id,
                "batch_id": self.batch_id,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_batch_provider.hooks.batch import BatchHook

        if self.recheck_at is not None:
            await asyncio.sleep(max(0.0, self.recheck_at - time.time()))
            yield self._event("recheck", None, "time for the next look-up of a job in doubt", 0)
            return
        policy = PollPolicy.from_dict(self.policy)
        state = start(policy, self.submitted_at)
        ref = BatchRef(self.provider, self.batch_id, self.idempotency_key)
        client = await BatchHook.aget_status_client(self.batch_conn_id)
        last: BatchStatus | None = None
        try:
            await asyncio.sleep(first_poll_delay(self.batch_id, policy.initial_interval))
            while True:
                status: BatchStatus | None = None
                error: str | None = None
                try:
                    status = await client.status(ref)
                    last = status
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    self.log.warning("batch %s: status poll failed: %s", self.batch_id, error)
                    count_poll_error(error, self.workload, self.provider)
                decision = decide(policy, state, time.time(), status=status, error=error)
                state = decision.state
                if status is not None:
                    self.log.info(
                        "batch %s: %s, %d/%d done, %d failed (poll %d)",
                        self.batch_id,
                        status.raw_state or status.state,
                        status.completed,
                        status.total,
                        status.failed,
                        state.polls,
                    )
                if decision.action != "wait":
                    yield self._event(decision.action, last, decision.reason, state.polls)
                    return
                await asyncio.sleep(decision.delay)
        finally:
            await client.close()
