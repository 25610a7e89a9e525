"""Deliver a run's final answers to one sink, each written once and recorded per item.

A delivery reads the run's published answers with what the sink was last given for each
(:func:`~airflow_batch_provider.ledger.candidates.candidate_pages`), maps each to the sink's row,
and leaves out every row whose values the sink already holds (the same digest, ``delivered``).
The rest go in batches: the sink commits a batch (one transaction), then the ledger records it.

A crash between the two commits leaves rows in the sink that the ledger does not know were
delivered: the next delivery writes them again, which is harmless because every sink write is
idempotent (an upsert or an update by key writes the same values onto the same row). The other
order (record first) could record a row the sink never got; so the sink commits first.

A row the sink refuses (a type or constraint error: the writer retries a refused batch row by
row to find it) is recorded ``refused`` with the sink's message and is tried again by the next
delivery; the others of its batch are written. No Airflow here: the sink brings its own writer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.core.interpreter import tuned_for_bulk_loop
from airflow_batch_provider.ledger.candidates import Candidate, candidate_pages
from airflow_batch_provider.ledger.deliveries import (
    Delivery,
    record_delivered,
    record_deliveries,
)
from airflow_batch_provider.ledger.digests import values_sha256
from airflow_batch_provider.ledger.store import Ledger
from airflow_batch_provider.staging import Staging

#: Makes a ``NamedTuple`` from a tuple of all its fields in C (its class's ``__new__`` is Python).
_new: Final = tuple.__new__
#: At most this many refusal messages are kept in a delivery's counts (all are in the ledger).
MESSAGES_SHOWN = 20


class SinkRow(NamedTuple):
    """One row for a sink: its key columns and the columns written.

    Immutable, and built once a row in a delivery's hot loop (a ``NamedTuple``, as
    :class:`~airflow_batch_provider.ledger.candidates.Candidate`).

    :param keys: key column -> value (the application id, the prompt version where kept)
    :param values: column -> value
    :param digest: :func:`~airflow_batch_provider.ledger.digests.values_sha256` of the keys and
        values together, where the sink computed it with the row (``None``: the delivery computes it)
    """

    keys: Mapping[str, Any]
    values: Mapping[str, Any]
    digest: str | None = None


class RowWriter(Protocol):
    """Writes batches of rows into a sink, one transaction per batch."""

    def write(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        """Write ``rows`` and commit; return the refused rows (index -> the sink's message).

        :param rows: the batch
        """
        ...


class Sink(Protocol):
    """What a delivery needs of a sink."""

    @property
    def sink_name(self) -> str:
        """The name its deliveries are recorded under (unique within the workload)."""
        ...

    @property
    def batch_size(self) -> int:
        """Rows per transaction."""
        ...

    def row_for(self, result: Candidate) -> SinkRow:
        """Map one final answer to the sink's row.

        :param result: the answer
        """
        ...

    def open(self) -> AbstractContextManager[RowWriter]:
        """Open the sink for one delivery."""
        ...


@dataclass
class DeliveryCounts:
    """What one delivery did.

    :param sink: the sink's name
    :param written: rows the sink committed
    :param unchanged: rows left out because the sink holds their values already
    :param refused: rows the sink refused (recorded with its message)
    :param messages: the first refusal messages, ``app_id: message``
    """

    sink: str
    written: int = 0
    unchanged: int = 0
    refused: int = 0
    messages: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counts as a small dict (XCom, the report)."""
        return {
            "sink": self.sink,
            "written": self.written,
            "unchanged": self.unchanged,
            "refused": self.refused,
            "messages": list(self.messages),
        }


def deliver(ledger: Ledger, workload: str, run_id: str, sink: Sink) -> DeliveryCounts:
    """Deliver the run's final answers that the sink does not hold yet; record each row.

    Three threads, one batch at each step: this one reads and maps the answers a page at a time;
    a second one opens the sink and writes each batch (the sink commits it); a third records a
    batch in the ledger once the sink has committed it, while the sink writes the next one
    (:class:`_Pipeline`). So the ledger is never more than two committed batches behind the sink
    (what a crash leaves: rows a later delivery writes again, with the same values). The sink is
    opened, written and closed on its one thread (a DB-API connection may belong to the thread
    that made it, as ``sqlite3``'s does). Meanwhile the collector is kept off the process's older
    objects and the threads hand the interpreter lock to each other sooner
    (:func:`~airflow_batch_provider.core.interpreter.tuned_for_bulk_loop`).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run whose published answers are delivered
    :param sink: the sink
    """
    counts = DeliveryCounts(sink.sink_name)
    opened = ExitStack()
    with (
        tuned_for_bulk_loop(),
        ThreadPoolExecutor(1, thread_name_prefix="abp-deliver") as sink_thread,
        ThreadPoolExecutor(1, thread_name_prefix="abp-record") as record_thread,
    ):
        writer = sink_thread.submit(opened.enter_context, sink.open()).result()
        batch = _Batch(ledger, workload, sink.sink_name, run_id, writer)
        pipeline = _Pipeline(batch, counts, sink_thread, record_thread)
        pages = candidate_pages(ledger, workload, sink.sink_name, run_id, sink.batch_size)
        try:
            try:
                for page in pages:
                    pipeline.send(*_rows(sink, page, counts))
            finally:  # what the sink committed is recorded, whatever stopped the reading
                try:
                    pipeline.drain()
                finally:  # the reading's connection given back now, not when a failure's traceback goes
                    pages.close()
        finally:
            sink_thread.submit(opened.close).result()
    return counts


@dataclass(frozen=True)
class _Written:
    """What the sink did with one batch: rows written, and the rows it refused (app id, message)."""

    written: int
    refused: list[tuple[str, str]]


#: One mapped batch: each answer with its row and the digest of the row's values.
_Todo = Sequence[tuple[Candidate, SinkRow, str]]


@dataclass(frozen=True)
class _Batch:
    """A batch's two steps: into the sink (its thread), then its record into the ledger (the record's)."""

    ledger: Ledger
    workload: str
    sink: str
    run_id: str
    writer: RowWriter

    def write(self, todo: _Todo) -> dict[int, str]:
        """Write ``todo``'s rows (the sink commits); return the refused ones (index -> the sink's message).

        :param todo: each answer with its row and the digest of the row's values
        """
        rejected = self.writer.write([row for _, row, _ in todo]) if todo else {}
        failpoint("deliver.after_sink_commit")
        return rejected

    def record(self, todo: _Todo, refused: list[Delivery], rejected: Mapping[int, str]) -> _Written:
        """Record a committed batch in the ledger: ``todo`` as written or refused by the sink, and ``refused``.

        :param todo: the batch the sink committed
        :param refused: the page's answers the mapping refused, recorded with the batch
        :param rejected: the rows the sink refused (index -> its message)
        """
        if not rejected and not refused:  # the sink took the whole batch: its rows staged as they are
            record_delivered(
                self.ledger,
                self.workload,
                self.sink,
                self.run_id,
                [
                    (result.item_key, result.app_id, result.prompt_version, digest)
                    for result, _, digest in todo
                ],
            )
            return _Written(len(todo), [])
        done = [  # tuple.__new__: a NamedTuple's own __new__ is Python
            _new(Delivery, (result.item_key, result.app_id, result.prompt_version, "delivered", digest, None))
            for index, (result, _, digest) in enumerate(todo)
            if index not in rejected
        ]
        by_sink: list[tuple[str, str]] = []
        for index, message in sorted(rejected.items()):
            result, _, digest = todo[index]
            refused.append(_refused(result, digest, message))
            by_sink.append((result.app_id, message))
        record_deliveries(self.ledger, self.workload, self.sink, self.run_id, [*done, *refused], keyed=False)
        return _Written(len(done), by_sink)


@dataclass
class _Pipeline:
    """Batches through the sink's thread, then the record's: a batch's record only after its sink commit.

    :param batch: the two steps
    :param counts: the delivery's counts (``written``, ``refused``)
    :param sink_thread: where the sink is written
    :param record_thread: where the ledger records
    """

    batch: _Batch
    counts: DeliveryCounts
    sink_thread: ThreadPoolExecutor
    record_thread: ThreadPoolExecutor
    #: the batch the sink is writing, with what its record needs
    writing: tuple[Future[dict[int, str]], _Todo, list[Delivery]] | None = None
    #: the record in progress
    recording: Future[_Written] | None = None

    def send(self, todo: _Todo, refused: list[Delivery]) -> None:
        """Write the next batch once the sink has committed the one before (whose record then starts).

        :param todo: the mapped batch
        :param refused: the page's answers the mapping refused
        """
        self._record_written()
        self.writing = (self.sink_thread.submit(self.batch.write, todo), todo, refused)

    def drain(self) -> None:
        """Wait for the batch in the sink and for every record; count them."""
        try:
            self._record_written()
        finally:
            self._count_recorded()

    def _record_written(self) -> None:
        if self.writing is None:
            return
        (written, todo, refused), self.writing = self.writing, None
        rejected = written.result()
        self._count_recorded()
        self.recording = self.record_thread.submit(self.batch.record, todo, refused, rejected)

    def _count_recorded(self) -> None:
        """Wait for the record in progress, if any, and count it."""
        if self.recording is not None:
            recording, self.recording = self.recording, None
            _count(recording.result(), self.counts)


def _count(written: _Written, counts: DeliveryCounts) -> None:
    counts.written += written.written
    for app_id, message in written.refused:
        _note_refusal(counts, app_id, message)


def _rows(
    sink: Sink, page: Sequence[Candidate], counts: DeliveryCounts
) -> tuple[list[tuple[Candidate, SinkRow, str]], list[Delivery]]:
    """Map a page to the sink's rows and their digests; leave out those the sink holds; refuse the unmappable.

    :param sink: the sink
    :param page: the answers with the sink's records
    :param counts: the delivery's counts (``unchanged``, ``refused``)
    """
    todo: list[tuple[Candidate, SinkRow, str]] = []
    refused: list[Delivery] = []
    for result in page:
        try:
            row = sink.row_for(result)
        except (KeyError, TypeError, ValueError) as exc:  # the mapping refused the answer
            message = f"the sink's column mapping failed on this answer: {exc!r}"
            refused.append(_refused(result, values_sha256({"error": message}), message))
            _note_refusal(counts, result.app_id, message)
            continue
        digest = row.digest or values_sha256({**row.keys, **row.values})
        if result.recorded_state == "delivered" and result.recorded_sha256 == digest:
            counts.unchanged += 1
            continue
        todo.append((result, row, digest))
    return todo, refused


def _refused(result: Candidate, digest: str, message: str) -> Delivery:
    return Delivery(result.item_key, result.app_id, result.prompt_version, "refused", digest, message)


def _note_refusal(counts: DeliveryCounts, app_id: str, message: str) -> None:
    counts.refused += 1
    if len(counts.messages) < MESSAGES_SHOWN:
        counts.messages.append(f"{app_id}: {message}")


def report_json_writer(staging: Staging, workload: str, run_id: str) -> Callable[[dict[str, Any]], None]:
    """A function that writes the run's report as ``report.json`` in its staging folder.

    A delivery task hands it to :func:`~airflow_batch_provider.ledger.deliveries.note_in_report`,
    which calls it with the updated report while the run's row is locked.

    :param staging: the staging area
    :param workload: workload name
    :param run_id: the run
    """
    target = staging.run_dir(workload, run_id) / "report.json"

    def write_report(report: dict[str, Any]) -> None:
        with staging.writer(target) as fh:
            fh.write(json.dumps(report, indent=2, default=str).encode("utf-8"))

    return write_report
