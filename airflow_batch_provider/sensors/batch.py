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
from airflow_batch_provider.exceptions import PollError
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services import harvest
from airflow_batch_provider.triggers.batch import BatchStatusTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_batch_provider.staging import Staging


class BatchStatusSensor(BaseSensorOperator):
    """Wait until a batch is terminal, or until the deadline, logging progress at each poll.

    Deferrable by default: the wait happens in the triggerer with the async SDK client. With
    ``deferrable=False`` it polls in the worker with the same decision object
    (:func:`airflow_batch_provider.core.policy.decide`), so both paths behave the same.

    Every terminal state is an outcome, not a task failure: ``failed`` (with the provider's
    cause, ``error_code``), ``expired`` and ``cancelled`` batches succeed here; reconcile turns
    their lines into retryable or permanent item states, and publish reports them. Only giving
    up on polling (timeout, too many status errors) fails the task.

    A job *in doubt* (its create may or may not have taken effect) is resolved here first, in the
    worker, once per poll round (:func:`airflow_batch_provider.services.submit.resolve_in_doubt`):
    found, the wait attaches to that batch; proven absent, the job is created in this task;
    still unknown at the deadline or the poll timeout (counted from the job's intent), its items go
    to review with code ``in_doubt``.

    :param batch: the submit task's result (``job_id``, ``batch_id``, ``submitted_at``)
    :param batch_conn_id: the provider connection
    :param ledger_conn_id: the ledger connection (``None``: embedded)
    :param poll: the poll policy (intervals, error tolerance, timeout)
    :param deadline: when the deadline branch takes over (aware datetime or ISO string); the
        sensor then returns with ``deadline: true`` instead of failing
    :param deadline_margin: seconds before ``deadline`` to stop, to leave time for harvesting
    :param deferrable: wait in the triggerer (default) or in the worker
    :param staging_root: staging URL (to create a job proven absent after doubt)
    :param staging_conn_id: object store connection of ``staging_root``
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
        staging_root: str | None = None,
        staging_conn_id: str | None = None,
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
        self.staging_root = staging_root
        self.staging_conn_id = staging_conn_id

    @cached_property
    def adapter(self) -> BatchAdapter:
        """The provider adapter."""
        return BatchHook(self.batch_conn_id).get_adapter()

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger."""
        return LedgerHook(self.ledger_conn_id).get_conn()

    @cached_property
    def staging(self) -> Staging:
        """The staging area."""
        from airflow_batch_provider.staging import Staging

        return Staging(self.staging_root, self.staging_conn_id)

    def policy(self) -> PollPolicy:
        """The poll policy with this run's deadline applied."""
        deadline = self.deadline
        if isinstance(deadline, str) and deadline:
            import pendulum

            deadline = pendulum.parse(deadline)  # type: ignore[assignment]
        stamp = deadline.timestamp() if isinstance(deadline, datetime) else None
        data = {**self.poll.to_dict(), "deadline": stamp, "deadline_margin": self.deadline_margin}
        return PollPolicy.from_dict(data)

    def execute(self, context: Context) -> dict[str, Any]:
        if self.batch.get("route") == "sync":  # sent through the real-time API by the submit task
            return {**dict(self.batch), "state": "completed", "deadline": False, "counts": {}}
        policy = self.policy()
        batch = dict(self.batch)
        if not batch.get("batch_id"):
            resolved = self._resolve_doubt(context, batch, policy)
            if not resolved.get("batch_id"):
                return resolved
            batch = resolved
        self.batch = batch
        ref = BatchRef(self.adapter.name, batch["batch_id"], batch["idempotency_key"])
        state = start(policy, float(batch["submitted_at"]))
        status, error = harvest.read_status(self.adapter, ref)
        decision = decide(policy, state, time.time(), status=status, error=error)
        if status is not None:
            self._log_progress(status)
        if decision.action != "wait":
            return self._finish(decision.action, status, decision.reason)
        if self.deferrable:
            self.defer(
                trigger=BatchStatusTrigger(
                    batch_conn_id=self.batch_conn_id,
                    job_id=batch["job_id"],
                    batch_id=batch["batch_id"],
                    provider=self.adapter.name,
                    idempotency_key=batch["idempotency_key"],
                    submitted_at=float(batch["submitted_at"]),
                    policy=policy.to_dict(),
                ),
                method_name="execute_complete",
                kwargs={"batch": batch},
            )
        time.sleep(decision.delay)
        waited = harvest.wait_terminal(
            self.adapter, ref, policy, float(batch["submitted_at"]), on_status=self._log_progress
        )
        return self._finish(waited.action, waited.status, waited.reason)

    def execute_complete(
        self, context: Context, event: Mapping[str, Any], batch: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resume after the trigger fired.

        :param context: the task context
        :param event: the trigger's payload
        :param batch: the batch the trigger polled (when resolved from doubt in this task)
        """
        if batch is not None:
            self.batch = batch
        status = BatchStatus.from_dict(event["batch"]) if event.get("batch") else None
        return self._finish(str(event["status"]), status, str(event.get("reason") or ""))

    def _resolve_doubt(self, context: Context, batch: dict[str, Any], policy: PollPolicy) -> dict[str, Any]:
        """Resolve an in-doubt job, once per poll round, until found, created, or waiting must stop."""
        from airflow_batch_provider.operators.batch import attempt_owner
        from airflow_batch_provider.services import submit

        job_id = batch["job_id"]
        owner = attempt_owner(context)
        state = start(policy, float(batch["submitted_at"]))
        while True:
            how, batch_id = submit.resolve_in_doubt(self.ledger, self.adapter, job_id, owner)
            if how == "found" and batch_id:
                return {**batch, "batch_id": batch_id, "in_doubt": False}
            if how == "absent":
                done = submit.submit_job(
                    ledger=self.ledger, adapter=self.adapter, staging=self.staging, job_id=job_id, owner=owner
                )
                if done.batch_id:
                    return {
                        **batch,
                        "batch_id": done.batch_id,
                        "submitted_at": done.submitted_at,
                        "in_doubt": False,
                    }
            # Still unknown: the poll policy says how long to wait (its deadline and timeout, no status).
            status = BatchStatus("validating")
            decision = decide(policy, state, time.time(), status=status)
            state = decision.state
            if decision.action != "wait":
                why = "the deadline came" if decision.action == "deadline" else decision.reason
                moved = submit.settle_in_doubt(self.ledger, job_id, why)
                return {
                    **batch,
                    "state": None,
                    "deadline": decision.action == "deadline",
                    "in_doubt": True,
                    "counts": {"review": moved},
                }
            self.log.info("job %s still in doubt; asking the provider again in %.0fs", job_id, decision.delay)
            time.sleep(decision.delay)

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
        if action in ("timeout", "give_up"):
            raise PollError(f"stopped waiting for batch {self.batch['batch_id']} (job {job_id}): {reason}.")
        out = {
            **dict(self.batch),
            "state": status.state if status else None,
            "deadline": action == "deadline",
            "counts": {"total": status.total, "completed": status.completed, "failed": status.failed}
            if status
            else {},
        }
        if status is None:
            return out
        values: dict[str, Any] = {"batch_state": status.state}
        if status.state == "failed":
            code, values["error"] = harvest.failure_note(status)
            out["error_code"] = code
            self.log.warning(
                "batch %s (job %s) failed at the provider (%s); its items go to the next round or to "
                "review by that cause, and the run goes on",
                self.batch["batch_id"],
                job_id,
                values["error"],
            )
        self.ledger.update_job(job_id, **values)
        return out
