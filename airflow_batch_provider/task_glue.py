"""What the batch operators and the status sensor share about the task they run in.

The owner string of a task attempt (claims and leases), its DAG id, its alerts, its extra links,
its submit claim when it is killed, and the routes whose job the wait passes through. It sits
below ``operators/`` and ``sensors/`` (both import it; it imports neither) and above the
services, whose Airflow-free results it turns into log lines, alerts and links.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider import metrics, notifications
from airflow_batch_provider.exceptions import LedgerError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.links.batch import BatchConsoleLink, LedgerRunLink
from airflow_batch_provider.services import harvest
from airflow_batch_provider.services.submit import claim_owner, release_on_kill

if TYPE_CHECKING:
    from airflow_batch_provider.notifications import BatchAlerts, BatchEvent

log = logging.getLogger(__name__)

#: The route of a job a cleared task of its old run left to the run that owns it now (the wait and
#: the deadline harvest pass it through, as a real-time ``sync`` one).
MOVED: Final = "moved"
#: The routes whose job the wait task passes through without polling a batch.
PASS_THROUGH_ROUTES: Final = frozenset({"sync", MOVED})


def dag_id_of(context: Mapping[str, Any]) -> str | None:
    """The DAG id of the task's run (from the DAG, else the task instance; ``None``: neither).

    :param context: the task context
    """
    found = getattr(context.get("dag"), "dag_id", None) or getattr(context.get("ti"), "dag_id", None)
    return str(found) if found else None


def emit_alert(alerts: BatchAlerts | None, context: Mapping[str, Any], event: BatchEvent) -> None:
    """Send an alert event; never fails the task (a notifier's error, or building it, is logged).

    :param alerts: the group's alerts (``None``: only the ``alerts.<kind>`` metric is counted)
    :param context: the task context
    :param event: the event
    """
    try:
        if alerts is None:
            metrics.record_alert(event.kind)
            return
        alerts.emit(context, event)
    except Exception:
        log.exception("alert %s of %s could not be sent", event.kind, event.workload)


def persist_links(
    context: Mapping[str, Any], provider: str, batch_ids: Sequence[str], base_url: str | None = None
) -> str | None:
    """Store the "Provider batch" and "LLM batch run" links of a task now (before it defers).

    Returns the console URL stored, or ``None`` when the context cannot store links (no task
    instance, no DAG); a link that cannot be stored is logged, never fatal.

    :param context: the task context
    :param provider: provider (adapter) name
    :param batch_ids: the task's provider batch ids
    :param base_url: the connection's API host (a shipped console page is only for its own host)
    """
    if context.get("ti") is None or context.get("dag") is None or not batch_ids:
        return None
    try:
        url = BatchConsoleLink.persist(
            context, provider=provider, batch_ids=list(batch_ids), base_url=base_url
        )
        LedgerRunLink.persist(context)
    except Exception as exc:
        log.warning("the extra links of batch %s could not be stored: %s", ", ".join(batch_ids), exc)
        return None
    return url


def in_doubt_alert(
    alerts: BatchAlerts | None, context: Mapping[str, Any], provider: str
) -> Callable[[JobRow, str], None]:
    """The ``on_in_doubt`` callback of :func:`~airflow_batch_provider.services.submit.submit_job` for a task.

    :param alerts: the group's alerts
    :param context: the task context
    :param provider: provider (adapter) name
    """

    def send(job: JobRow, reason: str) -> None:
        event = notifications.batch_in_doubt(
            str(job.workload),
            str(job.run_id),
            job_id=str(job.job_id),
            provider=provider,
            lines=int(job.lines or 0),
            reason=reason,
            dag_id=dag_id_of(context),
        )
        emit_alert(alerts, context, event)

    return send


def known_job(ledger: Ledger, job_id: str) -> JobRow | None:
    """The job row, or ``None`` for a batch the ledger does not know (a hand-made wait).

    :param ledger: the ledger
    :param job_id: the job
    """
    try:
        return ledger.get_job(job_id)
    except LedgerError:
        return None


def batch_ended(
    alerts: BatchAlerts | None,
    context: Mapping[str, Any],
    job: JobRow,
    state: str,
    provider: str,
    error_code: str | None = None,
) -> None:
    """A provider batch reached a terminal state: count it; a failed one is a ``batch_failed`` alert.

    Call it once per job (where the job's recorded ``batch_state`` changes to the terminal one).
    Never raises.

    :param alerts: the group's alerts
    :param context: the task context
    :param job: the ledger job row (as it was before this state was recorded)
    :param state: the terminal state
    :param provider: provider (adapter) name
    :param error_code: why a failed batch failed, when known
    """
    try:
        metrics.record_batch(state, workload=str(job.workload), provider=provider)
    except Exception as exc:
        log.warning("metric of batch %s not recorded: %s", job.batch_id, exc)
    if state != "failed":
        return
    event = notifications.batch_failed(
        str(job.workload),
        str(job.run_id),
        job_id=str(job.job_id),
        batch_id=job.batch_id,
        provider=provider,
        lines=int(job.lines or 0),
        error_code=error_code or harvest.BATCH_FAILED,
        dag_id=dag_id_of(context),
    )
    emit_alert(alerts, context, event)


def kill_claim(task: Any) -> None:
    """``on_kill`` of a task that may hold a submit claim (``task._claim``: job id and owner, or ``None``).

    Sets ``task._killed`` (its submit stops before the next provider call) and releases the claim
    when nothing of the job can be in flight. Never raises: the ledger may be unreachable, and
    the claim's lease then ends by itself.

    :param task: the submit operator or the status sensor
    """
    task._killed = True
    claim = getattr(task, "_claim", None)
    if claim is None:
        return
    job_id, owner = claim
    try:
        if release_on_kill(task.ledger, job_id, owner):
            log.warning("killed: released the submit claim on job %s (nothing was sent)", job_id)
    except Exception as exc:
        log.warning("killed: the claim on job %s could not be released (%s)", job_id, exc)


def attempt_owner(context: Mapping[str, Any]) -> str:
    """The owner string of this task attempt for claims and leases: dag/run/task/map index/try@host:pid.

    :param context: the task context
    """
    ti = context.get("ti")
    return claim_owner(
        str(getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "-")),
        context["run_id"],
        str(getattr(ti, "task_id", "-")),
        getattr(ti, "map_index", None),
        getattr(ti, "try_number", None),
    )
