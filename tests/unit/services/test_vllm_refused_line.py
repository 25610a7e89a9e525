"""A pod whose engine refuses one line of its file: that item is rejected, the others are not charged.

The stand-in ``vllm`` is as strict as the engine (one invalid line fails the whole file: exit 1,
no output) and can be told to refuse a line by a rule the lane's own checks do not know
(``FAKE_VLLM_REFUSE_CUSTOM_ID``), as a newer engine would.
"""

# ruff: noqa: F811  (the fixtures ``api`` and ``ledger`` of test_vllm_pod, imported by name)

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.vllm_refused_line import named_line
from tests.support.kube_api import KubeApi, PodFault
from tests.unit.operators.test_vllm_pod import (  # noqa: F401
    JOB_ID,
    LINES,
    RUN,
    api,
    context,
    ledger,
    operator,
    output_lines,
    reconcile,
)

pytest.importorskip("airflow.providers.cncf.kubernetes")


def _items(ledger: Ledger) -> dict[str, object]:
    return {row.app_id: row for row in ledger.iter_item_rows("w", RUN)}


def test_the_line_the_engine_names_is_rejected_and_the_rest_run_again_without_being_charged_an_attempt(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    refused = f"{item_key('i2')}__a1c0"
    api.add_fault(PodFault("env", env={"FAKE_VLLM_REFUSE_CUSTOM_ID": refused}))
    result = operator(tmp_path).execute(context())  # type: ignore[arg-type]
    assert (result["state"], result["reason"].split(":")[0]) == ("failed", "invalid_line"), result
    assert api.live_pods() == [] and output_lines(tmp_path) == []  # the engine wrote nothing
    # reconcile: the named item waits in review with the engine's words, the other four go to the
    # next round with the attempt they had before this pod (the engine ran none of them)
    assert reconcile(tmp_path) == {"review": 1, "failed_retryable": LINES - 1}
    rows = _items(ledger)
    bad = rows.pop("i2")
    assert bad.state == "review" and bad.error_code == "engine_invalid_request"  # type: ignore[attr-defined]
    assert "Invalid request on line 3" in bad.error_message  # type: ignore[attr-defined]
    assert "a rule of this engine (stand-in) refuses the request" in bad.error_message  # type: ignore[attr-defined]
    assert {row.attempts for row in rows.values()} == {0}  # type: ignore[attr-defined]
    assert {row.error_code for row in rows.values()} == {"engine_refused_another_line"}  # type: ignore[attr-defined]


def test_a_line_number_outside_the_chunk_leaves_the_job_failed_as_any_exit_1(
    tmp_path: Path, api: KubeApi, ledger: Ledger
) -> None:
    from airflow_batch_provider.services.vllm_refused_line import settle_named_line
    from airflow_batch_provider.staging import Staging

    job = ledger.get_job(JOB_ID)
    before = {app_id: (row.state, row.attempts) for app_id, row in _items(ledger).items()}  # type: ignore[attr-defined]
    chunk = Staging(f"file://{tmp_path / 'staging'}").at(job.staged_path)
    assert settle_named_line(ledger, job, chunk, LINES + 1, "Invalid request on line 6") is None
    assert settle_named_line(ledger, job, tmp_path / "nowhere.jsonl", 1, "Invalid request on line 1") is None
    assert {app_id: (row.state, row.attempts) for app_id, row in _items(ledger).items()} == before  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "INFO x\nValueError: Invalid request on line 7: 1 validation error for BatchRequestInput\n"
            "body.messages\n  Input should be a valid list\n",
            (7, "Invalid request on line 7: 1 validation error for BatchRequestInput\nbody.messages\n"
             "  Input should be a valid list"),
        ),
        ("2026-12-02T01:00:00Z ValueError: Invalid request on line 12\n", (12, "Invalid request on line 12")),
        ("ERROR EngineDeadError: the engine died\n", None),
    ],
)  # fmt: skip
def test_the_engine_s_invalid_request_message_names_its_line(
    log: str, expected: tuple[int, str] | None
) -> None:
    assert named_line(log) == expected
