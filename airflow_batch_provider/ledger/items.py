"""The ledger's items room: bring a run's items in, record the ones that cannot be sent, move them.

:meth:`ItemRoom.upsert_items` decides per item, in slices of
:data:`~airflow_batch_provider.ledger.bulk.BATCH`, whether it is new, unchanged, changed, held in
review or another run's; new items go in at the database's bulk-insert floor and the others move
through one staged, guarded transition. Reading a run's items back is
:mod:`~airflow_batch_provider.ledger.item_reads`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    Column,
    String,
    Table,
    Text,
    and_,
    case,
    literal_column,
    select,
    text,
)
from sqlalchemy.engine import Connection

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.states import (
    IN_FLIGHT_STATES,
    ITEM_STATES,
    USABLE_STATES,
)
from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger import unharvested
from airflow_batch_provider.ledger.bulk import (
    STAGING_META,
    chunks,
    db_stamp,
    insert_rows,
    pair_filter,
    stage,
)
from airflow_batch_provider.ledger.prompt_changes import (
    changed_prompt,
    record_prompt_changes,
    run_prompt_digests,
)
from airflow_batch_provider.ledger.room import Room
from airflow_batch_provider.ledger.runs import newer_runs
from airflow_batch_provider.ledger.transitions import Moved, guarded_transition, state_guard


@dataclass(frozen=True)
class PreparedItem:
    """An item ready for the ledger.

    :param key: item key (charset-safe)
    :param request: the canonical request
    """

    key: str
    request: CanonicalRequest


@dataclass(frozen=True)
class UpsertStats:
    """What :meth:`Ledger.upsert_items` did.

    :param new: items seen for the first time
    :param changed: items whose input changed (or that had not succeeded) and go out again
    :param unchanged: items whose input matches an earlier success; not sent again
    :param already_in_run: items this run had recorded before (a rerun of the task)
    :param in_review: unchanged items held in review (or resolved/skipped by a person); not sent
        again until their input changes or someone re-drives them
    :param in_flight_elsewhere: items staged or sent by another run that may already be at a
        provider; they stay with that run (never sent twice)
    :param owned_by_newer_run: items a run that started later owns; a rerun of an older run leaves
        them (and that run's history) alone
    :param prompt_changed: of the ``changed``, items sent again only because the prompt's content
        changed under the same version (an in-place edit; recorded in ``abp_prompt_changes``)
    """

    new: int = 0
    changed: int = 0
    unchanged: int = 0
    already_in_run: int = 0
    in_review: int = 0
    in_flight_elsewhere: int = 0
    owned_by_newer_run: int = 0
    prompt_changed: int = 0


#: The columns :meth:`Ledger.upsert_items` fills for a new item, in order (the benchmark floor writes the same).
NEW_ITEM_COLUMNS: Final = (
    "workload",
    "item_key",
    "prompt_version",
    "app_id",
    "model",
    "input_hash",
    "request_json",
    "state",
    "attempts",
    "run_id",
    "created_at",
    "updated_at",
)

#: Per-connection staging table of :meth:`Ledger.upsert_items`: one row per item a new run takes
#: over (``kind``: ``held`` in review, ``unchanged``, or ``changed`` and sent again).
ITEMS_STAGE = Table(
    "abp_stage_items",
    STAGING_META,
    Column("b_key", String(64)),  # no key: a key given twice is refused by the move, as before
    Column("b_version", String(100)),
    Column("b_from", String(32)),
    Column("state", String(32)),
    Column("kind", String(16)),
    Column("run_id", String(250)),
    Column("app_id", Text),
    Column("model", String(200)),
    Column("input_hash", String(64)),
    Column("request_json", Text),
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
)
#: The columns a changed item starts over without (its last attempt's news).
_CLEARED_ON_CHANGE: Final = (
    "job_id",
    "custom_id",
    "output_json",
    "error_code",
    "error_message",
    "review_action",
    "review_note",
)


class ItemRoom(Room):
    """A run's items in and on (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def upsert_items(self, workload: str, run_id: str, items: Iterable[PreparedItem]) -> UpsertStats:
        """Bring this run's items into the ledger.

        A new item, or one whose input changed or that never succeeded, becomes ``pending``. An item
        whose input hash matches its last success becomes ``unchanged`` and keeps its output. An
        item this run already recorded with the same input is left alone, so rerunning the task
        changes nothing; one whose input changed since (a record fixed after its reject, an edited
        input) is prepared again (``pending``) unless it is staged or sent. An item a run that
        started later owns stays with that run (a rerun of an older run).

        Sticky, when the input is unchanged: an item in ``review`` (or that a person resolved or
        skipped) stays there, and a ``failed_permanent`` one goes to ``review``: neither is paid for
        again until its input or prompt version changes or someone re-drives it. An item another
        run has staged or sent (or may have: its job was claimed, is in doubt or has a batch)
        stays with that run, whatever its input.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param items: the prepared items (streamed)
        :raises LedgerError: two application ids map to the same key
        """
        stats = Counter[str]()
        now = utcnow()
        c = s.items.c
        for batch in chunks(items):
            with self.engine.begin() as conn:
                keys = [(it.key, it.request.prompt_version) for it in batch]
                existing = {
                    (r["item_key"], r["prompt_version"]): r
                    for r in conn.execute(
                        select(
                            c.item_key,
                            c.prompt_version,
                            c.app_id,
                            c.run_id,
                            c.state,
                            c.input_hash,
                            c.succeeded_hash,
                            c.review_action,
                            c.job_id,
                        ).where(c.workload == workload, pair_filter(c.item_key, c.prompt_version, keys))
                    ).mappings()
                }
                newer = newer_runs(conn, workload, run_id, {str(r["run_id"]) for r in existing.values()})
                prompts = run_prompt_digests(
                    conn, workload, {run_id, *(str(r["run_id"]) for r in existing.values())}
                )
                prompt_edits: list[tuple[str, str, str, str, str]] = []
                unsent = self._unsent_jobs(
                    conn,
                    {
                        r["job_id"]
                        for r in existing.values()
                        if r["state"] == "staged" and r["run_id"] != run_id and r["job_id"]
                    },
                )
                # the send guard: an item whose job holds a batch not yet harvested, that may
                # still answer (and bill) it, stays with its run
                guarded = unharvested.guarded_items(
                    conn, and_(c.workload == workload, pair_filter(c.item_key, c.prompt_version, keys))
                )
                inserts: list[tuple[Any, ...]] = []
                stamp = db_stamp(conn, now)
                reopened: list[tuple[Any, ...]] = []
                first_ids: dict[tuple[str, str], str] = {}
                for it in batch:
                    req = it.request
                    row = existing.get((it.key, req.prompt_version))
                    # Also across this slice: two ids inserted together would otherwise surface as a
                    # bare unique-constraint error.
                    first_id = first_ids.setdefault(
                        (it.key, req.prompt_version), row["app_id"] if row is not None else req.app_id
                    )
                    if first_id != req.app_id:
                        raise LedgerError(
                            f"application ids {first_id!r} and {req.app_id!r} map to the same item key "
                            f"{it.key!r}; rename one of them."
                        )
                    input_hash = req.input_hash  # computed once: it serialises the request

                    if row is None:
                        inserts.append(
                            (
                                workload,
                                it.key,
                                req.prompt_version,
                                req.app_id,
                                req.model,
                                input_hash,
                                json.dumps(req.to_dict(), ensure_ascii=False),
                                "pending",
                                0,
                                run_id,
                                stamp,
                                stamp,
                            )
                        )
                        stats["new"] += 1
                        continue
                    state = row["state"]
                    if row["run_id"] == run_id and (
                        row["input_hash"] == input_hash or state in IN_FLIGHT_STATES
                    ):
                        stats["already_in_run"] += 1
                        continue
                    if row["run_id"] in newer:
                        stats["owned_by_newer_run"] += 1
                        continue
                    in_flight = state in IN_FLIGHT_STATES and not (
                        state == "staged" and row["job_id"] in unsent
                    )
                    if in_flight or (it.key, req.prompt_version) in guarded:
                        stats["in_flight_elsewhere"] += 1
                        continue
                    address = (it.key, req.prompt_version, state)
                    same_input = row["input_hash"] == input_hash
                    if same_input and (
                        state in ("review", "failed_permanent") or row["review_action"] is not None
                    ):
                        held = "review" if state == "failed_permanent" else state
                        reopened.append((*address, held, "held", run_id, None, None, None, None))
                        stats["in_review"] += 1
                    elif row["succeeded_hash"] == input_hash and state in USABLE_STATES:
                        reopened.append((*address, "unchanged", "unchanged", run_id, None, None, None, None))
                        stats["unchanged"] += 1
                    else:
                        edit = changed_prompt(prompts, str(row["run_id"]), run_id, req.prompt_version)
                        if edit is not None and (
                            row["succeeded_hash"] is not None
                            or state in ("review", "failed_permanent")
                            or row["review_action"] is not None
                        ):
                            # kept but for the prompt's in-place edit: the recorded reason it is paid again
                            prompt_edits.append((it.key, req.prompt_version, str(row["run_id"]), *edit))
                            stats["prompt_changed"] += 1
                        reopened.append(
                            (
                                *address,
                                "pending",
                                "changed",
                                run_id,
                                req.app_id,
                                req.model,
                                input_hash,
                                json.dumps(req.to_dict(), ensure_ascii=False),
                            )
                        )
                        stats["changed"] += 1
                if reopened:
                    stage(conn, ITEMS_STAGE, reopened)
                    t = ITEMS_STAGE.c
                    changed = t.kind == literal_column("'changed'")
                    moved = guarded_transition(
                        conn,
                        now,
                        staged=ITEMS_STAGE,
                        workload=workload,
                        targets={r[3] for r in reopened},
                        reopen=True,
                        values={
                            "run_id": t.run_id,
                            "route": case(
                                (t.kind == literal_column("'unchanged'"), literal_column("'unchanged'")),
                                (changed, None),
                                else_=c.route,
                            ),
                            "attempts": case((changed, 0), else_=c.attempts),
                            **{
                                name: case((changed, t[name]), else_=c[name])
                                for name in ("app_id", "model", "input_hash", "request_json")
                            },
                            **{name: case((changed, None), else_=c[name]) for name in _CLEARED_ON_CHANGE},
                        },
                    )
                    if moved.refused:
                        raise LedgerError(
                            f"{moved.refused} item(s) of workload {workload!r} changed state while run "
                            f"{run_id!r} was preparing them (another run of the workload is active?); "
                            "retry the task, and let one run hold the workload at a time."
                        )
                record_prompt_changes(conn, workload, run_id, now, prompt_edits)
                # New items start pending, at the database's bulk-insert floor.
                insert_rows(conn, s.items, NEW_ITEM_COLUMNS, inserts)
        if (
            self.engine.dialect.name == "postgresql"
            and stats["new"] + stats["changed"] + stats["unchanged"] >= 5000
        ):
            # Fresh statistics, so that the run's keyset pages use the (workload, run_id, key) index
            # right away instead of sorting the run on every page until autovacuum analyses.
            with self.engine.begin() as conn:
                conn.execute(text("ANALYZE abp_items"))
        return UpsertStats(**stats)

    @staticmethod
    def _unsent_jobs(conn: Connection, job_ids: set[str]) -> set[str]:
        """Of ``job_ids``, those proven never sent: staged, never claimed, not in doubt, no batch."""
        if not job_ids:
            return set()
        j = s.jobs.c
        q = select(j.job_id).where(
            j.job_id.in_(sorted(job_ids)), j.state == "staged", j.claim_count == 0, j.batch_id.is_(None)
        )
        unsent = {str(r) for r in conn.execute(q).scalars()}
        known = {
            str(r) for r in conn.execute(select(j.job_id).where(j.job_id.in_(sorted(job_ids)))).scalars()
        }
        return unsent | (job_ids - known)

    def reject_items(
        self, workload: str, run_id: str, rejected: Iterable[tuple[PreparedItem | None, str, str, str]]
    ) -> int:
        """Record items that cannot be sent, in ``review`` with the reason; others go on.

        An item a run that started later owns is left with it.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param rejected: (item or ``None`` when it could not be rendered, app id, code, message)
        """
        now = utcnow()
        count = 0
        with self.engine.begin() as conn:
            for prepared, app_id, code, message in rejected:
                from airflow_batch_provider.core.custom_ids import item_key

                key = prepared.key if prepared else item_key(app_id)
                version = prepared.request.prompt_version if prepared else "-"
                where = and_(
                    s.items.c.workload == workload,
                    s.items.c.item_key == key,
                    s.items.c.prompt_version == version,
                )
                found = conn.execute(select(s.items.c.run_id).where(where)).first()
                values = {"run_id": run_id, "error_code": code, "error_message": message, "route": None}
                if found and found.run_id != run_id and newer_runs(conn, workload, run_id, [found.run_id]):
                    continue  # a newer run owns it: a rerun of an older run does not take it back
                if found:
                    # An item another run has in flight stays with it; anything else is reopened.
                    moved = guarded_transition(
                        conn,
                        now,
                        target="review",
                        where=where,
                        values=values,
                        from_states=(
                            ITEM_STATES if found.run_id == run_id else set(ITEM_STATES) - IN_FLIGHT_STATES
                        ),
                        reopen=True,
                    )
                    count += moved.moved
                else:
                    req = prepared.request if prepared else None
                    conn.execute(
                        s.items.insert().values(
                            workload=workload,
                            item_key=key,
                            prompt_version=version,
                            app_id=app_id,
                            model=req.model if req else "-",
                            input_hash=req.input_hash if req else "-",
                            request_json=json.dumps(req.to_dict()) if req else "{}",
                            attempts=0,
                            created_at=now,
                            updated_at=now,
                            state="review",
                            **values,
                        )
                    )
                    count += 1
        return count

    def transition(
        self,
        workload: str,
        run_id: str,
        target: str,
        from_states: Sequence[str],
        keys: Sequence[tuple[str, str]] | None = None,
        *,
        attempts_below: int | None = None,
        **values: Any,
    ) -> int:
        """Move this run's items in ``from_states`` (optionally only ``keys``) to ``target``.

        Through the guarded transition: an item that left ``from_states`` meanwhile is not moved.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param target: the new state
        :param from_states: states to move from; each must connect to ``target``
        :param keys: (item key, prompt version) pairs to restrict to
        :param attempts_below: only items with fewer attempts than this (one statement, however
            many items: no list of keys)
        :param values: extra columns to set
        :raises InvalidTransitionError: a source state does not connect to ``target``
        """
        state_guard(target, from_states, reopen=False)  # refuse a bad move before touching anything
        total = Moved()
        base = and_(
            s.items.c.workload == workload, s.items.c.run_id == run_id, s.items.c.state.in_(list(from_states))
        )
        if attempts_below is not None:
            base = and_(base, s.items.c.attempts < attempts_below)
        with self.engine.begin() as conn:
            now = utcnow()
            for batch in [None] if keys is None else chunks(keys):
                where = (
                    base
                    if batch is None
                    else and_(base, pair_filter(s.items.c.item_key, s.items.c.prompt_version, batch))
                )
                total = total + guarded_transition(
                    conn, now, target=target, where=where, values=values, from_states=from_states
                )
        return total.moved
