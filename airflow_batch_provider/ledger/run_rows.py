"""The ledger's runs room: a run's row in ``abp_runs``, from prepare's start to publish's report.

What a run keeps against the other runs of its workload (its prompt, who owns an item) is
:mod:`~airflow_batch_provider.ledger.runs`; the queries across runs are
:mod:`~airflow_batch_provider.ledger.reads`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    select,
)

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.room import Room


class RunRoom(Room):
    """A run's own row (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def start_run(
        self,
        workload: str,
        run_id: str,
        provider: str,
        model: str,
        dag_id: str | None = None,
        batch_conn_id: str | None = None,
    ) -> str | None:
        """Record that a run started (idempotent); return the batch connection it started on.

        The first call records ``batch_conn_id``; a later one never changes it (a run started
        before the column existed takes the first one given).

        :param workload: workload name
        :param run_id: the Airflow run id
        :param provider: adapter name
        :param model: model name
        :param dag_id: the DAG of the run, when known
        :param batch_conn_id: the batch connection id the run starts on, as rendered
        """
        key = (s.runs.c.workload == workload, s.runs.c.run_id == run_id)
        with self.engine.begin() as conn:
            found = conn.execute(select(s.runs.c.dag_id, s.runs.c.batch_conn_id).where(*key)).first()
            if found is None:
                conn.execute(
                    s.runs.insert().values(
                        workload=workload,
                        run_id=run_id,
                        provider=provider,
                        model=model,
                        started_at=utcnow(),
                        dag_id=dag_id,
                        batch_conn_id=batch_conn_id,
                    )
                )
                return batch_conn_id
            if dag_id and found.dag_id != dag_id:
                conn.execute(s.runs.update().where(*key).values(dag_id=dag_id))
            if found.batch_conn_id is None and batch_conn_id is not None:
                conn.execute(
                    s.runs.update()
                    .where(*key, s.runs.c.batch_conn_id.is_(None))
                    .values(batch_conn_id=batch_conn_id)
                )
                return str(conn.execute(select(s.runs.c.batch_conn_id).where(*key)).scalar_one())
            return None if found.batch_conn_id is None else str(found.batch_conn_id)

    def run_batch_conn_id(self, workload: str, run_id: str) -> str | None:
        """The batch connection id a run started on (``None``: no such run, or none recorded).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        with self.engine.connect() as conn:
            value = conn.execute(
                select(s.runs.c.batch_conn_id).where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
            ).scalar()
        return None if value is None else str(value)

    def finish_run(self, workload: str, run_id: str, report: Mapping[str, Any]) -> None:
        """Store the run's report.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param report: JSON-safe report
        """
        with self.engine.begin() as conn:
            conn.execute(
                s.runs.update()
                .where(s.runs.c.workload == workload, s.runs.c.run_id == run_id)
                .values(finished_at=utcnow(), report_json=json.dumps(report, default=str))
            )

    def runs(self, workload: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Return the latest runs, newest first.

        :param workload: only this workload
        :param limit: how many
        """
        q = select(s.runs).order_by(s.runs.c.started_at.desc()).limit(limit)
        if workload:
            q = q.where(s.runs.c.workload == workload)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]
