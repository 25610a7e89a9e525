"""A job whose whole file an engine refused for one named line: that item rejected, the rest spared.

``vllm run-batch`` checks every line of its input before it answers any and exits with no output
when one is invalid, naming it (``Invalid request on line N``). Nothing of the job ran, so only
the named item is at fault: it goes to ``review`` with the engine's words, and every other item
of the job goes back to ``failed_retryable`` with the attempt it was charged for this job given
back (the next round sends it again; the attempts cap is not spent on a line the engine never
ran). Their attempt rows stay, with the outcome ``not_run`` (no usage, no cost). One transaction,
through the guarded transition: an item no longer ``submitted`` on this job is left as it is, so
a rerun changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import and_, update

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.review import write_audit as _audit
from airflow_batch_provider.ledger.transitions import guarded_transition as _transition

#: Error code of the item whose line the engine refused (as the lane's own pre-pod check names it).
REFUSED_CODE: Final = "engine_invalid_request"
#: Error code of the job's other items: sent again, not charged.
SPARED_CODE: Final = "engine_refused_another_line"
#: Attempt outcome of a line the engine never ran.
NOT_RUN: Final = "not_run"


@dataclass(frozen=True)
class RefusedLine:
    """What settling a refused line did.

    :param rejected: items moved to ``review`` (0 or 1)
    :param spared: items sent back to the next round with their attempt given back
    """

    rejected: int
    spared: int


def settle_refused_line(ledger: Ledger, job_id: str, custom_id: str, message: str) -> RefusedLine:
    """Reject the item on ``custom_id`` of ``job_id`` and give the job's other items their attempt back.

    :param ledger: the ledger
    :param job_id: the job whose file the engine refused
    :param custom_id: the custom id on the line the engine named
    :param message: the engine's words (kept on the rejected item)
    """
    job = ledger.get_job(job_id)
    c, a = s.items.c, s.attempts.c
    of_job = and_(c.workload == job.workload, c.job_id == job_id)
    spared_note = (
        f"the engine refused line {custom_id!r} of job {job_id} and ran none of its lines; sent again "
        "in the next round, with this attempt given back"
    )
    now = utcnow()
    with ledger.engine.begin() as conn:
        rejected = _transition(
            conn,
            now,
            target="review",
            where=and_(of_job, c.custom_id == custom_id),
            from_states=["submitted"],
            values={"error_code": REFUSED_CODE, "error_message": message[:4000], "route": None},
        )
        spared = _transition(
            conn,
            now,
            target="failed_retryable",
            where=and_(of_job, c.custom_id != custom_id, c.attempts > 0),
            from_states=["submitted"],
            values={"attempts": c.attempts - 1, "error_code": SPARED_CODE, "error_message": spared_note},
        )
        lines = and_(a.job_id == job_id, a.outcome.is_(None))
        conn.execute(
            update(s.attempts)
            .where(lines, a.custom_id == custom_id)
            .values(
                outcome="failed_permanent",
                error_code=REFUSED_CODE,
                error_message=message[:4000],
                updated_at=now,
            )
        )
        conn.execute(
            update(s.attempts)
            .where(lines, a.custom_id != custom_id)
            .values(outcome=NOT_RUN, error_code=SPARED_CODE, updated_at=now)
        )
        if rejected.moved or spared.moved:
            _audit(
                conn,
                now,
                "engine",
                "refused_line",
                job.workload,
                rejected.moved + spared.moved,
                {"job_id": job_id, "custom_id": custom_id},
                message[:500],
            )
    return RefusedLine(rejected.moved, spared.moved)
