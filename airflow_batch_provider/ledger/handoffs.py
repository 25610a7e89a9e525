"""A consumer's hand-offs: the published answers it has not acknowledged, each with a stable key.

For side effects that cannot be upserted (a ticket, an email, an API call). A consumer's row in
``abp_deliveries`` (see :mod:`airflow_batch_provider.ledger.deliveries`, which writes every row
through its one guarded function) moves ``offered`` -> ``acknowledged`` (it acted), ``refused``
(its function failed: offered again by its next try, with the same key) or ``left_out`` (its
filter left the answer out: offered again only when the answer changes). The key is the same for
an item and prompt version until it is acknowledged; an acknowledged hand-off is never offered
again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, func, literal_column, or_, select, tuple_
from sqlalchemy.sql.selectable import Join

from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.deliveries import (
    PAGE,
    Delivery,
    put_in_report,
    record_deliveries,
    write_deliveries,
)
from airflow_batch_provider.ledger.digests import delivery_keys
from airflow_batch_provider.ledger.store import Ledger

#: The consumer's states after an offer (:func:`settle`).
Settled = Literal["acknowledged", "refused", "left_out"]


def _published_with(sink: str) -> Join:
    """The published answers, each with the sink's (or consumer's) delivery row where it has one."""
    r, d = s.published.c, s.deliveries.c
    return s.published.outerjoin(
        s.deliveries,
        and_(
            d.workload == r.workload,
            d.sink == sink,
            d.app_id == r.app_id,
            d.prompt_version == r.prompt_version,
        ),
    )


@dataclass(frozen=True)
class HandOff:
    """A result handed to a consumer, with the idempotency key to pass on to the external system.

    :param key: stable for this item and prompt version: the same until it is acknowledged
    :param app_id: the application id
    :param prompt_version: the prompt version of the answer
    :param output: the parsed answer
    :param item_key: the item's ledger key (with ``prompt_version``, where the next page starts)
    """

    key: str
    app_id: str
    prompt_version: str
    output: Any
    item_key: str


def _answer_sha256(output_json: str | None) -> str:
    return hashlib.sha256((output_json or "").encode("utf-8")).hexdigest()


def pending_for(
    ledger: Ledger,
    workload: str,
    consumer: str,
    run_id: str | None = None,
    limit: int = PAGE,
    after: tuple[str, str] | None = None,
) -> list[HandOff]:
    """Offer a consumer the published final answers it has not acknowledged, at most ``limit``.

    The offer is recorded (``offered``) before it is returned: a consumer that crashes before
    :func:`acknowledge` is offered the same items again with the same keys; an acknowledged item
    is never offered again, and one its filter left out (:func:`settle`) only once its answer
    changed. Answers come in item key order; ``after`` starts past the last one of a page, so that
    a consumer pages past the ones it leaves unacknowledged (failed) in this try.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param run_id: only this run's answers (``None``: every published answer of the workload)
    :param limit: at most this many
    :param after: ``(item_key, prompt_version)`` of the last hand-off of the previous page
    """
    r, d = s.published.c, s.deliveries.c
    found: list[tuple[Any, ...]] = []
    while len(found) < limit:
        q = (
            select(r.item_key, r.app_id, r.prompt_version, r.output_json, r.run_id, d.state, d.result_sha256)
            .select_from(_published_with(consumer))
            .where(
                r.workload == workload,
                r.state.in_(sorted(USABLE_STATES)),
                or_(d.state.is_(None), d.state != "acknowledged"),
            )
            .order_by(r.item_key, r.prompt_version)
            .limit(limit)
        )
        if run_id is not None:
            q = q.where(r.run_id == run_id)
        if after is not None:
            q = q.where(tuple_(r.item_key, r.prompt_version) > tuple_(*after))
        with ledger.engine.connect() as conn:
            rows = conn.execute(q).all()
        for row in rows:  # left out, and the same answer still: not offered again
            if not (row[5] == "left_out" and row[6] == _answer_sha256(row[3])):
                found.append(tuple(row[:5]))
        if len(rows) < limit:
            break
        after = (rows[-1][0], rows[-1][2])
    found = found[:limit]
    by_run: dict[str, list[Delivery]] = {}
    for key, app_id, version, out, run in found:
        by_run.setdefault(run, []).append(Delivery(key, app_id, version, "offered", _answer_sha256(out)))
    for run, group in by_run.items():
        record_deliveries(ledger, workload, consumer, run, group)
    key_of = delivery_keys(workload, consumer)
    return [
        HandOff(
            key_of(app_id, version),
            app_id,
            version,
            json.loads(out) if out else None,
            key,
        )
        for key, app_id, version, out, _ in found
    ]


def acknowledge(ledger: Ledger, workload: str, consumer: str, keys: Iterable[str]) -> int:
    """Record that a consumer acted on the hand-offs with these keys; return how many moved.

    Only an offered hand-off is acknowledged (a key never offered, or acknowledged already, is not
    counted); repeating the call changes nothing.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param keys: keys from :func:`pending_for`
    """
    return settle(ledger, workload, consumer, keys, "acknowledged")


def settle(
    ledger: Ledger,
    workload: str,
    consumer: str,
    keys: Iterable[str],
    state: Settled,
    error: str | None = None,
) -> int:
    """Move offered hand-offs to ``state``; return how many moved (one transaction).

    ``acknowledged``: the consumer acted (never offered again). ``refused``: its function failed,
    with ``error`` (offered again by its next try, with the same key; listed by
    :func:`refused_rows` meanwhile). ``left_out``: its filter left the answer out (offered again
    only when the answer changes). A key that is not offered is not counted; repeating the call
    changes nothing.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param keys: keys from :func:`pending_for`
    :param state: where they move
    :param error: the failure's message (``refused``)
    """
    wanted = sorted(set(keys))
    if not wanted:
        return 0
    d = s.deliveries.c
    moved = 0
    with ledger.engine.begin() as conn:
        for start in range(0, len(wanted), PAGE):
            found = conn.execute(
                select(d.item_key, d.app_id, d.prompt_version, d.result_sha256, d.run_id).where(
                    d.workload == workload,
                    d.sink == consumer,
                    d.state == literal_column("'offered'"),  # a literal: the partial index's condition
                    d.delivery_key.in_(wanted[start : start + PAGE]),
                )
            ).all()
            for key, app_id, version, sha, run in found:
                write_deliveries(
                    conn, workload, consumer, run, state, [Delivery(key, app_id, version, state, sha, error)]
                )
            moved += len(found)
    return moved


def handoff_states(ledger: Ledger, workload: str, consumer: str, run_id: str) -> dict[str, int]:
    """How many of the run's published final answers the consumer's rows hold in each state.

    ``pending``: never offered. An answer acknowledged in an earlier run (the same item and prompt
    version, unchanged since) counts as ``acknowledged``.

    :param ledger: the ledger
    :param workload: workload name
    :param consumer: the consumer's name
    :param run_id: the run
    """
    r, d = s.published.c, s.deliveries.c
    q = (
        select(d.state, func.count())
        .select_from(_published_with(consumer))
        .where(r.workload == workload, r.run_id == run_id, r.state.in_(sorted(USABLE_STATES)))
        .group_by(d.state)
    )
    with ledger.engine.connect() as conn:
        return {str(state or "pending"): int(n) for state, n in conn.execute(q)}


def note_handoffs_in_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    consumer: str,
    counts: Mapping[str, Any],
    then: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any] | None:
    """Put a consumer's counts in the run's stored report, under ``deliveries``/``consumer``.

    ``kind`` is ``consumer``; of the run's answers: ``acted`` (acted on and acknowledged by the
    latest try), ``already_acknowledged`` (before it, by an earlier try or run), ``left_out`` (by
    its filter), ``failed`` (its function failed on them in the latest try: offered again by the
    next), ``pending`` (not offered yet), and the latest try's failure messages. A rerun replaces
    them; a run without a report is left alone (``None``).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run
    :param consumer: the consumer's name
    :param counts: what the latest try did (acted, failed, messages)
    :param then: as for :func:`note_in_report`
    """
    states = handoff_states(ledger, workload, consumer, run_id)
    acted = int(counts.get("acted", 0))
    entry = {
        "kind": "consumer",
        "acted": acted,
        "already_acknowledged": max(states.get("acknowledged", 0) - acted, 0),
        "left_out": states.get("left_out", 0),
        "failed": states.get("refused", 0),
        "pending": states.get("pending", 0) + states.get("offered", 0),
        "messages": list(counts.get("messages", ())),
    }
    return put_in_report(ledger, workload, run_id, consumer, entry, then)
