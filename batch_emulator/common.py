"""What every provider router does the same way, written once.

- :func:`stable_id`: ids derived from a job and an item, the same in every rerun;
- :func:`jsonl` and :class:`ResultWriter`: result files written line by line to the data
  directory, with the item faults that touch a line (``malformed``, ``duplicate``) and the
  foreign lines of ``unknown_result_lines`` applied in one place;
- :func:`injected_error`: an item's injected fault as the provider's error, looked up in the
  provider's table (each router states its errors as data: :data:`ErrorTable`);
- :func:`key_given`: the API key a request carries, from the places the provider reads it;
- :func:`settle`: a job's view at a moment, rendering its results the first time it is seen ended
  (the first step of every router's job-to-JSON); :func:`retrieve_fails`: the injected transient
  error of a status read;
- :func:`output_file`: the metadata of a result file a router keeps;
- :class:`InputScan`: the checks every JSONL batch input gets line by line (blank lines, the
  request limit, JSON), each provider wording its problems as data (:class:`InputWords`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from batch_emulator.faults import HTML_PAGE, ItemDecision, foreign_lines
from batch_emulator.lifecycle import Job, JobItem, JobView, ValidationIssue
from batch_emulator.store import EmulatorState, StoredFile

#: an item fault (``server_error``, ``rate_limited``, ``invalid_request``, ``context_length``) ->
#: the error it becomes, in the router's own error shape
ErrorTable = Mapping[str, Mapping[str, Any]]
#: where a provider reads the API key: ``bearer`` (``Authorization: Bearer``), ``?key`` (a query
#: parameter), or a header name
KeySource = str
BEARER: Final = "bearer"


def stable_id(prefix: str, *parts: str, length: int = 24) -> str:
    """Return an id made from its parts (a job id, a custom id ...), the same in every rerun.

    :param prefix: e.g. ``batch_req_``
    :param parts: what the id is of
    :param length: hex characters after the prefix
    """
    return prefix + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:length]


def jsonl(obj: Mapping[str, Any]) -> bytes:
    """Return one compact JSON line (UTF-8, newline-terminated).

    :param obj: the object
    """
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def injected_error(item: JobItem, table: ErrorTable) -> Mapping[str, Any] | None:
    """Return the provider's error for an item's injected fault, or ``None`` when it has none.

    :param item: the item
    :param table: the provider's errors by fault
    """
    return table.get(item.decision.fault)


def another_answer(text: Any) -> str:
    """Return a different answer to the same request (fault ``rate_duplicate_other``).

    :param text: the first answer's text
    """
    return f"{text} (answered again)"


def html_page_instead(state: EmulatorState, purpose: str = "batch_output") -> Response | None:
    """The HTML page served with HTTP 200 in place of a result file, while ``html_downloads`` lasts.

    :param state: the shared state (the countdown is counted down once per page served)
    :param purpose: the file's purpose; only result files (``batch_output``) are replaced
    """
    if purpose != "batch_output" or not state.consume_countdown("html_downloads"):
        return None
    return Response(HTML_PAGE, status_code=200, media_type="text/html; charset=utf-8")


def key_given(request: Request, sources: Sequence[KeySource]) -> list[str]:
    """Return the API keys a request carries, from the places a provider reads them.

    :param request: the request
    :param sources: ``bearer``, ``?<query parameter>`` or a header name, in the provider's order
    """
    found = []
    for source in sources:
        if source == BEARER:
            header = request.headers.get("authorization", "")
            value = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        elif source.startswith("?"):
            value = request.query_params.get(source[1:])
        else:
            value = request.headers.get(source)
        if value is not None:
            found.append(value)
    return found


def key_accepted(state: EmulatorState, request: Request, sources: Sequence[KeySource]) -> bool:
    """Tell whether a request may pass: no key is configured, or it carries the configured key.

    :param state: the shared state (its configuration names the key)
    :param request: the request
    :param sources: where the provider reads the key
    """
    expected = state.config.api_key
    return expected is None or expected in key_given(request, sources)


def settle(state: EmulatorState, job: Job, now: float, render: Callable[[Job, float, str], Any]) -> JobView:
    """Return a job's view at ``now``; the first time it is seen ended, render its results.

    :param state: the shared state (its lock makes the rendering happen once)
    :param job: the job
    :param now: the current time
    :param render: writes the job's result files; its value becomes ``job.results``
    """
    with state.lock:
        view = job.view(now)
        if view.terminal and job.results is None:
            job.results = render(job, now, view.status)
    return view


def retrieve_fails(state: EmulatorState, provider: str) -> bool:
    """Count a status read and tell whether it must answer the injected transient error.

    :param state: the shared state
    :param provider: the router (counts ``<provider>.retrieve_requests`` and ``.retrieve_5xx``)
    """
    counter = state.bump(provider, "retrieve_requests")
    config = state.config
    if config.faults.request_fails(config.seed, "retrieve", counter, config.faults.retrieve_5xx_rate):
        state.bump(provider, "retrieve_5xx")
        return True
    return False


def output_file(
    state: EmulatorState, provider: str, id_prefix: str, filename: str, ttl_s: int, id_length: int = 24
) -> StoredFile:
    """Return the metadata of a new result file (its id taken now), expiring ``ttl_s`` from now.

    :param state: the shared state
    :param provider: the router that owns it
    :param id_prefix: its id's prefix (``file-``, ``gr`` ...)
    :param filename: its name
    :param ttl_s: seconds until it expires
    :param id_length: hex characters of its id
    """
    stamp = int(state.now())
    return StoredFile(
        id=state.new_id(id_prefix, id_length),
        filename=filename,
        purpose="batch_output",
        bytes=0,
        created_at=stamp,
        sha256="",
        expires_at=stamp + ttl_s,
        provider=provider,
    )


@dataclass(frozen=True)
class InputWords:
    """How a provider words the problems of a JSONL batch input.

    :param too_many: over the request limit; ``{limit}`` and the ``name`` given to the scan are
        filled in
    :param bad_json: a line that is not JSON; ``{number}`` and ``{name}`` are filled in
    :param too_many_code: the issue code of ``too_many``
    :param bad_json_code: the issue code of ``bad_json``
    """

    too_many: str
    bad_json: str
    too_many_code: str = "too_many_requests"
    bad_json_code: str = "invalid_json_line"


class InputScan:
    """Read a JSONL batch input line by line, and yield its good lines parsed.

    Blank lines are skipped; reading stops past the request limit or at ``max_issues`` problems;
    a line that is not JSON becomes an issue.

    :param words: the provider's wording
    :param issues: the list problems are added to
    :param max_requests: most non-blank lines
    :param max_issues: stop reading once this many problems are known
    :param name: the input file's name, for the wording
    """

    def __init__(
        self,
        words: InputWords,
        issues: list[ValidationIssue],
        max_requests: int,
        max_issues: int | None = None,
        name: str = "",
    ) -> None:
        self._words = words
        self._issues = issues
        self._max_requests = max_requests
        self._max_issues = max_issues
        self._name = name
        #: non-blank lines seen (JSON or not)
        self.count = 0

    def lines(self, raw_lines: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
        """Yield ``(1-based line number, parsed JSON)`` of each good line.

        :param raw_lines: the input's lines
        """
        words = self._words
        for number, raw in enumerate(raw_lines, start=1):
            if self._max_issues is not None and len(self._issues) >= self._max_issues:
                return
            if not raw.strip():
                continue
            self.count += 1
            if self.count > self._max_requests:
                message = words.too_many.format(limit=self._max_requests, name=self._name)
                self._issues.append(ValidationIssue(words.too_many_code, message, number))
                return
            try:
                parsed = json.loads(raw)
            except ValueError:
                message = words.bad_json.format(number=number, name=self._name)
                self._issues.append(ValidationIssue(words.bad_json_code, message, number))
                continue
            yield number, parsed


class ResultWriter:
    """One result file, written a line at a time to the data directory (never held in memory).

    :param sink: the open file (from :meth:`~batch_emulator.store.FileStore.writer`)
    :param id_field: the key of a line that holds the custom id (``custom_id``, ``key``, ``recordId``)
    """

    def __init__(self, sink: Any, id_field: str) -> None:
        self._sink = sink
        self._id_field = id_field
        self._template: bytes | None = None
        #: lines written
        self.lines = 0

    def write(self, obj: Mapping[str, Any], decision: ItemDecision | None = None) -> None:
        """Write one line; an item's ``malformed`` fault cuts it in half, ``duplicate`` writes it twice.

        :param obj: the line's object
        :param decision: the item's injected decision, when the line is a success the faults apply to
        """
        line = jsonl(obj)
        if decision is not None and decision.malformed:
            line = line[: max(1, len(line) // 2)] + b"\n"
        elif self._template is None and self._id_field in obj:
            self._template = line
        self._sink.write(line)
        self.lines += 1
        if decision is not None and decision.duplicate:
            self._sink.write(line)
            self.lines += 1

    def write_foreign(self, count: int, salt: str) -> None:
        """Write ``count`` copies of a line under custom ids nobody sent (fault ``unknown_result_lines``).

        :param count: how many
        :param salt: the job id
        """
        template = [self._template] if self._template is not None else []
        for line in foreign_lines(template, self._id_field, count, salt):
            self._sink.write(line)
            self.lines += 1

    def keep(self, meta: StoredFile) -> None:
        """Name the file: it is stored under ``meta`` when the writing ends.

        :param meta: the file's metadata (its id is taken now, so ids follow the order of keeping)
        """
        self._sink.keep(meta)


@contextmanager
def result_file(state: EmulatorState, id_field: str) -> Iterator[ResultWriter]:
    """Open a result file in the data directory; it is stored only if :meth:`ResultWriter.keep` named it.

    :param state: the shared state
    :param id_field: the key of a line that holds the custom id
    """
    with state.files.writer() as sink:
        yield ResultWriter(sink, id_field)
