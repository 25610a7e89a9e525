from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_batch_provider.adapters.base import Limits
from airflow_batch_provider.core.chunking import Chunker, ChunkInfo, Placed, iter_chunk_lines
from airflow_batch_provider.core.custom_ids import parse_custom_id
from airflow_batch_provider.exceptions import ItemError


class MemorySinks:
    """Keeps every chunk file's bytes and the order of opens and closes."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.events: list[tuple[str, str]] = []

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        assert name not in self.files, f"{name} opened twice"
        self.events.append(("open", name))
        buf = io.BytesIO()
        yield buf
        self.files[name] = buf.getvalue()
        self.events.append(("written", name))


class CountingSink(io.RawIOBase):
    """Hashes and counts what is written, and keeps nothing."""

    def __init__(self) -> None:
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.size += len(data)
        return len(data)


def line_of(size: int) -> Callable[[str], bytes]:
    """A request line of about ``size`` bytes for whatever custom id it is given."""

    def build(custom_id: str) -> bytes:
        return json.dumps({"custom_id": custom_id, "body": "p" * size}).encode()

    return build


def record_closes() -> tuple[list[tuple[ChunkInfo, list[Placed]]], Callable[[ChunkInfo, list[Placed]], None]]:
    closed: list[tuple[ChunkInfo, list[Placed]]] = []

    def on_close(info: ChunkInfo, placed: list[Placed]) -> None:
        closed.append((info, list(placed)))

    return closed, on_close


def test_chunks_close_at_the_request_count_limit() -> None:
    sinks = MemorySinks()
    with Chunker(Limits(max_requests=3, max_bytes=10**6), sinks.open) as chunker:
        for i in range(7):
            chunker.add(f"k{i}", f"k{i}", 1, line_of(10))
    assert [c.lines for c in chunker.chunks] == [3, 3, 1]
    assert [c.name for c in chunker.chunks] == ["chunk-00000.jsonl", "chunk-00001.jsonl", "chunk-00002.jsonl"]


def test_a_tighter_max_requests_wins_over_the_adapters_limit() -> None:
    sinks = MemorySinks()
    with Chunker(Limits(max_requests=100, max_bytes=10**6), sinks.open, max_requests=2) as chunker:
        for i in range(5):
            chunker.add(f"k{i}", f"k{i}", 1, line_of(10))
    assert [c.lines for c in chunker.chunks] == [2, 2, 1]


def test_chunks_close_before_the_byte_limit_with_headroom() -> None:
    line = len(line_of(100)("k0__a1c0")) + 1
    limits = Limits(max_requests=1000, max_bytes=line * 10, headroom=0.5)
    assert limits.usable_bytes == line * 5
    sinks = MemorySinks()
    with Chunker(limits, sinks.open) as chunker:
        for i in range(12):
            chunker.add(f"k{i}", f"k{i}", 1, line_of(100))
    assert [c.lines for c in chunker.chunks] == [5, 5, 2]
    assert all(c.size <= limits.usable_bytes for c in chunker.chunks)


def test_each_line_carries_the_custom_id_of_the_chunk_it_landed_in() -> None:
    sinks = MemorySinks()
    with Chunker(Limits(max_requests=2, max_bytes=10**6), sinks.open, first_index=7) as chunker:
        placed = [chunker.add(f"k{i}", f"k{i}", 3, line_of(5)) for i in range(5)]
    assert [p.chunk for p in placed] == [7, 7, 8, 8, 9]
    for p in placed:
        assert parse_custom_id(p.custom_id) == parse_custom_id(f"{p.key}__a3c{p.chunk}")
        body = sinks.files[f"chunk-{p.chunk:05d}.jsonl"]
        assert json.dumps({"custom_id": p.custom_id, "body": "ppppp"}).encode() + b"\n" in body


def test_first_index_continues_the_numbering_of_an_interrupted_round() -> None:
    sinks = MemorySinks()
    closed, on_close = record_closes()
    with Chunker(Limits(max_requests=1, max_bytes=10**6), sinks.open, on_close, first_index=4) as chunker:
        for i in range(3):
            chunker.add(f"k{i}", f"k{i}", 1, line_of(5))
    assert [c.index for c in chunker.chunks] == [4, 5, 6]
    assert sorted(sinks.files) == ["chunk-00004.jsonl", "chunk-00005.jsonl", "chunk-00006.jsonl"]
    assert [info.index for info, _ in closed] == [4, 5, 6]


def test_the_prefix_names_the_chunk_files() -> None:
    sinks = MemorySinks()
    with Chunker(Limits(max_requests=5, max_bytes=10**6), sinks.open, prefix="round-2") as chunker:
        chunker.add("k", "k", 2, line_of(5))
    assert list(sinks.files) == ["round-2-00000.jsonl"]


def test_no_items_make_no_chunk_and_close_is_idempotent() -> None:
    sinks = MemorySinks()
    closed, on_close = record_closes()
    chunker = Chunker(Limits(max_requests=5, max_bytes=10**6), sinks.open, on_close)
    chunker.close()
    chunker.close()
    assert chunker.chunks == [] and closed == [] and sinks.files == {}
    chunker.add("k", "k", 1, line_of(5))
    chunker.close()
    chunker.close()
    assert len(chunker.chunks) == 1 and len(closed) == 1


def test_an_item_over_the_byte_limit_is_refused_by_name_size_limit_and_fix_and_the_rest_go_on() -> None:
    limits = Limits(max_requests=100, max_bytes=1000, headroom=0.9)
    sinks = MemorySinks()
    closed, on_close = record_closes()
    with Chunker(limits, sinks.open, on_close) as chunker:
        chunker.add("a", "app-a", 1, line_of(10))
        big = len(line_of(2000)("big__a1c0")) + 1
        with pytest.raises(ItemError) as caught:
            chunker.add("big", "app-big", 1, line_of(2000))
        chunker.add("b", "app-b", 1, line_of(10))
    err = caught.value
    assert err.code == "item_too_large"
    assert err.app_id == "app-big"
    message = str(err)
    assert "'app-big'" in message
    assert f"{big:,} bytes" in message
    assert "900 bytes" in message
    assert "Shorten the input" in message and "synchronous path" in message
    assert [c.lines for c in chunker.chunks] == [2]
    assert [p.key for p in closed[0][1]] == ["a", "b"]
    assert b"big" not in sinks.files["chunk-00000.jsonl"]


def test_an_item_refused_at_a_chunk_boundary_leaves_no_empty_chunk_behind() -> None:
    # The line fits exactly at chunk 9; in chunk 10 its custom id is one byte longer and it no longer
    # does. The chunk opened for it must not be recorded as an empty job.
    exact = len(line_of(100)("k1__a1c9")) + 1
    limits = Limits(max_requests=1, max_bytes=exact, headroom=1.0)
    sinks = MemorySinks()
    closed, on_close = record_closes()
    with Chunker(limits, sinks.open, on_close, first_index=9) as chunker:
        chunker.add("k0", "k0", 1, line_of(50))
        with pytest.raises(ItemError):
            chunker.add("k1", "k1", 1, line_of(100))
    assert all(c.lines > 0 for c in chunker.chunks), chunker.chunks
    assert all(placed for _, placed in closed)
    assert all(data for data in sinks.files.values())


def test_on_close_gets_each_chunk_with_its_items_before_the_next_chunk_opens() -> None:
    sinks = MemorySinks()
    log: list[tuple[str, str]] = sinks.events

    def on_close(info: ChunkInfo, placed: list[Placed]) -> None:
        log.append(("on_close", info.name))
        assert info.name in sinks.files  # the file is complete when on_close sees it
        assert all(p.chunk == info.index for p in placed)

    with Chunker(Limits(max_requests=2, max_bytes=10**6), sinks.open, on_close) as chunker:
        for i in range(5):
            chunker.add(f"k{i}", f"k{i}", 1, line_of(5))
    names = [f"chunk-{i:05d}.jsonl" for i in range(3)]
    assert log == [
        event for name in names for event in (("open", name), ("written", name), ("on_close", name))
    ]


def test_the_chunker_closes_the_open_chunk_when_the_block_fails() -> None:
    sinks = MemorySinks()
    closed, on_close = record_closes()
    with (
        pytest.raises(RuntimeError),
        Chunker(Limits(max_requests=5, max_bytes=10**6), sinks.open, on_close) as c,
    ):
        c.add("k", "k", 1, line_of(5))
        raise RuntimeError("boom")
    assert [info.lines for info, _ in closed] == [1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 400), min_size=0, max_size=60),
    max_requests=st.integers(1, 12),
    max_bytes=st.integers(150, 2000),
    headroom=st.sampled_from([0.5, 0.8, 0.95, 1.0]),
    first_index=st.integers(0, 20),
)
def test_every_item_is_placed_once_within_the_limits_and_every_checksum_matches_the_bytes(
    sizes: list[int], max_requests: int, max_bytes: int, headroom: float, first_index: int
) -> None:
    limits = Limits(max_requests=max_requests, max_bytes=max_bytes, headroom=headroom)
    sinks = MemorySinks()
    closed, on_close = record_closes()
    rejected: list[str] = []
    #: each rejected item's key -> the index a fresh chunk would have had then (its custom id
    #: carries the chunk's index: a later chunk's line can be a byte longer)
    fresh_index: dict[str, int] = {}
    placed: list[Placed] = []
    with Chunker(limits, sinks.open, on_close, first_index=first_index) as chunker:
        for i, size in enumerate(sizes):
            try:
                placed.append(chunker.add(f"k{i}", f"app{i}", 2, line_of(size)))
            except ItemError as exc:
                assert exc.code == "item_too_large"
                rejected.append(f"k{i}")
                fresh_index[f"k{i}"] = placed[-1].chunk + 1 if placed else first_index

    # every item is placed exactly once or rejected, never both
    assert sorted([p.key for p in placed] + rejected) == sorted(f"k{i}" for i in range(len(sizes)))
    keys_in_files = [
        parse_custom_id(json.loads(line)["custom_id"]).key
        for data in sinks.files.values()
        for line in iter_chunk_lines(io.BytesIO(data))
    ]
    assert sorted(keys_in_files) == sorted(p.key for p in placed)
    # a rejected item could not have fitted even in the empty chunk that would have been opened for it
    for key in rejected:
        i = int(key[1:])
        assert len(line_of(sizes[i])(f"{key}__a2c{fresh_index[key]}")) + 1 > limits.usable_bytes

    # chunks are numbered on from first_index, within the limits, and match their bytes
    assert [c.index for c in chunker.chunks] == list(range(first_index, first_index + len(chunker.chunks)))
    assert [info for info, _ in closed] == chunker.chunks
    for info, items in closed:
        data = sinks.files[info.name]
        assert 0 < info.lines <= max_requests
        assert info.size <= limits.usable_bytes
        assert info.size == len(data)
        assert info.lines == data.count(b"\n") == len(items)
        assert info.sha256 == hashlib.sha256(data).hexdigest()
        for p, line in zip(items, iter_chunk_lines(io.BytesIO(data)), strict=True):
            assert json.loads(line)["custom_id"] == p.custom_id
            assert parse_custom_id(p.custom_id).chunk == info.index == p.chunk

    # a chunk closes only when the next item would not fit (no half-empty chunk mid-stream)
    order = [p for _, items in closed for p in items]
    for (info, _), nxt in zip(closed[:-1], [items[0] for _, items in closed[1:]], strict=True):
        nxt_size = len(line_of(sizes[int(nxt.key[1:])])(f"{nxt.key}__a2c{info.index}")) + 1
        assert info.lines == max_requests or info.size + nxt_size > limits.usable_bytes
    assert order == placed


def _padded_line(pad: bytes) -> Callable[[str], bytes]:
    def build(custom_id: str) -> bytes:
        return b'{"custom_id":"' + custom_id.encode() + b'","body":"' + pad + b'"}'

    return build


def _peak_bytes(count: int) -> tuple[int, int]:
    """Stream ``count`` small lines through a chunker; return (peak traced bytes, bytes written)."""
    sink = CountingSink()
    written = 0

    @contextmanager
    def open_sink(name: str) -> Iterator[IO[bytes]]:
        yield sink  # type: ignore[misc]

    pads = [b"p" * (20 + n) for n in range(50)]

    def records() -> Iterator[tuple[str, Callable[[str], bytes]]]:
        for i in range(count):
            yield f"item-{i}", _padded_line(pads[i % 50])

    def on_close(info: ChunkInfo, placed: list[Placed]) -> None:
        nonlocal written
        written += info.size

    tracemalloc.start()
    try:
        with Chunker(Limits(max_requests=500, max_bytes=10**9), open_sink, on_close) as chunker:
            for key, build in records():
                chunker.add(key, key, 1, build)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written == sink.size
    return peak, written


def test_the_chunker_streams_and_never_holds_all_records_in_memory() -> None:
    small_peak, _ = _peak_bytes(20_000)
    big_peak, big_written = _peak_bytes(200_000)
    assert big_written > 15_000_000
    # ten times the records may not need ten times the memory: what grows is the list of chunks only
    assert big_peak < 2 * small_peak + 200_000, (small_peak, big_peak)
    assert big_peak < big_written / 20, (big_peak, big_written)


def test_iter_chunk_lines_skips_blank_lines_and_strips_line_endings() -> None:
    stream = io.BytesIO(b'{"a":1}\r\n\n{"b":2}\n\r\n{"c":3}')
    assert list(iter_chunk_lines(stream)) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
