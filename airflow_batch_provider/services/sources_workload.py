"""Records from another workload's published answers: one workload's results are the next one's input.

No Airflow here: the prepare operator opens the ledger (the reading group's own, or the source's
``ledger_conn_id``) and hands it in; :mod:`airflow_batch_provider.ledger.answers` reads it.

Which answers: those the workload's newest finished run published (its ``publish`` task ended),
one per item of that run's input, under the prompt version it ran with; an item in review, failed
or left pending there has no answer and gives no record. A run of the workload in progress is not
read until it finishes; one that is publishing at that moment (its rows half written) makes the
source refuse, naming it, and so does a run that finished while the answers were read: a retry
reads the newer run whole.

Each answer is seen through an envelope, ``{"answer": <the answer>, "source_id": <its application
id>}``; with ``each=`` (a path to a list in it) every element is a record of its own, the envelope
then also holding ``"item"`` (the element) and ``"n"`` (its 0-based index), and the record's id is
``<source_id>:<n>`` (or ``<source_id>:<key>``, ``key=`` a path to a value of the element). ``fields=``
maps the template's fields to paths into the envelope; without it the envelope itself is the
record. The reading workload's ledger then does the rest: an answer that did not change renders
the same requests (``unchanged``, nothing sent), a changed one changes only the records built from
it, and a record whose answer left the source leaves the input like any record that leaves.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from airflow_batch_provider.core.json_path import MissingStep, follow_path, parse_path
from airflow_batch_provider.core.names import check_workload, is_templated
from airflow_batch_provider.exceptions import ConfigurationError, RecordSourceError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.answers import (
    Answer,
    PublishedRun,
    iter_answers,
    latest_published_run,
    published_states,
    runs_publishing_after,
    workloads_with_answers,
)
from airflow_batch_provider.services.records import RAW_LIMIT, SourceRecord

log = logging.getLogger(__name__)

#: What a path starts at: the envelope's keys (``item`` and ``n`` only with ``each=``).
ENVELOPE: Final[tuple[str, ...]] = ("answer", "source_id")
ELEMENT: Final[tuple[str, ...]] = ("item", "n")

Path = tuple[str | int, ...]


def _path(what: str, path: str, starts: tuple[str, ...]) -> Path:
    steps = parse_path(path)
    if not steps or steps[0] not in starts:
        begin = ", ".join(f"$.{s}" for s in starts)
        raise ConfigurationError(
            f"WorkloadSource {what}: the path {path!r} does not start at the envelope of an answer; start "
            f"it at one of {begin} (e.g. '$.answer.vendor'"
            + (", '$.item.description'" if "item" in starts else "")
            + ")."
        )
    return steps


@dataclass(frozen=True)
class WorkloadSource:
    """The answers another workload published, as records: chain workloads (extract, then classify).

    Pass it as ``records=``. Put the reading group after the writing one in the same DAG
    (``extract >> classify``), or schedule the reading DAG on the Asset the writing group's publish
    updates (``outlets=``).

    :param workload: the workload whose answers are read (templated)
    :param ledger_conn_id: the ledger that workload runs in (default: the reading group's ledger)
    :param each: a path to a list in the envelope (``"$.answer.line_items"``): one record per
        element, its id ``<source_id>:<n>``; default: one record per answer, its id the answer's
    :param fields: template field -> path into the envelope (``$.answer...``, ``$.source_id``, and
        with ``each`` ``$.item...`` and ``$.n``); a path an answer lacks makes its record a reject.
        Default: the envelope is the record (the template reads ``{{ answer.vendor }}``)
    :param key: with ``each``, a path to the value that names an element within its answer (its
        id becomes ``<source_id>:<value>``; default ``$.n``, its index)
    :param where: called with each record's fields; ``False`` leaves the record out of the input
    :param prompt_version: the prompt version the answers must come from; the newest finished
        run having run another makes the source refuse (default: whichever that run used)
    :param page_size: answers per ledger query: the most the task holds at once
    """

    workload: str
    ledger_conn_id: str | None = None
    each: str | None = None
    fields: Mapping[str, str] | None = None
    key: str | None = None
    where: Callable[[Mapping[str, Any]], bool] | None = None
    prompt_version: str | None = None
    page_size: int = 1000
    _fields: dict[str, Path] = field(default_factory=dict, init=False, repr=False, compare=False)
    _each: Path = field(default=(), init=False, repr=False, compare=False)
    _key: Path = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not is_templated(self.workload):
            check_workload(self.workload)
        if self.page_size < 1:
            raise ConfigurationError(
                f"WorkloadSource(workload={self.workload!r}): page_size={self.page_size} is below 1; give "
                "the number of answers read per query (e.g. 1000)."
            )
        if self.key is not None and self.each is None:
            raise ConfigurationError(
                f"WorkloadSource(workload={self.workload!r}): key= names an element of each=, and each= is "
                "not given; give each= (a path to a list in the answer) or leave key= out."
            )
        starts: tuple[str, ...] = ENVELOPE
        if self.each is not None:
            starts = (*ENVELOPE, *ELEMENT)
            object.__setattr__(self, "_each", _path("each=", self.each, ("answer",)))
            object.__setattr__(self, "_key", _path("key=", self.key or "$.n", starts))
        for name, path in (self.fields or {}).items():
            if not isinstance(path, str):
                raise ConfigurationError(
                    f"WorkloadSource field {name!r}: {path!r}; give a path such as '$.answer.vendor'."
                )
            self._fields[name] = _path(f"field {name!r}", path, starts)

    def describe(self) -> str:
        """The source in words, for messages."""
        return f"WorkloadSource(answers of workload {self.workload!r})"


def read_workload(ledger: Ledger, source: WorkloadSource, *, id_field: str) -> Iterator[SourceRecord]:
    """Read the answers of ``source.workload``'s newest finished run as records, a page at a time.

    :param ledger: the ledger the workload runs in
    :param source: the source (its ``workload`` already rendered)
    :param id_field: the reading prompt's id field (each record's id is given under it)
    :raises RecordSourceError: the workload has no finished run, a newer run is publishing, the
        run used another prompt version than ``source.prompt_version``, a run finished while the
        answers were read, or no answer has the list ``each`` names
    """
    if source.fields is not None and id_field in source.fields:
        raise ConfigurationError(
            f"{source.describe()}: fields= maps {id_field!r}, the prompt's id field; the source gives each "
            f"record its id there (the answer's id, or <id>:<n> with each=). Map the value to another name."
        )
    run = _the_run(ledger, source)
    states = published_states(ledger, run)
    log.info(
        "reading the answers workload %r published in run %s (prompt version %s, finished %s): %s",
        run.workload,
        run.run_id,
        run.prompt_version,
        run.finished_at.isoformat(),
        dict(sorted(states.items())),
    )
    counts: Counter[str] = Counter()
    position = 0
    for answer in iter_answers(ledger, run, source.page_size):
        counts["answers"] += 1
        for record in _records(source, run, answer, id_field, position, counts):
            yield record
            position += 1
    _check_unchanged(ledger, run)
    if source.each is not None and counts["answers"] and counts["no_list"] == counts["answers"]:
        raise RecordSourceError(
            f"none of the {counts['answers']} answers of workload {run.workload!r} (run {run.run_id}) has a "
            f"list at {source.each!r}; check the path against the workload's answers (each= starts at "
            "$.answer)."
        )
    log.info(
        "%d answers of workload %r read: %d records, %d left out by where=, %d answers with no list at %s",
        counts["answers"],
        run.workload,
        position,
        counts["filtered"],
        counts["no_list"],
        source.each,
    )


def _the_run(ledger: Ledger, source: WorkloadSource) -> PublishedRun:
    run = latest_published_run(ledger, source.workload)
    if run is None:
        known = workloads_with_answers(ledger)
        raise RecordSourceError(
            f"workload {source.workload!r} has no published answers in this ledger: none of its runs has "
            "finished (a run's answers are read once its publish task ends). Run the workload's DAG first "
            "(or put this group after its group: extract >> classify), or check the name"
            + (f"; workloads with published answers: {known}" if known else "")
            + "."
        )
    publishing = runs_publishing_after(ledger, run)
    if publishing:
        raise RecordSourceError(
            f"run {publishing[0]} of workload {source.workload!r} has published part of its answers and is "
            f"not finished (its publish is running, stopped part-way or was cleared): the answers of run "
            f"{run.run_id} are partly replaced. Retry when that run's publish task has ended (clear it if "
            "it failed)."
        )
    if source.prompt_version is not None and run.prompt_version != source.prompt_version:
        raise RecordSourceError(
            f"the newest finished run of workload {source.workload!r} ({run.run_id}) answered with prompt "
            f"version {run.prompt_version!r}, not {source.prompt_version!r} as WorkloadSource(prompt_version=...) "
            "asks; run that workload with the prompt version first, or change prompt_version=."
        )
    return run


def _check_unchanged(ledger: Ledger, run: PublishedRun) -> None:
    """Refuse when another run of the workload finished or started publishing while its answers were read."""
    now = latest_published_run(ledger, run.workload)
    moved = runs_publishing_after(ledger, run)
    if now is not None and now.run_id != run.run_id:
        moved.insert(0, now.run_id)
    if moved:
        raise RecordSourceError(
            f"run {moved[0]} of workload {run.workload!r} published answers while those of run {run.run_id} "
            "were read, so the records read are not one run's answers; retry the task (it reads the newest "
            "finished run whole)."
        )


def _records(
    source: WorkloadSource,
    run: PublishedRun,
    answer: Answer,
    id_field: str,
    position: int,
    counts: Counter[str],
) -> Iterator[SourceRecord]:
    """The records of one answer: itself, or one per element of its ``each`` list."""
    envelope: dict[str, Any] = {"answer": answer.output, "source_id": answer.app_id}
    of = f"the answer of {answer.app_id!r} (workload {run.workload!r}, run {run.run_id})"
    if source.each is None:
        record = _record(source, envelope, answer.app_id, id_field, position, of)
        if record is not None:
            yield record
        else:
            counts["filtered"] += 1
        return
    try:
        elements = follow_path(envelope, source._each)
    except MissingStep:
        elements = None
    if elements is None:
        counts["no_list"] += 1
        return
    if not isinstance(elements, list):
        reason = (
            f"{of} holds a {type(elements).__name__} at {source.each!r}, not a list; each= must name a "
            "list (one record per element): fix the path, or the workload's output schema."
        )
        yield SourceRecord(position, None, problem=("answer_not_a_list", reason), raw=_dump(envelope))
        return
    for n, element in enumerate(elements):
        inner = {**envelope, "item": element, "n": n}
        where = f"{of}, element {n} of {source.each}"
        try:
            name = follow_path(inner, source._key)
        except MissingStep as exc:
            name = exc
        if isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name).strip():
            found = name.found if isinstance(name, MissingStep) else repr(name)
            reason = (
                f"{where}: key={source.key!r} reads {found}, not a string or an integer that names the "
                "element; point key= at a value every element has (default $.n, the index)."
            )
            yield SourceRecord(position, None, problem=("invalid_id", reason), raw=_dump(inner))
            position += 1
            continue
        record = _record(source, inner, f"{answer.app_id}:{name}", id_field, position, where)
        if record is None:
            counts["filtered"] += 1
            continue
        yield record
        position += 1


def _record(
    source: WorkloadSource,
    envelope: Mapping[str, Any],
    record_id: str,
    id_field: str,
    position: int,
    where: str,
) -> SourceRecord | None:
    """One record from an envelope: the mapped fields (or the envelope), its id; ``None``: filtered out."""
    if source.fields is None:
        value: dict[str, Any] = {**envelope, id_field: record_id}
        problem: tuple[str, str] | None = None
    else:
        value, problem = {id_field: record_id}, None
        for name, path in source.fields.items():
            try:
                value[name] = follow_path(envelope, source._fields[name])
            except MissingStep as exc:
                problem = problem or (
                    "answer_field_missing",
                    f"{where} has no {path!r} (field {name!r}): {exc}; map the field to a path every answer "
                    "has, or have the workload's output schema require it.",
                )
    if problem is None and source.where is not None and not source.where(value):
        return None
    return SourceRecord(position, None, value=value, problem=problem, raw=_dump(value))


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:RAW_LIMIT]
