"""The statements that decide and apply a staged slice of one job's result lines (the results room's SQL).

Python stages what each line says into :data:`RESULTS_STAGE`; one set-based ``UPDATE ... FROM``
decides every line against its attempt and item (:func:`result_rules`), and one per table applies
them, the items' through :func:`~airflow_batch_provider.ledger.transitions.guarded_transition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    String,
    Table,
    Text,
    and_,
    case,
    func,
    not_,
    null,
    or_,
    select,
)
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.states import (
    USABLE_STATES,
    sources_of,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import STAGING_META
from airflow_batch_provider.ledger.transitions import guarded_transition, word, words

# The item state each neutral outcome leads to.
OUTCOME_STATE: dict[str, str] = {
    "succeeded": "succeeded",
    "failed_retryable": "failed_retryable",
    "failed_permanent": "failed_permanent",
    "expired": "expired",
    "cancelled": "cancelled",
    "invalid_output": "failed_retryable",
    "missing": "failed_retryable",
}


#: What one result line writes to its attempt row besides its outcome (staging columns of that name).
_ATTEMPT_USAGE_COLUMNS: Final = (
    "error_code",
    "error_message",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "cost_nusd",
)

#: Per-connection staging table of :meth:`Ledger.apply_results`: one row per result line of a slice.
#: Python fills what the line says (``seq`` to ``output_json``); one set-based statement then
#: decides, against the line's attempt and item, what the line does (``b_key`` to ``route``).
RESULTS_STAGE = Table(
    "abp_stage_results",
    STAGING_META,
    Column("seq", Integer),  # the line's place in the slice (several lines for one item apply in order)
    # The job's id on every line: joined through it, each line looks its attempt up by key (a
    # constant would let the planner walk every attempt of the job for each line instead).
    Column("job_id", String(250)),
    Column("custom_id", Text),  # no key and no length: a hostile line's id is staged too, then unknown
    Column("outcome", String(32)),
    Column("target", String(32)),  # the item state the outcome leads to
    Column("error_code", String(100)),
    Column("error_message", Text),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("cached_input_tokens", BigInteger),
    Column("cache_write_tokens", BigInteger),
    Column("cost_nusd", BigInteger),
    Column("output_json", Text),  # succeeded lines only
    # decided in SQL (NULL b_key: the job never sent this custom id)
    Column("b_key", String(64)),
    Column("b_version", String(100)),
    Column("b_from", String(32)),  # the item's state as read (NULL: the item is gone)
    Column("state", String(32)),  # the item's new state, NULL: the item does not move
    Column("verdict", String(8)),  # applied | late | discard (a paid-for success that is not used)
    Column("att_write", String(8)),  # full | discard (discarded flag only) | NULL (recorded already)
    Column("succeeded_hash", String(64)),
    Column("route", String(32)),
    Column("rnk", Integer),  # the line's turn among this slice's lines for its item (1 almost always)
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
)

#: What Python stages per result line, in :data:`RESULTS_STAGE`'s column order.
RESULT_LINE_COLUMNS: Final = (
    "seq",
    "job_id",
    "custom_id",
    "outcome",
    "target",
    *_ATTEMPT_USAGE_COLUMNS,
    "output_json",
)


@dataclass(frozen=True)
class ResultRules:
    """The statements that decide and apply a staged slice of one job's result lines.

    :param decide: fills each line's item, verdict and writes (lines whose item exists)
    :param decide_gone: the same for lines whose attempt exists but whose item is gone (``late``)
    :param twice: finds an item addressed by more than one line of the slice
    :param rank: numbers each item's lines in slice order (``rnk``)
    :param write_full: records outcome, usage and cost on the lines' attempts
    :param write_discard: marks the attempts of unused successes discarded
    :param item_values: what the items' move sets besides the state
    :param tally: (outcome, verdict, count) of the known lines
    :param workload: the job's workload
    """

    decide: Any
    decide_gone: Any
    twice: Any
    rank: Any
    write_full: Any
    write_discard: Any
    item_values: Mapping[str, Any]
    tally: Any
    workload: str

    def apply(self, conn: Connection, now: datetime, several: bool) -> None:
        """Decide and apply the staged slice (its lines' custom ids are distinct).

        Lines for distinct items are decided at once. Should several lines of the slice address one
        item (two attempts of it in one job), they go in turns, each decided against the item as
        the turn before left it, as if applied one after another.

        :param conn: the open transaction that staged the slice
        :param now: the ``updated_at`` to write
        :param several: more than one line is staged
        """
        t = RESULTS_STAGE.c
        conn.execute(self.decide)
        conn.execute(self.decide_gone)
        turns = 1
        if several and conn.execute(self.twice).first() is not None:
            conn.execute(self.rank)
            turns = int(conn.execute(select(func.max(t.rnk))).scalar_one())
            later = and_(t.rnk > 1, t.b_from.is_not(None))
            conn.execute(RESULTS_STAGE.update().where(later).values(verdict=None, att_write=None, state=None))
        for turn in range(1, turns + 1):
            if turn > 1:
                done = or_(t.rnk < turn, t.b_from.is_(None))
                conn.execute(RESULTS_STAGE.update().where(done).values(att_write=None, state=None))
                conn.execute(self.decide.where(t.rnk == turn))
            conn.execute(self.write_full.values(updated_at=now))
            conn.execute(self.write_discard.values(updated_at=now))
            guarded_transition(
                conn,
                now,
                staged=RESULTS_STAGE,
                workload=self.workload,
                targets=set(OUTCOME_STATE.values()),
                values=self.item_values,
            )


def result_rules(job_id: str, workload: str) -> ResultRules:
    """Build the statements of :class:`ResultRules` for one job.

    The rules (decided per line in Python until 30 Nov, now one ``CASE`` in SQL):

    - a line is *taken* when it answers the item's current attempt (``custom_id`` matches), or is
      a late success while the item has no usable result and may still succeed, **and** the item's
      state may reach the line's target (:func:`~airflow_batch_provider.core.states.sources_of`);
    - a taken line is ``applied`` and moves the item unless it is there already; a line not taken
      is ``discard`` (a paid-for success not used) or ``late`` (kept as cost only);
    - the attempt is written in full unless it holds this outcome and cost already (a rerun), and
      an unused success marks it discarded;
    - a line for an item that is gone is ``late`` and only its attempt is written.

    :param job_id: the job
    :param workload: its workload
    """
    a, c, t = s.attempts.c, s.items.c, RESULTS_STAGE.c
    success = t.outcome == word("succeeded")
    late = or_(c.custom_id.is_(None), c.custom_id != t.custom_id)
    late_success_taken = and_(success, c.state.in_(words(sources_of("succeeded") - USABLE_STATES)))
    reaches = or_(
        *(
            and_(t.target == word(target), c.state.in_(words(sources_of(target))))
            for target in sorted(set(OUTCOME_STATE.values()))
        )
    )
    taken = and_(or_(not_(late), late_success_taken), reaches)
    recorded = and_(a.outcome == t.outcome, a.cost_nusd == t.cost_nusd)
    this_attempt = and_(a.job_id == t.job_id, a.custom_id == t.custom_id)
    decide = (
        RESULTS_STAGE.update()
        .where(
            this_attempt,
            c.workload == workload,
            c.item_key == a.item_key,
            c.prompt_version == a.prompt_version,
        )
        .values(
            b_key=a.item_key,
            b_version=a.prompt_version,
            b_from=c.state,
            verdict=case((taken, word("applied")), (success, word("discard")), else_=word("late")),
            att_write=case(
                (recorded, case((and_(not_(taken), success, not_(a.discarded)), word("discard")))),
                else_=word("full"),
            ),
            state=case((and_(taken, c.state != t.target), t.target)),
            succeeded_hash=c.input_hash,
            route=case((a.attempt <= 1, word("batch")), else_=word("resubmitted")),
        )
    )
    decide_gone = (
        RESULTS_STAGE.update()
        .where(this_attempt, t.b_key.is_(None))
        .values(
            b_key=a.item_key,
            b_version=a.prompt_version,
            verdict=word("late"),
            att_write=case((recorded, null()), else_=word("full")),
        )
    )
    twice = (
        select(t.b_key)
        .where(t.b_key.is_not(None))
        .group_by(t.b_key, t.b_version)
        .having(func.count() > 1)
        .limit(1)
    )
    turns = (
        select(
            t.seq.label("line"),
            func.row_number().over(partition_by=(t.b_key, t.b_version), order_by=t.seq).label("turn"),
        )
        .where(t.b_key.is_not(None))
        .subquery("turns")
    )
    rank = RESULTS_STAGE.update().where(t.seq == turns.c.line).values(rnk=turns.c.turn)
    write_full = (
        s.attempts.update()
        .where(this_attempt, t.att_write == word("full"))
        .values(
            outcome=t.outcome,
            discarded=or_(t.outcome == word("invalid_output"), t.verdict == word("discard")),
            **{name: t[name] for name in _ATTEMPT_USAGE_COLUMNS},
        )
    )
    write_discard = (
        s.attempts.update().where(this_attempt, t.att_write == word("discard")).values(discarded=True)
    )
    moved_success = t.state == word("succeeded")
    item_values = {
        "error_code": t.error_code,
        "error_message": t.error_message,
        "output_json": case((moved_success, t.output_json), else_=c.output_json),
        "succeeded_hash": case((moved_success, t.succeeded_hash), else_=c.succeeded_hash),
        "route": case((moved_success, t.route), else_=c.route),
        "custom_id": case((moved_success, t.custom_id), else_=c.custom_id),
        "job_id": case((moved_success, job_id), else_=c.job_id),
    }
    tally = (
        select(t.outcome, t.verdict, func.count()).where(t.b_key.is_not(None)).group_by(t.outcome, t.verdict)
    )
    return ResultRules(
        decide, decide_gone, twice, rank, write_full, write_discard, item_values, tally, workload
    )
