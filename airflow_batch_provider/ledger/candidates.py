"""The answers a delivery reads: a run's published final answers, a page at a time, with the sink's record.

The answers are the run's rows of ``abp_results`` (states ``succeeded`` and ``unchanged``); each
comes with what the sink was last given for it (its ``abp_deliveries`` row's state and digest),
so that the delivery leaves out what the sink holds already.
"""

from __future__ import annotations

import json
import json.scanner
import sqlite3
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final, NamedTuple

from sqlalchemy import text

from airflow_batch_provider.core.states import USABLE_STATES
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import keys_by_version, sqlite_json
from airflow_batch_provider.ledger.store import Ledger

#: Makes a ``NamedTuple`` from a tuple of all its fields in C.
_new: Final = tuple.__new__
#: Answers per page, unless the caller says otherwise (a sink reads a page per batch).
PAGE = 1000


class Candidate(NamedTuple):
    """A published final answer of the run, with what the sink holds of it.

    Immutable, and built once an answer in a delivery's hot loop: a ``NamedTuple`` is made in a
    third of a frozen dataclass's time (0.27 against 0.80 us, seven fields).

    :param item_key: the item's ledger key
    :param app_id: the application id
    :param prompt_version: the prompt version of the answer
    :param state: ``succeeded`` or ``unchanged``
    :param output: the parsed answer (``None`` when it has none)
    :param recorded_state: the delivery row's state (``None``: never delivered)
    :param recorded_sha256: the digest of the values the sink was last given
    """

    item_key: str
    app_id: str
    prompt_version: str
    state: str
    output: Any
    recorded_state: str | None
    recorded_sha256: str | None


def candidate_pages(
    ledger: Ledger, workload: str, sink: str, run_id: str, page: int = PAGE
) -> Generator[list[Candidate], None, None]:
    """Yield the run's published final answers in key order, ``page`` at a time, with the sink's record.

    The pages follow a keyset on ``ix_abp_results_run``, each its own short read (no cursor or
    transaction stays open between pages; on SQLite the pages share one pooled connection, given
    back when the pages end or are closed). On SQLite (with its JSON functions,
    :func:`~airflow_batch_provider.ledger.bulk.sqlite_json`) a page and the sink's records of it
    are one read that returns the page as one JSON value (:class:`_JsonPage`): one call into
    SQLite, the interpreter lock released while it runs, where a row-by-row fetch takes the lock
    back once a row (and waits for it while the delivery's other threads hold it). Elsewhere a
    page is two reads (:class:`_TwoReads`).

    :param ledger: the ledger
    :param workload: workload name
    :param sink: the sink's name
    :param run_id: the run whose published answers are delivered
    :param page: answers per page
    """
    one_value = ledger.engine.dialect.name == "sqlite" and sqlite_json()
    read = (_JsonPage if one_value else _TwoReads)(ledger, workload, sink, run_id, page)
    after: tuple[str, str] | None = None
    try:
        while True:
            found = read.page(after)
            if not found:
                return
            yield found
            if len(found) < page:
                return
            after = (found[-1].item_key, found[-1].prompt_version)
    finally:
        read.close()


def _answers_sql(mark: str, page: int) -> tuple[str, str]:
    """The run's next ``page`` answers in key order: the first page's statement and a later page's."""
    usable = ", ".join(f"'{state}'" for state in sorted(USABLE_STATES))
    answers = (
        f"SELECT item_key, prompt_version, app_id, state, output_json FROM {s.published.name} "
        f"WHERE workload = {mark} AND run_id = {mark} AND state IN ({usable}){{after}} "
        f"ORDER BY item_key, prompt_version LIMIT {int(page)}"
    )
    return answers.format(after=""), answers.format(
        after=f" AND (item_key, prompt_version) > ({mark}, {mark})"
    )


@dataclass
class _JsonPage:
    """SQLite: a page with the sink's records in one read, as one JSON array (see :func:`candidate_pages`).

    An answer that is RFC 8259 JSON comes parsed by SQLite, in the page's one JSON value; any
    other (``NaN``, which Python's ``json`` writes and reads) comes as its text, parsed here as
    before. The sink's records join the page by their primary key (at most one each). SQLite does
    not promise the aggregate's order: the page is sorted here, by the same key (text compares the
    same in UTF-8 bytes as in code points).

    A page whose JSON value would pass SQLite's longest string (``SQLITE_MAX_LENGTH``, a billion
    bytes by default: a thousand answers of a megabyte) is read by the two reads instead.
    """

    ledger: Ledger
    workload: str
    sink: str
    run_id: str
    size: int

    #: the pool's connection the pages are read on, from the first page to :meth:`close`
    _conn: Any = field(default=None, init=False, repr=False)

    def page(self, after: tuple[str, str] | None) -> list[Candidate]:
        """The page after the key ``after`` (``None``: the first page)."""
        first, later = self._sql
        params = (
            (self.workload, self.run_id, self.workload, self.sink)
            if after is None
            else (self.workload, self.run_id, *after, self.workload, self.sink)
        )
        if self._conn is None:
            self._conn = self.ledger.engine.raw_connection()
        cursor = self._conn.cursor()  # the driver's cursor: a page is one value, nothing to map
        try:
            (found,) = cursor.execute(first if after is None else later, params).fetchone()
        except sqlite3.DataError as exc:
            if "too big" not in str(exc):  # "string or blob too big": too long for one value
                raise
            found = None
        finally:
            cursor.close()
        if found is None:
            return _TwoReads(self.ledger, self.workload, self.sink, self.run_id, self.size).page(after)
        rows = json.loads(found)
        rows.sort()
        return [  # tuple.__new__: a NamedTuple made in C (its class's own __new__ is Python)
            _new(
                Candidate,
                (
                    key,
                    app_id,
                    version,
                    state,
                    output if raw is None else _parsed(raw) if raw else None,
                    held,
                    sha,
                ),
            )
            for key, version, app_id, state, output, raw, held, sha in rows
        ]

    def close(self) -> None:
        """Give the reading connection back to the pool."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    @cached_property
    def _sql(self) -> tuple[str, str]:
        """The first page's read and a later page's."""
        first, later = (
            f"WITH page AS ({answers}) SELECT json_group_array(json_array(page.item_key, page.prompt_version, "
            "page.app_id, page.state, CASE WHEN json_valid(page.output_json) THEN json(page.output_json) END, "
            "CASE WHEN json_valid(page.output_json) THEN NULL ELSE page.output_json END, d.state, d.result_sha256)) "
            f"FROM page LEFT JOIN {s.deliveries.name} AS d ON d.workload = ? AND d.sink = ? "
            "AND d.app_id = page.app_id AND d.prompt_version = page.prompt_version"
            for answers in _answers_sql("?", self.size)
        )
        return first, later


@dataclass
class _TwoReads:
    """A page as two reads: the run's next answers, then the sink's records of those answers by key.

    (One outer join reads the same, but PostgreSQL's planner, without statistics on
    ``abp_deliveries``, joins each answer through ``ix_abp_deliveries_run`` and walks every record
    of the sink for it.) On PostgreSQL the statistics are refreshed before the first page and each
    time the pages read since have doubled the table (a first delivery fills it faster than
    autovacuum looks), so that a page's records are read by their key, not by scanning the sink's.

    Both reads are plain SQL on the driver's own markers: a page's thousand keys rendered and
    bound by SQLAlchemy cost more than the rest of the read.
    """

    ledger: Ledger
    workload: str
    sink: str
    run_id: str
    size: int
    #: answers read so far; the count when the statistics were last refreshed (-1: never); the
    #: table's rows as the planner then counted them
    read: int = 0
    analyzed: int = -1
    table_rows: int = 0

    def close(self) -> None:
        """Nothing held between pages: each is its own short read."""

    def page(self, after: tuple[str, str] | None) -> list[Candidate]:
        """The page after the key ``after`` (``None``: the first page)."""
        first, later = self._sql
        if self.ledger.engine.dialect.name == "postgresql" and (
            self.analyzed < 0 or self.read - self.analyzed >= max(self.size, self.table_rows)
        ):
            self.table_rows, self.analyzed = _analyze(self.ledger), self.read
        with self.ledger.engine.connect() as conn:
            if after is None:
                rows = conn.exec_driver_sql(first, (self.workload, self.run_id)).all()
            else:
                rows = conn.exec_driver_sql(later, (self.workload, self.run_id, *after)).all()
            held = self._records(conn, rows) if rows else {}
        self.read += len(rows)
        return [
            Candidate(
                key,
                app_id,
                version,
                state,
                _parsed(out) if out else None,
                *held.get((app_id, version), (None, None)),
            )
            for key, version, app_id, state, out in rows
        ]

    @cached_property
    def _mark(self) -> str:
        """The driver's parameter marker."""
        return "?" if self.ledger.engine.dialect.paramstyle == "qmark" else "%s"

    @cached_property
    def _sql(self) -> tuple[str, str]:
        """The first page's read of the answers and a later page's."""
        return _answers_sql(self._mark, self.size)

    def _records(self, conn: Any, rows: Sequence[Any]) -> dict[tuple[str, str], tuple[str, str]]:
        """The sink's records of the page's answers: (app id, version) -> (state, digest)."""
        mark = self._mark
        # pair_filter's shape (version = v AND app_id IN (...) per version), on the driver's markers
        by_version = keys_by_version((app_id, version) for _, version, app_id, _, _ in rows)
        pairs = " OR ".join(
            f"(prompt_version = {mark} AND app_id IN ({', '.join([mark] * len(ids))}))"
            for ids in by_version.values()
        )
        params: list[str] = [self.workload, self.sink]
        for version, ids in by_version.items():
            params.append(version)
            params.extend(ids)
        found = conn.exec_driver_sql(
            f"SELECT app_id, prompt_version, state, result_sha256 FROM {s.deliveries.name} "
            f"WHERE workload = {mark} AND sink = {mark} AND ({pairs})",
            tuple(params),
        )
        return {(app_id, version): (state, sha) for app_id, version, state, sha in found}


#: The C scanner of the standard JSON decoder: a stored answer (compact JSON, as the package
#: writes it) parsed without ``json.loads``' whitespace checks around it.
_SCAN: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # (typeshed: the class)


def _parsed(text_: str) -> Any:
    """A stored answer's JSON, parsed (``json.loads`` where it is not compact JSON from the first character)."""
    try:
        value, end = _SCAN(text_, 0)
    except StopIteration:
        return json.loads(text_)
    return value if end == len(text_) else json.loads(text_)


def _analyze(ledger: Ledger) -> int:
    """PostgreSQL: refresh the planner's statistics on ``abp_deliveries``; return its rows as counted."""
    with ledger.engine.begin() as conn:
        conn.execute(text(f"ANALYZE {s.deliveries.name}"))
        found = conn.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = CAST(:name AS regclass)"),
            {"name": s.deliveries.name},
        ).scalar()
    return max(0, int(found or 0))
