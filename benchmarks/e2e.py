"""The machinery of the end-to-end benchmarks: records, the emulator as a process, a process per stage.

Each stage of a pipeline (the package's tasks, the seeds' blueprint, the peer operator) runs in a
process of its own, started by :func:`run_stage` as ``python benchmarks/e2e.py STAGE SPEC OUT``:
the child imports what the stage needs, notes its resident size after the imports, runs the
stage and writes ``{"seconds", "peak_rss_mib", "import_rss_mib", "out"}`` to ``OUT``, where
``peak_rss_mib`` is the process's own ``ru_maxrss`` (the most it ever held, imports included),
which is what a worker slot would have to hold for that task. ``seconds`` is the stage's own work,
without the interpreter's start and the imports.

The emulator runs as a separate process too (:class:`EmulatorProcess`); its peak resident size is
read from ``/proc/<pid>/status`` (``VmHWM``) when it stops.

The stage functions themselves live in ``stages_abp.py`` (the package's operators, called as the
DAG's tasks call them) and ``blueprint.py`` (the naive floor); each is looked up by name in
:data:`STAGE_MODULES`.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = HERE.parent
#: stage name prefix -> module (in ``benchmarks/``) that defines ``STAGES: dict[str, callable]``
STAGE_MODULES: Final[dict[str, str]] = {"abp": "stages_abp", "naive": "blueprint", "peer": "peer_llm_batch"}
#: the size of one record's text, in bytes (the issue's "1 KB records")
RECORD_TEXT_BYTES: Final = 1000
_WORDS: Final = (
    "the delivery was late but the support team answered quickly and kindly; "
    "product quality is fine, packaging could be better, would order again maybe. "
)


def record_text(index: int, size: int = RECORD_TEXT_BYTES) -> str:
    """The text of record ``index``: ``size`` ASCII characters, different for every index.

    :param index: the record's number
    :param size: how many characters
    """
    head = f"comment {index}: "
    body = (_WORDS * (size // len(_WORDS) + 2))[index % len(_WORDS) :]
    return (head + body)[:size]


def record_id(index: int) -> str:
    """The id of record ``index`` (stable, sortable).

    :param index: the record's number
    """
    return f"c{index:08d}"


def write_records(path: Path, count: int) -> int:
    """Write ``count`` JSONL records ``{"id", "text"}`` of about 1 KB each; return the bytes written.

    :param path: the file to write
    :param count: how many records
    """
    size = 0
    with path.open("w", encoding="utf-8") as fh:
        for i in range(count):
            line = json.dumps({"id": record_id(i), "text": record_text(i)}) + "\n"
            fh.write(line)
            size += len(line)
    return size


def free_port() -> int:
    """A free TCP port on the loopback address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_status_kib(pid: int, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmHWM``: peak resident, ``VmRSS``: now).

    :param pid: the process
    :param field: the field's name
    :return: the value in KiB, or ``None`` where it cannot be read (not Linux, process gone)
    """
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return parse_status_kib(text, field)


def parse_status_kib(text: str, field: str) -> int | None:
    """Read ``field`` (in kB) from the text of a ``/proc/<pid>/status`` file.

    :param text: the file's text
    :param field: the field's name, e.g. ``VmHWM``
    """
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0])
    return None


@dataclass
class EmulatorProcess:
    """The emulator (``python -m batch_emulator``) as a separate process.

    :param workdir: where its data directory and log go
    :param faults: ``KEY=VALUE`` fault settings (``rate_500=0.02``)
    :param time_scale: the emulator's time scale (phases of a batch last ``14 s x time_scale``)
    :param python: the interpreter that runs it
    """

    workdir: Path
    faults: Sequence[str] = ()
    time_scale: float = 0.05
    python: str = sys.executable
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    peak_rss_kib: int | None = None

    @property
    def url(self) -> str:
        """The base URL (the OpenAI SDK's ``base_url`` is this plus ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> EmulatorProcess:
        """Start it and wait until ``/_emulator/health`` answers.

        :param timeout_s: give up after this long
        :raises RuntimeError: it did not come up (its log is in the message)
        """
        import httpx

        self.port = free_port()
        data = self.workdir / "emulator-data"
        data.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.python,
            "-m",
            "batch_emulator",
            "--port",
            str(self.port),
            "--time-scale",
            str(self.time_scale),
            "--data-dir",
            str(data),
        ]
        for fault in self.faults:
            cmd += ["--fault", fault]
        log = (self.workdir / "emulator.log").open("wb")
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env({}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/_emulator/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"the emulator did not start: {(self.workdir / 'emulator.log').read_text()[-2000:]}"
        )

    def stats(self) -> dict[str, Any]:
        """``GET /_emulator/stats`` (its counters)."""
        import httpx

        return dict(httpx.get(f"{self.url}/_emulator/stats", timeout=30.0).json())

    def rss_kib(self) -> tuple[int | None, int | None]:
        """(peak resident, resident now) of the emulator process, in KiB."""
        if self.process is None:
            return None, None
        return proc_status_kib(self.process.pid, "VmHWM"), proc_status_kib(self.process.pid, "VmRSS")

    def stop(self) -> None:
        """Read its peak resident size, then stop it (SIGTERM, then SIGKILL)."""
        if self.process is None:
            return
        self.peak_rss_kib = proc_status_kib(self.process.pid, "VmHWM") or self.peak_rss_kib
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a stage process: this one's, the repository on the path, plus ``extra``.

    :param extra: variables to add (the ledger URL, the staging root, connections)
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@dataclass(frozen=True)
class StageRun:
    """What one stage process reported.

    :param stage: the stage's name
    :param seconds: the stage's own work (no interpreter start, no imports)
    :param peak_rss_mib: the process's peak resident size (``ru_maxrss``), imports included
    :param import_rss_mib: its resident size after the imports, before the work
    :param wall_s: the process's whole life, start and imports included
    :param out: what the stage returned (JSON)
    """

    stage: str
    seconds: float
    peak_rss_mib: float
    import_rss_mib: float
    wall_s: float
    out: Any


def run_stage(
    stage: str,
    spec: Mapping[str, Any],
    workdir: Path,
    env: Mapping[str, str],
    python: str = sys.executable,
    script: Path | None = None,
    timeout_s: float = 3600.0,
) -> StageRun:
    """Run one stage in a fresh process and return what it reported.

    :param stage: ``<prefix>.<name>``, e.g. ``abp.prepare`` (see :data:`STAGE_MODULES`)
    :param spec: the stage's input (JSON)
    :param workdir: where the spec and the report are written
    :param env: extra environment variables
    :param python: the interpreter (the peer runs in its own virtualenv)
    :param script: the child's entry point (default this file)
    :param timeout_s: kill it after this long
    :raises RuntimeError: the stage failed (its stderr tail is in the message)
    """
    tag = f"{stage.replace('.', '_')}-{time.monotonic_ns()}"
    spec_path = workdir / f"{tag}.spec.json"
    out_path = workdir / f"{tag}.out.json"
    spec_path.write_text(json.dumps(spec))
    start = time.perf_counter()
    proc = subprocess.run(
        [python, str(script or Path(__file__)), stage, str(spec_path), str(out_path)],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"stage {stage} failed (exit {proc.returncode}): {proc.stderr[-4000:]}")
    got = json.loads(out_path.read_text())
    return StageRun(
        stage, got["seconds"], got["peak_rss_mib"], got["import_rss_mib"], round(wall, 3), got["out"]
    )


def peak_rss_mib() -> float:
    """This process's peak resident size so far (``ru_maxrss``; KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(argv: Sequence[str]) -> int:
    """The stage process: ``e2e.py STAGE SPEC OUT``.

    :param argv: the arguments after the script's name
    """
    stage, spec_path, out_path = argv
    prefix, _, name = stage.partition(".")
    sys.path[:0] = [str(HERE.parent), str(HERE)]  # this tree's package measured, not another copy
    module = importlib.import_module(STAGE_MODULES[prefix])
    module.prepare_imports()
    spec = json.loads(Path(spec_path).read_text())
    import_rss = peak_rss_mib()
    start = time.perf_counter()
    out = module.STAGES[name](spec)
    seconds = time.perf_counter() - start
    report = {
        "seconds": round(seconds, 4),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "import_rss_mib": round(import_rss, 1),
        "out": out,
    }
    Path(out_path).write_text(json.dumps(report, default=str))
    return 0


def dir_bytes(path: Path) -> int:
    """Total size of the files under ``path``.

    :param path: a folder
    """
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
