"""The billed lines beyond an item's answer: written per job, rewritten by a rerun, read per run."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger.extra_lines import (
    ExtraLine,
    iter_extra_lines,
    record_extra_lines,
    request_json_of,
)
from tests.unit.services.test_harvest import submitted
from tests.unit.services.workload import RUN, WORKLOAD, world


def test_a_jobs_extra_lines_are_replaced_not_added_by_a_rerun_and_read_with_the_jobs_model(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        (job_id,) = submitted(w, 3)
        lines = [
            ExtraLine(4, "i1", "duplicate", Usage(5, 2), Decimal("0.007")),
            ExtraLine(6, None, "unreadable", Usage(9, 8), Decimal("0.017"), estimated=True),
        ]
        record_extra_lines(w.ledger, job_id, lines)
        record_extra_lines(w.ledger, job_id, lines)  # a second reconcile of the same files
        rows = list(iter_extra_lines(w.ledger, WORKLOAD, RUN))
        assert [(r["ordinal"], r["custom_id"], r["kind"], r["estimated"]) for r in rows] == [
            (4, "i1", "duplicate", False),
            (6, None, "unreadable", True),
        ]
        assert [(r["usage"], r["cost"], r["model"]) for r in rows] == [
            (Usage(5, 2), Decimal("0.007"), "gpt-4o-mini"),
            (Usage(9, 8), Decimal("0.017"), "gpt-4o-mini"),
        ]
        record_extra_lines(w.ledger, job_id, [])
        assert list(iter_extra_lines(w.ledger, WORKLOAD, RUN)) == []


def test_the_recorded_request_of_a_jobs_line_is_found_by_its_custom_id(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        (job_id,) = submitted(w, 3)
        every = request_json_of(w.ledger, job_id, None)
        assert len(every) == 3
        cid = sorted(every)[0]
        assert request_json_of(w.ledger, job_id, [cid]) == {cid: every[cid]}
        assert json.loads(every[cid])["model"] == "gpt-4o-mini"
