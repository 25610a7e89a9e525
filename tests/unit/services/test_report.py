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


def test_items_sent_real_time_after_exhausting_their_batch_attempts_are_their_own_route(
    tmp_path: Path,
) -> None:
    from airflow_batch_provider.core.results import ItemResult, Usage
    from airflow_batch_provider.services.harvest import reconcile_job
    from tests.unit.services.test_harvest import price, submitted
    from tests.unit.services.workload import PROMPT

    with world(tmp_path) as w:
        w.config(faults={"rate_500": 1.0})
        (job_id,) = submitted(w, 3)  # one batch attempt each, and every line a retryable 500
        w.wait_terminal(job_id)
        reconcile_job(w.ledger, w.adapter, w.staging, job_id, PROMPT, price)
        w.add_items(5)  # two more items, never sent in a batch (the deadline fallback's kind)
        for row in list(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])):
            cid = w.ledger.begin_sync_attempt(
                WORKLOAD, RUN, row["item_key"], row["prompt_version"], ["pending", "failed_retryable"]
            )
            assert cid is not None
            w.ledger.record_sync_result(
                WORKLOAD, RUN, ItemResult(cid, "succeeded", output="ok", usage=Usage(5, 1)), 7
            )
        out = report.build_report(w.ledger, WORKLOAD, RUN, "openai", None, max_attempts=1)
        assert out["items_by_route"]["exhausted_sync"] == 3
        assert out["items_by_route"]["fallback"] == 2
        assert sum(out["items_by_route"].values()) == 5
        assert out["exhausted_sync"]["items"] == 3
        assert "included in the fallback route" not in out["table"]
        # without the attempts cap nothing is known to be exhausted: all five are the fallback's
        plain = report.build_report(w.ledger, WORKLOAD, RUN, "openai", None)
        assert plain["items_by_route"]["fallback"] == 5 and plain["items_by_route"]["exhausted_sync"] == 0


def test_items_sent_again_for_a_prompt_edited_in_place_are_counted_apart_with_both_digests(
    tmp_path: Path,
) -> None:
    from airflow_batch_provider.ledger import Ledger
    from tests.unit.ledger.test_prompt_changes import NEW, OLD, WL, answer_all, prep, start

    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    first = [prep("a"), prep("b")]
    start(ledger, "r1", OLD)
    ledger.upsert_items(WL, "r1", first)
    answer_all(ledger, "r1", first)
    assert report.build_report(ledger, WL, "r1", "openai", None)["prompt_changed"] == {"items": 0}
    start(ledger, "r2", NEW)
    ledger.upsert_items(WL, "r2", [prep("a", system="in one word"), prep("b", system="in one word")])
    out = report.build_report(ledger, WL, "r2", "openai", None)
    assert out["prompt_changed"] == {
        "items": 2,
        "edits": [{"prompt_version": "v1", "previous_sha256": OLD, "sha256": NEW, "items": 2}],
    }
    assert "prompt_changed (sent and paid again" in out["table"] and "2 items" in out["table"]
    assert f"sha256 {OLD[:12]} -> {NEW[:12]}" in out["table"] and "bump `version`" in out["table"]
    ledger.engine.dispose()


def test_the_report_records_the_workloads_open_review_queue_as_the_run_leaves_it(tmp_path: Path) -> None:
    from airflow_batch_provider.core.custom_ids import item_key

    with world(tmp_path) as w:
        w.add_items(4)
        assert w.ledger.transition(WORKLOAD, RUN, "review", ["pending"], error_code="400") == 4
        w.ledger.resolve_review(WORKLOAD, item_keys=[item_key("i0")], actor="ops", note="answered by hand")
        out = report.build_report(w.ledger, WORKLOAD, RUN, "openai", None)
        # the queue the review page shows: in review with no person's decision yet
        assert out["review_queue"] == 3
        assert out["states"] == {"review": 4}
