"""The deadline branch: resolve the run's deadline, cancel and harvest open batches, route what is left.

::

    deadline -> prepare -> ... wait[] -> harvest[] -> download[] -> reconcile[] -> ...
                                                    -> deadline_branch -> publish              (all done)
                                                                       -> sync_fallback -> publish
                                                                       -> keep_pending  -> publish
                                                                       -> skip_unfinished -> publish

- :class:`BatchDeadlineOperator` turns the DAG's :class:`~airflow_batch_provider.core.deadline.DeadlineSpec`
  into this run's deadline (an ISO timestamp in XCom) that sensors and later tasks read;
- :class:`BatchDeadlineHarvestOperator` runs after each sensor: when the sensor returned at the
  deadline, it cancels the batch and waits (bounded) for its terminal state, so that the
  download and reconcile that follow harvest what the batch finished; otherwise it passes through;
- :class:`BatchDeadlineBranchOperator` routes: every item done, or the deadline not reached,
  goes to publish; otherwise the DAG's policy task;
- :class:`BatchDeadlineSettleOperator` is the ``publish_pending`` and ``skip`` policy task: it
  moves the items still open to ``pending`` or ``skipped`` before publish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from airflow.sdk import BaseBranchOperator, BaseOperator

from airflow_batch_provider import notifications
from airflow_batch_provider.adapters.base import BatchRef
from airflow_batch_provider.core.deadline import DeadlinePolicy, DeadlineSpec, check_policy, deadline_passed
from airflow_batch_provider.core.options import HARVEST_TIMEOUT_S, DeadlineOptions
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.core.states import UNSETTLED_STATES
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.operators.base import BatchBaseOperator
from airflow_batch_provider.services import harvest
from airflow_batch_provider.settings import default_poll_policy
from airflow_batch_provider.task_glue import batch_ended, emit_alert, known_job

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_batch_provider.notifications import BatchAlerts

#: Item states that are not done when the deadline comes (what the policy deals with).
OPEN_AT_DEADLINE: Final = UNSETTLED_STATES


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return None


class BatchDeadlineOperator(BaseOperator):
    """Resolve the DAG's deadline for this run; return it for the sensors and the branch.

    A time of day is anchored to the run's logical date (or ``run_after``), an offset to the
    run's start, so clearing and rerunning the task gives the same deadline.

    A templated deadline (``when``, e.g. ``"{{ var.value.get('my_deadline', '') }}"``) is rendered
    here, once per run: to a moment (an ISO datetime), to a rule (``PT2H``, ``06:30 Europe/Berlin``)
    resolved as above, or to nothing: no deadline this run (``deadline`` is then ``""``, which the
    sensors, pod tasks, resubmit and the branch read as none, so the branch goes to publish).

    :param spec: the deadline and its policy (``None`` when ``when`` is given)
    :param when: a template of the deadline, rendered when the task runs
    :param policy: the policy of a templated deadline
    :param margin_s: seconds before a templated deadline at which waiting stops
    """

    template_fields: Sequence[str] = ("when",)
    ui_color = "#fbe3e4"

    def __init__(
        self,
        *,
        spec: DeadlineSpec | None = None,
        when: str | None = None,
        policy: DeadlinePolicy | None = None,
        margin_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (spec is None) == (when is None):
            raise ConfigurationError(
                f"BatchDeadlineOperator(spec={spec!r}, when={when!r}): give exactly one, a DeadlineSpec or "
                "a template of the deadline."
            )
        if when is not None:
            check_policy(policy, True)
        self.spec = spec
        self.when = when
        #: the template as written (``when`` holds what it rendered to once the task runs)
        self.when_template = when
        self.policy = spec.policy if spec is not None else policy
        self.margin_s = spec.margin_s if spec is not None else margin_s

    def rendered(self) -> DeadlineSpec | datetime | None:
        """The templated deadline as rendered for this run: a rule, a moment, or ``None`` (none).

        :raises ConfigurationError: it rendered to neither, naming the template and the value
        """
        text = str(self.when or "").strip()
        if not text:
            return None
        try:
            return _aware(text)
        except ValueError:
            pass
        try:
            return DeadlineSpec.parse(text, self.policy, margin_s=self.margin_s)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"the deadline template {self.when_template!r} rendered to {text!r} for this run: {exc}"
            ) from exc

    def execute(self, context: Context) -> dict[str, Any]:
        now = datetime.now(timezone.utc)
        rule = self.spec if self.spec is not None else self.rendered()
        if rule is None:
            self.log.info(
                "deadline %s rendered to nothing: no deadline this run (%s does not apply)",
                self.when_template,
                self.policy,
            )
            return {"deadline": "", "stop_at": "", "policy": self.policy, "margin_s": self.margin_s}
        deadline, described = self.resolve(rule, context, now)
        stop_at = deadline - timedelta(seconds=self.margin_s)
        self.log.info(
            "%s: this run's deadline is %s (waiting stops at %s, %.0fs from now)",
            described,
            deadline.isoformat(),
            stop_at.isoformat(),
            (stop_at - now).total_seconds(),
        )
        return {
            "deadline": deadline.isoformat(),
            "stop_at": stop_at.isoformat(),
            "policy": self.policy,
            "margin_s": self.margin_s,
        }

    def resolve(self, rule: DeadlineSpec | datetime, context: Context, now: datetime) -> tuple[datetime, str]:
        """The run's deadline as a moment, and a sentence saying what it was made from.

        A rule is resolved from the run's start and logical date (``now`` when it has no start).

        :param rule: a rule (``DeadlineSpec``) or a moment
        :param context: the task context (the DAG run)
        :param now: the current time
        """
        if not isinstance(rule, DeadlineSpec):
            return rule, f"deadline {rule.isoformat()}, then {self.policy}"
        dag_run = context.get("dag_run")
        start = _aware(getattr(dag_run, "start_date", None)) or now
        logical = (
            _aware(context.get("logical_date"))
            or _aware(getattr(dag_run, "logical_date", None))
            or _aware(getattr(dag_run, "run_after", None))
        )
        return rule.resolve(start, logical), rule.describe()


class BatchDeadlineHarvestOperator(BatchBaseOperator):
    """After a sensor: cancel a batch the deadline cut short and wait until it is terminal.

    A batch the sensor saw finish passes through untouched. For one cut short (``deadline:
    true`` in the sensor's result) the operator cancels it at the provider and polls it with the
    run's poll policy (the sensor's intervals and error tolerance) until it is terminal, for at
    most ``harvest_timeout``: the provider then writes what the batch finished, and
    ``batch_cancelled`` lines for the rest, which the download and reconcile tasks that follow
    harvest. A batch that is still not terminal then is not given up: its items stay open for the
    deadline policy, and its files are fetched later (reconcile, publish) once it has ended; any
    answer that arrives after the fallback answered an item is kept as discarded cost.

    :param batch: the sensor's result for one job
    :param deadline: the group's deadline options: ``harvest_timeout_s`` is how long to wait for
        the terminal state after the cancel (``None``: :data:`HARVEST_TIMEOUT_S`, 600 seconds)
    :param poll: the run's poll policy (default: the ``[batch_provider]`` poll options)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "batch")
    ui_color = "#fbe3e4"

    def __init__(
        self,
        *,
        batch: Mapping[str, Any],
        deadline: DeadlineOptions | None = None,
        poll: PollPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch = batch
        self.deadline = deadline
        self.harvest_timeout = deadline.harvest_timeout_s if deadline is not None else HARVEST_TIMEOUT_S
        self.poll = poll or default_poll_policy()

    def execute(self, context: Context) -> dict[str, Any]:
        batch = dict(self.batch)
        if not batch.get("deadline") or not batch.get("batch_id"):
            return batch
        ref = BatchRef(self.adapter.name, batch["batch_id"], batch["idempotency_key"])
        policy = harvest.harvest_policy(self.poll, self.harvest_timeout)
        before = known_job(self.ledger, batch["job_id"])
        waited = harvest.cancel_and_wait(self.ledger, self.adapter, batch["job_id"], ref, policy)
        status = waited.status
        self.tell(context, ref, before, waited)
        return {**batch, "state": status.state if status else None, "harvested": True}

    def tell(self, context: Context, ref: BatchRef, before: JobRow | None, waited: harvest.Waited) -> None:
        """Count a batch first seen ended here (a failed one is an alert); log what the wait found.

        :param context: the task context
        :param ref: the batch
        :param before: its job as the ledger had it before the cancel (``None``: a batch it does not know)
        :param waited: what the cancel and the wait found
        """
        status = waited.status
        if (
            before is not None
            and status is not None
            and status.terminal
            and before.batch_state != status.state
        ):
            batch_ended(
                self.alerts, context, before, status.state, self.adapter.name, harvest.error_code_of(status)
            )
        if status is None or not status.terminal:
            self.log.warning(
                "batch %s is not terminal %.0fs after the cancel (%s); its items stay open for the deadline "
                "policy and its files are fetched once it has ended. Raise DeadlineOptions(harvest_timeout_s=...) "
                "(or margin_s) to wait longer.",
                ref.batch_id,
                self.harvest_timeout,
                waited.reason,
            )
        else:
            self.log.info(
                "batch %s is %s: %d done, %d failed of %d; harvesting",
                ref.batch_id,
                status.state,
                status.completed,
                status.failed,
                status.total,
            )


class BatchDeadlineBranchOperator(BaseBranchOperator):
    """Route the end of a run: publish when all is done, else the deadline policy's task.

    Goes to ``publish_task_id`` when no item of the run is open (see :data:`OPEN_AT_DEADLINE`),
    or when the deadline has not been reached (items that ran out of attempts then go to review
    in publish, as without a deadline). Otherwise goes to ``policy_task_id``.

    :param workload: the workload's name
    :param ledger_conn_id: the ledger connection (``None``: embedded)
    :param deadline: the group's deadline options, with this run's deadline as a moment
        (``DeadlineOptions.resolved_by`` for a rule); its margin and policy
    :param publish_task_id: the publish task's full id
    :param policy_task_id: the policy task's full id
    :param alerts: where the ``deadline_missed`` event goes (sent when the deadline passed with items open)
    """

    template_fields: Sequence[str] = ("deadline_at",)
    ui_color = "#fbe3e4"

    def __init__(
        self,
        *,
        workload: str,
        ledger_conn_id: str | None,
        deadline: DeadlineOptions,
        publish_task_id: str,
        policy_task_id: str,
        alerts: BatchAlerts | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.alerts = alerts
        self.workload = workload
        self.ledger_conn_id = ledger_conn_id
        self.deadline = deadline
        #: the run's deadline (templated: rendered when the task runs)
        self.deadline_at: str = deadline.at()
        self.policy = deadline.policy
        self.publish_task_id = publish_task_id
        self.policy_task_id = policy_task_id

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger."""
        return LedgerHook(self.ledger_conn_id).get_conn()

    def choose_branch(self, context: Context) -> str:
        counts = self.ledger.count_states(self.workload, context["run_id"])
        still_open = {s: n for s, n in counts.items() if s in OPEN_AT_DEADLINE and n}
        deadline = self.deadline_at if self.deadline_at else None
        passed = deadline_passed(deadline, self.deadline.margin_s, datetime.now(timezone.utc))
        self.log.info(
            "items by state: %s; deadline %s (%s)", counts, deadline, "passed" if passed else "ahead"
        )
        if not still_open:
            self.log.info("every item is done: publish")
            return self.publish_task_id
        if not passed:
            self.log.info("deadline not reached; %s open items settle in publish", sum(still_open.values()))
            return self.publish_task_id
        self.log.info(
            "deadline reached with %d items not done (%s): policy %s",
            sum(still_open.values()),
            still_open,
            self.policy,
        )
        event = notifications.deadline_missed(
            self.workload,
            context["run_id"],
            deadline=str(deadline),
            open_items=sum(still_open.values()),
            dag_id=getattr(context.get("dag"), "dag_id", None),
        )
        emit_alert(self.alerts, context, event)
        return self.policy_task_id


class BatchDeadlineSettleOperator(BatchBaseOperator):
    """The ``publish_pending`` and ``skip`` policy task: settle the items still open at the deadline.

    Items that ran out of attempts, and permanent failures, go to ``review`` first (they did not
    fail for lack of time); every other open item goes to ``state``, with the reason.

    :param state: ``pending`` (published and reported as pending) or ``skipped``
    :param max_attempts: the attempts cap (as in resubmit)
    """

    ui_color = "#fbe3e4"

    def __init__(self, *, state: str, max_attempts: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if state not in ("pending", "skipped"):
            raise ConfigurationError(
                f"state={state!r}; the deadline settles items as 'pending' or 'skipped'."
            )
        self.state = state
        self.max_attempts = max_attempts

    def execute(self, context: Context) -> dict[str, int]:
        run_id = context["run_id"]
        _, to_review = self.ledger.retry_candidates(self.workload, run_id, self.max_attempts)
        sources = [s for s in OPEN_AT_DEADLINE if s not in ("fallback", self.state)]
        moved = self.ledger.transition(
            self.workload,
            run_id,
            self.state,
            sources,
            error_code="deadline",
            error_message=f"not done by the deadline; {self.state} by the DAG's deadline policy",
        )
        self.log.info(
            "deadline: %d items -> %s, %d to review (attempts exhausted)", moved, self.state, to_review
        )
        return {self.state: moved, "review": to_review}
