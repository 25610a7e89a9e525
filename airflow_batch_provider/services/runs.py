"""What every task of a run must agree on with the run as prepare started it."""

from __future__ import annotations

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger


def check_run_connection(
    ledger: Ledger, workload: str, run_id: str, batch_conn_id: str, task_id: str
) -> None:
    """Refuse a task whose batch connection is not the one its run started on.

    A templated ``batch_conn_id`` (``{{ var.value.get(...) }}``) is rendered by every task: a
    Variable changed during a run would send the run's later tasks to another account or provider,
    which knows nothing of the batches created before. The run keeps the connection prepare
    recorded; the change takes effect with the next run.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run the task belongs to
    :param batch_conn_id: the task's connection id, rendered
    :param task_id: the task, for the message
    :raises ConfigurationError: the run started on another connection
    """
    started_on = ledger.run_batch_conn_id(workload, run_id)
    if started_on is not None and started_on != batch_conn_id:
        raise ConfigurationError(
            f"{task_id}: batch_conn_id is {batch_conn_id!r} but run {run_id!r} of workload {workload!r} "
            f"started on {started_on!r} (its batches live behind that connection); the Variable or "
            f"template it reads changed during the run. Set it back to {started_on!r} and clear this "
            "task; a new connection takes effect with the next run."
        )
