"""The ledger's item-reads room: a run's items streamed back, a page per short read, and counted.

Keyset pagination: no cursor stays open between pages, so a caller may write to the ledger while
it iterates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any, TypeVar, overload

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.engine import Row, RowMapping

from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import BATCH, keyset_pages
from airflow_batch_provider.ledger.records import (
    ITEM_SHAPES,
    ItemRow,
)
from airflow_batch_provider.ledger.room import Room

_Shape = TypeVar("_Shape")


class ItemReadRoom(Room):
    """A run's items read back (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def iter_items(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        page: int = BATCH,
    ) -> Iterator[RowMapping]:
        """Stream this run's items in key order, a page per short read (keyset pagination).

        No cursor stays open between pages, so the caller may write to the ledger while iterating.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param states: only these states
        :param columns: only these columns (the key columns are always included)
        :param page: rows per read
        """
        wanted = list(
            dict.fromkeys(["item_key", "prompt_version", *(columns or [col.name for col in s.items.c])])
        )
        for rows in self._item_pages(workload, run_id, states, wanted, page):
            yield from (row._mapping for row in rows)

    @overload
    def iter_item_rows(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        *,
        job_id: str | None = None,
        page: int = BATCH,
    ) -> Iterator[ItemRow]: ...

    @overload
    def iter_item_rows(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        *,
        shape: type[_Shape],
        job_id: str | None = None,
        page: int = BATCH,
    ) -> Iterator[_Shape]: ...

    def iter_item_rows(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None = None,
        *,
        shape: type[Any] = ItemRow,
        job_id: str | None = None,
        page: int = BATCH,
    ) -> Iterator[Any]:
        """Stream this run's items as typed, frozen rows, in key order, a page per short read.

        Only the columns of ``shape`` are read (``OpenItem`` for sending, ``ItemRef`` without the
        bodies, ``ItemOutcome`` for results, ``ItemRow`` for all). No cursor stays open between
        pages, so the caller may write to the ledger while iterating.

        :param workload: workload name
        :param run_id: the Airflow run id
        :param states: only these states
        :param shape: the record to build (one of ``ledger.records.ITEM_SHAPES``)
        :param job_id: only the items placed on this job
        :param page: rows per read
        :raises LedgerError: ``shape`` is not one of the item shapes
        """
        if shape not in ITEM_SHAPES:
            raise LedgerError(
                f"iter_item_rows reads items as one of {[c.__name__ for c in ITEM_SHAPES]}, not "
                f"{getattr(shape, '__name__', shape)!r}; add the shape to ledger/records.py's ITEM_SHAPES."
            )
        # Selected in the shape's field order, so each row builds its record positionally.
        for rows in self._item_pages(
            workload, run_id, states, [f.name for f in dataclass_fields(shape)], page, job_id
        ):
            yield from (shape(*row) for row in rows)

    def _item_pages(
        self,
        workload: str,
        run_id: str,
        states: Sequence[str] | None,
        wanted: Sequence[str],
        page: int,
        job_id: str | None = None,
    ) -> Iterator[list[Row[Any]]]:
        """Pages of this run's items (``wanted`` columns, which include the key), in key order."""
        c = s.items.c
        q = select(*[c[name] for name in wanted]).where(c.workload == workload, c.run_id == run_id)
        if states is not None:
            q = q.where(c.state.in_(list(states)))
        if job_id is not None:
            q = q.where(c.job_id == job_id)
        yield from keyset_pages(self.engine, q, (c.item_key, c.prompt_version), page)

    def count_states(self, workload: str, run_id: str) -> dict[str, int]:
        """Return this run's items by state.

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        q = (
            select(s.items.c.state, func.count())
            .where(s.items.c.workload == workload, s.items.c.run_id == run_id)
            .group_by(s.items.c.state)
        )
        with self.engine.connect() as conn:
            return {state: int(n) for state, n in conn.execute(q)}
