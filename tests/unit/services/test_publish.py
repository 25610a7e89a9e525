"""Publish's work without Airflow: every item settled, then the results, the report and the finished run."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_batch_provider.ledger.runs import finished_run
from airflow_batch_provider.services import publish
from tests.unit.services.workload import RUN, WORKLOAD, world


def test_a_published_run_has_one_result_line_per_item_a_report_and_is_finished(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.stage(3)
        assert publish.settle_run(w.ledger, WORKLOAD, RUN, 3, "skipped") == (0, 3)
        done = publish.publish_run(w.ledger, w.staging, WORKLOAD, RUN, "openai", None, 3)
        lines = [json.loads(x) for x in w.staging.at(done.results).read_text().splitlines()]
        assert [line["state"] for line in lines] == ["skipped"] * 3
        assert {line["error_message"] for line in lines} == {"not finished when the run closed"}
        assert sorted(lines[0]) == ["error_code", "error_message", "id", "output", "route", "state"]
        assert (
            json.loads(w.staging.at(done.report).read_text())["items_by_state"]
            == done.summary["items_by_state"]
        )
        assert done.items == 3 and finished_run(w.ledger, WORKLOAD, RUN) is not None
        out = publish.publish_outcome(done.summary, done.report)
        assert out["report"] == done.report and out["items_by_state"] == {"skipped": 3}


def test_settling_closes_a_real_time_send_a_crash_interrupted(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        w.add_items(2)
        row = next(iter(w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])))
        assert w.ledger.begin_sync_attempt(WORKLOAD, RUN, row["item_key"], row["prompt_version"], ["pending"])
        assert w.ledger.count_states(WORKLOAD, RUN) == {"fallback": 1, "pending": 1}
        publish.settle_run(w.ledger, WORKLOAD, RUN, 1, "review")
        assert w.ledger.count_states(WORKLOAD, RUN) == {"review": 1, "pending": 1}
