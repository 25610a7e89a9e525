"""``BatchConsumeOperator``: a consumer acts once on each of a run's final answers, with an idempotency key."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.exceptions import ConsumerActError
from airflow_batch_provider.ledger.handoffs import note_handoffs_in_report
from airflow_batch_provider.operators.deliver import BatchPublishedAnswersOperator
from airflow_batch_provider.services.consumers import HandOffConsumer, consume


class BatchConsumeOperator(BatchPublishedAnswersOperator):
    """Hand the run's published final answers to ``consumer``, each acted on once (after publish).

    Each answer its filter keeps that it has not acknowledged is handed to its function with a
    stable idempotency key (per item, prompt version and consumer), then acknowledged; a cleared,
    retried or killed try hands over only what is not acknowledged, with the same keys. A failure
    of the function is recorded for its item with the message (the review list shows it under
    ``sink_refused``) and the others go on; the task then fails, naming it, so that a retry offers
    it again. The counts (acted, already acknowledged, left out, failed) go in the run's report
    (``deliveries``), in ``report.json`` in staging, and in the task's return value.

    :param workload: the workload's name
    :param consumer: the consumer (:class:`~airflow_batch_provider.sinks.consumer.Consumer`)
    :param kwargs: ``ledger_conn_id``, ``run_id`` (default: this DAG run), ``staging_root``,
        ``staging_conn_id`` (:class:`~airflow_batch_provider.operators.deliver.BatchPublishedAnswersOperator`)
        and the ``BaseOperator`` arguments
    """

    def __init__(self, *, workload: str, consumer: HandOffConsumer, **kwargs: Any) -> None:
        super().__init__(workload=workload, **kwargs)
        self.consumer = consumer

    def execute(self, context: Any) -> dict[str, Any]:
        run_id, ledger, write_report = self.run_ledger_report(context)
        counts = consume(ledger, self.workload, run_id, self.consumer)
        name = self.consumer.sink_name
        report = note_handoffs_in_report(ledger, self.workload, run_id, name, counts.as_dict(), write_report)
        # the report's counts are the ledger's, over the run's answers (a run not published has none)
        out = {**counts.as_dict(), **(report or {}).get("deliveries", {}).get(name, {})}
        out.pop("kind", None)
        self.log.info(
            "consumer %s: %d acted on and acknowledged, %d acknowledged before, %d left out by its filter, "
            "%d failed",
            name,
            counts.acted,
            out.get("already_acknowledged", 0),
            out["left_out"],
            counts.failed,
        )
        for message in counts.messages:
            self.log.warning("consumer %s failed on %s", name, message)
        if counts.failed:
            raise ConsumerActError(name, run_id, counts.failed, counts.messages[0])
        return out
