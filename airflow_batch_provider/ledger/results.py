"""The ledger's results room: a job's result lines applied by custom id, and the lines no file answered.

Every pass is safe to repeat: a result for an older attempt is kept as cost (``late``), a success
that comes too late to be used is kept as discarded cost, and a line seen twice is applied once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    func,
    select,
)

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.money import to_nusd
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import bulk_update, chunks, stage
from airflow_batch_provider.ledger.jobs import JobRoom
from airflow_batch_provider.ledger.result_rules import (
    OUTCOME_STATE,
    RESULT_LINE_COLUMNS,
    RESULTS_STAGE,
    result_rules,
)
from airflow_batch_provider.ledger.transitions import ITEM_ROW, guarded_transition


@dataclass
class ReconcileStats:
    """What one reconcile pass did.

    :param applied: results that changed an item's state
    :param late: results for an attempt that is no longer the item's current one (kept as cost)
    :param duplicates: result lines seen twice in this pass
    :param unknown: result lines whose custom id this job never sent
    :param outcomes: results by outcome
    """

    applied: int = 0
    late: int = 0
    duplicates: int = 0
    unknown: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


_ATTEMPT_ROW = and_(s.attempts.c.job_id == bindparam("b_job"), s.attempts.c.custom_id == bindparam("b_cid"))


#: Lines of one :meth:`Ledger.apply_results` transaction (staged in a temporary table, applied
#: set-based); bounded so that memory stays flat however long the result file is.
APPLY_SLICE = 5000


class ResultRoom(JobRoom):
    """A job's results (a room of :class:`~airflow_batch_provider.ledger.Ledger`).

    It reads the job through :class:`~airflow_batch_provider.ledger.jobs.JobRoom`.
    """

    def apply_results(
        self,
        job_id: str,
        results: Iterable[ItemResult],
        cost_of: Callable[[Usage], Decimal],
    ) -> ReconcileStats:
        """Upsert result lines of one job by custom id, and move items accordingly.

        A result for the item's current attempt sets its state; a result for an older attempt is
        kept in the attempts table (its cost is real) and counted as ``late``; a success that
        comes too late to be used (the item settled meanwhile) is kept as discarded cost. A line
        seen twice in one pass is counted as a duplicate and applied once. Repeating the pass
        changes nothing.

        Set-based: Python prices each line; a slice of :data:`APPLY_SLICE` lines is staged in a
        temporary table (``COPY`` on PostgreSQL, one ``executemany`` on SQLite), one ``UPDATE ...
        FROM`` decides every line against its attempt and item (:func:`result_rules`), and one
        ``UPDATE ... FROM`` per table applies them, the items' through :func:`guarded_transition`.

        :param job_id: the job whose files these are
        :param results: parsed results (streamed)
        :param cost_of: prices one line's usage
        """
        stats = ReconcileStats()
        seen: set[str] = set()
        rules = result_rules(job_id, self.job(job_id)["workload"])
        prices: dict[Usage, int] = {}
        for batch in chunks(results, APPLY_SLICE):
            lines: list[tuple[Any, ...]] = []
            for res in batch:
                cid = res.custom_id
                if cid in seen:
                    stats.duplicates += 1
                    continue
                seen.add(cid)
                usage = res.usage
                cost = prices.get(usage)
                if cost is None:
                    if len(prices) >= APPLY_SLICE:
                        prices.clear()
                    cost = prices[usage] = to_nusd(cost_of(usage))
                lines.append(
                    (
                        len(lines),
                        job_id,
                        cid,
                        res.outcome,
                        OUTCOME_STATE[res.outcome],
                        res.error_code,
                        res.error_message,
                        usage.input_tokens,
                        usage.output_tokens,
                        usage.cached_input_tokens,
                        usage.cache_write_tokens,
                        cost,
                        json.dumps(res.output, ensure_ascii=False) if res.outcome == "succeeded" else None,
                    )
                )
            if not lines:
                continue
            with self.engine.begin() as conn:
                stage(conn, RESULTS_STAGE, lines, RESULT_LINE_COLUMNS)
                rules.apply(conn, utcnow(), several=len(lines) > 1)
                known = 0
                for outcome, verdict, count in conn.execute(rules.tally):
                    known += count
                    stats.outcomes[outcome] += count
                    if verdict == "applied":
                        stats.applied += count
                    else:
                        stats.late += count
                stats.unknown += len(lines) - known
        return stats

    def mark_missing(self, job_id: str) -> int:
        """Mark every line of a finished job that no result file mentioned as ``missing``.

        Their items become ``failed_retryable`` (error code ``missing``) when the missing line is
        their current attempt. Returns how many lines of the job are missing in all (so a rerun
        reports the same figure).

        :param job_id: the job id
        """
        now = utcnow()
        job = self.job(job_id)
        with self.engine.begin() as conn:
            rows = list(
                conn.execute(
                    select(s.attempts).where(s.attempts.c.job_id == job_id, s.attempts.c.outcome.is_(None))
                ).mappings()
            )
            bulk_update(
                conn,
                s.attempts,
                _ATTEMPT_ROW,
                [
                    {
                        "b_job": job_id,
                        "b_cid": a["custom_id"],
                        "outcome": "missing",
                        "error_code": "missing",
                        "updated_at": now,
                    }
                    for a in rows
                ],
            )
            if rows:
                # Only items whose current attempt is the missing line move; an item that went on to
                # a newer attempt keeps its state.
                guarded_transition(
                    conn,
                    now,
                    where=and_(ITEM_ROW, s.items.c.custom_id == bindparam("b_cid")),
                    from_states=["submitted"],
                    rows=[
                        {
                            "b_workload": job["workload"],
                            "b_key": a["item_key"],
                            "b_version": a["prompt_version"],
                            "b_cid": a["custom_id"],
                            "state": "failed_retryable",
                            "error_code": "missing",
                            "error_message": "absent from every result file of the batch",
                        }
                        for a in rows
                    ],
                )
            total = conn.execute(
                select(func.count()).where(s.attempts.c.job_id == job_id, s.attempts.c.outcome == "missing")
            ).scalar_one()
        return int(total)
