"""Wait for a provider batch to finish, without holding a worker slot (deferrable)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef, BatchStatus
from airflow_batch_provider.core.policy import PollPolicy, decide, start
from airflow_batch_provider.exceptions import BatchFailedError, PollError
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.triggers.batch import BatchStatusTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class BatchStatusSensor(BaseSensorOperator):
    """Wait until a batch is terminal, or until the deadline, logging progress at each poll.

    Deferrable by default: the wait happens in the triggerer with the async SDK client. With
    ``deferrable=False`` it polls in the worker with the same decision object
    (:func:`airflow_batch_provider.core.policy.decide`), so both paths behave the same.

    A batch that ends ``failed`` (nothing ran, e.g. validation) fails the task with the
    provider's reason. ``expired`` and ``cancelled`` batches succeed: what they finished is
    downloaded and reconciled, and the rest is retried.

    :param batch: the submit task's result (``job_id``, ``batch_id``, ``submitted_at``)
    :param batch_conn_id: the provider connection
    :param ledger_conn_id: the ledger connection (``None``: embedded)
    :param poll: the poll policy (intervals, error tolerance, timeout)
    :param deadline: when the deadline branch takes over (aware datetime or ISO string); the
        sensor then returns with ``deadline: true`` instead of failing
    :param deadline_margin: seconds before ``deadline`` to stop, to leave time for harvesting
    :param deferrable: wait in the triggerer (default) or in the worker
    """

    template_fields: Sequence[str] = ("batch", "deadline")
    ui_color = "#fdf1d6"

    def __init__(
        self,
        *,
        batch: Mapping[str, Any],
        batch_conn_id: str = BatchHook.default_conn_name,
        ledger_conn_id: str | None = None,
        poll: PollPolicy | None = None,
        deadline: datetime | str | None = None,
        deadline_margin: float = 0.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", 60 * 60 * 27)
        super().__init__(**kwargs)
        self.batch = batch
        self.batch_conn_id = batch_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.poll = poll or PollPolicy()
        self.deadline = deadline
        self.deadline_margin = deadline_margin
        self.deferrable = deferrable

    @cached_property
    def adapter(self) -> BatchAdapter:
        """The provider adapter."""
        return BatchHook(self.batch_conn_id).get_adapter()

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger."""
        return LedgerHook(self.ledger_conn_id).get_conn()

    def policy(self) -> PollPolicy:
        """The poll policy with this run's deadline applied."""
        deadline = self.deadline
        if isinstance(deadline, str) and deadline:
            import pendulum

            deadline = pendulum.parse(deadline)  # type: ignore[assignment]
        stamp = deadline.timestamp() if isinstance(deadline, datetime) else None
        data = {**self.poll.to_dict(), "deadline": stamp, "deadline_margin": self.deadline_margin}
        return PollPolicy.from_dict(data)

    def _ref(self) -> BatchRef:
        return BatchRef(self.adapter.name, self.batch["batch_id"], self.batch["idempotency_key"])

    def execute(self, context: Context) -> dict[str, Any]:
        if self.batch.get("route") == "sync":  # sent through the real-time API by the submit task
            return {**dict(self.batch), "state": "completed", "deadline": False, "counts": {}}
        policy = self.policy()
        state = start(policy, float(self.batch["submitted_at"]))
        while True:
            status: BatchStatus | None = None
            error: str | None = None
            try:
                status = self.adapter.status(self._ref())
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.log.warning("status poll failed: %s", error)
            decision = decide(policy, state, time.time(), status=status, error=error)
            state = decision.state
            if status is not None:
                self._log_progress(status)
            if decision.action != "wait":
                return self._finish(decision.action, status, decision.reason)
            if self.deferrable:
                self.defer(
                    trigger=BatchStatusTrigger(
                        batch_conn_id=self.batch_conn_id,
                        job_id=self.batch["job_id"],
                        batch_id=self.batch["batch_id"],
                        provider=self.adapter.name,
                        idempotency_key=self.batch["idempotency_key"],
                        submitted_at=float(self.batch["submitted_at"]),
                        policy=policy.to_dict(),
                    ),
                    method_name="execute_complete",
                )
            time.sleep(decision.delay)

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, Any]:
        """Resume after the trigger fired.

        :param context: the task context
        :param event: the trigger's payload
        """
        status = BatchStatus.from_dict(event["batch"]) if event.get("batch") else None
        return self._finish(str(event["status"]), status, str(event.get("reason") or ""))

    def _log_progress(self, status: BatchStatus) -> None:
        self.log.info(
            "batch %s: %s, %d/%d done, %d failed",
            self.batch["batch_id"],
            status.raw_state or status.state,
            status.completed,
            status.total,
            status.failed,
        )

    def _finish(self, action: str, status: BatchStatus | None, reason: str) -> dict[str, Any]:
        job_id = self.batch["job_id"]
        if status is not None:
            self.ledger.update_job(job_id, batch_state=status.state)
        if action == "done" and status is not None and status.state == "failed":
            self.ledger.update_job(job_id, error=status.reason)
            raise BatchFailedError(
                f"batch {self.batch['batch_id']} (job {job_id}) failed at the provider before running: "
                f"{status.reason or 'no reason given'}. Fix the input named there and clear the prepare task."
            )
        if action in ("timeout", "give_up"):
            raise PollError(f"stopped waiting for batch {self.batch['batch_id']} (job {job_id}): {reason}.")
        return {
            **dict(self.batch),
            "state": status.state if status else None,
            "deadline": action == "deadline",
            "counts": {"total": status.total, "completed": status.completed, "failed": status.failed}
            if status
            else {},
        }
