"""Alerts a DAG author sets once on the batch group: who is told what, when a night goes wrong.

Five moments are worth telling someone about; each is a :class:`BatchEvent` of one ``kind``:

- ``deadline_missed``: the run passed its deadline with items still open;
- ``budget_refused``: a round was not started because it would pass the budget;
- ``batch_failed`` and ``batch_in_doubt``: a provider batch ended failed, or its creation could
  not be confirmed (nothing is created for it again until that is settled);
- ``review_growth``: a run added at least ``review_growth_threshold`` items to the review queue;
- ``run_summary``: the run published (items by state, cost per usable result, savings).

:class:`BatchAlerts` sends an event to each of its notifiers. A notifier is any Airflow
``BaseNotifier`` — Airflow's own ``SlackNotifier``, ``SmtpNotifier`` and the rest work unchanged,
and this module depends on none of them — or a plain callable ``(context, event)``. A
``BaseNotifier`` is rendered against the task's context plus ``batch_event`` (the event, with
``kind``, ``workload``, ``run_id``, ``message``, ``details``), so a DAG author writes::

    alerts = BatchAlerts(
        notifiers=[SlackNotifier(text="LLM batch {{ batch_event.kind }}: {{ batch_event.message }}")],
        on={"deadline_missed", "batch_failed", "batch_in_doubt", "review_growth"},
        review_growth_threshold=50,
    )

Sending never fails the task: a notifier that raises is logged and the others still run.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal, get_args

log = logging.getLogger(__name__)

EventKind = Literal[
    "deadline_missed", "budget_refused", "batch_failed", "batch_in_doubt", "review_growth", "run_summary"
]
EVENT_KINDS: Final[tuple[EventKind, ...]] = get_args(EventKind)
Severity = Literal["info", "warning", "error"]
#: A notifier: an Airflow ``BaseNotifier`` or a callable given the task context and the event.
Notifier = Any
#: Review growth below this many items in one run is not an event (``BatchAlerts`` default).
DEFAULT_REVIEW_GROWTH_THRESHOLD: Final = 50


@dataclass(frozen=True)
class BatchEvent:
    """Something a person should hear about.

    :param kind: what happened (:data:`EVENT_KINDS`)
    :param workload: the workload
    :param run_id: the Airflow run id
    :param message: one line a person reads first; names the workload, the numbers and the remedy
    :param severity: ``info``, ``warning`` or ``error``
    :param details: JSON-safe facts (counts, amounts as decimal strings, job and batch ids)
    :param dag_id: the DAG, when known
    """

    kind: EventKind
    workload: str
    run_id: str
    message: str
    severity: Severity = "warning"
    details: Mapping[str, Any] = field(default_factory=dict)
    dag_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The event as a JSON-safe dict (for webhooks and logs)."""
        return {
            "kind": self.kind,
            "workload": self.workload,
            "run_id": self.run_id,
            "dag_id": self.dag_id,
            "severity": self.severity,
            "message": self.message,
            "details": dict(self.details),
        }


# --------------------------------------------------------------------------- the events


def deadline_missed(
    workload: str, run_id: str, *, deadline: str, open_items: int, dag_id: str | None = None
) -> BatchEvent:
    """The run passed its deadline with items still open.

    :param workload: the workload
    :param run_id: the run
    :param deadline: the deadline (ISO 8601)
    :param open_items: items not final at the deadline
    :param dag_id: the DAG
    """
    return BatchEvent(
        "deadline_missed",
        workload,
        run_id,
        f"{workload}: deadline {deadline} passed with {open_items:,} items still open; "
        "they go the deadline policy's way (fallback, review or cancel).",
        "error",
        {"deadline": deadline, "open_items": open_items},
        dag_id,
    )


def budget_refused(
    workload: str,
    run_id: str,
    *,
    budget: Decimal,
    spent: Decimal,
    needed: Decimal,
    items: int,
    dag_id: str | None = None,
    went_to: str = "review",
) -> BatchEvent:
    """A round was not started: it would have passed the budget; its items went to review (or ``went_to``).

    :param workload: the workload
    :param run_id: the run
    :param budget: the run's budget
    :param spent: paid so far
    :param needed: the refused round's estimate
    :param items: items the round would have sent
    :param dag_id: the DAG
    :param went_to: the state the refused items are in (the deadline fallback skips them)
    """
    return BatchEvent(
        "budget_refused",
        workload,
        run_id,
        f"{workload}: a round of {items:,} items (about ${needed}) was not sent: ${spent} of the ${budget} "
        f"budget is spent. The items are in {went_to}; raise the budget or re-drive them.",
        "warning",
        {"budget": str(budget), "spent": str(spent), "needed": str(needed), "items": items},
        dag_id,
    )


def batch_failed(
    workload: str,
    run_id: str,
    *,
    job_id: str,
    batch_id: str | None,
    provider: str,
    lines: int,
    error_code: str | None,
    dag_id: str | None = None,
) -> BatchEvent:
    """A provider batch ended ``failed`` (its items are retried or reviewed as the policy says).

    :param workload: the workload
    :param run_id: the run
    :param job_id: the ledger job
    :param batch_id: the provider's batch id
    :param provider: the provider
    :param lines: requests in the batch
    :param error_code: the provider's reason (e.g. ``token_limit_exceeded``), when given
    :param dag_id: the DAG
    """
    return BatchEvent(
        "batch_failed",
        workload,
        run_id,
        f"{workload}: {provider} batch {batch_id or job_id} ({lines:,} requests) failed"
        f"{f' ({error_code})' if error_code else ''}; its items are retried up to their attempt limit.",
        "error",
        {
            "job_id": job_id,
            "batch_id": batch_id,
            "provider": provider,
            "lines": lines,
            "error_code": error_code,
        },
        dag_id,
    )


def batch_in_doubt(
    workload: str,
    run_id: str,
    *,
    job_id: str,
    provider: str,
    lines: int,
    reason: str,
    dag_id: str | None = None,
) -> BatchEvent:
    """A batch's creation could not be confirmed: nothing is created for it until that is settled.

    :param workload: the workload
    :param run_id: the run
    :param job_id: the ledger job
    :param provider: the provider
    :param lines: requests in the chunk
    :param reason: what is known
    :param dag_id: the DAG
    """
    return BatchEvent(
        "batch_in_doubt",
        workload,
        run_id,
        f"{workload}: creating a {provider} batch for job {job_id} ({lines:,} requests) could not be "
        f"confirmed ({reason}); it is not created again until a look-up by key settles it. "
        "See the review page's batches in doubt.",
        "error",
        {"job_id": job_id, "provider": provider, "lines": lines, "reason": reason},
        dag_id,
    )


def review_growth(
    workload: str, run_id: str, *, added: int, queue: int, dag_id: str | None = None
) -> BatchEvent:
    """The run added ``added`` items to the review queue, which now holds ``queue``.

    :param workload: the workload
    :param run_id: the run
    :param added: items this run sent to review
    :param queue: items in the queue now
    :param dag_id: the DAG
    """
    return BatchEvent(
        "review_growth",
        workload,
        run_id,
        f"{workload}: {added:,} items went to review in this run ({queue:,} waiting). "
        "Re-drive, resolve or skip them on the LLM batch review page.",
        "warning",
        {"added": added, "queue": queue},
        dag_id,
    )


def run_summary(
    workload: str, run_id: str, report: Mapping[str, Any], dag_id: str | None = None
) -> BatchEvent:
    """The run's summary from its cost report (items by state and route, cost per usable result, savings).

    :param workload: the workload
    :param run_id: the run
    :param report: the cost report (``CostReport.to_dict()``, as publish writes it)
    :param dag_id: the DAG
    """
    states = report.get("items_by_state") or report.get("states") or {}
    counts = ", ".join(f"{k} {int(v):,}" for k, v in states.items() if v) or "no items"
    # by route, ``exhausted_sync`` (real-time after the batch attempts ran out) apart from ``fallback``
    routes = report.get("items_by_route") or {}
    by_route = ", ".join(f"{k} {int(v):,}" for k, v in routes.items() if v)
    per = report.get("cost_per_usable_result")
    return BatchEvent(
        "run_summary",
        workload,
        run_id,
        f"{workload}: {counts}{f' (routes: {by_route})' if by_route else ''}; paid ${report.get('paid', '0')}, "
        f"{'n/a' if per is None else '$' + str(per)} per usable result, saved ${report.get('savings', '0')}.",
        "info",
        {
            "items_by_state": dict(states),
            "items_by_route": dict(routes),
            "paid": report.get("paid"),
            "cost_per_usable_result": per,
            "savings": report.get("savings"),
            "usable_results": report.get("usable_results"),
            "currency": report.get("currency", "USD"),
        },
        dag_id,
    )


# --------------------------------------------------------------------------- sending


@dataclass(frozen=True)
class BatchAlerts:
    """Where a group's events go; set once on ``batch_inference_group(alerts=...)``.

    :param notifiers: Airflow ``BaseNotifier`` instances and/or callables ``(context, event)``
    :param on: the kinds to send (default: all)
    :param review_growth_threshold: a run sending at least this many items to review is an event
    """

    notifiers: tuple[Notifier, ...] = ()
    on: Collection[EventKind] = frozenset(EVENT_KINDS)
    review_growth_threshold: int = DEFAULT_REVIEW_GROWTH_THRESHOLD

    def __post_init__(self) -> None:
        object.__setattr__(self, "notifiers", tuple(self.notifiers))
        object.__setattr__(self, "on", frozenset(self.on))
        unknown = sorted(set(self.on) - set(EVENT_KINDS))
        if unknown:
            raise ValueError(
                f"BatchAlerts(on=...) names unknown kinds {unknown}; known: {', '.join(EVENT_KINDS)}"
            )
        if self.review_growth_threshold < 1:
            raise ValueError(f"review_growth_threshold must be 1 or more; got {self.review_growth_threshold}")
        for notifier in self.notifiers:
            if not callable(notifier):
                raise TypeError(
                    f"a notifier must be a BaseNotifier or a callable; got {type(notifier).__name__}"
                )

    def wants(self, kind: EventKind) -> bool:
        """Whether events of ``kind`` are sent.

        :param kind: the kind
        """
        return kind in self.on and bool(self.notifiers)

    def emit(self, context: Mapping[str, Any], event: BatchEvent) -> int:
        """Send ``event`` to every notifier; returns how many took it without raising.

        :param context: the task's context (``BaseNotifier`` templates render against it)
        :param event: the event
        """
        from airflow_batch_provider import metrics

        metrics.record_alert(event.kind)
        if not self.wants(event.kind):
            return 0
        sent = 0
        for notifier in self.notifiers:
            try:
                _send(notifier, context, event)
                sent += 1
            except Exception:
                log.exception(
                    "notifier %s failed on a %s event of %s", _name(notifier), event.kind, event.workload
                )
        return sent

    def review_growth(
        self, context: Mapping[str, Any], workload: str, run_id: str, *, added: int, queue: int
    ) -> BatchEvent | None:
        """Send a ``review_growth`` event when ``added`` reaches the threshold; return it, else ``None``.

        :param context: the task's context
        :param workload: the workload
        :param run_id: the run
        :param added: items this run sent to review
        :param queue: items in the queue now
        """
        if added < self.review_growth_threshold:
            return None
        event = review_growth(workload, run_id, added=added, queue=queue, dag_id=_dag_id(context))
        self.emit(context, event)
        return event


def _send(notifier: Notifier, context: Mapping[str, Any], event: BatchEvent) -> None:
    from airflow.sdk.bases.notifier import BaseNotifier

    if isinstance(notifier, BaseNotifier):
        # rendering is in place and irreversible: render a copy, so the templates serve every event
        fresh = copy.copy(notifier)
        fresh({**context, "batch_event": event})
        return
    call: Callable[[Mapping[str, Any], BatchEvent], Any] = notifier
    call(context, event)


def _name(notifier: Notifier) -> str:
    return str(getattr(notifier, "__name__", None) or type(notifier).__name__)


def _dag_id(context: Mapping[str, Any]) -> str | None:
    dag = context.get("dag")
    return getattr(dag, "dag_id", None)
