"""A download that is not a valid result file is fetched again, and never read as "every item missing"."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.services.harvest import download_job, reconcile_job
from airflow_batch_provider.services.report import build_report
from airflow_batch_provider.services.result_files import FETCH_TRIES, INVALID_FILE
from tests.unit.services.test_harvest import submitted
from tests.unit.services.workload import RUN, WORKLOAD, world


def price(usage: Usage) -> Decimal:
    return Decimal(usage.input_tokens + usage.output_tokens) / 1000


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_html_page_served_in_place_of_the_output_file_is_fetched_again_and_every_answer_is_kept(
    tmp_path: Path, provider: str
) -> None:
    with world(tmp_path, provider) as w:
        (job_id,) = submitted(w, 6)
        w.wait_terminal(job_id)
        w.config(faults={"html_downloads": FETCH_TRIES - 1})
        summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, price)
        assert summary["complete"] is True and summary["missing"] == 0
        assert w.ledger.count_states(WORKLOAD, RUN) == {"succeeded": 6}
        assert w.ledger.get_job(job_id).error is None
        remaining = httpx.get(f"{w.url}/_emulator/config").json()["faults"]["html_downloads"]
        assert remaining == 0  # every page was served, and each was fetched past


def test_a_file_that_stays_an_html_page_leaves_the_download_incomplete_and_the_items_open_not_missing(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        (job_id,) = submitted(w, 5)
        w.wait_terminal(job_id)
        w.config(faults={"html_downloads": FETCH_TRIES})
        summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, price)
        assert summary == {"job_id": job_id, "complete": False}
        assert w.ledger.count_states(WORKLOAD, RUN) == {"submitted": 5}  # open, not missing
        job = w.ledger.get_job(job_id)
        assert job.state == "submitted" and str(job.error).startswith(INVALID_FILE)
        report = build_report(w.ledger, WORKLOAD, RUN, "openai", None)
        assert [j["job_id"] for j in report["incomplete_jobs"]] == [job_id]
        assert INVALID_FILE in report["table"]

        # the provider serves the file again: the next reconcile harvests every answer
        got = download_job(w.ledger, w.adapter, w.staging, job_id)
        assert (got.complete, got.fetched) == (True, True)
        assert reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, price)["missing"] == 0
        assert w.ledger.count_states(WORKLOAD, RUN) == {"succeeded": 5}
        assert w.ledger.get_job(job_id).error is None


def test_a_staged_output_file_replaced_by_an_html_page_after_its_download_is_fetched_again_at_reconcile(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        (job_id,) = submitted(w, 4)
        w.wait_terminal(job_id)
        got = download_job(w.ledger, w.adapter, w.staging, job_id)
        assert (got.complete, got.fetched) == (True, True)
        staged = w.staging.at(str(got.paths["output_path"]))
        good = staged.read_bytes()
        staged.write_bytes(b"<html><body><h1>502 Bad Gateway</h1></body></html>\n")

        summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, price)
        assert summary["complete"] is True
        assert (summary["missing"], summary["malformed"], summary["unreadable"]) == (0, 0, 0)
        assert w.ledger.count_states(WORKLOAD, RUN) == {"succeeded": 4}
        assert staged.read_bytes() == good  # fetched again, not read as a page of missing items


def test_a_staged_file_of_a_reconciled_job_is_only_checked_to_exist_not_fetched_again(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        (job_id,) = submitted(w, 2)
        w.wait_terminal(job_id)
        reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, price)
        staged = w.staging.at(str(w.ledger.get_job(job_id).output_path))
        staged.write_bytes(b"<html></html>\n")
        got = download_job(w.ledger, w.adapter, w.staging, job_id)
        assert (got.complete, got.fetched) == (True, False)
        assert w.ledger.get_job(job_id).state == "reconciled"
