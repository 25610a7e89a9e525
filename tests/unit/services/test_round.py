"""Staging a round: chunks and jobs recorded once; smaller chunks after a token-limit failure."""

from __future__ import annotations

from pathlib import Path

from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.services import round as rounds
from tests.unit.services.workload import RUN, WORKLOAD, world


def _going_out(error_code: str | None) -> OpenItem:
    return OpenItem("k", "v1", "a", "failed_retryable", 1, None, None, error_code, "{}")


def test_a_round_records_one_job_per_chunk_and_a_rerun_returns_the_same_jobs(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        first = w.stage(10, max_requests=4)
        assert [m["lines"] for m in first] == [4, 4, 2]
        assert w.ledger.count_states(WORKLOAD, RUN) == {"staged": 10}
        # cleared and rerun: nothing pending is left, the round's jobs are returned as they are
        assert w.stage(10, max_requests=4) == first
        assert len(w.ledger.get_jobs(WORKLOAD, RUN)) == 3


def test_job_ids_stay_within_the_ledger_column_for_a_very_long_run_id(tmp_path: Path) -> None:
    run_id = "backfill__" + "x" * 240
    with world(tmp_path) as w:
        (job,) = w.stage(3, run_id=run_id)
        assert len(job["job_id"]) <= 250
        assert w.ledger.get_job(job["job_id"]).run_id == run_id


def test_after_a_token_limit_failure_the_next_round_halves_its_chunks(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.stage(10, max_requests=8)
        rows = [_going_out(rounds.TOKEN_LIMIT), _going_out(None)]
        assert rounds.retry_chunk_limit(w.ledger, WORKLOAD, RUN, 2, rows, None) == 4
        assert rounds.retry_chunk_limit(w.ledger, WORKLOAD, RUN, 2, rows, 3) == 3
        assert rounds.retry_chunk_limit(w.ledger, WORKLOAD, RUN, 2, [_going_out("missing")], None) is None
