"""Streaming chunker: request lines into provider-bounded JSONL files.

Lines are written as they come; nothing holds more than one line in memory. A chunk closes when
the next line would pass the adapter's request count or byte limit (with headroom). Every chunk
gets its SHA-256, line count and size, computed while writing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, Any

from airflow_batch_provider.core.batch import Limits
from airflow_batch_provider.core.custom_ids import MAX_CHUNK, make_custom_id
from airflow_batch_provider.exceptions import ChunkingError, ItemError


@dataclass(frozen=True)
class ChunkInfo:
    """One written chunk.

    :param index: chunk index within its round, from 0
    :param name: the chunk's file name
    :param sha256: hex SHA-256 of the file's bytes
    :param lines: request lines in the file
    :param size: bytes in the file
    """

    index: int
    name: str
    sha256: str
    lines: int
    size: int

    def to_dict(self) -> dict[str, Any]:
        """Return an XCom- and manifest-safe dict."""
        return {
            "index": self.index,
            "name": self.name,
            "sha256": self.sha256,
            "lines": self.lines,
            "size": self.size,
        }


@dataclass(frozen=True)
class Placed:
    """Where one item landed.

    :param key: the item key
    :param custom_id: the custom id written on its line
    :param chunk: the chunk index
    :param attempt: the attempt number
    """

    key: str
    custom_id: str
    chunk: int
    attempt: int


OpenSink = Callable[[str], AbstractContextManager[IO[bytes]]]


class Chunker:
    """Write lines into chunk files, bounded by count and bytes.

    Use as a context manager; :meth:`add` places one item, :attr:`chunks` lists finished chunks.

    :param limits: the adapter's limits
    :param open_sink: opens a binary writer for a chunk file name
    :param on_close: called with each finished chunk and the items placed in it, before the next
        chunk opens (record the job there, so that a crash loses at most one chunk's work)
    :param prefix: chunk file name prefix
    :param max_requests: optional tighter request limit (e.g. to spread work over more jobs)
    :param max_bytes: optional tighter byte limit per file (smaller uploads, faster retries)
    :param first_index: index of the first chunk (to continue a round that was interrupted)
    """

    def __init__(
        self,
        limits: Limits,
        open_sink: OpenSink,
        on_close: Callable[[ChunkInfo, list[Placed]], None] | None = None,
        prefix: str = "chunk",
        max_requests: int | None = None,
        max_bytes: int | None = None,
        first_index: int = 0,
    ) -> None:
        self._max_lines = min(limits.max_requests, max_requests or limits.max_requests)
        self._max_bytes = min(limits.usable_bytes, max_bytes or limits.usable_bytes)
        self._open_sink = open_sink
        self._on_close = on_close
        self._placed: list[Placed] = []
        self._prefix = prefix
        self._index = first_index - 1
        self._first = first_index
        self._cm: AbstractContextManager[IO[bytes]] | None = None
        self._sink: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._lines = 0
        self._bytes = 0
        self.chunks: list[ChunkInfo] = []

    def __enter__(self) -> Chunker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _name(self, index: int) -> str:
        return f"{self._prefix}-{index:05d}.jsonl"

    def _open_next(self) -> None:
        self._finish()
        self._index += 1
        if self._index > MAX_CHUNK:
            raise ChunkingError(
                f"more than {MAX_CHUNK + 1} chunks in one round; raise max_requests per chunk."
            )
        self._cm = self._open_sink(self._name(self._index))
        self._sink = self._cm.__enter__()
        self._hash = hashlib.sha256()
        self._lines = 0
        self._bytes = 0

    def _finish(self) -> None:
        if self._cm is None:
            return
        self._cm.__exit__(None, None, None)
        info = ChunkInfo(
            self._index, self._name(self._index), self._hash.hexdigest(), self._lines, self._bytes
        )
        self.chunks.append(info)
        self._cm = None
        self._sink = None
        placed, self._placed = self._placed, []
        if self._on_close is not None:
            self._on_close(info, placed)

    def add(self, key: str, app_id: str, attempt: int, line_for: Callable[[str], bytes]) -> Placed:
        """Place one item, opening a new chunk when the current one is full.

        :param key: the item key (see :func:`~airflow_batch_provider.core.custom_ids.item_key`)
        :param app_id: the application id, for error messages
        :param attempt: the item's attempt number in this job
        :param line_for: builds the JSON line (no newline) for a given custom id
        :raises ItemError: the item alone is larger than one chunk may be
        """
        index = max(self._index, self._first)
        custom_id = make_custom_id(key, attempt, index)
        line = line_for(custom_id)
        self._check_size(app_id, len(line) + 1)
        if (
            self._sink is None
            or self._lines >= self._max_lines
            or self._bytes + len(line) + 1 > self._max_bytes
        ):
            # The next chunk's custom id may be a byte longer: check the line before opening the
            # chunk, so that a refused item never leaves an empty chunk (an empty job) behind.
            if self._index + 1 != index and self._index + 1 <= MAX_CHUNK:
                custom_id = make_custom_id(key, attempt, self._index + 1)
                line = line_for(custom_id)
                self._check_size(app_id, len(line) + 1)
            self._open_next()
        assert self._sink is not None
        size = len(line) + 1
        data = line + b"\n"
        self._sink.write(data)
        self._hash.update(data)
        self._lines += 1
        self._bytes += size
        placed = Placed(key, custom_id, self._index, attempt)
        self._placed.append(placed)
        return placed

    def _check_size(self, app_id: str, size: int) -> None:
        if size > self._max_bytes:
            raise ItemError(
                app_id,
                "item_too_large",
                f"its request line is {size:,} bytes; one batch file takes at most {self._max_bytes:,} "
                "bytes after headroom. Shorten the input (truncate or split the document) or send it "
                "through the synchronous path.",
            )

    def close(self) -> None:
        """Finish the open chunk (idempotent)."""
        self._finish()


def iter_chunk_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Yield the non-empty lines of a binary JSONL stream without their newline.

    :param stream: readable binary stream
    """
    for raw in stream:
        line = raw.rstrip(b"\r\n")
        if line:
            yield line
