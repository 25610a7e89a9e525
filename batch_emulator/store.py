"""Files and jobs, the clock and the counters: the shared state.

Everything here is provider-neutral and thread-safe: one re-entrant lock guards the whole state,
which is plenty for an emulator. File bytes, a job's items and its billed tokens live on disk,
under ``data_dir`` (a temporary folder, removed with the emulator, when none is given), never in
RAM: uploads are streamed in, results are written line by line (:meth:`FileStore.writer`) and
content is always read back in chunks, so the emulator's memory stays flat as a batch grows.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import CreateFault, CreateOp, SlidingWindowLimiter
from batch_emulator.lifecycle import ItemLog, Job, JobItem, ValidationIssue, billed

CHUNK: Final = 64 * 1024


class Clock:
    """Wall-clock time plus an offset that tests may advance (time travel, no sleeping).

    :param source: the underlying time source, seconds since the epoch
    """

    def __init__(self, source: Callable[[], float] = time.time) -> None:
        self._source = source
        self._offset = 0.0

    def now(self) -> float:
        """Return the emulator's current time."""
        return self._source() + self._offset

    def advance(self, seconds: float) -> float:
        """Move the clock forward and return the new time.

        :param seconds: how far, 0 or more
        """
        if seconds < 0:
            raise ValueError("the clock only moves forward; give 0 or more seconds.")
        self._offset += seconds
        return self.now()


@dataclass
class StoredFile:
    """One stored file's metadata; the bytes live in the :class:`FileStore`.

    :param id: file id
    :param filename: the name given at upload
    :param purpose: the purpose (``batch``, ``batch_output`` ...)
    :param bytes: size in bytes
    :param created_at: unix seconds
    :param sha256: hex digest of the content
    :param expires_at: unix seconds when it expires, if it does
    :param provider: the router that created it
    """

    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    sha256: str
    expires_at: int | None = None
    provider: str = "openai"


class FileTooLargeError(ValueError):
    """An upload is larger than the configured limit."""


class _Sink:
    """A file being written: counts its bytes and hashes them as they go."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.size = 0
        self.digest = hashlib.sha256()
        #: the file's metadata once named (:meth:`keep`); an unnamed file is not stored
        self.meta: StoredFile | None = None

    def keep(self, meta: StoredFile) -> None:
        """Store the file under ``meta`` when the writing ends.

        :param meta: its metadata; ``bytes`` and ``sha256`` are filled in at the end
        """
        self.meta = meta

    def write(self, block: bytes) -> None:
        """Append bytes.

        :param block: the bytes
        """
        self._fh.write(block)
        self.size += len(block)
        self.digest.update(block)


class FileStore:
    """Files by id, their content on disk in ``data_dir``.

    :param data_dir: directory for file bytes (``None``: a temporary folder, removed when the
        store is forgotten)
    :param lock: the state lock
    """

    def __init__(self, data_dir: Path | None, lock: threading.RLock) -> None:
        if data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix="batch-emulator-"))
            weakref.finalize(self, shutil.rmtree, str(data_dir), ignore_errors=True)
        data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = data_dir
        self._lock = lock
        self._meta: dict[str, StoredFile] = {}

    @property
    def directory(self) -> Path:
        """The data directory (files, and the spools of jobs under ``jobs/``)."""
        return self._dir

    def put(self, meta: StoredFile, source: IO[bytes] | bytes, max_bytes: int | None = None) -> StoredFile:
        """Store content and return its metadata (with ``bytes`` and ``sha256`` filled in).

        :param meta: metadata; ``bytes`` and ``sha256`` are overwritten
        :param source: the content, or a binary stream read in chunks
        :param max_bytes: refuse content larger than this
        :raises FileTooLargeError: the content is over ``max_bytes``
        """
        stream: IO[bytes] = io.BytesIO(source) if isinstance(source, bytes) else source
        with self.writer() as sink:
            sink.keep(meta)
            while block := stream.read(CHUNK):
                if max_bytes is not None and sink.size + len(block) > max_bytes:
                    raise FileTooLargeError(f"file is larger than {max_bytes} bytes")
                sink.write(block)
        return meta

    @contextmanager
    def writer(self) -> Iterator[_Sink]:
        """Write a new file piece by piece; it appears (with its size and digest) once the block ends.

        Nothing appears when the block raises or never named the file (``sink.keep(meta)``).
        """
        fd, name = tempfile.mkstemp(dir=self._dir, prefix=".upload-")
        tmp_path = Path(name)
        try:
            with open(fd, "wb") as fh:
                sink = _Sink(fh)
                yield sink
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise
        meta = sink.meta
        if meta is None:
            tmp_path.unlink(missing_ok=True)
            return
        meta.bytes = sink.size
        meta.sha256 = sink.digest.hexdigest()
        with self._lock:
            shutil.move(str(tmp_path), str(self._path(meta.id)))
            self._meta[meta.id] = meta

    def _path(self, file_id: str) -> Path:
        return self._dir / file_id

    def get(self, file_id: str) -> StoredFile | None:
        """Return a file's metadata, or ``None``.

        :param file_id: the id
        """
        with self._lock:
            return self._meta.get(file_id)

    def list(self, provider: str | None = None) -> list[StoredFile]:
        """Return every file, oldest first.

        :param provider: only this router's files
        """
        with self._lock:
            return [m for m in self._meta.values() if provider is None or m.provider == provider]

    def delete(self, file_id: str) -> bool:
        """Delete a file; return False when it did not exist.

        :param file_id: the id
        """
        with self._lock:
            if self._meta.pop(file_id, None) is None:
                return False
            self._path(file_id).unlink(missing_ok=True)
            return True

    def iter_bytes(self, file_id: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """Yield a file's content in chunks.

        :param file_id: the id
        :param chunk_size: bytes per chunk
        :raises KeyError: no such file
        """
        with self._lock:
            if file_id not in self._meta:
                raise KeyError(file_id)
        with open(self._path(file_id), "rb") as fh:
            while block := fh.read(chunk_size):
                yield block

    def iter_lines(self, file_id: str) -> Iterator[bytes]:
        """Yield a file's lines (with their line endings), without loading it whole.

        :param file_id: the id
        :raises KeyError: no such file
        """
        rest = b""
        for block in self.iter_bytes(file_id):
            rest += block
            *lines, rest = rest.split(b"\n")
            for line in lines:
                yield line + b"\n"
        if rest:
            yield rest

    def clear(self) -> None:
        """Delete every file."""
        with self._lock:
            for file_id in list(self._meta):
                self.delete(file_id)


class JobStore:
    """Jobs by id, in creation order, for every provider.

    :param lock: the state lock
    """

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._jobs: dict[str, Job] = {}
        self._created: Counter[str] = Counter()

    def next_index(self, provider: str) -> int:
        """Reserve and return the next 0-based creation index of a provider's jobs.

        :param provider: the router name
        """
        with self._lock:
            index = self._created[provider]
            self._created[provider] += 1
            return index

    def add(self, job: Job) -> None:
        """Store a job.

        :param job: the job
        """
        with self._lock:
            self._jobs[job.id] = job

    def get(self, job_id: str, provider: str | None = None) -> Job | None:
        """Return a job, or ``None``.

        :param job_id: the id
        :param provider: only when it belongs to this router
        """
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or (provider is not None and job.provider != provider):
                return None
            return job

    def list(self, provider: str | None = None) -> list[Job]:
        """Return jobs newest first.

        :param provider: only this router's jobs
        """
        with self._lock:
            jobs = [j for j in self._jobs.values() if provider is None or j.provider == provider]
        return jobs[::-1]

    def clear(self) -> None:
        """Forget every job (and remove its spool files) and reset the creation indices."""
        with self._lock:
            for job in self._jobs.values():
                job.discard()
            self._jobs.clear()
            self._created.clear()


class EmulatorState:
    """Everything a router needs: configuration, clock, files, jobs, counters, ids.

    :param config: the configuration at start
    :param clock: the clock (tests may pass one with a fixed source)
    """

    def __init__(self, config: EmulatorConfig, clock: Clock | None = None) -> None:
        self.initial_config = config
        self.config = config
        self.clock = clock or Clock()
        self.lock = threading.RLock()
        self.files = FileStore(config.data_dir, self.lock)
        self.jobs = JobStore(self.lock)
        self.counters: Counter[str] = Counter()
        self.limiter = SlidingWindowLimiter()
        #: prompt prefixes seen by the synchronous endpoints (for cached_tokens)
        self.seen_prefixes: set[str] = set()
        self._ids: Counter[str] = Counter()
        self._generation = 0
        #: every real-time answer given, for the record (see :meth:`record_realtime`)
        self.realtime: list[dict[str, Any]] = []
        #: provider -> a function that brings a job's results up to date (renders them once it ended)
        self.finalizers: dict[str, Callable[[Job, float], object]] = {}

    def now(self) -> float:
        """Return the emulator's current time."""
        return self.clock.now()

    def new_id(self, prefix: str, length: int = 24) -> str:
        """Return a fresh id, deterministic in the seed and the number of ids made so far.

        :param prefix: e.g. ``file-`` or ``batch_``
        :param length: hex characters after the prefix
        """
        with self.lock:
            n = self._ids[prefix]
            self._ids[prefix] += 1
            key = f"{self.config.seed}:{self._generation}:{prefix}:{n}"
        return prefix + hashlib.sha256(key.encode()).hexdigest()[:length]

    def count(self, name: str, by: int = 1) -> int:
        """Add to a named counter and return the value before adding.

        :param name: the counter (``batches_created``, ``openai.retrieve`` ...)
        :param by: the increment
        """
        with self.lock:
            before = self.counters[name]
            self.counters[name] += by
            return before

    def bump(self, provider: str, name: str) -> int:
        """Count an event both in total (``name``) and per provider (``provider.name``).

        :param provider: the router name
        :param name: the event (``batches_created``, ``files_uploaded``, ``sync_requests`` ...)
        :return: the provider's count before this event (a 0-based request counter)
        """
        with self.lock:
            self.counters[name] += 1
            return self.count(f"{provider}.{name}")

    def update_config(self, patch: dict[str, Any]) -> EmulatorConfig:
        """Apply a partial configuration update and return the new configuration.

        :param patch: the ``PUT /_emulator/config`` body
        :raises ValueError: invalid keys or values
        """
        with self.lock:
            new = self.config.updated(patch)
            if "faults" in patch or "seed" in patch:
                self.limiter.reset()
            self.config = new
            return new

    def item_log(self) -> ItemLog:
        """Return an empty item log spooled in the data directory, for a router to fill while it parses."""
        return ItemLog(self.files.directory / "jobs")

    def create_job(
        self,
        provider: str,
        job_id: str,
        items: ItemLog | list[JobItem],
        issues: list[ValidationIssue],
        config: EmulatorConfig,
        attrs: dict[str, Any],
    ) -> Job:
        """Create, store and count one batch job (its creation index is taken under the lock).

        :param provider: the router name
        :param job_id: the provider-shaped id
        :param items: the parsed request lines (an :meth:`item_log`, or a list that is spooled)
        :param issues: validation problems (a non-empty list fails the batch)
        :param config: the configuration the job keeps for its whole life
        :param attrs: provider-specific attributes
        """
        if not isinstance(items, ItemLog):
            items = ItemLog(self.files.directory / "jobs", items)
        with self.lock:
            job = Job(
                job_id=job_id,
                provider=provider,
                creation_index=self.jobs.next_index(provider),
                created=self.now(),
                items=items,
                issues=issues,
                config=config,
                attrs=attrs,
            )
            self.jobs.add(job)
            self.bump(provider, "batches_created")
        return job

    def consume_validation_failure(self) -> bool:
        """Return True (and count one down) when the next batch must fail validation."""
        return self.consume_countdown("fail_validation")

    def consume_countdown(self, name: str) -> bool:
        """Return True (and count one down) when a countdown fault (``fail_validation`` ...) is armed.

        :param name: the fault setting that counts the next batches to fail
        """
        with self.lock:
            remaining = int(getattr(self.config.faults, name))
            if remaining <= 0:
                return False
            self.config = self.config.updated({"faults": {name: remaining - 1}})
            return True

    def take_create_fault(self, provider: str, op: CreateOp) -> CreateFault:
        """Decide the fault of one create-like call: the next matching script entry, else a roll.

        Counted as ``<provider>.create_faults.<fault>`` when one is injected.

        :param provider: the router
        :param op: ``upload`` or ``create``
        """
        with self.lock:
            faults = self.config.faults
            counter = self.count(f"{provider}.{op}_calls")
            index = faults.script_index(op)
            if index is not None:
                script = list(faults.create_script)
                fault: CreateFault = script.pop(index).partition(":")[2]  # type: ignore[assignment]
                self.config = self.config.updated({"faults": {"create_script": script}})
            else:
                fault = faults.decide_create(self.config.seed, provider, op, counter)
            if fault != "none":
                self.bump(provider, f"create_faults.{fault}")
            return fault

    def record_realtime(self, provider: str, custom_id: str | None, usage: dict[str, int]) -> None:
        """Remember one real-time answer that was billed, for ``GET /_emulator/record``.

        :param provider: the router
        :param custom_id: the caller's id of the item (``x-abp-custom-id`` header), if sent
        :param usage: billed tokens (``input_tokens`` uncached, ``cached_input_tokens``,
            ``cache_write_tokens``, ``output_tokens``)
        """
        with self.lock:
            self.realtime.append(
                {"provider": provider, "custom_id": custom_id, "at": self.now(), "usage": billed(**usage)}
            )

    def record(self) -> dict[str, Any]:
        """Return everything the emulator created and billed (the ``GET /_emulator/record`` body)."""
        now = self.now()
        with self.lock:
            jobs = self.jobs.list()[::-1]
            for job in jobs:
                finalize = self.finalizers.get(job.provider)
                if finalize is not None:
                    finalize(job, now)
            out: dict[str, Any] = {"now": now, "batches": {}, "realtime": {}}
            for job in jobs:
                out["batches"].setdefault(job.provider, []).append(job.record(now))
            for answer in self.realtime:
                out["realtime"].setdefault(answer["provider"], []).append(
                    {k: v for k, v in answer.items() if k != "provider"}
                )
            return out

    def reset(self) -> None:
        """Forget every file, job and counter, and restore the start configuration."""
        with self.lock:
            self.files.clear()
            self.jobs.clear()
            self.counters.clear()
            self.limiter.reset()
            self.seen_prefixes.clear()
            self.realtime.clear()
            self._ids.clear()
            self._generation += 1
            self.config = self.initial_config
