"""The ledger's facade: :class:`Ledger`, one class made of the rooms. No Airflow imports.

Give it a SQLAlchemy URL or engine. Each concern of the ledger is a room, a module of its own
under ``ledger/`` with one class of methods:

- :mod:`~airflow_batch_provider.ledger.schema_setup`: create and upgrade the schema;
- :mod:`~airflow_batch_provider.ledger.run_rows`: a run's row, from start to report;
- :mod:`~airflow_batch_provider.ledger.items` and :mod:`~airflow_batch_provider.ledger.item_reads`:
  a run's items in, rejected, moved, and read back;
- :mod:`~airflow_batch_provider.ledger.jobs`: jobs, their create claims and jobs in doubt;
- :mod:`~airflow_batch_provider.ledger.leases`: one run at a time holds a workload;
- :mod:`~airflow_batch_provider.ledger.results` (its SQL in
  :mod:`~airflow_batch_provider.ledger.result_rules`): result lines applied, missing lines marked;
- :mod:`~airflow_batch_provider.ledger.rounds`: what may be resubmitted, what goes to review;
- :mod:`~airflow_batch_provider.ledger.review`: the review queue, a person's actions, the audit table;
- :mod:`~airflow_batch_provider.ledger.costs`: costs, route counts and the published results;
- :mod:`~airflow_batch_provider.ledger.sync_attempts`: one item sent synchronously.

Two rooms hold no methods of :class:`Ledger` and serve the others:
:mod:`~airflow_batch_provider.ledger.bulk` (slices and writes at the database's floor: ``COPY``
on PostgreSQL, one prepared ``executemany`` on SQLite) and
:mod:`~airflow_batch_provider.ledger.transitions` (the one function that writes an item's state,
guarded in SQL). Every write is a transaction; every operation is safe to repeat: a cleared task
that runs again converges to the same rows.

Why mixins and not delegation: each room's methods keep their names, signatures and docstrings
beside their code, and the facade repeats none of them (delegating 45 methods would copy every
signature and docstring into this file again, which is what the split took out). :class:`Ledger`
stays one class, so callers, ``isinstance``, subclasses and a test's ``monkeypatch`` of a method
see what they saw before. A room that needs another's method says so by subclassing it
(:class:`~airflow_batch_provider.ledger.results.ResultRoom` reads jobs through
:class:`~airflow_batch_provider.ledger.jobs.JobRoom`,
:class:`~airflow_batch_provider.ledger.costs.CostRoom` reads items through
:class:`~airflow_batch_provider.ledger.item_reads.ItemReadRoom`).

The names this module exported before the split (``PreparedItem``, ``UpsertStats``,
``ReconcileStats``, ``Moved``, ``BATCH``, ``APPLY_SLICE``, ``NEW_ITEM_COLUMNS``, ``sync_job_id``)
are re-exported here. Time and money helpers live in :mod:`airflow_batch_provider.core.clock`
and :mod:`airflow_batch_provider.core.money`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, event

from airflow_batch_provider.ledger.bulk import BATCH
from airflow_batch_provider.ledger.costs import CostRoom
from airflow_batch_provider.ledger.item_reads import ItemReadRoom
from airflow_batch_provider.ledger.items import NEW_ITEM_COLUMNS, ItemRoom, PreparedItem, UpsertStats
from airflow_batch_provider.ledger.jobs import JobRoom
from airflow_batch_provider.ledger.leases import LeaseRoom
from airflow_batch_provider.ledger.records import sync_job_id
from airflow_batch_provider.ledger.results import APPLY_SLICE, ReconcileStats, ResultRoom
from airflow_batch_provider.ledger.review import ReviewRoom
from airflow_batch_provider.ledger.rounds import RoundRoom
from airflow_batch_provider.ledger.run_rows import RunRoom
from airflow_batch_provider.ledger.schema_setup import SchemaRoom
from airflow_batch_provider.ledger.sync_attempts import SyncRoom
from airflow_batch_provider.ledger.transitions import Moved

__all__ = [
    "APPLY_SLICE",
    "BATCH",
    "NEW_ITEM_COLUMNS",
    "Ledger",
    "Moved",
    "PreparedItem",
    "ReconcileStats",
    "UpsertStats",
    "sync_job_id",
]


class Ledger(
    SchemaRoom,
    RunRoom,
    ItemRoom,
    CostRoom,
    ItemReadRoom,
    ResultRoom,
    JobRoom,
    LeaseRoom,
    RoundRoom,
    ReviewRoom,
    SyncRoom,
):
    """The per-item store.

    :param engine: a SQLAlchemy engine (SQLite or PostgreSQL)
    """

    @classmethod
    def from_url(cls, url: str, **engine_kwargs: Any) -> Ledger:
        """Open a ledger from a SQLAlchemy URL; SQLite gets WAL mode and a busy timeout.

        :param url: e.g. ``sqlite:////data/ledger.sqlite`` or ``postgresql+psycopg2://...``
        :param engine_kwargs: passed to :func:`sqlalchemy.create_engine`
        """
        if url.startswith("sqlite"):
            engine_kwargs.setdefault("connect_args", {"timeout": 30})
        elif url.startswith("postgresql+psycopg2"):
            # batched round trips for the executemany UPDATEs of reconcile and staging
            engine_kwargs.setdefault("executemany_mode", "values_plus_batch")
        engine = create_engine(url, future=True, **engine_kwargs)
        if engine.dialect.name == "sqlite":

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA foreign_keys=ON")
                # A million-row table written in random key order (abp_deliveries' primary key: a
                # delivery goes in item-key order, a hash) touches an index page per row: a 32 MiB
                # page cache (at most, per connection) and a checkpoint per 10,000 WAL pages (not
                # 1,000: one per batch) keep those writes off the disk's path.
                cur.execute("PRAGMA cache_size=-32768")
                cur.execute("PRAGMA wal_autocheckpoint=10000")
                cur.close()

        ledger = cls(engine)
        ledger.ensure_schema()
        return ledger
