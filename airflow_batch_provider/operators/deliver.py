"""``BatchDeliverOperator``: a run's final answers into one sink, each row once, recorded per item."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger.deliveries import note_in_report
from airflow_batch_provider.services.delivery import Sink, deliver


class BatchDeliverOperator(BaseOperator):
    """Deliver the run's published final answers to ``sink`` (after publish).

    Only answers the sink does not hold yet are written (a cleared, retried or killed try skips
    what an earlier one delivered; a changed answer updates its row); a row the sink refuses is
    recorded with the sink's message, and the others are written. The counts go in the run's
    report (``deliveries``) and the task's return value.

    :param workload: the workload's name
    :param sink: the sink (e.g. :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink`)
    :param ledger_conn_id: ledger connection (``None``: embedded SQLite)
    :param run_id: the run whose answers are delivered (default: this DAG run)
    """

    template_fields: Sequence[str] = ("workload", "run_id")
    ui_color = "#e6f5ea"

    def __init__(
        self,
        *,
        workload: str,
        sink: Sink,
        ledger_conn_id: str | None = None,
        run_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload = workload
        self.sink = sink
        self.ledger_conn_id = ledger_conn_id
        self.run_id = run_id

    def execute(self, context: Any) -> dict[str, Any]:
        run_id = self.run_id or context["run_id"]
        ledger = LedgerHook(self.ledger_conn_id).get_conn()
        counts = deliver(ledger, self.workload, run_id, self.sink)
        out = counts.as_dict()
        note_in_report(ledger, self.workload, run_id, self.sink.sink_name, out)
        self.log.info(
            "sink %s: %d rows written, %d unchanged (already delivered), %d refused",
            counts.sink,
            counts.written,
            counts.unchanged,
            counts.refused,
        )
        for message in counts.messages:
            self.log.warning("sink %s refused %s", counts.sink, message)
        return out
