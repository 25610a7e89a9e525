"""The benchmarks' CPU accounting: this process's CPU, and a local PostgreSQL server's read from ``/proc``.

No speed is asserted: only that work done on one side is counted on that side.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import create_engine, text

from tests.support.scripts import load_script

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
#: Modules a benchmark's process imports after the tree is first on its path (``e2e.py``'s stages).
RUN_BY_A_RUNNER = frozenset({"stages_abp.py"})


def load_common() -> ModuleType:
    return load_script(BENCH / "common.py", "bench_common_under_test")


@pytest.mark.postgres
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the server's CPU is read from /proc")
def test_work_done_by_the_server_is_counted_as_the_servers_cpu_not_this_processs(postgres_url: str) -> None:
    common = load_common()
    engine = create_engine(postgres_url)
    try:
        server = common.postgres_server_cpu(engine)
        assert server is not None

        def sum_on_the_server() -> None:
            with engine.connect() as conn:
                # a few hundred milliseconds of the server's CPU, almost none of this process's
                for _ in range(5):
                    conn.execute(text("SELECT sum(i) FROM generate_series(1, 2000000) AS i")).scalar_one()

        split = common.cpu_split(sum_on_the_server, 5, server)
    finally:
        engine.dispose()
    assert split.server_us is not None
    assert split.server_us > 0
    assert split.server_us > 5 * split.client_us, split


@pytest.mark.postgres
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the server's CPU is read from /proc")
def test_the_work_of_a_connection_closed_as_the_work_ends_is_counted_too(postgres_url: str) -> None:
    """A sink's connection closes at the end of a delivery: its backend exits as the CPU is read."""
    from sqlalchemy.pool import NullPool

    common = load_common()
    engine = create_engine(postgres_url, poolclass=NullPool)  # each connection its own backend, gone on close
    try:
        server = common.postgres_server_cpu(engine)
        assert server is not None

        def sum_then_close() -> None:
            with engine.connect() as conn:
                conn.execute(text("SELECT sum(i) FROM generate_series(1, 3000000) AS i")).scalar_one()

        splits = [common.cpu_split(sum_then_close, 1, server) for _ in range(6)]
    finally:
        engine.dispose()
    for split in splits:
        assert split.server_us is not None
        assert split.server_us > 5 * split.client_us, splits


def test_work_done_here_is_counted_as_this_processs_cpu_and_no_server_reads_as_none() -> None:
    common = load_common()
    split = common.cpu_split(lambda: sum(i * i for i in range(2_000_000)), 2, None)
    assert split.server_us is None
    assert split.client_us > 0
    assert split.wall_us > 0


def test_pieces_of_work_timed_in_turns_each_run_once_a_turn_after_the_setup_and_keep_their_best() -> None:
    common = load_common()
    calls: list[str] = []
    clock = {"now": 0.0}

    def work(name: str, seconds: list[float]) -> object:
        def run() -> str:
            calls.append(name)
            clock["now"] += seconds.pop(0)
            return f"{name} {len(calls)}"

        return run

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(common.time, "perf_counter", lambda: clock["now"])
        timings = common.timed_in_turns(
            {"delivery": work("delivery", [3.0, 1.0, 2.0]), "baseline": work("baseline", [5.0, 6.0, 4.0])},
            repeat=3,
            setup=lambda: calls.append("setup"),
        )
        # one run of each a turn, the setup before every run: never all runs of one, then the other's
        assert calls == ["setup", "delivery", "setup", "baseline"] * 3
        one = common.timed(work("alone", [2.0, 1.5]), repeat=2)  # one piece of work alone: ``timed``

    assert timings["delivery"].best_s == 1.0 and timings["delivery"].all_s == (3.0, 1.0, 2.0)
    assert timings["baseline"].best_s == 4.0 and timings["baseline"].all_s == (5.0, 6.0, 4.0)
    assert timings["delivery"].last == "delivery 10" and timings["baseline"].last == "baseline 12"
    assert one.best_s == 1.5 and one.all_s == (2.0, 1.5)


def test_a_benchmark_measures_the_package_of_its_own_tree_even_where_another_copy_comes_first(
    tmp_path: Path,
) -> None:
    # another clone's package first on the path (its editable install, a wheel): importing the
    # benchmarks' common module puts this tree ahead of it
    shadow = tmp_path / "shadow" / "airflow_batch_provider"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    probe = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import common, airflow_batch_provider; "
        "print(airflow_batch_provider.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(shadow.parent)}
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(found).resolve() == BENCH.parent / "airflow_batch_provider" / "__init__.py"


def test_every_benchmark_script_imports_the_common_module_before_the_package() -> None:
    late = []
    for script in sorted(BENCH.glob("*.py")):
        tree = ast.parse(script.read_text())
        first: dict[str, int] = {}
        for node in ast.walk(tree):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                # another benchmark script imports common first itself (this test checks it too)
                wanted = "common" if name == "common" or name.startswith("bench_") else name.split(".")[0]
                first[wanted] = min(first.get(wanted, node.lineno), node.lineno)
        if "airflow_batch_provider" in first and script.name != "common.py":
            imported_by_a_runner = script.name in RUN_BY_A_RUNNER
            if not imported_by_a_runner and first.get("common", 10**9) > first["airflow_batch_provider"]:
                late.append(script.name)
    assert not late, f"import common (which puts this tree first on sys.path) before the package in {late}"
