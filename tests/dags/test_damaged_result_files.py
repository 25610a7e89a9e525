"""Damaged result files under ``airflow dags test``: the report's billed tokens are the provider's bill.

The emulator serves an HTML page in place of the first result file downloaded, writes an error
line before the success of some items, a second copy with another answer (billed again) for some,
an identical copy for some, and truncates some lines. Every item ends in one final state; the
report's billed usage, less the estimate it prices the unreadable lines at (reported apart),
equals the emulator's bill for every readable line exactly.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.ledger import Ledger
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from tests.support.airflow_run import openai_dag_env, run_airflow
from tests.support.bill import expected_bill

pytestmark = pytest.mark.airflow_e2e

ITEMS = 40
WORKLOAD = "damaged_files"
TOKENS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens")
FAULTS = FaultConfig(
    html_downloads=1,
    rate_error_before_success=0.2,
    rate_duplicate_other=0.2,
    rate_duplicate=0.1,
    rate_malformed=0.1,
)
DAG_FILE = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group

PROMPT = PromptTemplate(
    version="v1",
    model="gpt-4o-mini",
    system="Label the comment positive, negative or neutral.",
    user="Comment {{ id }}: {{ text }}",
    params={"max_tokens": 16},
)


def records(context):
    for i in range(ITEMS):
        yield {"id": f"c{i:03d}", "text": f"the parcel number {i} arrived late but intact"}


with DAG(dag_id="WORKLOAD", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    batch_inference_group(
        workload="WORKLOAD",
        records=records,
        prompt=PROMPT,
        batch_conn_id="openai_batch_default",
        max_attempts=4,
        deferrable=False,
    )
"""


def test_with_damaged_result_files_the_reports_billed_tokens_equal_the_emulators_bill(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    text = textwrap.dedent(DAG_FILE).replace("ITEMS", str(ITEMS)).replace("WORKLOAD", WORKLOAD)
    (dags / f"{WORKLOAD}.py").write_text(text, encoding="utf-8")
    config = EmulatorConfig(time_scale=0.02, faults=FAULTS)
    polling = {"poll_initial_interval": "0.2", "poll_factor": "1.2", "poll_max_interval": "1"}
    with openai_dag_env(airflow_home, tmp_path, config, dags=dags, password="sk-test", **polling) as (
        url,
        env,
    ):
        ledger_url = env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"]
        result = run_airflow(env, "dags", "test", WORKLOAD, timeout=300)
        record = httpx.get(f"{url}/_emulator/record").json()
        served = httpx.get(f"{url}/_emulator/config").json()["faults"]["html_downloads"]
    log = result.stdout + result.stderr
    (tmp_path / "dags_test.log").write_text(log, encoding="utf-8")
    assert result.returncode == 0, log[-6000:]
    assert served == 0, "the HTML page was never served"
    ledger = Ledger.from_url(ledger_url)
    [run] = ledger.runs(WORKLOAD)
    states = ledger.count_states(WORKLOAD, str(run["run_id"]))
    assert sum(states.values()) == ITEMS and set(states) <= {"succeeded", "review"}, states
    assert states.get("succeeded", 0) >= ITEMS - 2, states

    # the bill of every readable line: the record's bill less the lines it says it truncated
    # (priced by the report at an estimate, reported apart), as the stateful invariant reads it
    bill = expected_bill(record, {}, "openai", "gpt-4o-mini")
    readable = {key: getattr(bill.readable_usage, key) for key in TOKENS}
    damaged = sum(len(batch["truncated"] or ()) for batch in record["batches"]["openai"])
    truncated = {cid for batch in record["batches"]["openai"] for cid in batch["truncated"] or ()}
    # a second answer is a discarded duplicate, unless the first was truncated: then it is the
    # first readable success, and the item keeps it
    again = sum(
        cid not in truncated
        for batch in record["batches"]["openai"]
        for cid, _ in batch["billed_again"] or []
    )
    assert damaged and again, (damaged, again)

    (path,) = list((tmp_path / "staging").rglob("report.json"))
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    unreadable = report["unreadable"]
    assert unreadable["lines"] == damaged
    estimate = unreadable["estimated_usage"]
    assert estimate["input_tokens"] > 0 and estimate["output_tokens"] == 16 * damaged
    assert {k: report["usage"][k] - estimate[k] for k in TOKENS} == readable
    assert report["extra_lines"]["duplicate"] == again
