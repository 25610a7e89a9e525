"""Run, or resume, one DAG run with a fixed run id: ``python -m tests.support.chaos_dagrun``.

``airflow dags test`` names its run after the moment it starts, so running it again on the same
logical date starts a *second* run instead of resuming the first. The chaos suite needs the
user's resume: the run whose worker was killed is cleared and run again, under the same run id, so
the ledger sees the same run. This command is ``airflow dags test`` (the same ``DAG.test`` loop,
tasks and triggers in this process) with the run's ``run_after`` fixed, plus, with ``--resume``,
what the scheduler does after it notices a dead worker (its task instances still ``running`` are
marked ``failed``: the heartbeat timeout) and what "Clear" on the run does (the run is running
again; ``DAG.test`` clears every task instance of it before running).

Usage: ``python -m tests.support.chaos_dagrun DAG_ID LOGICAL_DATE RUN_AFTER [--resume]``, in an
environment with ``AIRFLOW_HOME`` and the DAGs folder set. Exit status 0 when the run succeeded,
1 when it failed; a process killed by a fail point ends with ``SIGKILL`` (-9).
"""

from __future__ import annotations

import sys


def resume(dag_id: str, run_id: str) -> int:
    """Mark the run's unfinished task instances failed and the run running; return how many.

    :param dag_id: the DAG
    :param run_id: the run
    """
    from airflow.models import DagRun, TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    orphaned = {
        TaskInstanceState.RUNNING,
        TaskInstanceState.QUEUED,
        TaskInstanceState.DEFERRED,
        TaskInstanceState.SCHEDULED,
        TaskInstanceState.RESTARTING,
    }
    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            return 0
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        marked = 0
        for ti in tis:
            if ti.state in orphaned:
                ti.state = TaskInstanceState.FAILED
                marked += 1
        run.state = DagRunState.RUNNING
    return marked


def main(argv: list[str]) -> int:
    """Run (or resume) the DAG run; return the exit status.

    :param argv: ``DAG_ID LOGICAL_DATE RUN_AFTER [--resume]``
    """
    from airflow._shared.timezones import timezone
    from airflow.models import DagRun
    from airflow.utils.cli import get_bagged_dag
    from airflow.utils.providers_configuration_loader import providers_configuration_loaded
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    dag_id, logical, after = argv[:3]
    logical_date = timezone.parse(logical)
    run_after = timezone.parse(after)

    @providers_configuration_loaded
    def run() -> int:
        dag = get_bagged_dag(None, dag_id)
        if "--resume" in argv[3:]:
            run_id = DagRun.generate_run_id(
                run_type=DagRunType.MANUAL, logical_date=logical_date, run_after=run_after
            )
            print(f"chaos: resuming {run_id}: {resume(dag_id, run_id)} orphaned task instances failed")
        dr = dag.test(logical_date=logical_date, run_after=run_after)
        print(f"chaos: run {dr.run_id} ended {dr.state}")
        return 0 if dr.state == DagRunState.SUCCESS else 1

    return run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
