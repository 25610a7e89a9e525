"""The ledger's jobs room: a chunk's job from staged to submitted, its create claim, and jobs in doubt.

A job's claim is a compare-and-set in one statement, so two task attempts never both create its
batch; a create whose outcome is unknown leaves the job in doubt until a person or the provider's
list settles it (written to the audit table).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    func,
    or_,
    select,
)

from airflow_batch_provider.core.clock import iso_or_unknown, utcnow
from airflow_batch_provider.core.states import (
    IN_DOUBT_CODE,
)
from airflow_batch_provider.exceptions import (
    InvalidTransitionError,
    JobClaimedError,
    JobNotClaimableError,
    LedgerError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import chunks
from airflow_batch_provider.ledger.records import (
    JobClaim,
    JobRow,
)
from airflow_batch_provider.ledger.review import write_audit
from airflow_batch_provider.ledger.room import Room
from airflow_batch_provider.ledger.transitions import guarded_transition


class JobRoom(Room):
    """Jobs, claims and jobs in doubt (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def record_job(
        self,
        job: Mapping[str, Any],
        placements: Iterable[tuple[str, str, str, int]],
    ) -> None:
        """Record a staged job and move its items to ``staged`` in one transaction (idempotent).

        :param job: the job row (``job_id``, ``workload``, ``run_id``, ``round``, ``chunk_index``,
            ``provider``, ``model``, ``idempotency_key``, ``staged_path``, ``input_sha256``, ``lines``,
            ``size_bytes``)
        :param placements: (item key, prompt version, custom id, attempt) per line of the chunk
        """
        now = utcnow()
        with self.engine.begin() as conn:
            found = conn.execute(select(s.jobs.c.job_id).where(s.jobs.c.job_id == job["job_id"])).first()
            if found is not None:
                return
            conn.execute(s.jobs.insert().values(**job, state="staged", created_at=now))
            for batch in chunks(placements):
                conn.execute(
                    s.attempts.insert(),
                    [
                        {
                            "job_id": job["job_id"],
                            "custom_id": cid,
                            "workload": job["workload"],
                            "item_key": key,
                            "prompt_version": version,
                            "run_id": job["run_id"],
                            "attempt": attempt,
                            "mode": "batch",
                            "created_at": now,
                            "updated_at": now,
                        }
                        for key, version, cid, attempt in batch
                    ],
                )
                moved = guarded_transition(
                    conn,
                    now,
                    rows=[
                        {
                            "b_workload": job["workload"],
                            "b_key": key,
                            "b_version": version,
                            "state": "staged",
                            "job_id": job["job_id"],
                            "custom_id": cid,
                            "attempts": attempt,
                            "error_code": None,
                            "error_message": None,
                        }
                        for key, version, cid, attempt in batch
                    ],
                )
                if moved.refused:
                    raise InvalidTransitionError(
                        f"job {job['job_id']!r}: {moved.refused} of its items are no longer in a state "
                        "that may be staged (settled, in review or in flight elsewhere); nothing was "
                        "recorded. Clear the prepare task so that it chunks the open items again."
                    )

    def job(self, job_id: str) -> dict[str, Any]:
        """Return one job as a dict, for the ledger's own code (the glue reads :meth:`get_job`).

        :param job_id: the job id
        :raises LedgerError: no such job
        """
        with self.engine.connect() as conn:
            row = conn.execute(select(s.jobs).where(s.jobs.c.job_id == job_id)).mappings().first()
        if row is None:
            raise LedgerError(
                f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
            )
        return dict(row)

    def get_job(self, job_id: str) -> JobRow:
        """Return one job as a typed row.

        :param job_id: the job id
        :raises LedgerError: no such job
        """
        return JobRow.from_row(self.job(job_id))

    def get_jobs(self, workload: str, run_id: str, round_: int | None = None) -> list[JobRow]:
        """Return this run's jobs (optionally one round's), by round and chunk, as typed rows.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param round_: only this round
        """
        q = select(s.jobs).where(s.jobs.c.workload == workload, s.jobs.c.run_id == run_id)
        if round_ is not None:
            q = q.where(s.jobs.c.round == round_)
        q = q.order_by(s.jobs.c.round, s.jobs.c.chunk_index)
        with self.engine.connect() as conn:
            return [JobRow.from_row(r) for r in conn.execute(q).mappings()]

    # ------------------------------------------------------------------ job claims
    def claim_job(self, job_id: str, owner: str, lease_s: float) -> JobClaim:
        """Claim a job's create call: a compare-and-set in one statement, so two attempts never both win.

        The claim is taken when the job is unclaimed, already claimed by ``owner`` (a retry of the
        same attempt), or its previous claim expired. Each claim increments the job's claim count,
        so a later claimer knows that an earlier one may have reached the provider and must look
        the batch up by its idempotency key before creating.

        :param job_id: the job
        :param owner: who claims (unique per task attempt, e.g. ``dag/run/task/try/pid``)
        :param lease_s: seconds the claim holds before another owner may take it over
        :raises JobClaimedError: another owner holds an unexpired claim
        :raises JobNotClaimableError: the job has a batch id or is in doubt
        :raises LedgerError: no such job
        """
        now = utcnow()
        expires = now + timedelta(seconds=lease_s)
        j = s.jobs.c
        stmt = (
            s.jobs.update()
            .where(
                j.job_id == job_id,
                j.batch_id.is_(None),
                j.state != "in_doubt",
                or_(j.claim_owner.is_(None), j.claim_owner == owner, j.claim_expires_at < now),
            )
            .values(claim_owner=owner, claim_count=j.claim_count + 1, claim_expires_at=expires)
            .returning(j.claim_count, j.claim_expires_at)
        )
        with self.engine.begin() as conn:
            won = conn.execute(stmt).first()
            if won is not None:
                return JobClaim(job_id, owner, int(won.claim_count), won.claim_expires_at)
            job = conn.execute(select(s.jobs).where(j.job_id == job_id)).mappings().first()
        if job is None:
            raise LedgerError(
                f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
            )
        if job["batch_id"] is not None:
            raise JobNotClaimableError(job_id, "submitted", str(job["batch_id"]))
        if job["state"] == "in_doubt":
            raise JobNotClaimableError(job_id, "in_doubt", str(job["in_doubt_reason"]))
        raise JobClaimedError(job_id, str(job["claim_owner"]), iso_or_unknown(job["claim_expires_at"]))

    def release_job_claim(self, job_id: str, owner: str) -> bool:
        """Give up a claim (after the batch id is recorded, or when nothing was sent).

        Returns whether ``owner`` held it; a claim taken over by someone else is left alone. The
        claim count stays: it is the job's history.

        :param job_id: the job
        :param owner: who claimed it
        """
        j = s.jobs.c
        with self.engine.begin() as conn:
            res = conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, j.claim_owner == owner)
                .values(claim_owner=None, claim_expires_at=None)
            )
        return bool(res.rowcount)

    # ------------------------------------------------------------------ jobs in doubt
    def mark_job_in_doubt(self, job_id: str, reason: str) -> None:
        """Record that a create call's outcome is unknown: nothing is created for the job until resolved.

        Its items stay ``staged`` under the job (never picked up by another job or run). The claim
        is dropped: no attempt may create while the job is in doubt.

        :param job_id: the job
        :param reason: what happened (e.g. ``timeout after create; provider cannot be listed``)
        :raises LedgerError: no such job, or it has a batch id already
        """
        j = s.jobs.c
        with self.engine.begin() as conn:
            res = conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, j.batch_id.is_(None))
                .values(
                    state="in_doubt",
                    in_doubt_reason=reason,
                    in_doubt_at=utcnow(),
                    claim_owner=None,
                    claim_expires_at=None,
                )
            )
        if not res.rowcount:
            job = self.job(job_id)
            raise LedgerError(
                f"job {job_id!r} has batch {job['batch_id']!r} already; it is not in doubt. Poll that batch."
            )

    def resolve_job(
        self,
        job_id: str,
        batch_id: str | None,
        actor: str,
        note: str,
        submitted_at: datetime | None = None,
        input_ref: str | None = None,
    ) -> JobRow:
        """Settle a job in doubt, and write the decision to the audit table.

        :param job_id: the job
        :param batch_id: the batch found for it: the job becomes ``submitted`` and its ``staged``
            items ``submitted``, and so do those sent to review while it was in doubt (code
            ``in_doubt``, no person's decision): the batch answered and billed them, so they are
            harvested from it (by the run's publish, or by the next run of the workload once the
            run is finished: :mod:`~airflow_batch_provider.services.late_harvest`),
            never sent again; ``None``: proven absent, the job goes back to ``staged`` and may be
            claimed again (its items stay staged under it; those in review may be re-driven)
        :param actor: who decided (a person, or ``provider-list`` when matched automatically)
        :param note: why (what was checked)
        :param submitted_at: when the batch was created, if known (keeps the poll timeout honest)
        :param input_ref: the provider's input file id, if known
        :raises LedgerError: no such job, or it is not in doubt
        """
        j = s.jobs.c
        now = utcnow()
        with self.engine.begin() as conn:
            job = conn.execute(select(s.jobs).where(j.job_id == job_id).with_for_update()).mappings().first()
            if job is None:
                raise LedgerError(
                    f"job {job_id!r} is not in the ledger; check the id (`airflow-batch jobs in-doubt`)."
                )
            if job["state"] != "in_doubt":
                raise LedgerError(
                    f"job {job_id!r} is {job['state']!r} (batch {job['batch_id']!r}), not in doubt; nothing to resolve."
                )
            if batch_id is not None:
                values: dict[str, Any] = {
                    "state": "submitted",
                    "batch_id": batch_id,
                    "submitted_at": submitted_at or job["in_doubt_at"] or now,
                }
                if input_ref is not None:
                    values["input_ref"] = input_ref
                conn.execute(s.jobs.update().where(j.job_id == job_id).values(**values))
                ic = s.items.c
                guarded_transition(
                    conn,
                    now,
                    target="submitted",
                    where=and_(
                        ic.job_id == job_id,
                        or_(
                            ic.state == "staged",
                            # sent to review while the job was in doubt, no person's decision yet:
                            # the batch holds their answers, harvested from it, never sent again
                            and_(
                                ic.state == "review",
                                ic.error_code == IN_DOUBT_CODE,
                                ic.review_action.is_(None),
                            ),
                        ),
                    ),
                    values={"error_code": None, "error_message": None},
                )
            else:
                conn.execute(
                    s.jobs.update()
                    .where(j.job_id == job_id)
                    .values(state="staged", claim_owner=None, claim_expires_at=None)
                )
            write_audit(
                conn,
                now,
                actor,
                "resolve_job",
                str(job["workload"]),
                int(job["lines"]),
                {"job_id": job_id, "batch_id": batch_id, "in_doubt_reason": job["in_doubt_reason"]},
                note,
            )
            row = conn.execute(select(s.jobs).where(j.job_id == job_id)).mappings().one()
        return JobRow.from_row(row)

    def jobs_in_doubt(self, workload: str | None = None) -> list[JobRow]:
        """Return the jobs whose create call's outcome is unknown, oldest first.

        :param workload: only this workload
        """
        q = select(s.jobs).where(s.jobs.c.state == "in_doubt").order_by(s.jobs.c.in_doubt_at, s.jobs.c.job_id)
        if workload is not None:
            q = q.where(s.jobs.c.workload == workload)
        with self.engine.connect() as conn:
            return [JobRow.from_row(r) for r in conn.execute(q).mappings()]

    def update_job(self, job_id: str, **values: Any) -> None:
        """Set columns of one job.

        :param job_id: the job id
        :param values: columns to set
        """
        with self.engine.begin() as conn:
            conn.execute(s.jobs.update().where(s.jobs.c.job_id == job_id).values(**values))

    def record_upload(self, job_id: str, input_kind: str, input_ref: str | None) -> tuple[str, str | None]:
        """Record what the upload task staged at the provider; the first recorded upload wins.

        A compare-and-set: the job takes ``input_kind``/``input_ref`` (and state ``uploaded``)
        only while it has no recorded input and no batch. Returns what the job holds afterwards:
        the arguments when this call recorded them, else the upload recorded earlier (a second
        file for the same chunk is then not used: the caller reports it).

        :param job_id: the job
        :param input_kind: ``file``, ``uri`` or ``inline``
        :param input_ref: the file id or URI (``None`` for ``inline``)
        :raises LedgerError: no such job
        """
        j = s.jobs.c
        with self.engine.begin() as conn:
            conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, j.input_kind.is_(None), j.batch_id.is_(None))
                .values(input_kind=input_kind, input_ref=input_ref, state="uploaded")
            )
            held = conn.execute(select(j.input_kind, j.input_ref).where(j.job_id == job_id)).first()
        if held is None:
            raise LedgerError(
                f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
            )
        return str(held.input_kind or input_kind), held.input_ref

    def mark_submitted(
        self, job_id: str, batch_id: str, input_ref: str, submitted_at: datetime | None = None
    ) -> None:
        """Record the provider's batch id and move the job's items to ``submitted``.

        Repeating it with the same batch keeps the first ``submitted_at`` (a re-attach does not
        restart the poll timeout). A different batch for a job that has one is refused: two
        batches were created for one job and both are billed.

        :param job_id: the job id
        :param batch_id: the provider's batch id
        :param input_ref: where the input was staged at the provider
        :param submitted_at: when the provider created the batch, if known (default: now)
        :raises LedgerError: no such job, or it has another batch already
        """
        now = utcnow()
        j = s.jobs.c
        with self.engine.begin() as conn:
            res = conn.execute(
                s.jobs.update()
                .where(j.job_id == job_id, or_(j.batch_id.is_(None), j.batch_id == batch_id))
                .values(
                    state="submitted",
                    batch_id=batch_id,
                    input_ref=input_ref,
                    submitted_at=func.coalesce(j.submitted_at, submitted_at or now),
                )
            )
            if not res.rowcount:
                held = conn.execute(select(j.batch_id).where(j.job_id == job_id)).first()
                if held is None:
                    raise LedgerError(
                        f"job {job_id!r} is not in the ledger; was the prepare task of this run cleared?"
                    )
                raise LedgerError(
                    f"job {job_id!r} has batch {held.batch_id!r} already, and batch {batch_id!r} was "
                    "created for it too: both are billed. Nothing was recorded for the second; cancel "
                    "it at the provider, or reconcile it by hand."
                )
            guarded_transition(
                conn,
                now,
                target="submitted",
                where=and_(s.items.c.job_id == job_id, s.items.c.state == "staged"),
            )
