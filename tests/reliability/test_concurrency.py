"""Two runs of one workload at once (a manual run beside the scheduled one), on SQLite and PostgreSQL.

Each run has its own Airflow (its own metadata database: two deployments, or two DAGs sharing a
workload name); they share the ledger and the staging root. One of them must hold the workload:
the other waits or fails fast with a message naming the run that holds it, and is resumed after.
Nothing is sent or paid twice, and both reports are honest: together they count exactly what the
emulator billed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos import ChaosRun, chaos_emulator, check_invariants

pytestmark = pytest.mark.reliability


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_two_runs_of_one_workload_at_once_never_pay_twice_and_both_report_honestly(
    airflow_home: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    ledger_url = None
    if backend == "postgresql":
        server = request.getfixturevalue("postgres_server")
        ledger_url = server.url_for(server.create_database(f"chaos_{tmp_path.name[-12:].lower()}"))
    with chaos_emulator() as url:
        runs = [
            ChaosRun(airflow_home, tmp_path, name, url, day=day, ledger_url=ledger_url)
            for name, day in (("scheduled", 1), ("manual", 2))
        ]
        procs = [run.start() for run in runs]
        first = [run.finish(proc) for run, proc in zip(runs, procs, strict=True)]
        for run, attempt in zip(runs, first, strict=True):
            if attempt.returncode != 0:
                other = next(r for r in runs if r is not run)
                assert other.run_id in attempt.output, (
                    f"{run.run_id} failed without naming the run that holds the workload:\n{attempt.tail()}"
                )
        for run, attempt in zip(runs, first, strict=True):
            if attempt.returncode != 0:
                run.resume_until_done()
        verdict = check_invariants(url, runs)
        for run in runs:
            run.ledger().engine.dispose()
    assert not verdict.violations, verdict.explain()
