"""Whether the DAG run that holds a workload is still alive, judged as Airflow's scheduler judges it.

A run killed where no scheduler watches it (``airflow dags test``, a worker whose task no scheduler
queued) stays ``running`` in Airflow's database for ever, and so does the task instance that was
running when the process died. The scheduler itself calls such a task instance dead once its last
heartbeat is older than ``[scheduler] task_instance_heartbeat_timeout`` (see its
``_find_task_instances_without_heartbeats``); this module applies the same rule to every task
instance of the holding run:

- a task instance that a scheduler queued, while that scheduler job is alive, is live: that
  scheduler judges it itself (it fails it after the heartbeat timeout, and the run then ends, so
  the lease is taken over from the failed run);
- a deferred task instance whose trigger exists is live (a triggerer runs it, or will);
- any other task instance is live while its newest sign of life (heartbeat, start, end, queueing,
  last update) is younger than the heartbeat timeout; a task instance that ended that recently
  counts too, so a run moving from one task to the next is not taken for dead.

A run with no live task instance lost its worker: another run may take its workload. Where the task
process may not read Airflow's database (a supervised worker), only the task states are known
(through the Task SDK); a run with any unfinished task instance then counts as live, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from airflow.providers.common.compat.sdk import conf

log = logging.getLogger(__name__)

#: Task-instance states of work that is not over (the run may still act on its items).
UNFINISHED_TI_STATES: Final = frozenset(
    {"running", "restarting", "queued", "deferred", "scheduled", "up_for_retry", "up_for_reschedule"}
)
#: Airflow's default ``[scheduler] task_instance_heartbeat_timeout``, in seconds.
DEFAULT_HEARTBEAT_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True)
class TaskInstanceSign:
    """What Airflow knows of one task instance of the holding run.

    :param task_id: the task
    :param map_index: the map index (-1: not mapped)
    :param state: its state (``None``: not scheduled yet)
    :param last_seen: its newest sign of life (``None``: unknown, only the state was readable)
    :param watched: a scheduler queued it and that scheduler job is alive
    :param trigger_pending: deferred, with its trigger in Airflow's trigger table
    """

    task_id: str
    map_index: int
    state: str | None
    last_seen: datetime | None = None
    watched: bool = False
    trigger_pending: bool = False

    def live(self, now: datetime, timeout_s: float) -> bool:
        """Whether this task instance is alive at ``now``, by the scheduler's rule (module docstring).

        :param now: the current time (timezone-aware)
        :param timeout_s: the heartbeat timeout in seconds
        """
        unfinished = self.state in UNFINISHED_TI_STATES
        if unfinished and (self.watched or (self.state == "deferred" and self.trigger_pending)):
            return True
        if self.last_seen is None:
            return unfinished
        return now - self.last_seen < timedelta(seconds=timeout_s)

    def describe(self) -> str:
        """``task[map index] state (last seen ...)`` for a log line."""
        index = "" if self.map_index < 0 else f"[{self.map_index}]"
        seen = self.last_seen.isoformat() if self.last_seen else "unknown"
        return f"{self.task_id}{index} {self.state} (last seen {seen})"


def live_task_instances(
    signs: Iterable[TaskInstanceSign], now: datetime, timeout_s: float
) -> list[TaskInstanceSign]:
    """The task instances of a run that are alive at ``now``.

    :param signs: what Airflow knows of the run's task instances
    :param now: the current time (timezone-aware)
    :param timeout_s: the heartbeat timeout in seconds
    """
    return [sign for sign in signs if sign.live(now, timeout_s)]


def heartbeat_timeout_s() -> float:
    """Airflow's ``[scheduler] task_instance_heartbeat_timeout`` (seconds), as the scheduler reads it."""
    return float(
        conf.getfloat("scheduler", "task_instance_heartbeat_timeout", fallback=DEFAULT_HEARTBEAT_TIMEOUT_S)
    )


def _newest(values: Sequence[datetime | None]) -> datetime | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _signs_from_database(dag_id: str, run_id: str) -> list[TaskInstanceSign]:
    """Read the run's task instances, their heartbeats, schedulers and triggers from Airflow's database.

    :param dag_id: the DAG
    :param run_id: the run
    :raises Exception: this process may not read the database (a supervised worker)
    """
    # Airflow's ORM models open its database: only a process that may read it gets this far
    from airflow.jobs.job import Job
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import select

    signs: list[TaskInstanceSign] = []
    alive_jobs: dict[int, bool] = {}
    with create_session() as session:
        rows = session.execute(
            select(
                TI.task_id,
                TI.map_index,
                TI.state,
                TI.last_heartbeat_at,
                TI.updated_at,
                TI.start_date,
                TI.end_date,
                TI.queued_dttm,
                TI.queued_by_job_id,
                TI.trigger_id,
            ).where(TI.dag_id == dag_id, TI.run_id == run_id)
        ).all()
        for row in rows:
            watched = False
            if row.queued_by_job_id is not None:
                if row.queued_by_job_id not in alive_jobs:
                    job: Any = session.get(Job, row.queued_by_job_id)
                    alive_jobs[row.queued_by_job_id] = bool(job is not None and job.is_alive())
                watched = alive_jobs[row.queued_by_job_id]
            pending = row.trigger_id is not None and (
                session.scalar(select(Trigger.id).where(Trigger.id == row.trigger_id)) is not None
            )
            signs.append(
                TaskInstanceSign(
                    str(row.task_id),
                    int(row.map_index),
                    None if row.state is None else str(getattr(row.state, "value", row.state)),
                    _newest(
                        [row.last_heartbeat_at, row.updated_at, row.start_date, row.end_date, row.queued_dttm]
                    ),
                    watched,
                    pending,
                )
            )
    return signs


def _signs_from_task_sdk(dag_id: str, run_id: str) -> list[TaskInstanceSign]:
    """Read only the states of the run's task instances, through the Task SDK's supervisor.

    :param dag_id: the DAG
    :param run_id: the run
    """
    # the supervised worker's API to Airflow: imported only when a lease is contended
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states = RuntimeTaskInstance.get_task_states(dag_id, run_ids=[run_id]).get(run_id, {})
    return [
        TaskInstanceSign(str(task), -1, None if state is None else str(state))
        for task, state in states.items()
    ]


def holder_task_instances(dag_id: str, run_id: str) -> list[TaskInstanceSign] | None:
    """What Airflow knows of a run's task instances (``None``: nothing could be read).

    :param dag_id: the DAG
    :param run_id: the run
    """
    try:
        return _signs_from_database(dag_id, run_id)
    except Exception as exc:  # a supervised worker: no database access
        log.info(
            "task instances of %s/%s not readable from the database (%s); asking the SDK", dag_id, run_id, exc
        )
    try:
        return _signs_from_task_sdk(dag_id, run_id)
    except Exception as exc:  # no supervisor either (a bare process)
        log.warning("task instances of DAG run %s/%s unreadable: %s", dag_id, run_id, exc)
        return None
