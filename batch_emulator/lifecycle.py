"""Provider-neutral batch lifecycle, computed lazily from elapsed time (no background threads).

A job's whole future is fixed when it is created: phase boundaries come from the timings times
the time scale, each item's fault comes from :meth:`FaultConfig.decide_item`, and the processing
order is a seeded shuffle. Asking for the job's state at a time ``now`` only does arithmetic:

``validating [t0, t1)`` -> ``in_progress [t1, t2)`` -> ``finalizing [t2, t3)`` -> ``completed``

- a job with validation issues is ``failed`` at ``t1``;
- an expiring job stops at ``t1 + expire_after_fraction * (t2 - t1)`` and is ``expired`` there;
- a cancel at ``tc`` (before the natural end) stops the work at ``tc``; the job is ``cancelling``
  until ``tc + cancelling delay`` and ``cancelled`` after;
- a stuck job (fault ``stuck_batches``) stays ``in_progress`` until it is cancelled, with no item
  finished, or with the first ``stuck_after_fraction`` of them finished (at the usual pace) and
  none after.

A job's items live on disk, not in memory (:class:`ItemLog`: one JSON record per item in a spool
file of the data directory, with only its offset and its failing flag kept in RAM), and its
billed tokens too; so a batch of 200,000 lines costs the emulator a few bytes per line of memory.

Items finish evenly spread over ``in_progress`` in processing order (the ``k``-th item at
``t1 + k / n * (t2 - t1)``), so request counts grow with time. Status names are OpenAI's, which are
also the package's neutral :data:`~airflow_batch_provider.core.states.BATCH_STATES`; other
providers' routers map them to their own words.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import weakref
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Literal, overload

from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig, ItemDecision, ItemFault

JobStatus = Literal[
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"
]
TERMINAL: Final[frozenset[str]] = frozenset({"completed", "failed", "expired", "cancelled"})
ItemEnd = Literal["processed", "expired", "cancelled"]


#: job attribute -> its name in the record's ``keys`` (what a client may find a job by)
_KEY_ATTRS: Final = (
    ("metadata", "metadata"),
    ("display_name", "display_name"),
    ("jobName", "job_name"),
    ("clientRequestToken", "client_token"),
)


def billed(
    input_tokens: int = 0, output_tokens: int = 0, cached_input_tokens: int = 0, cache_write_tokens: int = 0
) -> dict[str, int]:
    """Return one item's billed tokens in the record's shape.

    :param input_tokens: input tokens at the full input rate (cached ones excluded)
    :param output_tokens: output tokens
    :param cached_input_tokens: input tokens read from the prompt cache
    :param cache_write_tokens: input tokens written to the prompt cache
    """
    return {
        "input_tokens": int(input_tokens),
        "output_tokens": int(output_tokens),
        "cached_input_tokens": int(cached_input_tokens),
        "cache_write_tokens": int(cache_write_tokens),
    }


@dataclass(frozen=True)
class ValidationIssue:
    """Why a job's input was refused.

    :param code: machine-readable code
    :param message: what is wrong and how to fix it
    :param line: 1-based input line, where it applies
    :param param: the offending field, where it applies
    """

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class JobItem:
    """One request of a job.

    :param custom_id: the caller's id of the item
    :param line: 1-based input line
    :param body: the provider's request payload, kept for rendering the answer
    :param decision: the injected fault
    :param natural_error: an error the request itself causes (bad body, too long), as a dict with
        ``status``, ``type``, ``code``, ``message``, ``param``; it wins over injected faults
    """

    custom_id: str
    line: int
    body: Mapping[str, Any]
    decision: ItemDecision = field(default_factory=ItemDecision)
    natural_error: Mapping[str, Any] | None = None

    @property
    def failing(self) -> bool:
        """True when the item ends as an error line."""
        return self.natural_error is not None or self.decision.failing


@dataclass(frozen=True)
class JobView:
    """A job's state at one moment.

    :param status: the status
    :param times: unix seconds of the phases reached so far (``in_progress_at`` ...), int
    :param total: items counted (0 while validating and when validation failed)
    :param completed: finished items that succeeded (``missing`` items count here)
    :param failed: finished items that ended as errors
    """

    status: JobStatus
    times: Mapping[str, int]
    total: int
    completed: int
    failed: int

    @property
    def terminal(self) -> bool:
        """True when nothing more will change."""
        return self.status in TERMINAL


@dataclass(frozen=True)
class ItemOutcome:
    """How one item ended, for rendering result files.

    :param item: the item
    :param end: ``processed`` (answer or error line), ``expired`` or ``cancelled``
    :param position: 0-based position in processing order (processed items only, else -1)
    :param index: 0-based position in input order
    """

    item: JobItem
    end: ItemEnd
    position: int
    index: int = -1


def _unlink(path: str) -> None:
    with suppress(OSError):
        os.unlink(path)


class ItemLog(Sequence[JobItem]):
    """A job's items, spooled to a file as they are parsed: memory stays flat as a batch grows.

    Each item is one JSON line of the spool file; RAM holds only its offset (8 bytes) and its
    failing flag (1 byte). Items are read back one at a time (by index, or in order). The file is
    removed when the log is forgotten (its job reset or the emulator gone).

    :param directory: where the spool file goes (the emulator's data directory; ``None``: the
        system's temporary folder)
    :param items: items to append at once
    """

    def __init__(self, directory: Path | None = None, items: Iterable[JobItem] = ()) -> None:
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="items-", suffix=".jsonl", dir=directory)
        self.path = Path(name)
        self._sink: IO[bytes] | None = open(fd, "wb")  # noqa: SIM115 - closed by seal()
        self._offsets = array("q")
        self._failing = bytearray()
        self._size = 0
        self._cleanup = weakref.finalize(self, _unlink, name)
        for item in items:
            self.append(item)

    def append(self, item: JobItem) -> None:
        """Write one item at the end of the log.

        :param item: the item
        """
        if self._sink is None:
            raise ValueError("this item log is sealed; a job's items do not change once it exists.")
        record = {
            "c": item.custom_id,
            "l": item.line,
            "b": item.body,
            "d": asdict(item.decision),
            "e": item.natural_error,
        }
        raw = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
        self._offsets.append(self._size)
        self._failing.append(1 if item.failing else 0)
        self._sink.write(raw)
        self._size += len(raw)

    def seal(self) -> None:
        """Finish writing: the log becomes read-only (a job seals its log when it is created)."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def discard(self) -> None:
        """Remove the spool file now (the log is unusable afterwards)."""
        self.seal()
        self._cleanup()

    @staticmethod
    def _decode(raw: bytes) -> JobItem:
        record = json.loads(raw)
        decision = record["d"]
        fault: ItemFault = decision["fault"]
        return JobItem(
            custom_id=record["c"],
            line=record["l"],
            body=record["b"],
            decision=ItemDecision(
                fault,
                bool(decision["duplicate"]),
                bool(decision["malformed"]),
                bool(decision.get("other_answer")),
                bool(decision.get("error_first")),
            ),
            natural_error=record["e"],
        )

    def failing(self, index: int) -> bool:
        """Tell whether item ``index`` ends as an error line, without reading it.

        :param index: 0-based input position
        """
        return bool(self._failing[index])

    def __len__(self) -> int:
        return len(self._offsets)

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """Open the spool once and yield a function that reads the item at an index.

        For many reads in any order (processing order is a shuffle of the input order).
        """
        if self._sink is not None:
            self._sink.flush()
        with open(self.path, "rb") as fh:

            def get(index: int) -> JobItem:
                fh.seek(self._offsets[index])
                return self._decode(fh.readline())

            yield get

    @overload
    def __getitem__(self, index: int) -> JobItem: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[JobItem]: ...

    def __getitem__(self, index: int | slice) -> JobItem | Sequence[JobItem]:
        if isinstance(index, slice):
            with self.reading() as get:
                return [get(i) for i in range(len(self))[index]]
        position = range(len(self))[index]
        with self.reading() as get:
            item: JobItem = get(position)
            return item

    def __iter__(self) -> Iterator[JobItem]:
        if self._sink is not None:
            self._sink.flush()
        count = len(self)
        with open(self.path, "rb") as fh:
            for _ in range(count):
                yield self._decode(fh.readline())

    def custom_ids(self) -> Iterator[str]:
        """Yield every item's custom id in input order."""
        for item in self:
            yield item.custom_id


class Job:
    """One batch job and its precomputed schedule.

    :param job_id: the provider's id
    :param provider: the router that owns it (``openai`` ...)
    :param creation_index: 0-based index among the provider's jobs since start or reset
    :param created: creation time (emulator clock, seconds)
    :param items: the parsed requests, in input order
    :param issues: validation issues; non-empty makes the job fail validation
    :param config: the emulator configuration at creation (its faults, timings and scale stick)
    :param attrs: provider-specific fields kept with the job (endpoint, metadata, file ids ...)
    """

    def __init__(
        self,
        *,
        job_id: str,
        provider: str,
        creation_index: int,
        created: float,
        items: ItemLog | Sequence[JobItem],
        issues: Sequence[ValidationIssue],
        config: EmulatorConfig,
        attrs: dict[str, Any] | None = None,
    ) -> None:
        self.id = job_id
        self.provider = provider
        self.creation_index = creation_index
        self.created = created
        log = items if isinstance(items, ItemLog) else ItemLog(None, items)
        log.seal()
        #: the items in input order, on disk
        self.items: ItemLog = log
        self.issues = tuple(issues)
        self.config = config
        self.faults: FaultConfig = config.faults
        self.attrs: dict[str, Any] = attrs or {}
        self.cancel_requested_at: float | None = None
        #: provider-owned results (file ids, usage) once written; ``None`` until then
        self.results: dict[str, Any] | None = None

        scale = config.time_scale
        t = config.timings
        self.t_in_progress = created + t.validating_s * scale
        self.t_finalizing = self.t_in_progress + t.in_progress_s * scale
        self.t_completed = self.t_finalizing + t.finalizing_s * scale
        #: the seconds over which all items would finish (kept when a stuck job never finalizes)
        self.work_span = self.t_finalizing - self.t_in_progress
        self.stuck = not issues and self.faults.batch_stuck(creation_index)
        #: the most items a stuck job finishes before it stalls (all, for other jobs)
        self.stall_count = len(log)
        if self.stuck:
            self.stall_count = math.floor(self.faults.stuck_after_fraction * len(log) + 1e-9)
            self.t_finalizing = self.t_completed = math.inf
        #: billed tokens per item, one JSON line each, spooled beside the items
        self._billed_path = log.path.with_suffix(".billed")
        self._billed_cleanup = weakref.finalize(self, _unlink, str(self._billed_path))
        self._bills: list[str] = []
        #: second answers billed for an item that already had one, ``[custom_id, tokens]`` each
        self.billed_again: list[list[Any]] = []
        self.cancel_delay = t.cancelling_s * scale
        self.expires = (
            not self.issues and not self.stuck and self.faults.batch_expires(config.seed, creation_index)
        )
        self.t_expired = self.t_in_progress + self.faults.expire_after_fraction * (
            self.t_finalizing - self.t_in_progress
        )
        order = array("I", range(len(self.items)))
        random.Random(f"{config.seed}:{provider}:{creation_index}:order").shuffle(order)
        #: item indices (input order) in processing order
        self.order: array[int] = order
        failed_prefix = array("I", [0])
        for idx in self.order:
            failed_prefix.append(failed_prefix[-1] + (1 if log.failing(idx) else 0))
        self._failed_prefix = failed_prefix

    def bill(self, custom_id: str, **usage: int) -> None:
        """Record the tokens billed for one item (once per item, whatever its result lines).

        :param custom_id: the item
        :param usage: ``input_tokens`` (uncached), ``cached_input_tokens``, ``cache_write_tokens``,
            ``output_tokens``
        """
        line = json.dumps([custom_id, billed(**usage)], separators=(",", ":"), ensure_ascii=False)
        self._bills.append(line + "\n")
        if len(self._bills) >= 1024:
            self._flush_bills()

    def bill_again(self, custom_id: str, **usage: int) -> None:
        """Record a second answer billed for an item that already has one (``rate_duplicate_other``).

        :param custom_id: the item
        :param usage: the second answer's tokens, as for :meth:`bill`
        """
        self.billed_again.append([custom_id, billed(**usage)])

    def _flush_bills(self) -> None:
        if self._bills:
            with open(self._billed_path, "a", encoding="utf-8") as fh:
                fh.writelines(self._bills)
            self._bills.clear()

    @property
    def billed(self) -> dict[str, dict[str, int]]:
        """Billed tokens per custom id, read back from disk (the last bill of an item wins)."""
        self._flush_bills()
        out: dict[str, dict[str, int]] = {}
        try:
            with open(self._billed_path, encoding="utf-8") as fh:
                for line in fh:
                    custom_id, usage = json.loads(line)
                    out[custom_id] = usage
        except FileNotFoundError:
            pass
        return out

    def discard(self) -> None:
        """Remove the job's spool files now (on reset)."""
        self.items.discard()
        self._billed_cleanup()

    def record(self, now: float) -> dict[str, Any]:
        """Return this job's entry of the emulator's record (see ``GET /_emulator/record``).

        :param now: the current time
        """
        view = self.view(now)
        keys = {name: self.attrs[attr] for attr, name in _KEY_ATTRS if self.attrs.get(attr) is not None}
        return {
            "id": self.id,
            "creation_index": self.creation_index,
            "created_at": self.created,
            "keys": keys,
            "request_count": len(self.items),
            "custom_ids": list(self.items.custom_ids()),
            "status": view.status,
            "billed": self.billed if self.results is not None else None,
            "billed_again": list(self.billed_again) if self.results is not None else None,
            "truncated": self.truncated if self.results is not None else None,
        }

    @property
    def truncated(self) -> list[str]:
        """The billed items whose output line was written truncated (fault ``rate_malformed``), input order.

        Once each: a truncated line also written twice (``rate_duplicate``) is one billed answer.
        """
        billed = self.billed
        return [item.custom_id for item in self.items if item.decision.malformed and item.custom_id in billed]

    # -- schedule ------------------------------------------------------------------------

    @property
    def natural_end(self) -> tuple[JobStatus, float]:
        """The terminal status and time without a cancel."""
        if self.issues:
            return "failed", self.t_in_progress
        if self.expires:
            return "expired", self.t_expired
        return "completed", self.t_completed

    @property
    def work_end(self) -> float:
        """The time after which no more items finish."""
        status = self.natural_end[0]
        if status == "failed":
            return self.t_in_progress
        stop = self.t_expired if status == "expired" else self.t_finalizing
        if self.cancel_effective:
            assert self.cancel_requested_at is not None
            stop = min(stop, self.cancel_requested_at)
        return stop

    @property
    def cancel_effective(self) -> bool:
        """True when a cancel came before the natural end."""
        return self.cancel_requested_at is not None and self.cancel_requested_at < self.natural_end[1]

    def request_cancel(self, now: float) -> bool:
        """Record a cancel request; return False when the job had already ended.

        :param now: the current time
        """
        if self.cancel_requested_at is not None:
            return True
        if now >= self.natural_end[1]:
            return False
        self.cancel_requested_at = now
        return True

    def done_count(self, now: float) -> int:
        """Return how many items (in processing order) have finished by ``now``.

        :param now: the current time
        """
        n = len(self.items)
        cut = min(now, self.work_end)
        if self.issues or n == 0 or cut < self.t_in_progress:
            return 0
        span = self.work_span
        if span <= 0:
            return n
        return max(0, min(n, self.stall_count, math.floor((cut - self.t_in_progress) / span * n + 1e-9)))

    def view(self, now: float) -> JobView:
        """Return the state at ``now``.

        :param now: the current time
        """
        times: dict[str, int] = {}
        status: JobStatus
        if self.cancel_effective:
            tc = self.cancel_requested_at
            assert tc is not None
            if tc >= self.t_in_progress:
                times["in_progress_at"] = int(self.t_in_progress)
            if tc >= self.t_finalizing and not self.expires:
                times["finalizing_at"] = int(self.t_finalizing)
            times["cancelling_at"] = int(tc)
            if now >= tc + self.cancel_delay:
                status = "cancelled"
                times["cancelled_at"] = int(tc + self.cancel_delay)
            else:
                status = "cancelling"
        else:
            end_status, end = self.natural_end
            if now < self.t_in_progress:
                status = "validating"
            elif end_status == "failed":
                status = "failed"
                times["failed_at"] = int(end)
            else:
                times["in_progress_at"] = int(self.t_in_progress)
                if end_status == "expired" and now >= end:
                    status = "expired"
                    times["expired_at"] = int(end)
                elif now < self.t_finalizing or end_status == "expired":
                    status = "in_progress"
                elif now < self.t_completed:
                    status = "finalizing"
                    times["finalizing_at"] = int(self.t_finalizing)
                else:
                    status = "completed"
                    times["finalizing_at"] = int(self.t_finalizing)
                    times["completed_at"] = int(self.t_completed)
        total = len(self.items) if "in_progress_at" in times else 0
        done = self.done_count(now)
        failed = self._failed_prefix[done]
        return JobView(status=status, times=times, total=total, completed=done - failed, failed=failed)

    def outcomes(self, now: float) -> Iterator[ItemOutcome]:
        """Yield every item's end, processed items first in processing order, one item at a time.

        Meant for a terminal job: items not processed by then are ``expired`` or ``cancelled``.

        :param now: the current time
        """
        if self.issues:
            return
        done = self.done_count(now)
        end: ItemEnd = "cancelled" if self.cancel_effective else "expired"
        with self.items.reading() as get:
            for pos, idx in enumerate(self.order):
                if pos < done:
                    yield ItemOutcome(get(idx), "processed", pos, idx)
                else:
                    yield ItemOutcome(get(idx), end, -1, idx)
