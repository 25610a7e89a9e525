"""Reading input records and rendering them into ledger items, one bad record at a time.

No Airflow here: the prepare operator opens the file (or calls the records callable) and hands
the byte stream or the iterable in.

Rules, for every source:

- A bad record never fails the task and never stops the reading: it becomes a :class:`Reject`
  with its position, its line (files) and a reason that names the fix, and reading goes on.
  CSV and JSONL are decoded line by line, so a byte that is not UTF-8 costs only its record.
- The counts always add up: ``items + rejected == read``. Blank lines are not records.
- The first good record of an id is the item; a later good record with the same id is a
  ``duplicate_id`` reject, and a bad copy (before or after it) is a reject with its own line and
  reason that leaves the item alone. Only an id with no good record goes to review, once, with
  its first bad copy's reason.
- When the source itself fails part-way (the records callable raises, a read fails, a CSV header
  is unreadable), the records read before are kept (upserted, rejects recorded) and
  :attr:`PrepareResult.source_error` says where and why; the operator then fails the task,
  because the rest of the input is unknown and publishing a partial run as complete would hide
  it. A retry reads the source again and converges (items already in the run are left alone).
"""

from __future__ import annotations

import codecs
import csv
import json
import logging
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Final, Protocol

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError, ItemError, RecordSourceError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem, UpsertStats

#: How much of a value the rejects file keeps when a records callable yields something odd.
RAW_LIMIT: Final = 100_000


@dataclass(frozen=True)
class SourceRecord:
    """One record as read, or the reason it could not be read.

    :param position: 0-based index among the records read (blank lines are not records)
    :param line: 1-based line of the file where the record starts (``None`` for a callable)
    :param value: the record's fields (with a problem: the fields that could be read, for its id)
    :param problem: why it cannot be used, as (code, reason and fix), when it cannot
    :param raw: the record's text as read, for the rejects file
    """

    position: int
    line: int | None
    value: Mapping[str, Any] | None = None
    problem: tuple[str, str] | None = None
    raw: str | None = None


@dataclass(frozen=True)
class Reject:
    """A record that is not sent, kept whole with its reason.

    :param position: 0-based index among the records read
    :param line: 1-based line in the file (``None`` for a callable)
    :param app_id: the application id, when the record has one
    :param code: the reason's code (``invalid_utf8``, ``csv_missing_cell``, ``duplicate_id`` ...)
    :param message: the reason and the fix, in words
    :param record: the record's text
    """

    position: int
    line: int | None
    app_id: str | None
    code: str
    message: str
    record: str | None

    def to_dict(self) -> dict[str, Any]:
        """The line written to ``rejects.jsonl``."""
        return {
            "position": self.position,
            "line": self.line,
            "id": self.app_id,
            "code": self.code,
            "message": self.message,
            "record": self.record,
        }


@dataclass(frozen=True)
class PrepareResult:
    """What reading and upserting one run's records did.

    :param read: records read
    :param items: records that became items (``items + rejected == read``)
    :param rejected: records rejected
    :param rejected_by_code: rejects by reason code
    :param ledger: what the ledger upsert did with the items
    :param source_error: why the source stopped early, when it did (the rest is unread)
    """

    read: int
    items: int
    rejected: int
    rejected_by_code: Mapping[str, int] = field(default_factory=dict)
    ledger: UpsertStats = field(default_factory=UpsertStats)
    source_error: str | None = None

    def __post_init__(self) -> None:
        if self.items + self.rejected != self.read:
            raise AssertionError(f"counts do not add up: {self.items} + {self.rejected} != {self.read}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form (``prepare_summary.json``, the task's XCom)."""
        return {
            "read": self.read,
            "items": self.items,
            "rejected": self.rejected,
            "rejected_by_code": dict(self.rejected_by_code),
            "ledger": {
                "new": self.ledger.new,
                "changed": self.ledger.changed,
                "unchanged": self.ledger.unchanged,
                "already_in_run": self.ledger.already_in_run,
                "prompt_changed": self.ledger.prompt_changed,
            },
            "source_error": self.source_error,
        }

    def describe(self) -> str:
        """One log line: the counts and what the ledger did."""
        text = (
            f"{self.read} records read: {self.items} items, {self.rejected} rejected"
            f"{' ' + str(dict(self.rejected_by_code)) if self.rejected else ''}; ledger: {self.ledger.new} new, "
            f"{self.ledger.changed} changed"
            f"{f' ({self.ledger.prompt_changed} of them only by the prompt edited in place)' if self.ledger.prompt_changed else ''}, "
            f"{self.ledger.unchanged} unchanged (skipped), "
            f"{self.ledger.already_in_run} already in this run"
        )
        if self.ledger.owned_by_newer_run:
            text += f", {self.ledger.owned_by_newer_run} left with a newer run that owns them"
        return text + (f"; the source stopped early: {self.source_error}" if self.source_error else "")


class Log(Protocol):
    """What this module logs to: a stdlib logger or an operator's ``self.log``."""

    def error(self, msg: Any, /, *args: Any) -> Any:
        """Log an error.

        :param msg: the message (``%`` format)
        :param args: its arguments
        """


# ---------------------------------------------------------------------------------------- readers


def _decode(raw: bytes, line: int) -> tuple[str, tuple[str, str] | None]:
    """Decode one line; on a bad byte return its text with replacement characters and the problem."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        reason = f"line {line} is not UTF-8 (byte {exc.start}: {exc.reason}); re-encode the source as UTF-8."
        return raw.decode("utf-8", errors="replace"), ("invalid_utf8", reason)


def _lines(fh: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Number a byte stream's lines from 1, without a leading UTF-8 byte order mark."""
    for number, raw in enumerate(fh, start=1):
        yield (
            number,
            (raw[len(codecs.BOM_UTF8) :] if number == 1 and raw.startswith(codecs.BOM_UTF8) else raw),
        )


def read_jsonl(fh: IO[bytes]) -> Iterator[SourceRecord]:
    """Read JSON Lines: one object per line; blank lines are skipped.

    :param fh: the file, opened in binary mode
    """
    position = 0
    for line, raw in _lines(fh):
        if not raw.strip():
            continue
        text, problem = _decode(raw, line)
        text = text.rstrip("\r\n")
        value: Any = None
        if problem is None:
            try:
                value = json.loads(text)
            except ValueError as exc:
                problem = ("invalid_json", f"line {line} is not JSON ({exc}); fix the line.")
            else:
                if not isinstance(value, dict):
                    problem = (
                        "invalid_json",
                        f"line {line} is a JSON {type(value).__name__}, not an object; write one "
                        'object per line, e.g. {"id": "a1", ...}.',
                    )
                    value = None
        yield SourceRecord(position, line, value=value, problem=problem, raw=text)
        position += 1


def read_csv(fh: IO[bytes]) -> Iterator[SourceRecord]:
    """Read CSV with a header row; each row is decoded on its own; blank rows are skipped.

    A row with more or fewer cells than the header is rejected (naming the columns), never
    padded with ``None`` or truncated.

    :param fh: the file, opened in binary mode
    :raises RecordSourceError: the header is missing a name, repeats one or is not UTF-8
    """
    consumed: list[tuple[int, str, tuple[str, str] | None]] = []

    def text_lines() -> Iterator[str]:
        for number, raw in _lines(fh):
            text, problem = _decode(raw, number)
            consumed.append((number, text, problem))
            yield text

    # strict: an unclosed quote is an error, not a value that silently swallows the rest of the file
    reader = csv.reader(text_lines(), strict=True)
    header = _csv_header(reader, consumed)
    if header is None:
        return
    position = 0
    while True:
        consumed.clear()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            # The reader starts afresh on the next line. The lines this row took (an unclosed
            # quote takes them up to the end of the file) are kept whole in the reject.
            first = consumed[0][0] if consumed else reader.line_num
            span = f"line {first} is" if len(consumed) < 2 else f"lines {first}-{consumed[-1][0]} are"
            fix = (
                f"a value is longer than the {csv.field_size_limit()} characters Python's csv reader accepts "
                "(or a quote is not closed); give values this long in JSONL"
                if "field limit" in str(exc)
                else "a quoted value is probably not closed, or a quote inside a quoted value is not doubled; "
                'close the quote and write an inner quote as ""'
            )
            problem = ("csv_malformed", f"{span} not a valid CSV row ({exc}): {fix}.")
            yield SourceRecord(position, first, problem=problem, raw="".join(t for _, t, _ in consumed))
            position += 1
            continue
        if not row:
            continue
        line = consumed[0][0]
        raw = "".join(text for _, text, _ in consumed).rstrip("\r\n")
        bad = next((p for _, _, p in consumed if p is not None), None)
        if bad is not None:
            yield SourceRecord(position, line, problem=bad, raw=raw)
        else:
            # With a cell problem the fields that are there still name the record (its id).
            value = dict(zip(header, row, strict=False))
            yield SourceRecord(position, line, value=value, problem=_cells(row, header, line), raw=raw)
        position += 1


def _csv_header(reader: Any, consumed: list[tuple[int, str, tuple[str, str] | None]]) -> list[str] | None:
    try:
        header: list[str] | None = next(reader, None)
    except csv.Error as exc:
        raise RecordSourceError(
            f"the CSV header (line 1) is not valid CSV ({exc}); fix the header row."
        ) from exc
    if header is None:
        return None
    bad = next((p for _, _, p in consumed if p is not None), None)
    if bad is not None:
        raise RecordSourceError(f"the CSV header is not UTF-8: {bad[1]}")
    repeated = sorted(name for name, n in Counter(header).items() if n > 1)
    if repeated or "" in header:
        what = f"repeats the column(s) {repeated}" if repeated else f"has an empty column name ({header!r})"
        raise RecordSourceError(f"the CSV header {what}; give every column a distinct name.")
    return header


def _cells(row: list[str], header: list[str], line: int) -> tuple[str, str] | None:
    if len(row) > len(header):
        return (
            "csv_extra_cell",
            f"line {line} has {len(row)} cells but the header has {len(header)} columns (extra: "
            f"{row[len(header) :]!r}); quote values that contain a comma, or remove the extra cells.",
        )
    if len(row) < len(header):
        missing = ", ".join(repr(c) for c in header[len(row) :])
        return (
            "csv_missing_cell",
            f"line {line} has {len(row)} cells but the header has {len(header)} columns: no value for "
            f"{missing}; add the cells (an empty value is an empty cell).",
        )
    return None


def read_values(produce: Callable[[], Iterable[Any]]) -> Iterator[SourceRecord]:
    """Read what a records callable yields; anything but a dict (mapping) is a reject.

    :param produce: calls the records callable (its errors surface while iterating)
    """
    for position, value in enumerate(produce()):
        if isinstance(value, Mapping):
            yield SourceRecord(position, None, value=value, raw=_dump(value))
            continue
        problem = (
            "invalid_record",
            f"the records callable yielded a {type(value).__name__}, not a dict; yield one dict per record.",
        )
        yield SourceRecord(position, None, problem=problem, raw=_dump(value))


def _dump(value: Any) -> str:
    try:
        return json.dumps(value, default=str, ensure_ascii=False)[:RAW_LIMIT]
    except (TypeError, ValueError):  # e.g. non-string keys that json cannot sort out
        return repr(value)[:RAW_LIMIT]


# ---------------------------------------------------------------------------------------- rendering


class FirstPositions:
    """The position of the first record of each application id, in flat memory.

    Ids go to a private SQLite database on disk (a temporary file that SQLite deletes when the
    connection closes), ``flush`` at a time; the ones not yet written are held in a dict and
    looked at first. A million ids held in a dict took about 130 MB of the prepare task's memory;
    here the task holds at most ``flush`` of them and SQLite's page cache.

    :param flush: how many ids are held in memory before they are written
    """

    def __init__(self, flush: int = 10_000) -> None:
        self.flush = flush
        self._pending: dict[str, int] = {}
        self._db: sqlite3.Connection | None = None

    def get(self, app_id: str) -> int | None:
        """Return the first position of ``app_id``, or ``None`` when no record of it was kept.

        :param app_id: the record's application id
        """
        found = self._pending.get(app_id)
        if found is not None or self._db is None:
            return found
        row = self._db.execute("SELECT position FROM first_ids WHERE app_id = ?", (app_id,)).fetchone()
        return None if row is None else int(row[0])

    def setdefault(self, app_id: str, position: int) -> int:
        """Return the first position of ``app_id``, recording ``position`` when it is new.

        :param app_id: the record's application id
        :param position: the record's position
        """
        found = self.get(app_id)
        if found is not None:
            return found
        self._pending[app_id] = position
        if len(self._pending) >= self.flush:
            self._write()
        return position

    def _write(self) -> None:
        if self._db is None:
            self._db = sqlite3.connect("")  # "": a private temporary database on disk
            self._db.execute(
                "CREATE TABLE first_ids (app_id TEXT PRIMARY KEY, position INTEGER) WITHOUT ROWID"
            )
        with self._db:
            self._db.executemany("INSERT INTO first_ids VALUES (?, ?)", self._pending.items())
        self._pending.clear()

    def held(self) -> int:
        """How many ids are held in memory now."""
        return len(self._pending)

    def close(self) -> None:
        """Drop every id (the temporary file goes with the connection)."""
        self._pending.clear()
        if self._db is not None:
            self._db.close()
            self._db = None


class RecordPreparer:
    """Render source records into prepared items; every bad one goes to ``on_reject``.

    It remembers which ids became items until :meth:`close` (:meth:`is_item`).

    :param template: the prompt
    :param on_reject: called once per rejected record, in order
    """

    def __init__(self, template: PromptTemplate, on_reject: Callable[[Reject], None]) -> None:
        self.template = template
        self.on_reject = on_reject
        self.read = 0
        self.rejected: Counter[str] = Counter()
        self.source_error: str | None = None
        self._first = FirstPositions()

    @property
    def items(self) -> int:
        """Records that became items so far."""
        return self.read - sum(self.rejected.values())

    def prepare(self, records: Iterable[SourceRecord]) -> Iterator[PreparedItem]:
        """Yield one item per good record, streaming; stop quietly when the source fails.

        :param records: the source's records
        """
        source = iter(records)
        while True:
            try:
                rec = next(source)
            except StopIteration:
                return
            except Exception as exc:  # the source's failure is reported, not raised here
                self.source_error = (
                    f"after {self.read} records, reading the source raised {type(exc).__name__}: {exc}"
                )
                return
            self.read += 1
            try:
                request = self._render(rec)
            except ItemError as exc:
                self.rejected[exc.code] += 1
                self.on_reject(Reject(rec.position, rec.line, exc.app_id, exc.code, str(exc), rec.raw))
                continue
            yield PreparedItem(item_key(request.app_id), request)

    def is_item(self, app_id: str) -> bool:
        """Whether a good record of ``app_id`` became an item (until :meth:`close`).

        :param app_id: the application id
        """
        return self._first.get(app_id) is not None

    def close(self) -> None:
        """Forget the ids read (their temporary file goes)."""
        self._first.close()

    def _render(self, rec: SourceRecord) -> CanonicalRequest:
        if rec.problem is not None or rec.value is None:
            code, reason = rec.problem or ("invalid_record", "the record could not be read.")
            raise ItemError(self._id_of(rec.value), code, reason, rec.position)
        request = self.template.render(rec.value, rec.position)
        first = self._first.setdefault(request.app_id, rec.position)
        if first != rec.position:
            raise ItemError(
                request.app_id,
                "duplicate_id",
                f"repeats the id of record {first}; the first is kept. Make application ids unique per workload.",
                rec.position,
            )
        return request

    def _id_of(self, value: Mapping[str, Any] | None) -> str | None:
        """The id of a record that cannot be sent, when it has a usable one (to record it for review)."""
        raw = (value or {}).get(self.template.id_field)
        if isinstance(raw, bool) or not isinstance(raw, (str, int)) or not str(raw).strip():
            return None
        return str(raw)


def check_kind(workload: str, template: PromptTemplate, adapter: BatchAdapter | type[BatchAdapter]) -> None:
    """Refuse a prompt whose request kind the workload's provider does not accept.

    Called by prepare before any record is read, staged or paid for.

    :param workload: the workload, named in the message
    :param template: the prompt (its ``kind``)
    :param adapter: the provider's adapter (or its class)
    :raises ConfigurationError: the kind is not in the adapter's ``kinds``; the message names the
        workload, the kind, the provider and the providers that accept the kind
    """
    refusal = adapter.kind_refusal(template.kind, workload)
    if refusal is not None:
        raise ConfigurationError(f"prompt {template.version!r}: {refusal}")


def load_records(
    *,
    ledger: Ledger,
    workload: str,
    run_id: str,
    template: PromptTemplate,
    records: Iterable[SourceRecord],
    write_reject: Callable[[Reject], None],
    log: Log | None = None,
    adapter: BatchAdapter | type[BatchAdapter] | None = None,
) -> PrepareResult:
    """Upsert a run's good records into the ledger; record every bad one; return the counts.

    Rejected records that have an id and no good record in the input are also recorded in the
    ledger (state ``review``, under the prompt's version, with the first bad copy's reason, so that
    a fixed record replaces the row); a good record of the id is the item whatever its bad copies
    say, and a duplicate keeps the first good record's row. Every reject goes to ``write_reject`` (the rejects file) and the log.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the Airflow run id
    :param template: the prompt
    :param records: the source's records (streamed)
    :param write_reject: keeps one rejected record
    :param log: where each reject is logged (default: this module's logger)
    :param adapter: the workload's provider adapter; when given, a prompt kind it does not accept
        is refused (:func:`check_kind`) before any record is read
    :raises ConfigurationError: the provider does not accept the prompt's kind
    """
    if adapter is not None:
        check_kind(workload, template, adapter)
    logger: Log = log or logging.getLogger(__name__)
    # The first bad copy of each id, for review unless a good record of the id became the item.
    bad_copies: dict[str, tuple[PreparedItem | None, str, str, str]] = {}

    def on_reject(reject: Reject) -> None:
        where = (
            f"line {reject.line}: "
            if reject.line is not None and f"line {reject.line}" not in reject.message
            else ""
        )
        logger.error("rejected %s%s", where, reject.message)
        write_reject(reject)
        if reject.app_id is not None and reject.code != "duplicate_id":
            request = CanonicalRequest(reject.app_id, template.version, template.model)
            bad_copies.setdefault(
                reject.app_id,
                (PreparedItem(item_key(reject.app_id), request), reject.app_id, reject.code, reject.message),
            )

    preparer = RecordPreparer(template, on_reject)
    try:
        stats = ledger.upsert_items(workload, run_id, preparer.prepare(records))
        in_review = [entry for app_id, entry in bad_copies.items() if not preparer.is_item(app_id)]
    finally:
        preparer.close()
    if in_review:
        ledger.reject_items(workload, run_id, in_review)
    return PrepareResult(
        read=preparer.read,
        items=preparer.items,
        rejected=sum(preparer.rejected.values()),
        rejected_by_code=dict(preparer.rejected),
        ledger=stats,
        source_error=preparer.source_error,
    )
