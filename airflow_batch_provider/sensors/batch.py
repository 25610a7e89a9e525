"""Wait for a provider batch to finish: deferred in the triggerer, or poked by a worker."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.providers.common.compat.sdk import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_batch_provider.adapters.base import BATCH_STATES, BatchAdapter, BatchRef, BatchStatus
from airflow_batch_provider.core.policy import PollPolicy, PollState, decide, start
from airflow_batch_provider.exceptions import PollError, TriggerEventError
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.links.batch import BatchConsoleLink, LedgerRunLink
from airflow_batch_provider.services import harvest, submit
from airflow_batch_provider.services.runs import check_run_connection
from airflow_batch_provider.settings import default_poll_policy
from airflow_batch_provider.staging import Staging
from airflow_batch_provider.task_glue import (
    PASS_THROUGH_ROUTES,
    attempt_owner,
    batch_ended,
    in_doubt_alert,
    kill_claim,
    known_job,
    persist_links,
)
from airflow_batch_provider.triggers.batch import TRIGGER_STATUSES, BatchStatusTrigger, count_poll_error

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_batch_provider.notifications import BatchAlerts
    from airflow_batch_provider.staging import Staging


class BatchStatusSensor(BaseSensorOperator):
    """Wait until a batch is terminal, or until the deadline, logging progress at each poll.

    ``deferrable`` defaults to ``[operators] default_deferrable`` like the official operators
    (``batch_inference_group`` turns it on). Deferred, the wait happens in the triggerer with the
    async SDK client, and the sensor's ``timeout`` still holds (it is the deferral's timeout).
    Not deferred, :meth:`poke` reads the status once per poke with the same decision object
    (:func:`airflow_batch_provider.core.policy.decide`), so ``mode="reschedule"`` frees the worker
    slot between pokes; ``poke_interval`` defaults to the poll policy's first interval.

    Every terminal state is an outcome, not a task failure: ``failed`` (with the provider's
    cause, ``error_code``), ``expired`` and ``cancelled`` batches succeed here; reconcile turns
    their lines into retryable or permanent item states, and publish reports them. Only giving
    up on polling (timeout, too many status errors) fails the task. A batch that ends is counted
    (``batch_provider.batches.<state>``), a failed one is a ``batch_failed`` alert, once per job.

    A job *in doubt* (its create may or may not have taken effect) is resolved here first, one
    look-up per poll (:func:`airflow_batch_provider.services.submit.resolve_in_doubt`); deferred,
    the wait between two look-ups happens in the triggerer (:class:`BatchStatusTrigger` with
    ``recheck_at``, the delay from the same decision object), never in a worker slot:
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
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``)
    :param staging_root: staging URL (to create a job proven absent after doubt)
    :param staging_conn_id: object store connection of ``staging_root``
    :param alerts: where ``batch_failed`` and ``batch_in_doubt`` events go
    """

    template_fields: Sequence[str] = ("batch", "deadline", "batch_conn_id")
    ui_color = "#fdf1d6"
    operator_extra_links = (BatchConsoleLink(), LedgerRunLink())

    def __init__(
        self,
        *,
        batch: Mapping[str, Any],
        batch_conn_id: str = BatchHook.default_conn_name,
        ledger_conn_id: str | None = None,
        poll: PollPolicy | None = None,
        deadline: datetime | str | None = None,
        deadline_margin: float = 0.0,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        staging_root: str | None = None,
        staging_conn_id: str | None = None,
        alerts: BatchAlerts | None = None,
        **kwargs: Any,
    ) -> None:
        policy = poll or default_poll_policy()
        kwargs.setdefault("timeout", 60 * 60 * 27)
        kwargs.setdefault("poke_interval", policy.initial_interval)
        if policy.factor > 1:
            kwargs.setdefault("exponential_backoff", True)
            kwargs.setdefault("max_wait", policy.max_interval)
        super().__init__(**kwargs)
        self.batch = batch
        self.batch_conn_id = batch_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.poll = policy
        self.deadline = deadline
        self.deadline_margin = deadline_margin
        self.deferrable = deferrable
        self.staging_root = staging_root
        self.staging_conn_id = staging_conn_id
        self.alerts = alerts
        self._poll_state: PollState | None = None
        self._claim: tuple[str, str] | None = None
        self._killed = False

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
        return Staging(self.staging_root, self.staging_conn_id)

    def pre_execute(self, context: Any) -> None:
        """Before every try: the rendered ``batch_conn_id`` must be the one the job's run started on.

        :param context: the task context
        :raises ConfigurationError: it is not (see :func:`~airflow_batch_provider.services.runs.check_run_connection`)
        """
        super().pre_execute(context)
        job = self.ledger.get_job(dict(self.batch)["job_id"])
        check_run_connection(self.ledger, job.workload, job.run_id, self.batch_conn_id, self.task_id)

    def policy(self) -> PollPolicy:
        """The poll policy with this run's deadline applied."""
        deadline = self.deadline
        if isinstance(deadline, str) and deadline:
            deadline = pendulum.parse(deadline)  # type: ignore[assignment]
        stamp = deadline.timestamp() if isinstance(deadline, datetime) else None
        data = {**self.poll.to_dict(), "deadline": stamp, "deadline_margin": self.deadline_margin}
        return PollPolicy.from_dict(data)

    def execute(self, context: Context) -> Any:
        if self.batch.get("route") in PASS_THROUGH_ROUTES:  # real-time, or another run's job now
            return {**dict(self.batch), "state": "completed", "deadline": False, "counts": {}}
        if not self.deferrable:
            return super().execute(context)  # poke(), in this worker or rescheduled
        batch = dict(self.batch)
        if not batch.get("batch_id"):
            return self._resolve_or_defer(context, batch, start(self.policy(), float(batch["submitted_at"])))
        return self._wait_deferred(context, batch)

    def execute_in_doubt(
        self,
        context: Context,
        event: Any,
        batch: Mapping[str, Any],
        poll_state: Mapping[str, Any],
    ) -> Any:
        """Resume a wait on a job in doubt after the trigger's ``recheck``: ask the provider once more.

        :param context: the task context
        :param event: the trigger's payload
        :param batch: the submit task's result (no batch id)
        :param poll_state: the poll state before the wait (:class:`PollState` fields)
        :raises TriggerEventError: the event is not a ``recheck`` of this job
        """
        self.batch = dict(batch)
        action, _, _ = self._check_event(event)
        if action != "recheck":
            raise TriggerEventError(
                str(batch["job_id"]), f"status {action!r} while the job is in doubt", event
            )
        return self._resolve_or_defer(context, dict(batch), PollState(**poll_state))

    def _resolve_or_defer(self, context: Context, batch: dict[str, Any], state: PollState) -> Any:
        """Ask the provider once about a job in doubt; defer until the next look-up while it stays unknown."""
        policy = self.policy()
        resolved, state, delay = self._resolve_step(context, batch, policy, state)
        if resolved is None:
            self.log.info("job %s still in doubt; asking the provider again in %.0fs", batch["job_id"], delay)
            self.defer(
                trigger=BatchStatusTrigger(
                    batch_conn_id=self.batch_conn_id,
                    job_id=batch["job_id"],
                    batch_id="",
                    provider=self.adapter.name,
                    idempotency_key=batch["idempotency_key"],
                    submitted_at=float(batch["submitted_at"]),
                    policy=policy.to_dict(),
                    workload=self._workload(batch["job_id"]),
                    recheck_at=time.time() + delay,
                ),
                method_name="execute_in_doubt",
                kwargs={"batch": batch, "poll_state": asdict(state)},
                timeout=timedelta(seconds=self.timeout),
            )
        if not resolved.get("batch_id"):
            return resolved
        return self._wait_deferred(context, resolved)

    def _wait_deferred(self, context: Context, batch: dict[str, Any]) -> Any:
        """Read the batch's status once, then defer to the trigger until the policy says it is over."""
        policy = self.policy()
        self.batch = batch
        ref = BatchRef(self.adapter.name, batch["batch_id"], batch["idempotency_key"])
        status, error = self._read(ref)
        decision = decide(
            policy, start(policy, float(batch["submitted_at"])), time.time(), status=status, error=error
        )
        if status is not None:
            self._log_progress(status)
        if decision.action != "wait":
            return self._finish(context, decision.action, status, decision.reason)
        persist_links(context, self.adapter.name, [batch["batch_id"]], self.adapter.settings.base_url)
        self.defer(
            trigger=BatchStatusTrigger(
                batch_conn_id=self.batch_conn_id,
                job_id=batch["job_id"],
                batch_id=batch["batch_id"],
                provider=self.adapter.name,
                idempotency_key=batch["idempotency_key"],
                submitted_at=float(batch["submitted_at"]),
                policy=policy.to_dict(),
                workload=self._workload(batch["job_id"]),
            ),
            method_name="execute_complete",
            kwargs={"batch": batch},
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """Read the batch's status once; done when the policy says so (terminal, deadline).

        Without deferral this is the whole wait: in ``mode="poke"`` the worker sleeps between
        pokes, in ``mode="reschedule"`` the slot is freed and the task comes back (the ledger
        keeps what a poke learnt, such as the batch of a job resolved from doubt).

        :param context: the task context
        """
        if self.batch.get("route") in PASS_THROUGH_ROUTES:
            return PokeReturnValue(
                True, {**dict(self.batch), "state": "completed", "deadline": False, "counts": {}}
            )
        policy = self.policy()
        batch = dict(self.batch)
        state = self._poll_state or start(policy, float(batch["submitted_at"]))
        if not batch.get("batch_id"):
            resolved, self._poll_state, _ = self._resolve_step(context, batch, policy, state)
            if resolved is None:
                self.log.info(
                    "job %s still in doubt; asking the provider again at the next poke", batch["job_id"]
                )
                return False
            if not resolved.get("batch_id"):
                return PokeReturnValue(True, resolved)
            batch = resolved
            self.batch = batch
            state = start(policy, float(batch["submitted_at"]))
        persist_links(context, self.adapter.name, [batch["batch_id"]], self.adapter.settings.base_url)
        ref = BatchRef(self.adapter.name, batch["batch_id"], batch["idempotency_key"])
        status, error = self._read(ref)
        decision = decide(policy, state, time.time(), status=status, error=error)
        self._poll_state = decision.state
        if status is not None:
            self._log_progress(status)
        if decision.action == "wait":
            return False
        return PokeReturnValue(True, self._finish(context, decision.action, status, decision.reason))

    def execute_complete(
        self, context: Context, event: Any, batch: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resume after the trigger fired; the event is checked before anything is recorded.

        :param context: the task context
        :param event: the trigger's payload
        :param batch: the batch the trigger polled (when resolved from doubt in this task)
        :raises TriggerEventError: the event is not one :class:`BatchStatusTrigger` sends
        """
        if batch is not None:
            self.batch = batch
        action, status, reason = self._check_event(event)
        if action == "recheck":
            raise TriggerEventError(str(self.batch.get("job_id")), "a recheck while a batch is polled", event)
        return self._finish(context, action, status, reason)

    def on_kill(self) -> None:
        """Stop a creation after doubt before its next provider call; release its claim if nothing is in flight.

        The wait itself holds nothing in the ledger; see
        :func:`~airflow_batch_provider.task_glue.kill_claim`.
        """
        kill_claim(self)

    def _check_event(self, event: Any) -> tuple[str, BatchStatus | None, str]:
        job_id = str(self.batch.get("job_id") or "?")
        if not isinstance(event, Mapping):
            raise TriggerEventError(job_id, f"a {type(event).__name__}, not a mapping", event)
        action = event.get("status")
        if action not in TRIGGER_STATUSES:
            raise TriggerEventError(
                job_id, f"status {action!r} is not one of {', '.join(TRIGGER_STATUSES)}", event
            )
        if event.get("job_id") not in (None, job_id):
            raise TriggerEventError(job_id, f"it is about job {event.get('job_id')!r}", event)
        raw = event.get("batch")
        status: BatchStatus | None = None
        if raw is not None:
            if not isinstance(raw, Mapping):
                raise TriggerEventError(job_id, f"its batch is a {type(raw).__name__}, not a mapping", event)
            try:
                status = BatchStatus.from_dict(raw)
            except (KeyError, TypeError, ValueError) as exc:
                raise TriggerEventError(job_id, f"its batch status is malformed ({exc!r})", event) from exc
            if status.state not in BATCH_STATES:
                raise TriggerEventError(job_id, f"batch state {status.state!r} is unknown", event)
        if action == "done" and (status is None or not status.terminal):
            raise TriggerEventError(job_id, "status done without a terminal batch state", event)
        return str(action), status, str(event.get("reason") or "")

    def _read(self, ref: BatchRef) -> tuple[BatchStatus | None, str | None]:
        status, error = harvest.read_status(self.adapter, ref)
        if error is not None:
            count_poll_error(error, self._workload(self.batch["job_id"]), self.adapter.name)
        return status, error

    def _workload(self, job_id: str) -> str:
        try:
            return self.ledger.get_job(job_id).workload
        except Exception:  # a tag only: never fail the wait for it
            return ""

    def _resolve_step(
        self, context: Context, batch: dict[str, Any], policy: PollPolicy, state: PollState
    ) -> tuple[dict[str, Any] | None, PollState, float]:
        """Try once to resolve an in-doubt job: the batch to wait for, the final result, or ``None`` (wait)."""
        job_id = batch["job_id"]
        owner = attempt_owner(context)
        how, batch_id = submit.resolve_in_doubt(self.ledger, self.adapter, job_id, owner)
        if how == "found" and batch_id:
            return {**batch, "batch_id": batch_id, "in_doubt": False}, state, 0.0
        if how == "absent":
            self._claim = (job_id, owner)
            try:
                done = submit.submit_job(
                    ledger=self.ledger,
                    adapter=self.adapter,
                    staging=self.staging,
                    job_id=job_id,
                    owner=owner,
                    on_in_doubt=in_doubt_alert(self.alerts, context, self.adapter.name),
                    stop=lambda: self._killed,
                )
            finally:
                self._claim = None
            if done.batch_id:
                return (
                    {
                        **batch,
                        "batch_id": done.batch_id,
                        "submitted_at": done.submitted_at,
                        "in_doubt": False,
                    },
                    state,
                    0.0,
                )
        # Still unknown: the poll policy says how long to wait (its deadline and timeout, no status).
        decision = decide(policy, state, time.time(), status=BatchStatus("validating"))
        if decision.action == "wait":
            return None, decision.state, decision.delay
        why = "the deadline came" if decision.action == "deadline" else decision.reason
        moved = submit.settle_in_doubt(self.ledger, job_id, why)
        final = {
            **batch,
            "state": None,
            "deadline": decision.action == "deadline",
            "in_doubt": True,
            "counts": {"review": moved},
        }
        return final, decision.state, 0.0

    def _log_progress(self, status: BatchStatus) -> None:
        self.log.info(
            "batch %s: %s, %d/%d done, %d failed",
            self.batch["batch_id"],
            status.raw_state or status.state,
            status.completed,
            status.total,
            status.failed,
        )

    def _finish(
        self, context: Context, action: str, status: BatchStatus | None, reason: str
    ) -> dict[str, Any]:
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
        job = known_job(self.ledger, job_id)
        self.ledger.update_job(job_id, **values)
        if job is not None and status.terminal and job.batch_state != status.state:  # once per job
            batch_ended(
                self.alerts, context, job, status.state, self.adapter.name, harvest.error_code_of(status)
            )
        return out
