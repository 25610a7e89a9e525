"""The ledger's review and audit room: the review queue, a person's actions, the audit table.

A person re-drives, resolves or skips review items. Every action a person takes (and every automatic decision that settles a job or moves a lease) is
written to ``abp_audit`` by :func:`write_audit`, in the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    or_,
    select,
)
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.states import (
    REDRIVABLE_STATES,
)
from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger import unharvested
from airflow_batch_provider.ledger.bulk import BATCH
from airflow_batch_provider.ledger.records import (
    AuditRow,
    ItemRow,
)
from airflow_batch_provider.ledger.room import Room
from airflow_batch_provider.ledger.transitions import guarded_transition, word

#: At most this many item keys (and application ids) of one action are written to the audit row.
AUDIT_KEYS_SHOWN = 1000


class ReviewRoom(Room):
    """Review and audit (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def review_items(
        self, workload: str, error_code: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[ItemRow]:
        """Return the open review queue of a workload (in review, no person's decision yet), by key.

        :param workload: workload name
        :param error_code: only items with this error code
        :param limit: at most this many
        :param offset: skip this many first
        """
        c = s.items.c
        # the state inline: the partial review index (ix_abp_items_review) serves it on SQLite too
        q = select(s.items).where(
            c.workload == workload, c.state == word("review"), c.review_action.is_(None)
        )
        if error_code is not None:
            q = q.where(c.error_code == error_code)
        q = q.order_by(c.item_key, c.prompt_version).limit(limit).offset(offset)
        with self.engine.connect() as conn:
            return [ItemRow.from_row(r) for r in conn.execute(q).mappings()]

    def redrive(
        self,
        workload: str,
        *,
        item_keys: Sequence[str] | None = None,
        app_ids: Sequence[str] | None = None,
        error_code: str | None = None,
        actor: str,
        reason: str,
    ) -> int:
        """Send settled failures back to ``pending`` with attempts 0: the next run sends them again.

        Addresses items in review (the default), or any re-drivable state (review, failed,
        expired, cancelled, skipped) when keys, application ids or an error code are given.
        Items in flight or with a usable result are never moved. Returns how many moved; the
        action is written to the audit table.

        :param workload: workload name
        :param item_keys: only these item keys
        :param app_ids: only these application ids (with ``item_keys``: either)
        :param error_code: only items with this error code
        :param actor: who
        :param reason: why
        """
        return self._review_action(
            "redrive",
            workload,
            item_keys,
            app_ids,
            error_code,
            actor,
            reason,
            target="pending",
            from_states=REDRIVABLE_STATES,
            guard=True,
            values={
                "attempts": 0,
                "job_id": None,
                "custom_id": None,
                "route": None,
                "error_code": None,
                "error_message": None,
                "review_action": None,
                "review_note": None,
            },
        )

    def resolve_review(
        self,
        workload: str,
        *,
        item_keys: Sequence[str] | None = None,
        app_ids: Sequence[str] | None = None,
        error_code: str | None = None,
        actor: str,
        note: str,
    ) -> int:
        """Mark review items resolved by a person: they leave the queue and stay out of every run.

        They stay in ``review`` (no usable answer) until their input or prompt version changes or
        someone re-drives them. Returns how many; written to the audit table.

        :param workload: workload name
        :param item_keys: only these item keys
        :param app_ids: only these application ids
        :param error_code: only items with this error code
        :param actor: who
        :param note: how it was resolved
        """
        return self._review_action(
            "resolve_review",
            workload,
            item_keys,
            app_ids,
            error_code,
            actor,
            note,
            target="review",
            from_states={"review"},
            values={"review_action": "resolved", "review_note": note},
        )

    def skip_review(
        self,
        workload: str,
        *,
        item_keys: Sequence[str] | None = None,
        app_ids: Sequence[str] | None = None,
        error_code: str | None = None,
        actor: str,
        reason: str,
    ) -> int:
        """Skip review items: they become ``skipped`` (published so) and stay out of every run.

        Until their input or prompt version changes or someone re-drives them. Returns how many;
        written to the audit table.

        :param workload: workload name
        :param item_keys: only these item keys
        :param app_ids: only these application ids
        :param error_code: only items with this error code
        :param actor: who
        :param reason: why
        """
        return self._review_action(
            "skip_review",
            workload,
            item_keys,
            app_ids,
            error_code,
            actor,
            reason,
            target="skipped",
            from_states={"review"},
            values={"review_action": "skipped", "review_note": reason},
        )

    def _review_action(
        self,
        action: str,
        workload: str,
        item_keys: Sequence[str] | None,
        app_ids: Sequence[str] | None,
        error_code: str | None,
        actor: str,
        reason: str,
        *,
        target: str,
        from_states: Iterable[str],
        values: Mapping[str, Any],
        guard: bool = False,
    ) -> int:
        if not actor or not reason:
            raise LedgerError(f"{action} needs an actor and a reason, for the audit table.")
        c = s.items.c
        addressed = item_keys is not None or app_ids is not None or error_code is not None
        # Without an address only the open queue; an address may reach any state in from_states.
        wide = addressed and set(from_states) != {"review"}
        states = set(from_states) if wide else {"review"}
        base = [c.workload == workload, c.state.in_(sorted(states))]
        if not wide:
            base.append(c.review_action.is_(None))
        if error_code is not None:
            base.append(c.error_code == error_code)
        target_info: dict[str, Any] = {"error_code": error_code} if error_code is not None else {}
        now = utcnow()
        moved = 0
        with self.engine.begin() as conn:
            if item_keys is None and app_ids is None:
                if guard:
                    unharvested.refuse_unharvested(conn, "redrive", workload, and_(*base))
                moved = guarded_transition(
                    conn, now, target=target, where=and_(*base), values=values, from_states=states
                ).moved
                target_info["filter"] = "review queue" if not addressed else "error_code"
            else:
                keys, ids = list(item_keys or []), list(app_ids or [])
                for i in range(0, max(len(keys), len(ids)), BATCH):
                    who = or_(c.item_key.in_(keys[i : i + BATCH]), c.app_id.in_(ids[i : i + BATCH]))
                    if guard:
                        unharvested.refuse_unharvested(conn, "redrive", workload, and_(*base, who))
                    moved += guarded_transition(
                        conn, now, target=target, where=and_(*base, who), values=values, from_states=states
                    ).moved
                shown = AUDIT_KEYS_SHOWN
                target_info.update(item_keys=keys[:shown], app_ids=ids[:shown])
                if len(keys) > shown or len(ids) > shown:
                    target_info["truncated"] = {"item_keys": len(keys), "app_ids": len(ids)}
            write_audit(conn, now, actor, action, workload, moved, target_info, reason)
        return moved

    def audit_log(self, workload: str | None = None, limit: int = 100) -> list[AuditRow]:
        """Return the latest audit rows, newest first.

        :param workload: only this workload
        :param limit: how many
        """
        q = select(s.audit).order_by(s.audit.c.id.desc()).limit(limit)
        if workload is not None:
            q = q.where(s.audit.c.workload == workload)
        with self.engine.connect() as conn:
            return [AuditRow.from_row(r) for r in conn.execute(q).mappings()]


def write_audit(
    conn: Connection,
    now: datetime,
    actor: str,
    action: str,
    workload: str,
    item_count: int,
    target: Mapping[str, Any],
    reason: str,
) -> None:
    """Write one row of the audit table (in the caller's transaction)."""
    conn.execute(
        s.audit.insert().values(
            at=now,
            actor=actor,
            action=action,
            workload=workload,
            item_count=item_count,
            target=json.dumps(dict(target), ensure_ascii=False, default=str),
            reason=reason,
        )
    )
