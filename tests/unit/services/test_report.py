"""The run's report lists failed batches, jobs in doubt and incomplete harvests beside the cost."""

from __future__ import annotations

from pathlib import Path

from airflow_batch_provider.services import report
from tests.unit.services.workload import RUN, WORKLOAD, world


def test_the_report_names_the_failed_batch_and_the_job_whose_files_never_came(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        jobs = w.stage(6, max_requests=2)
        ids = [j["job_id"] for j in jobs]
        w.ledger.mark_submitted(ids[0], "batch_a", "file")
        w.ledger.update_job(
            ids[0], state="reconciled", batch_state="failed", error="invalid_file: bad line 3"
        )
        w.ledger.mark_submitted(ids[1], "batch_b", "file")
        w.ledger.update_job(ids[1], batch_state="cancelling")
        out = report.build_report(w.ledger, WORKLOAD, RUN, "openai", None)
        assert [j["job_id"] for j in out["failed_batches"]] == [ids[0]]
        assert out["failed_batches"][0]["error"] == "invalid_file: bad line 3"
        assert [j["job_id"] for j in out["incomplete_jobs"]] == [ids[1]]
        assert out["in_doubt_jobs"] == []
        assert "failed batches: 1" in out["table"] and "batch_a: invalid_file: bad line 3" in out["table"]
        assert "never came complete: 1" in out["table"]


def test_a_clean_run_has_no_job_sections_in_its_table(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.stage(2)
        out = report.build_report(w.ledger, WORKLOAD, RUN, "openai", None)
        assert out["failed_batches"] == out["in_doubt_jobs"] == out["incomplete_jobs"] == []
        assert "failed batches" not in out["table"]
