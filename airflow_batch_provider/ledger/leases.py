"""The ledger's lease room: one run at a time holds a workload.

Acquiring is one ``INSERT ... ON CONFLICT DO UPDATE`` (insert, or update when the lease is this
run's), so two runs never both win; a takeover and a person's release are written to the audit table.
"""

from __future__ import annotations

from sqlalchemy import (
    case,
    func,
    select,
)

from airflow_batch_provider.core.clock import iso_or_unknown, utcnow
from airflow_batch_provider.exceptions import (
    WorkloadLeasedError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import dialect_insert
from airflow_batch_provider.ledger.records import (
    WorkloadLease,
)
from airflow_batch_provider.ledger.review import write_audit
from airflow_batch_provider.ledger.room import Room


class LeaseRoom(Room):
    """The workload lease (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def acquire_workload_lease(
        self,
        workload: str,
        run_id: str,
        owner: str,
        dag_id: str | None = None,
        takeover: bool = False,
    ) -> WorkloadLease:
        """Let one run at a time hold a workload (one statement: insert, or update when it is ours).

        The same run acquires again without effect but the new ``owner`` (a retried or cleared
        task). Another run gets :class:`WorkloadLeasedError`, unless ``takeover``: then the lease
        moves to this run (the caller decides that, e.g. from Airflow's own state of the holding
        run) and the takeover is written to the audit table. Items another run has in flight stay
        with that run here; the new run's prepare adopts them
        (:mod:`~airflow_batch_provider.ledger.adoption`).

        :param workload: workload name
        :param run_id: the Airflow run id
        :param owner: the task attempt acquiring it
        :param dag_id: the run's DAG (also recorded on the run's row)
        :param takeover: move the lease from another run
        :raises WorkloadLeasedError: another run holds the workload
        """
        lt = s.leases
        now = utcnow()
        with self.engine.begin() as conn:
            before = None
            if takeover:
                before = conn.execute(select(lt.c.run_id).where(lt.c.workload == workload)).scalar()
            ins = dialect_insert(conn)(lt).values(
                workload=workload, run_id=run_id, dag_id=dag_id, owner=owner, acquired_at=now
            )
            mine = lt.c.run_id == ins.excluded.run_id
            stmt = ins.on_conflict_do_update(
                index_elements=[lt.c.workload],
                set_={
                    "run_id": ins.excluded.run_id,
                    "owner": ins.excluded.owner,
                    "dag_id": func.coalesce(ins.excluded.dag_id, lt.c.dag_id),
                    # a re-acquire by the holding run keeps its "since"
                    "acquired_at": case((mine, lt.c.acquired_at), else_=ins.excluded.acquired_at),
                    "taken_over_from": case((mine, lt.c.taken_over_from), else_=lt.c.run_id),
                },
                where=None if takeover else mine,
            ).returning(lt.c.run_id, lt.c.dag_id, lt.c.owner, lt.c.acquired_at, lt.c.taken_over_from)
            won = conn.execute(stmt).first()
            if won is None:
                held = conn.execute(select(lt).where(lt.c.workload == workload)).mappings().one()
                raise WorkloadLeasedError(
                    workload, held["run_id"], held["dag_id"], iso_or_unknown(held["acquired_at"])
                )
            if dag_id:
                conn.execute(
                    s.runs.update()
                    .where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
                    .values(dag_id=dag_id)
                )
            if takeover and before is not None and before != run_id:
                write_audit(
                    conn,
                    now,
                    owner,
                    "takeover_lease",
                    workload,
                    0,
                    {"from_run": before, "to_run": run_id},
                    "",
                )
        return WorkloadLease(
            workload, won.run_id, won.dag_id, won.owner, won.acquired_at, won.taken_over_from
        )

    def workload_lease(self, workload: str) -> WorkloadLease | None:
        """Return who holds a workload, or ``None``.

        :param workload: workload name
        """
        lt = s.leases
        with self.engine.connect() as conn:
            row = conn.execute(select(lt).where(lt.c.workload == workload)).mappings().first()
        if row is None:
            return None
        return WorkloadLease(
            row["workload"],
            row["run_id"],
            row["dag_id"],
            row["owner"],
            row["acquired_at"],
            row["taken_over_from"],
        )

    def release_workload_lease(
        self, workload: str, run_id: str, actor: str | None = None, reason: str = ""
    ) -> bool:
        """Release a workload if ``run_id`` holds it; return whether it did.

        :param workload: workload name
        :param run_id: the run that holds it (a lease another run holds is left alone)
        :param actor: a person releasing a dead run's lease: the release is written to the audit table
        :param reason: why (with ``actor``)
        """
        lt = s.leases
        with self.engine.begin() as conn:
            res = conn.execute(lt.delete().where(lt.c.workload == workload, lt.c.run_id == run_id))
            released = bool(res.rowcount)
            if released and actor is not None:
                write_audit(conn, utcnow(), actor, "release_lease", workload, 0, {"run_id": run_id}, reason)
        return released
