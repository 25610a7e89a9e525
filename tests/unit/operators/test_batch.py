"""Operator behaviour that a whole DAG run does not isolate (the DAG tests cover the rest)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.operators.batch import BatchResubmitOperator

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", system="Label it.")
RUN = "manual__2026-11-29T00:00:00+00:00"


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", url)
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", f"file://{tmp_path / 'staging'}")
    monkeypatch.setenv("AIRFLOW_CONN_OPS_TEST", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    ledger = Ledger.from_url(url)
    items = [
        PreparedItem(item_key(f"i{n}"), PROMPT.render({"id": f"i{n}", "text": "word " * 50}))
        for n in range(3)
    ]
    ledger.upsert_items("w", RUN, items)
    job_id = f"w:{RUN}:r1:c00000"
    ledger.record_job(
        {
            "job_id": job_id,
            "workload": "w",
            "run_id": RUN,
            "round": 1,
            "chunk_index": 0,
            "provider": "openai",
            "model": "gpt-4o-mini",
            "kind": "chat",
            "idempotency_key": "abp-k1",
            "staged_path": "file:///x",
            "input_sha256": "0" * 64,
            "lines": 3,
            "size_bytes": 1,
        },
        [(it.key, "v1", f"{it.key}__a1c0", 1) for it in items],
    )
    ledger.mark_submitted(job_id, "batch_1", "file-1")
    usage = Usage(input_tokens=100_000, output_tokens=10_000)
    results = [
        ItemResult("i0__a1c0", "succeeded", output="ok", usage=usage),
        ItemResult("i1__a1c0", "failed_retryable", error_code="server_error", usage=Usage()),
        ItemResult("i2__a1c0", "failed_retryable", error_code="server_error", usage=Usage()),
    ]
    ledger.apply_results(job_id, results, lambda u: Decimal("0.01") if u.input_tokens else Decimal(0))
    return ledger


def resubmit(budget: float | None) -> BatchResubmitOperator:
    return BatchResubmitOperator(
        task_id="resubmit_2",
        workload="w",
        batch_conn_id="ops_test",
        round_number=2,
        max_attempts=3,
        budget_usd=budget,
    )


def test_a_round_that_would_pass_the_budget_is_not_started_and_its_items_go_to_review(ledger: Ledger) -> None:
    assert ledger.run_cost("w", RUN) == Decimal("0.01")
    assert resubmit(0.010001).execute({"run_id": RUN}) == []  # type: ignore[arg-type]
    rows = {r["app_id"]: r for r in ledger.iter_items("w", RUN)}
    assert {rows["i1"]["state"], rows["i2"]["state"]} == {"review"}
    assert rows["i1"]["error_code"] == "budget_exceeded"
    assert "exceeds the run's budget of $0.010001; raise budget_usd" in rows["i1"]["error_message"]
    assert rows["i0"]["state"] == "succeeded"
    assert ledger.jobs_for("w", RUN, 2) == []


def test_a_round_within_the_budget_is_staged_and_a_rerun_is_not_checked_again(ledger: Ledger) -> None:
    manifests = resubmit(1.0).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert [m["lines"] for m in manifests] == [2]
    # cleared and rerun after the money was spent elsewhere: the round already exists, same jobs
    assert resubmit(0.0).execute({"run_id": RUN}) == manifests  # type: ignore[arg-type]
    assert ledger.count_states("w", RUN) == {"succeeded": 1, "staged": 2}


def test_without_a_budget_every_retryable_item_is_staged(ledger: Ledger) -> None:
    manifests = resubmit(None).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert sum(m["lines"] for m in manifests) == 2


@pytest.mark.parametrize("workload", ["../..", "a/../../b", "/tmp/x", "a..b"])
def test_prepare_refuses_a_workload_that_could_leave_the_staging_root_when_the_dag_is_parsed(
    workload: str,
) -> None:
    from airflow_batch_provider.exceptions import ConfigurationError
    from airflow_batch_provider.operators.batch import BatchPrepareOperator

    with pytest.raises(ConfigurationError, match="is not a valid workload name"):
        BatchPrepareOperator(task_id="prepare", workload=workload, records="/x.jsonl", prompt=PROMPT)
    templated = BatchPrepareOperator(
        task_id="prepare", workload="{{ params.w }}", records="/x.jsonl", prompt=PROMPT
    )
    assert templated.workload == "{{ params.w }}"  # checked by Staging.run_dir once rendered


def test_prepare_keeps_what_a_failing_records_callable_yielded_stages_nothing_and_fails_clearly(
    ledger: Ledger, tmp_path: Path
) -> None:
    from airflow_batch_provider.exceptions import RecordSourceError
    from airflow_batch_provider.operators.batch import BatchPrepareOperator

    def records(context: object) -> Iterator[dict[str, object]]:
        yield {"id": "a", "text": "one"}
        yield ["not", "a", "dict"]  # type: ignore[misc]
        yield {"id": "b", "text": "two"}
        raise ConnectionError("warehouse went away")

    prepare = BatchPrepareOperator(
        task_id="prepare", workload="p", batch_conn_id="ops_test", records=records, prompt=PROMPT
    )
    with pytest.raises(
        RecordSourceError, match=r"after 3 records.*ConnectionError: warehouse went away.*retry the task"
    ):
        prepare.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert ledger.count_states("p", RUN) == {"pending": 2}
    assert ledger.jobs_for("p", RUN) == []
    (summary,) = (tmp_path / "staging" / "p").glob("*/prepare_summary.json")
    counts = json.loads(summary.read_text())
    assert (counts["read"], counts["items"], counts["rejected"]) == (3, 2, 1)
    assert "warehouse went away" in counts["source_error"]
    (rejects,) = (tmp_path / "staging" / "p").glob("*/rejects.jsonl")
    assert json.loads(rejects.read_text())["code"] == "invalid_record"


def test_prepare_refuses_chunks_smaller_than_the_providers_minimum_batch(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.exceptions import ConfigurationError
    from airflow_batch_provider.operators.batch import BatchPrepareOperator

    bedrock = {
        "conn_type": "bedrock_batch",
        "extra": {"region_name": "us-east-1", "role_arn": "arn:aws:iam::1:role/r"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_BR_TEST", json.dumps(bedrock))
    prepare = BatchPrepareOperator(
        task_id="prepare",
        workload="p",
        batch_conn_id="br_test",
        records=lambda context: [],
        prompt=PROMPT,
        max_requests_per_chunk=50,
    )
    with pytest.raises(ConfigurationError, match="below bedrock's minimum of 100 requests per batch job"):
        prepare.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert ledger.count_states("p", RUN) == {}
