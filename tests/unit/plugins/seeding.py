"""A ledger seeded the way the DAG's tasks write it, and the users the page's tests act as.

Shared by the page's tests (``test_api.py``, ``test_review.py``); their fixtures are in
``conftest.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from fastapi import Request
from fastapi.testclient import TestClient

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.operators.batch import build_report
from airflow_batch_provider.plugins.access import Access, StaticAccess
from airflow_batch_provider.plugins.api import create_app
from tests.unit.ledger.jobs import job_row

MODEL = "gpt-4o-mini"
WL = "feedback"
RUN = "scheduled__2026-11-29T02:00:00+00:00"
DAG = "nightly_feedback"
HOSTILE_WL = '<script>alert("wl")</script>'
HOSTILE_APP = '"><img src=x onerror=alert(1)>'
USAGE = Usage(input_tokens=500, output_tokens=20)


def cost_of(usage: Usage) -> Decimal:
    """Batch price of gpt-4o-mini from the shipped table, as the download task prices lines."""
    return cost(usage, PriceTable.load(None).price("openai", MODEL), "batch")


def prep(app_id: str) -> PreparedItem:
    return PreparedItem(
        item_key(app_id),
        CanonicalRequest(
            app_id=app_id,
            prompt_version="v1",
            model=MODEL,
            system="Label the comment.",
            messages=({"role": "user", "content": f"comment {app_id}"},),
            params={"max_tokens": 20},
        ),
    )


def stage(
    ledger: Ledger, workload: str, run_id: str, app_ids: list[str], round_: int
) -> tuple[str, dict[str, str]]:
    """Record one job of ``app_ids`` (attempt ``round_``) the way the prepare/resubmit tasks do; (job id, custom ids)."""
    row = job_row(workload, run_id, len(app_ids), round_=round_)
    job_id = row["job_id"]
    row["staged_path"] = f"/secret-bucket/{job_id}.jsonl"  # the pages must never show it
    cids = {app_id: make_custom_id(item_key(app_id), round_, 0) for app_id in app_ids}
    ledger.record_job(row, [(item_key(a), "v1", cids[a], round_) for a in app_ids])
    return job_id, cids


def stage_and_submit(
    ledger: Ledger, workload: str, run_id: str, app_ids: list[str], round_: int, batch_id: str
) -> tuple[str, dict[str, str]]:
    """Record one job the way the prepare/resubmit tasks do, then mark it submitted."""
    job_id, cids = stage(ledger, workload, run_id, app_ids, round_)
    ledger.mark_submitted(job_id, batch_id, f"file-{batch_id}")
    return job_id, cids


@dataclass(frozen=True)
class Seeded:
    url: str
    report: dict[str, Any]


def seed_finished_run(
    ledger: Ledger,
    workload: str = WL,
    hostile_app: bool = False,
    dag_id: str | None = DAG,
    permanent_message: str = "<bad request>",
) -> dict[str, Any]:
    """Ten items: 7 succeed in round 1, 1 fails retryably and succeeds in round 2, 1 fails for good,
    1 is missing from every result file; then the run is published like the publish task does."""
    ids = [f"c{i:02d}" for i in range(9)] + [HOSTILE_APP if hostile_app else "c09"]
    ledger.start_run(workload, RUN, "openai", MODEL, dag_id=dag_id)
    ledger.upsert_items(workload, RUN, [prep(a) for a in ids])
    job1, cids = stage_and_submit(ledger, workload, RUN, ids, 1, "batch_round1_abc")
    results = [ItemResult(cids[a], "succeeded", output={"label": "ok"}, usage=USAGE) for a in ids[:7]]
    results.append(
        ItemResult(cids[ids[7]], "failed_retryable", usage=Usage(), error_code="500", error_message="boom")
    )
    results.append(
        ItemResult(
            cids[ids[9]], "failed_permanent", usage=Usage(), error_code="400", error_message=permanent_message
        )
    )
    ledger.apply_results(job1, results, cost_of)
    missing = ledger.mark_missing(job1)
    assert missing == 1
    ledger.update_job(
        job1,
        state="reconciled",
        batch_state="completed",
        result_lines=9,
        malformed_lines=1,
        duplicate_lines=2,
        missing=missing,
    )
    ledger.transition(workload, RUN, "staged", ["failed_retryable"], keys=[(item_key(ids[7]), "v1")])
    job2, cids2 = stage_and_submit(ledger, workload, RUN, [ids[7]], 2, "batch_round2_def")
    ledger.apply_results(
        job2, [ItemResult(cids2[ids[7]], "succeeded", output={"label": "ok"}, usage=USAGE)], cost_of
    )
    ledger.update_job(job2, state="reconciled", batch_state="completed", result_lines=1)
    # publish: exhausted/permanent items to review, then the report
    ledger.retry_candidates(workload, RUN, max_attempts=1)
    report = build_report(ledger, workload, RUN, "openai", None)
    ledger.finish_run(workload, RUN, report)
    return report


def client_for(url: str) -> TestClient:
    return TestClient(create_app(lambda: url, authenticate=False))


# ------------------------------------------------------------------------------------------ permissions
#
# Three workloads: ``feedback`` run by DAG nightly_feedback, ``tickets`` by DAG nightly_tickets on
# the same schedule (so the same run id), and ``legacy`` recorded without a DAG. The users are
# fixed lists of DAGs (the auth manager's answers); the Airflow login and auth manager themselves
# are exercised through the real API server in ``test_batch_progress.py``.

TICKETS, TICKETS_DAG, LEGACY = "tickets", "nightly_tickets", "legacy"
USERS: dict[str, StaticAccess] = {
    "admin": StaticAccess("admin", read=None, edit=None),
    "feedback_viewer": StaticAccess("feedback_viewer", read=frozenset({DAG})),
    "feedback_editor": StaticAccess("feedback_editor", read=frozenset({DAG}), edit=frozenset({DAG})),
    "nobody": StaticAccess("nobody", read=frozenset(), edit=frozenset()),
}


@dataclass(frozen=True)
class EditNoTrigger:
    """May edit the feedback DAG but not trigger its runs (an auth manager can answer so)."""

    actor: str = "no_trigger"

    def allowed(self, method: str, dag_id: str | None) -> bool:
        return dag_id == DAG and method in ("GET", "PUT")


SECRET = b"test-form-secret"


def user_from_header(request: Request) -> Access:
    name = request.headers["x-user"]
    return EditNoTrigger() if name == "no_trigger" else USERS[name]


@dataclass(frozen=True)
class Shared:
    url: str
    triggered: list[tuple[str, str, str]] = field(default_factory=list)

    def trigger(self, dag_id: str, actor: str, note: str) -> str:
        """Stands in for Airflow's trigger_dag (the stack test triggers for real)."""
        if dag_id == "broken":
            raise ConnectionError("metadata database unreachable")
        self.triggered.append((dag_id, actor, note))
        return f"manual__{len(self.triggered)}"

    def client(self, user: str) -> TestClient:
        app = create_app(
            lambda: self.url,
            access_for=user_from_header,
            authenticate=False,
            form_secret=SECRET,
            trigger=self.trigger,
        )
        return TestClient(app, headers={"x-user": user})


def stage_and_submit_unsent(
    ledger: Ledger, workload: str, run_id: str, app_ids: list[str]
) -> tuple[str, dict[str, str]]:
    """A staged job of a new run whose create call never confirmed (no batch id)."""
    ledger.start_run(workload, run_id, "openai", MODEL, dag_id=TICKETS_DAG)
    ledger.upsert_items(workload, run_id, [prep(a) for a in app_ids])
    return stage(ledger, workload, run_id, app_ids, 1)
