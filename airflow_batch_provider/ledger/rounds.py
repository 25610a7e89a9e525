"""The ledger's rounds room: after a round, what goes to review and what may be sent again."""

from __future__ import annotations

from sqlalchemy import (
    and_,
    func,
    select,
)

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.states import (
    RETRYABLE_STATES,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.room import Room
from airflow_batch_provider.ledger.transitions import guarded_transition


class RoundRoom(Room):
    """Rounds of resubmission (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def retry_candidates(self, workload: str, run_id: str, max_attempts: int) -> tuple[int, int]:
        """Send exhausted and permanent failures to ``review``; count what may go out again.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param max_attempts: attempts cap per item
        :return: (items that may be resubmitted, items sent to review now)
        """
        with self.engine.begin() as conn:
            base = and_(s.items.c.workload == workload, s.items.c.run_id == run_id)
            to_review = guarded_transition(
                conn,
                utcnow(),
                target="review",
                where=and_(
                    base,
                    (s.items.c.state == "failed_permanent")
                    | (s.items.c.state.in_(list(RETRYABLE_STATES)) & (s.items.c.attempts >= max_attempts)),
                ),
            ).moved
            retry = conn.execute(
                select(func.count()).where(
                    base, s.items.c.state.in_(list(RETRYABLE_STATES)), s.items.c.attempts < max_attempts
                )
            ).scalar_one()
        return int(retry), int(to_review or 0)
