"""The emulator's own memory as a batch grows: peak RSS of its process at N lines of about 1 KB.

Each size runs in a fresh ``python -m batch_emulator`` process (time scale 0: a batch ends as soon
as it is created; ``--data-dir`` in a temporary folder): upload an OpenAI batch input file of N
chat-completion lines, create the batch, wait until it is ``completed``, download the whole output
file streamed and count its lines (every one must be there), then read the process's peak RSS
(``VmHWM`` in ``/proc/<pid>/status``). The baseline of each figure is the same emulator's peak RSS
when idle (started and asked for its health, nothing else), measured in the same run; the ratio is
then how many times the idle footprint a batch of N lines costs. The last row compares the
largest N with the smallest: 1.0 is flat in N.

Run alone: ``python benchmarks/bench_emulator.py --lines 10000 50000 200000``. Linux only (it reads
``/proc``); elsewhere every case is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import check_size, result, row

LINES: Final[dict[str, tuple[int, ...]]] = {
    "tiny": (200, 1_000),
    "small": (2_000, 10_000),
    "default": (10_000, 50_000, 200_000),
}
LINE_BYTES: Final = 1024


def request_line(index: int) -> bytes:
    """One batch input line of about :data:`LINE_BYTES` bytes (a chat completion of a review).

    :param index: its number, which makes its custom id
    """
    base = {
        "custom_id": f"item-{index:09d}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "max_tokens": 16,
            "messages": [
                {"role": "system", "content": "Classify the sentiment of the review."},
                {"role": "user", "content": ""},
            ],
        },
    }
    empty = len(json.dumps(base, separators=(",", ":"))) + 1
    words = ("great delivery but the app crashes on login; refund please. " * 40)[: LINE_BYTES - empty]
    base["body"]["messages"][1]["content"] = words  # type: ignore[index]
    return json.dumps(base, separators=(",", ":")).encode() + b"\n"


def write_multipart(path: Path, lines: int) -> tuple[str, int]:
    """Write a ``multipart/form-data`` upload body of ``lines`` request lines to ``path``.

    :param path: where
    :param lines: how many request lines
    :return: the content type (with its boundary) and the body's size
    """
    boundary = uuid.uuid4().hex
    with path.open("wb") as out:
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'.encode())
        out.write(
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n".encode()
        )
        for i in range(lines):
            out.write(request_line(i))
        out.write(f"\r\n--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", path.stat().st_size


def peak_rss_mib(pid: int) -> float:
    """The peak resident set (``VmHWM``) of a process, in MiB.

    :param pid: the process
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def _call(url: str, method: str = "GET", body: Any = None, timeout: float = 600) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


@contextmanager
def emulator(data_dir: Path, max_lines: int, max_bytes: int) -> Iterator[tuple[str, int]]:
    """Start ``python -m batch_emulator`` and yield (its base URL, its pid); stop it after.

    :param data_dir: its data directory
    :param max_lines: its batch line limit
    :param max_bytes: its batch file size limit
    """
    log = data_dir.parent / f"{data_dir.name}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batch_emulator",
                "--port",
                "0",
                "--time-scale",
                "0",
                "--data-dir",
                str(data_dir),
                "--max-batch-requests",
                str(max_lines),
                "--max-batch-bytes",
                str(max_bytes),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )
        try:
            deadline = time.monotonic() + 60
            url = ""
            while not url:
                text = log.read_text()
                if "listening on " in text:
                    url = text.split("listening on ", 1)[1].split()[0]
                elif proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the emulator did not start: {text}")
                else:
                    time.sleep(0.05)
            yield url, proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def one_batch(base: str, lines: int, work: Path) -> dict[str, Any]:
    """Upload, create, wait for and download one batch of ``lines`` lines; return what was seen.

    :param base: the emulator's URL
    :param lines: request lines
    :param work: a folder for the upload body
    """
    body_path = work / "upload.bin"
    content_type, size = write_multipart(body_path, lines)
    with body_path.open("rb") as fh:
        request = urllib.request.Request(f"{base}/v1/files", data=fh, method="POST")
        request.add_header("content-type", content_type)
        request.add_header("content-length", str(size))
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=900) as reply:
            file_id = json.loads(reply.read())["id"]
    upload_s = time.perf_counter() - start
    body_path.unlink()
    start = time.perf_counter()
    batch = _call(
        f"{base}/v1/batches",
        "POST",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        timeout=900,
    )
    while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.2)
        batch = _call(f"{base}/v1/batches/{batch['id']}", timeout=900)
    process_s = time.perf_counter() - start
    if batch["status"] != "completed":
        raise RuntimeError(f"the batch ended {batch['status']}: {batch.get('errors')}")
    start = time.perf_counter()
    count = 0
    out_bytes = 0
    with urllib.request.urlopen(f"{base}/v1/files/{batch['output_file_id']}/content", timeout=900) as reply:
        for raw in reply:
            count += 1
            out_bytes += len(raw)
    download_s = time.perf_counter() - start
    if count != lines:
        raise RuntimeError(f"the output file has {count} lines for {lines} requests")
    return {
        "input_mib": size / 2**20,
        "output_mib": out_bytes / 2**20,
        "upload_s": upload_s,
        "process_s": process_s,
        "download_s": download_s,
    }


def measure(sizes: Sequence[int]) -> tuple[float, list[dict[str, Any]]]:
    """Return the idle peak RSS and, per size, the peak RSS and timings of one batch.

    :param sizes: line counts
    """
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-emulator-") as tmp:
        root = Path(tmp)
        limit_lines = max(sizes)
        limit_bytes = max(sizes) * LINE_BYTES * 2
        idle_dir = root / "idle"
        with emulator(idle_dir, limit_lines, limit_bytes) as (base, pid):
            _call(f"{base}/_emulator/health")
            idle = peak_rss_mib(pid)
        for n in sizes:
            data_dir = root / f"data-{n}"
            with emulator(data_dir, limit_lines, limit_bytes) as (base, pid):
                seen = one_batch(base, n, root)
                seen["lines"] = n
                seen["peak_rss_mib"] = peak_rss_mib(pid)
                seen["data_dir_mib"] = (
                    sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file()) / 2**20
                )
            figures.append(seen)
    return idle, figures


def run(size: str) -> dict[str, Any]:
    """Measure the emulator's peak RSS at the size's line counts (see the module's docstring).

    :param size: ``tiny``, ``small`` or ``default``
    """
    check_size(size)
    sizes = LINES[size]
    if not Path("/proc/self/status").exists():
        return result(
            "emulator",
            size,
            {"lines": list(sizes)},
            [],
            skipped=[{"case": "all", "reason": "skipped: no /proc here to read a process's peak RSS"}],
        )
    idle, figures = measure(sizes)
    rows = [
        row(
            f"{f['lines']:,} lines of 1 KB ({f['input_mib']:.1f} MiB in)",
            "peak RSS MiB",
            f["peak_rss_mib"],
            idle,
            subject="emulator process, one batch: upload, create, complete, download",
            baseline_name="the same emulator idle",
            note=(
                f"upload {f['upload_s']:.1f} s, create to completed {f['process_s']:.1f} s, "
                f"download {f['download_s']:.1f} s; data dir {f['data_dir_mib']:.0f} MiB"
            ),
        )
        for f in figures
    ]
    rows.append(
        row(
            f"{figures[-1]['lines']:,} against {figures[0]['lines']:,} lines",
            "peak RSS MiB",
            figures[-1]["peak_rss_mib"],
            figures[0]["peak_rss_mib"],
            subject=f"{figures[-1]['lines']:,} lines",
            baseline_name=f"{figures[0]['lines']:,} lines",
            note="1.0 is flat in N",
        )
    )
    return result(
        "emulator",
        size,
        {"lines": list(sizes), "line_bytes": LINE_BYTES, "idle_peak_rss_mib": idle},
        rows,
        notes=["Peak RSS is the kernel's VmHWM of the emulator process, one fresh process per size."],
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run at the given line counts and print the figures as JSON.

    :param argv: ``--lines N ...``
    """
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, nargs="+", default=list(LINES["default"]))
    args = parser.parse_args(argv)
    idle, figures = measure(args.lines)
    print(json.dumps({"idle_peak_rss_mib": idle, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
