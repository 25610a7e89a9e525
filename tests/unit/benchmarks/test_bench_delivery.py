"""The delivery benchmark's stage clock: each stage of a real delivery timed on its own thread, nothing left patched.

No speed is asserted: only that the wrapped stages are the delivery's own and that their times
add up the way the benchmark's rows say (a stage of one thread within the whole delivery).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from airflow_batch_provider.ledger import Ledger
from tests.support.scripts import load_script

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
RESULTS = 3_500  # four batches of 1,000: the sink's and the record's threads work while the delivery's reads


@pytest.fixture
def bench() -> ModuleType:
    return load_script(BENCH / "bench_delivery.py", "bench_delivery_under_test")


@pytest.mark.postgres
def test_each_stage_of_a_real_delivery_is_timed_within_the_whole_and_nothing_stays_wrapped(
    bench: ModuleType, postgres_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = postgres_server.create_database()
    url = postgres_server.url_for(name)
    target = create_engine(url)
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    originals = {stage.attr: getattr(stage.owner, stage.attr) for stage in bench.STAGES.values()}
    try:
        monkeypatch.setenv(f"AIRFLOW_CONN_{bench.CONN_ID.upper()}", bench.airflow_postgres_conn(url))
        with target.begin() as conn:
            conn.execute(text(bench.TABLE))
        bench.seed(ledger, RESULTS, 10)

        whole, spent = bench.stage_walls(ledger, target, RESULTS)

        assert set(spent) == set(bench.STAGES)
        assert all(seconds > 0 for seconds in spent.values()), spent
        assert spent[bench.READING] + spent[bench.MAPPING] < whole
        assert spent[bench.WRITE] < whole and spent[bench.RECORD] < whole
        with target.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar_one() == RESULTS

        rows = bench.stage_rows(ledger, target, RESULTS)  # again, from an empty table and ledger
        # each timed stage, and the waiting
        assert [row["case"].split(": ", 1)[1] for row in rows] == [
            f"{n} ({t})" for n, t in bench.SHOWN.items()
        ]
        assert set(bench.SHOWN) == {*bench.STAGES, bench.WAITING}
        assert all(row["value"] >= 0 and row["ratio"] is not None for row in rows), rows
    finally:
        assert {stage.attr: getattr(stage.owner, stage.attr) for stage in bench.STAGES.values()} == originals
        ledger.engine.dispose()
        target.dispose()
        postgres_server.drop_database(name)
