"""The prepare task (``BatchPrepareOperator``) by itself: what it refuses before anything is recorded, what a failing source leaves, how it cuts its chunks.

The prepare task under a distributed executor is tested with the whole run in ``test_batch.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.exceptions import ConfigurationError, RecordSourceError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.operators.prepare import BatchPrepareOperator
from tests.unit.operators.operator_env import PROMPT, RUN, configure


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    return configure(monkeypatch, tmp_path)


@pytest.mark.parametrize("workload", ["../..", "a/../../b", "/tmp/x", "a..b"])  # hostile input
def test_prepare_refuses_a_workload_that_could_leave_the_staging_root_when_the_dag_is_parsed(
    workload: str,
) -> None:

    with pytest.raises(ConfigurationError, match="is not a valid workload name"):
        BatchPrepareOperator(task_id="prepare", workload=workload, records="/x.jsonl", prompt=PROMPT)
    templated = BatchPrepareOperator(
        task_id="prepare", workload="{{ params.w }}", records="/x.jsonl", prompt=PROMPT
    )
    assert templated.workload == "{{ params.w }}"  # checked by Staging.run_dir once rendered


def test_prepare_keeps_what_a_failing_records_callable_yielded_stages_nothing_and_fails_clearly(
    ledger: Ledger, tmp_path: Path
) -> None:

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
    assert ledger.get_jobs("p", RUN) == []
    (summary,) = (tmp_path / "staging" / "p").glob("*/prepare_summary.json")
    counts = json.loads(summary.read_text())
    assert (counts["read"], counts["items"], counts["rejected"]) == (3, 2, 1)
    assert "warehouse went away" in counts["source_error"]
    (rejects,) = (tmp_path / "staging" / "p").glob("*/rejects.jsonl")
    assert json.loads(rejects.read_text())["code"] == "invalid_record"


def test_prepare_refuses_chunks_smaller_than_the_providers_minimum_batch(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:

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
        chunking=ChunkOptions(max_requests=50),
    )
    with pytest.raises(ConfigurationError, match="below bedrock's minimum of 100 requests per batch job"):
        prepare.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert ledger.count_states("p", RUN) == {}


@pytest.mark.parametrize(
    ("lane", "conn", "other"),
    [
        ("pod", {"conn_type": "openai_batch", "password": "k"}, "provider"),
        ("provider", {"conn_type": "vllm_kubernetes", "extra": {}}, "pod"),
    ],
)
def test_prepare_refuses_a_connection_of_the_other_lane_before_the_run_is_recorded(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, lane: str, conn: dict[str, Any], other: str
) -> None:

    monkeypatch.setenv("AIRFLOW_CONN_WRONG_LANE", json.dumps(conn))
    read: list[str] = []
    prepare = BatchPrepareOperator(
        task_id="prepare",
        workload="p",
        batch_conn_id="wrong_lane",
        records=lambda context: read.append("records") or [{"id": "a", "text": "one"}],
        prompt=PROMPT,
        lane=lane,  # type: ignore[arg-type]
    )
    with pytest.raises(ConfigurationError) as refused:
        prepare.execute({"run_id": RUN})  # type: ignore[arg-type]
    message = str(refused.value)
    for part in ("'wrong_lane'", repr(conn["conn_type"]), f"built the {lane} lane", f"lane={other!r}"):
        assert part in message, message
    assert read == [] and ledger.runs("p") == [] and ledger.count_states("p", RUN) == {}


def test_prepare_cuts_its_chunks_by_the_chunk_size_the_template_renders_to_for_this_run(
    ledger: Ledger,
) -> None:

    records = [{"id": f"r{i}", "text": f"t{i}"} for i in range(5)]

    def prepare(chunk: str, run_id: str) -> list[dict[str, Any]]:
        op = BatchPrepareOperator(
            task_id="prepare",
            workload="p",
            batch_conn_id="ops_test",
            records=lambda context: records,
            prompt=PROMPT,
            chunking=ChunkOptions(max_requests="{{ params.chunk }}"),
        )
        return op.execute({"run_id": run_id, "params": {"chunk": chunk}})  # type: ignore[arg-type,no-any-return]

    assert [m["lines"] for m in prepare("2", "run-a")] == [2, 2, 1]
    assert [m["lines"] for m in prepare("", "run-b")] == [5]  # nothing: the provider's limit
    with pytest.raises(ConfigurationError, match=r"rendered to 'two' for this run.*whole number"):
        prepare("two", "run-c")
    assert ledger.count_states("p", "run-c") == {}
