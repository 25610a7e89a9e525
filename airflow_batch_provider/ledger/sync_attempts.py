"""The ledger's sync-attempts room: one item sent synchronously (the fallback), its attempt and its answer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    select,
)
from sqlalchemy.engine import Connection, RowMapping

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.results import ItemResult
from airflow_batch_provider.core.states import (
    can_transition,
)
from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.records import (
    sync_job_id,
)
from airflow_batch_provider.ledger.room import Room
from airflow_batch_provider.ledger.transitions import guarded_transition


class SyncRoom(Room):
    """Synchronous attempts (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def begin_sync_attempt(
        self, workload: str, run_id: str, item_key: str, prompt_version: str, from_states: Sequence[str]
    ) -> str | None:
        """Move one open item to ``fallback`` and record its synchronous attempt (mode ``sync``).

        Returns the attempt's custom id (``<item key>__s<attempt>``), or ``None`` when the item is
        no longer in ``from_states`` (e.g. a late batch result gave it a usable result): it is not
        sent again. An item already in ``fallback`` for this run (a fallback task that was
        interrupted mid-call) gets its recorded attempt back, so a rerun sends it once more
        without a second attempt row.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param item_key: the item key
        :param prompt_version: the prompt version
        :param from_states: states the item may be sent from
        """
        job_id = sync_job_id(workload, run_id)
        now = utcnow()
        where = and_(
            s.items.c.workload == workload,
            s.items.c.item_key == item_key,
            s.items.c.prompt_version == prompt_version,
            s.items.c.run_id == run_id,
        )
        with self.engine.begin() as conn:
            cols = (s.items.c.state, s.items.c.attempts, s.items.c.custom_id, s.items.c.job_id)
            item = conn.execute(select(*cols).where(where)).first()
            if item is None:
                return None
            if item.state == "fallback" and item.job_id == job_id and item.custom_id:
                return str(item.custom_id)
            if item.state not in from_states or not can_transition(item.state, "fallback"):
                return None
            attempt = int(item.attempts or 0) + 1
            custom_id = f"{item_key}__s{attempt}"
            moved = guarded_transition(
                conn,
                now,
                target="fallback",
                where=and_(where, s.items.c.state == item.state),
                values={"route": "fallback", "job_id": job_id, "custom_id": custom_id, "attempts": attempt},
            )
            if not moved.moved:
                return None
            conn.execute(
                s.attempts.insert().values(
                    job_id=job_id,
                    custom_id=custom_id,
                    workload=workload,
                    item_key=item_key,
                    prompt_version=prompt_version,
                    run_id=run_id,
                    attempt=attempt,
                    mode="sync",
                    created_at=now,
                    updated_at=now,
                )
            )
        return custom_id

    def record_sync_result(self, workload: str, run_id: str, result: ItemResult, cost_nusd: int) -> str:
        """Record a synchronous attempt's final answer and settle its item; return the item's state.

        The attempt row keeps the usage and cost (priced by the caller at standard rates). A
        success makes the item ``succeeded`` (route ``fallback``); any failure sends it to
        ``review`` with the provider's error. When the item got a usable result elsewhere in the
        meantime (a late batch line), the answer is kept only as discarded cost, never a second row.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param result: the final result of the attempt (custom id from :meth:`begin_sync_attempt`)
        :param cost_nusd: its cost in nano-dollars
        """
        job_id = sync_job_id(workload, run_id)
        now = utcnow()
        with self.engine.begin() as conn:
            att = (
                conn.execute(
                    select(s.attempts).where(
                        s.attempts.c.job_id == job_id, s.attempts.c.custom_id == result.custom_id
                    )
                )
                .mappings()
                .first()
            )
            if att is None:
                raise LedgerError(
                    f"no synchronous attempt {result.custom_id!r} in run {run_id!r}; "
                    "call begin_sync_attempt before sending the item."
                )
            usage = result.usage
            conn.execute(
                s.attempts.update()
                .where(s.attempts.c.job_id == job_id, s.attempts.c.custom_id == result.custom_id)
                .values(
                    outcome=result.outcome,
                    discarded=result.outcome == "invalid_output",
                    error_code=result.error_code,
                    error_message=result.error_message,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cached_input_tokens=usage.cached_input_tokens,
                    cache_write_tokens=usage.cache_write_tokens,
                    cost_nusd=cost_nusd,
                    updated_at=now,
                )
            )
            where = and_(
                s.items.c.workload == workload,
                s.items.c.item_key == att["item_key"],
                s.items.c.prompt_version == att["prompt_version"],
            )
            item = conn.execute(
                select(s.items.c.state, s.items.c.custom_id, s.items.c.input_hash).where(where)
            ).first()
            if item is None:
                return "missing"
            if item.custom_id != result.custom_id or item.state != "fallback":
                if result.outcome == "succeeded":
                    self._mark_discarded(conn, att, now)
                return str(item.state)
            values: dict[str, Any] = {"route": "fallback"}
            if result.outcome == "succeeded":
                target = "succeeded"
                values.update(
                    output_json=json.dumps(result.output, ensure_ascii=False),
                    succeeded_hash=item.input_hash,
                    error_code=None,
                    error_message=None,
                )
            else:
                target = "review"
                values.update(
                    error_code=result.error_code or result.outcome,
                    error_message=result.error_message or f"synchronous fallback ended {result.outcome}",
                )
            moved = guarded_transition(
                conn,
                now,
                target=target,
                where=and_(where, s.items.c.state == "fallback", s.items.c.custom_id == result.custom_id),
                values=values,
            )
            if not moved.moved:  # settled meanwhile by another writer: the answer is unused cost
                if result.outcome == "succeeded":
                    self._mark_discarded(conn, att, now)
                state = conn.execute(select(s.items.c.state).where(where)).scalar()
                return str(state)
            return target

    @staticmethod
    def _mark_discarded(conn: Connection, att: RowMapping, now: datetime) -> None:
        if att["discarded"]:
            return
        conn.execute(
            s.attempts.update()
            .where(s.attempts.c.job_id == att["job_id"], s.attempts.c.custom_id == att["custom_id"])
            .values(discarded=True, updated_at=now)
        )
