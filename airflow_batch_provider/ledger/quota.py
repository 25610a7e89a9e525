"""Quotas shared by every task of a connection, kept in the ledger: a rate window and enqueued tokens.

Two stores, each keyed by a *quota key* (the connection id, or the ``quota_key`` the connection
names, so that two connections of one API key can share):

- :class:`SharedRateStore`: the synchronous API's RPM/TPM window as a sliding log
  (``abp_rate_log``), one row per request, with atomic :meth:`~SharedRateStore.reserve`,
  :meth:`~SharedRateStore.commit` and :meth:`~SharedRateStore.release` (the
  :class:`~airflow_batch_provider.core.ratelimit.RateStore` of the limiter);
- :class:`EnqueuedQuotaStore`: the batch jobs admitted under a provider's enqueued-token limit per
  model (``abp_enqueued``); a job's tokens count until its batch ends.

Atomic under concurrent processes on both databases the same way: every decision starts with a
write to the key's row in ``abp_quota_keys``. On PostgreSQL that takes the row lock, held until the
transaction ends; on SQLite it takes the database's write lock before anything is read (the first
statement of the transaction writes, so there is no older snapshot to upgrade), and a second
process waits on the busy timeout. The decision itself is :mod:`core <airflow_batch_provider.core.ratelimit>`'s
pure function; no SQL outside this module.

Times are epoch seconds from the callers (:class:`~airflow_batch_provider.core.ratelimit.WallClock`):
the processes that share a key must share a clock (one host, or hosts kept in time by NTP: a skew
of ``s`` seconds lets up to ``s / window`` of a limit through early).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, Engine, and_, case, delete, func, or_, select, update

from airflow_batch_provider.core.ratelimit import window_fits, window_wait
from airflow_batch_provider.core.states import (
    ENQUEUED_JOB_STATES,
    NOT_CREATED_JOB_STATES,
    TERMINAL_BATCH_STATES,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import dialect_insert

#: Rows of the rate log are kept at least this long (a caller with a longer window keeps them longer).
KEEP_S: Final = 120.0
#: A reservation whose answer never came (its process died) stops counting this long after it
#: was made (longer than an SDK call's timeout).
IN_FLIGHT_MAX_S: Final = 900.0
#: Job states whose batch may hold enqueued tokens at the provider (``staged``/``uploaded``:
#: admitted, not yet created; counted while its admission is younger than the stale limit).
HOLDING_STATES: Final[frozenset[str]] = ENQUEUED_JOB_STATES
#: An admitted job still ``staged`` or ``uploaded`` after this long was never created (its submit
#: died and was not retried): its tokens are released.
STALE_ADMISSION_S: Final = 3600.0


def _lock(conn: Connection, quota_key: str, paused_until: float = 0.0) -> float:
    """Lock the key's row for this transaction (creating it); raise its pause; return the pause."""
    insert = dialect_insert(conn)
    conn.execute(
        insert(s.quota_keys).values(quota_key=quota_key, paused_until=0.0, seq=0).on_conflict_do_nothing()
    )
    col = s.quota_keys.c
    conn.execute(
        update(s.quota_keys)
        .where(col.quota_key == quota_key)
        .values(
            seq=col.seq + 1,
            paused_until=case((col.paused_until < paused_until, paused_until), else_=col.paused_until),
        )
    )
    return float(conn.execute(select(col.paused_until).where(col.quota_key == quota_key)).scalar_one())


class SharedRateStore:
    """The RPM/TPM sliding window of one quota key, shared by every process that opens it.

    :param engine: the ledger's engine
    :param quota_key: the connection id (or the key the connection names)
    """

    def __init__(self, engine: Engine, quota_key: str) -> None:
        self.engine = engine
        self.quota_key = quota_key

    def reserve(
        self,
        tokens: int,
        now: float,
        rpm: int | None,
        tpm: int | None,
        window_s: float,
        paused_until: float = 0.0,
    ) -> tuple[int | None, float]:
        """Reserve one request of ``tokens`` now if the shared window has room.

        :param tokens: the request's token estimate
        :param now: epoch seconds
        :param rpm: most requests per window
        :param tpm: most tokens per window
        :param window_s: the window
        :param paused_until: a pause this process was told of; every process honours it from now on
        :return: ``(reservation id, 0)``, or ``(None, seconds to wait)``
        """
        log = s.rate_log.c
        mine = log.quota_key == self.quota_key
        with self.engine.begin() as conn:
            paused = _lock(conn, self.quota_key, paused_until)
            conn.execute(
                delete(s.rate_log).where(mine, log.at <= now - max(window_s, KEEP_S) - IN_FLIGHT_MAX_S)
            )
            live = and_(
                mine,
                or_(
                    log.at > now - window_s,
                    and_(log.settled.is_(False), log.at > now - window_s - IN_FLIGHT_MAX_S),
                ),
            )
            count, used = conn.execute(
                select(func.count(), func.coalesce(func.sum(log.tokens), 0)).where(live)
            ).one()
            if paused <= now and window_fits(int(count), int(used), tokens, rpm, tpm):
                wait = 0.0
            else:
                rows = conn.execute(select(log.at, log.tokens, log.settled).where(live)).all()
                in_window = [(float(a) if done else max(float(a), now), int(t)) for a, t, done in rows]
                wait = window_wait(in_window, tokens, now, rpm, tpm, window_s, paused)
            if wait > 0:
                return None, wait
            new = conn.execute(
                s.rate_log.insert().values(quota_key=self.quota_key, at=now, tokens=tokens, settled=False)
            )
            key = new.inserted_primary_key
            assert key is not None  # an INSERT of one row
            return int(key[0]), 0.0

    def commit(self, reservation_id: int, tokens: int, at: float) -> None:
        """Charge a reservation ``tokens`` from ``at`` (never earlier than it was reserved).

        :param reservation_id: what :meth:`reserve` returned
        :param tokens: the tokens charged
        :param at: when the charge counts from
        """
        log = s.rate_log.c
        with self.engine.begin() as conn:
            conn.execute(
                update(s.rate_log)
                .where(log.id == reservation_id)
                .values(tokens=max(0, tokens), at=case((log.at < at, at), else_=log.at), settled=True)
            )

    def release(self, reservation_id: int) -> None:
        """Give a reservation back whole (its request was never sent).

        :param reservation_id: what :meth:`reserve` returned
        """
        with self.engine.begin() as conn:
            conn.execute(delete(s.rate_log).where(s.rate_log.c.id == reservation_id))

    def in_window(self, now: float, window_s: float) -> tuple[int, int]:
        """(requests, tokens) reserved in the window ending ``now``, by every process.

        :param now: epoch seconds
        :param window_s: the window
        """
        log = s.rate_log.c
        with self.engine.connect() as conn:
            count, used = conn.execute(
                select(func.count(), func.coalesce(func.sum(log.tokens), 0)).where(
                    log.quota_key == self.quota_key,
                    or_(log.at > now - window_s, log.settled.is_(False)),
                )
            ).one()
        return int(count), int(used)


@dataclass(frozen=True)
class Holder:
    """A job whose batch holds enqueued tokens.

    :param job_id: the ledger job
    :param tokens: its estimated input tokens
    :param batch_id: its provider batch (``None`` before the create, or in doubt)
    """

    job_id: str
    tokens: int
    batch_id: str | None


@dataclass(frozen=True)
class Admission:
    """The answer to one job asking to be enqueued.

    :param admitted: the job may be created now
    :param tokens: the job's estimated input tokens
    :param enqueued: tokens the other admitted jobs hold
    :param limit: the limit for the model
    :param holders: the jobs holding them (when refused)
    """

    admitted: bool
    tokens: int
    enqueued: int
    limit: int
    holders: tuple[Holder, ...] = ()


class EnqueuedQuotaStore:
    """The enqueued-token admissions of one quota key, shared by every workload on it.

    A job's tokens are held from its admission until the ledger shows its batch ended (a terminal
    ``batch_state``, or the job moved past ``submitted``), until :meth:`release` is told so, or,
    for a job admitted and never created, :data:`STALE_ADMISSION_S` after its admission.

    :param engine: the ledger's engine
    :param quota_key: the connection id (or the key the connection names)
    """

    def __init__(self, engine: Engine, quota_key: str) -> None:
        self.engine = engine
        self.quota_key = quota_key
        self._lock_key = f"{quota_key}|enqueued"

    def _holders(self, conn: Connection, model: str, now: float) -> list[Holder]:
        """Release the admissions whose batch ended; return the ones still holding (lock held)."""
        q, j = s.enqueued.c, s.jobs.c
        rows = conn.execute(
            select(q.job_id, q.tokens, q.admitted_at, j.state, j.batch_state, j.batch_id)
            .select_from(s.enqueued.outerjoin(s.jobs, j.job_id == q.job_id))
            .where(q.quota_key == self.quota_key, q.model == model, q.released_at.is_(None))
        ).all()
        holding, ended = [], []
        for job_id, tokens, admitted_at, state, batch_state, batch_id in rows:
            over = (
                state not in HOLDING_STATES
                or batch_state in TERMINAL_BATCH_STATES
                or (state in NOT_CREATED_JOB_STATES and float(admitted_at) < now - STALE_ADMISSION_S)
            )
            if over:
                ended.append(job_id)
            else:
                holding.append(Holder(job_id, int(tokens), batch_id))
        self._release(conn, ended, now)
        return holding

    def _release(self, conn: Connection, job_ids: Sequence[str], now: float) -> None:
        q = s.enqueued.c
        if job_ids:
            conn.execute(
                update(s.enqueued)
                .where(q.quota_key == self.quota_key, q.job_id.in_(list(job_ids)), q.released_at.is_(None))
                .values(released_at=now)
            )

    def admit(self, job_id: str, model: str, tokens: int, limit: int, now: float) -> Admission:
        """Admit the job when its tokens fit under ``limit`` with the others' (or it is alone).

        Idempotent: a job already admitted and not released is admitted again without counting
        twice (a retried submit).

        :param job_id: the ledger job
        :param model: the model its batch runs on
        :param tokens: its estimated input tokens
        :param limit: the provider's enqueued-token limit for the model (after headroom)
        :param now: epoch seconds
        """
        with self.engine.begin() as conn:
            _lock(conn, self._lock_key)
            holders = self._holders(conn, model, now)
            others = [h for h in holders if h.job_id != job_id]
            held = sum(h.tokens for h in others)
            if len(others) < len(holders):
                return Admission(True, tokens, held, limit)
            if others and held + tokens > limit:
                return Admission(False, tokens, held, limit, tuple(others))
            insert = dialect_insert(conn)
            stmt = insert(s.enqueued).values(
                quota_key=self.quota_key, job_id=job_id, model=model, tokens=tokens, admitted_at=now
            )
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["quota_key", "job_id"],
                    set_={"model": model, "tokens": tokens, "admitted_at": now, "released_at": None},
                )
            )
            return Admission(True, tokens, held, limit)

    def release(self, job_ids: Sequence[str], now: float) -> None:
        """Release jobs whose batches ended (read from the provider, before the ledger heard).

        :param job_ids: the ledger jobs
        :param now: epoch seconds
        """
        with self.engine.begin() as conn:
            _lock(conn, self._lock_key)
            self._release(conn, job_ids, now)

    def enqueued(self, model: str, now: float) -> int:
        """Tokens held for ``model`` now (ended batches released first).

        :param model: the model
        :param now: epoch seconds
        """
        with self.engine.begin() as conn:
            _lock(conn, self._lock_key)
            return sum(h.tokens for h in self._holders(conn, model, now))
