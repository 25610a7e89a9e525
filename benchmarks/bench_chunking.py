"""How fast is the streaming Chunker, and does its memory stay flat as the input grows?

Subject: :class:`~airflow_batch_provider.core.chunking.Chunker` with the OpenAI adapter's
``format_line``, writing chunk files to a temporary directory (as the prepare/stage step does,
without the ledger).

Baseline (the floor): the same request lines built with one ``json.dumps`` each, written to one
file with one SHA-256 over it: the least work that produces the same bytes.

Memory: peak traced memory (:mod:`tracemalloc`) at N and 4N items, chunk size fixed, for the
Chunker and for a naive approach that lists every line first and then splits the list into
chunk files. A flat approach has a 4N/N peak ratio near 1; the naive one grows about 4x.

Usage: ``python benchmarks/bench_chunking.py [--size tiny|small|default]``
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import check_size, cli, mib, per_s, result, row, timed, traced_peak

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.chunking import Chunker, ChunkInfo
from airflow_batch_provider.core.custom_ids import make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate

#: size -> (items for throughput, items N for the memory runs, timing repeats)
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2_000, 1_000, 1),
    "small": (20_000, 10_000, 2),
    "default": (200_000, 50_000, 2),
}
POOL = 1024
SYSTEM = (
    "You label customer feedback for a retail support team. Answer with one JSON object: "
    '{"label": "positive" | "negative" | "neutral", "topic": one of delivery, product, price, '
    'support, app, other, "urgent": true | false}. Base the label on the customer\'s own words; '
    "ignore quoted text and signatures. Sarcasm counts as negative. A question with no opinion is "
    "neutral. A complaint about delivery that praises the product is negative about delivery."
)
WORDS = [
    "order",
    "arrived",
    "late",
    "the",
    "box",
    "was",
    "damaged",
    "but",
    "support",
    "replaced",
    "it",
    "quickly",
    "great",
    "app",
    "crashes",
    "every",
    "time",
    "I",
    "open",
    "checkout",
    "price",
    "went",
    "up",
    "again",
    "refund",
    "still",
    "pending",
    "after",
    "two",
    "weeks",
    "love",
    "the",
    "new",
    "colours",
    "size",
    "runs",
    "small",
    "courier",
    "left",
    "it",
    "in",
    "the",
    "rain",
    "thank",
    "you",
    "Anna",
    "for",
    "the",
    "help",
]


@functools.cache
def _pool() -> list[CanonicalRequest]:
    rnd = random.Random(7)
    out = []
    for i in range(POOL):
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(10, 90)))
        out.append(
            CanonicalRequest(
                app_id=f"pool-{i}",
                prompt_version="bench-v1",
                model="gpt-4o-mini",
                system=SYSTEM,
                messages=({"role": "user", "content": text},),
                params={"max_tokens": 60, "temperature": 0},
            )
        )
    return out


def _items(n: int, pool: list[CanonicalRequest]) -> Iterator[tuple[str, CanonicalRequest]]:
    """N synthetic rendered requests, built as they are consumed (no list of N)."""
    for i in range(n):
        yield f"c{i:09d}", pool[i % POOL]


def run_chunker(
    n: int, folder: Path, pool: list[CanonicalRequest], max_requests: int | None = None
) -> list[ChunkInfo]:
    """The subject: the streaming Chunker writing chunk files.

    :param n: items
    :param folder: where chunk files go
    :param pool: the request pool
    :param max_requests: a tighter chunk size than the adapter's limit
    """
    adapter = OpenAIBatchAdapter(AdapterSettings())

    def open_sink(name: str) -> IO[bytes]:
        return (folder / name).open("wb")

    with Chunker(adapter.limits, open_sink, max_requests=max_requests) as chunker:
        for key, req in _items(n, pool):
            chunker.add(key, key, 1, functools.partial(adapter.format_line, req))
    return chunker.chunks


def run_baseline(n: int, folder: Path, pool: list[CanonicalRequest]) -> tuple[int, str]:
    """The floor: one json.dumps per line, one file, one SHA-256.

    :param n: items
    :param folder: where the file goes
    :param pool: the request pool
    """
    digest = hashlib.sha256()
    size = 0
    with (folder / "baseline.jsonl").open("wb") as fh:
        for key, req in _items(n, pool):
            body = {
                "model": req.model,
                "messages": [{"role": "system", "content": req.system}, *req.messages],
            }
            body.update(req.params)
            data = (
                json.dumps(
                    {
                        "custom_id": f"{key}__a1c0",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    },
                    ensure_ascii=False,
                    separators=(",", ":"),
                ).encode("utf-8")
                + b"\n"
            )
            fh.write(data)
            digest.update(data)
            size += len(data)
    return size, digest.hexdigest()


def run_naive(n: int, folder: Path, pool: list[CanonicalRequest], max_requests: int) -> int:
    """The naive approach: list every line, then split the list into chunk files.

    :param n: items
    :param folder: where chunk files go
    :param pool: the request pool
    :param max_requests: lines per chunk
    """
    adapter = OpenAIBatchAdapter(AdapterSettings())
    lines = [
        adapter.format_line(req, make_custom_id(key, 1, i // max_requests))
        for i, (key, req) in enumerate(_items(n, pool))
    ]
    chunks = 0
    for start in range(0, len(lines), max_requests):
        part = lines[start : start + max_requests]
        data = b"\n".join(part) + b"\n"
        hashlib.sha256(data).hexdigest()
        (folder / f"naive-{chunks:05d}.jsonl").write_bytes(data)
        chunks += 1
    return chunks


TEMPLATE = PromptTemplate(
    version="bench-v1",
    model="gpt-4o-mini",
    system=SYSTEM,
    user="Comment from a {{ channel }} customer: {{ text }}",
    params={"max_tokens": 60, "temperature": 0},
)


def _records(n: int) -> Iterator[dict[str, str]]:
    texts = [str(r.messages[0]["content"]) for r in _pool()]
    for i in range(n):
        yield {"id": f"c{i:09d}", "channel": "web" if i % 3 else "app", "text": texts[i % POOL]}


def render_template(n: int) -> int:
    """The subject: records rendered by the prompt template (strict undefined, sandboxed).

    :param n: records
    """
    return sum(1 for i, rec in enumerate(_records(n)) if TEMPLATE.render(rec, i) is not None)


def render_baseline(n: int) -> int:
    """The floor: the same requests built with an f-string.

    :param n: records
    """
    count = 0
    for rec in _records(n):
        CanonicalRequest(
            app_id=str(rec["id"]),
            prompt_version=TEMPLATE.version,
            model=TEMPLATE.model,
            kind=TEMPLATE.kind,
            system=TEMPLATE.system,
            messages=(
                {"role": "user", "content": f"Comment from a {rec['channel']} customer: {rec['text']}"},
            ),
            params=dict(TEMPLATE.params),
        )
        count += 1
    return count


def _fresh(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def run(size: str = "default") -> dict[str, Any]:
    """Run the chunking benchmark and return its figures (see ``common.py`` for the shape).

    :param size: ``tiny``, ``small`` or ``default``
    """
    check_size(size)
    n, n_mem, repeat = SIZES[size]
    pool = _pool()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="abp-bench-chunking-") as tmp:
        folder = Path(tmp) / "out"

        # Throughput, with the adapter's own limits (50,000 requests per chunk for OpenAI).
        t_chunker = timed(lambda: run_chunker(n, folder, pool), repeat, setup=lambda: _fresh(folder))
        chunks: list[ChunkInfo] = t_chunker.last
        written = sum(c.size for c in chunks)
        t_base = timed(lambda: run_baseline(n, folder, pool), repeat, setup=lambda: _fresh(folder))
        base_size: int = t_base.last[0]
        rows.append(
            row(
                f"write {n:,} request lines",
                "lines/s",
                per_s(n, t_chunker.best_s),
                per_s(n, t_base.best_s),
                subject="Chunker + OpenAI format_line",
                baseline_name="json.dumps + one file + sha256",
                note=f"{len(chunks)} chunk(s), {mib(written):.0f} MiB; best of {repeat}; "
                f"spread {t_chunker.spread:.2f}/{t_base.spread:.2f}",
            )
        )
        rows.append(
            row(
                f"write {n:,} request lines",
                "MiB/s",
                mib(written) / t_chunker.best_s,
                mib(base_size) / t_base.best_s,
                subject="Chunker + OpenAI format_line",
                baseline_name="json.dumps + one file + sha256",
            )
        )

        # Rendering records into requests (before the ledger and the Chunker), on a quarter of N.
        n_render = max(1, n // 4)
        t_render = timed(lambda: render_template(n_render), repeat)
        t_format = timed(lambda: render_baseline(n_render), repeat)
        rows.append(
            row(
                f"render {n_render:,} records into requests",
                "records/s",
                per_s(n_render, t_render.best_s),
                per_s(n_render, t_format.best_s),
                subject="PromptTemplate.render (sandboxed Jinja2)",
                baseline_name="f-string + CanonicalRequest(...)",
                note=f"best of {repeat}",
            )
        )

        # Memory: peak traced at N and 4N, chunk size fixed at N/4.
        per_chunk = max(1, n_mem // 4)
        peaks: dict[str, dict[int, int]] = {"chunker": {}, "naive": {}, "baseline": {}}
        for count in (n_mem, 4 * n_mem):
            _fresh(folder)
            peaks["chunker"][count], _ = traced_peak(
                functools.partial(run_chunker, count, folder, pool, max_requests=per_chunk)
            )
            _fresh(folder)
            peaks["naive"][count], _ = traced_peak(
                functools.partial(run_naive, count, folder, pool, per_chunk)
            )
        _fresh(folder)
        peaks["baseline"][n_mem], _ = traced_peak(functools.partial(run_baseline, n_mem, folder, pool))
        big = 4 * n_mem
        rows.append(
            row(
                f"peak memory, {n_mem:,} lines",
                "MiB",
                mib(peaks["chunker"][n_mem]),
                mib(peaks["baseline"][n_mem]),
                subject="Chunker",
                baseline_name="json.dumps + one file + sha256",
                note=f"chunks of {per_chunk:,}; the Chunker keeps one chunk's placements for on_close",
            )
        )
        rows.append(
            row(
                f"peak memory growth, {n_mem:,} -> {big:,} lines",
                "peak(4N)/peak(N)",
                peaks["chunker"][big] / max(1, peaks["chunker"][n_mem]),
                peaks["naive"][big] / max(1, peaks["naive"][n_mem]),
                subject="Chunker",
                baseline_name="naive: list all lines, then split",
                note=f"Chunker {mib(peaks['chunker'][n_mem]):.1f} -> {mib(peaks['chunker'][big]):.1f} MiB; "
                f"naive {mib(peaks['naive'][n_mem]):.1f} -> {mib(peaks['naive'][big]):.1f} MiB",
            )
        )
        rows.append(
            row(
                f"memory per extra line, {n_mem:,} -> {big:,} lines",
                "bytes/line",
                (peaks["chunker"][big] - peaks["chunker"][n_mem]) / (big - n_mem),
                (peaks["naive"][big] - peaks["naive"][n_mem]) / (big - n_mem),
                subject="Chunker",
                baseline_name="naive: list all lines, then split",
                note="slope of peak memory against N: 0 = flat",
            )
        )
        rows.append(
            row(
                f"peak memory, {big:,} lines",
                "MiB",
                mib(peaks["chunker"][big]),
                mib(peaks["naive"][big]),
                subject="Chunker",
                baseline_name="naive: list all lines, then split",
            )
        )
    return result(
        "chunking",
        size,
        {
            "items": n,
            "memory_items": [n_mem, 4 * n_mem],
            "memory_chunk_size": per_chunk,
            "repeat": repeat,
            "request_pool": POOL,
            "limits": {"max_requests": OpenAIBatchAdapter.limits.max_requests},
        },
        rows,
        notes=[
            "lines/s ratio = Chunker / baseline (1.0 = as fast as the floor); memory ratio = Chunker / baseline.",
            "Peak memory is tracemalloc's (Python allocations only), measured in separate, untimed runs.",
            "The Chunker's memory is bounded by one chunk (its placements are handed to on_close), not by N.",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    cli(__doc__, run, SIZES, argv)


if __name__ == "__main__":
    main()
