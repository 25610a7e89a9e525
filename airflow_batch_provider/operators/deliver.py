"""``BatchDeliverOperator``: a run's final answers into one sink, each row once, recorded per item."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger.deliveries import note_in_report
from airflow_batch_provider.ledger.store import Ledger
from airflow_batch_provider.operators.lineage import operator_lineage, renderer
from airflow_batch_provider.services.delivery import Sink, deliver, report_json_writer
from airflow_batch_provider.staging import Staging

if TYPE_CHECKING:
    from airflow_batch_provider.operators.lineage import Lineage


class BatchPublishedAnswersOperator(BaseOperator):
    """What a task after publish shares: the run whose published answers it takes, the ledger, the report.

    :param workload: the workload's name
    :param ledger_conn_id: ledger connection (``None``: embedded SQLite)
    :param run_id: the run whose answers are taken (default: this DAG run)
    :param staging_root: staging URL where the run's ``report.json`` is (default
        ``[batch_provider] staging_root``)
    :param staging_conn_id: object store connection for ``staging_root``
    """

    template_fields: Sequence[str] = ("workload", "run_id")
    ui_color = "#e6f5ea"

    def __init__(
        self,
        *,
        workload: str,
        ledger_conn_id: str | None = None,
        run_id: str | None = None,
        staging_root: str | None = None,
        staging_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload = workload
        self.ledger_conn_id = ledger_conn_id
        self.run_id = run_id
        self.staging_root = staging_root
        self.staging_conn_id = staging_conn_id

    def run_ledger_report(self, context: Any) -> tuple[str, Ledger, Callable[[dict[str, Any]], None]]:
        """The run, the ledger, and the writer of the run's ``report.json`` in staging.

        :param context: the task's context
        """
        run_id = self.run_id or context["run_id"]
        staging = Staging(self.staging_root, self.staging_conn_id)
        return (
            run_id,
            LedgerHook(self.ledger_conn_id).get_conn(),
            report_json_writer(staging, self.workload, run_id),
        )


class BatchDeliverOperator(BatchPublishedAnswersOperator):
    """Deliver the run's published final answers to ``sink`` (after publish).

    Only answers the sink does not hold yet are written (a cleared, retried or killed try skips
    what an earlier one delivered; a changed answer updates its row); a row the sink refuses is
    recorded with the sink's message, and the others are written. The counts go in the run's
    report (``deliveries``: delivered, unchanged, refused, the refusal messages), in the run's
    ``report.json`` in staging, and in the task's return value. A refused row is in the workload's
    review queue with the sink's message (``airflow-batch review list``, the review page) until a
    later delivery writes it.

    :param workload: the workload's name
    :param sink: the sink (e.g. :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink`)
    :param kwargs: ``ledger_conn_id``, ``run_id``, ``staging_root``, ``staging_conn_id``
        (:class:`BatchPublishedAnswersOperator`) and the ``BaseOperator`` arguments
    """

    def __init__(self, *, workload: str, sink: Sink, **kwargs: Any) -> None:
        super().__init__(workload=workload, **kwargs)
        self.sink = sink

    def get_openlineage_facets_on_start(self) -> Lineage:
        """What the task writes, for Airflow's OpenLineage provider: the sink's table.

        A sink that declares no ``dataset`` reports none.
        """
        return self.get_openlineage_facets_on_complete(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Lineage:
        """What the task wrote, for Airflow's OpenLineage provider (as on start).

        :param task_instance: the finished task instance (``None``: the running task's context renders)
        """
        return operator_lineage(
            outputs=[getattr(self.sink, "dataset", None)], render=renderer(self, task_instance)
        )

    def execute(self, context: Any) -> dict[str, Any]:
        run_id, ledger, write_report = self.run_ledger_report(context)
        counts = deliver(ledger, self.workload, run_id, self.sink)
        out = counts.as_dict()
        note_in_report(ledger, self.workload, run_id, self.sink.sink_name, out, then=write_report)
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
