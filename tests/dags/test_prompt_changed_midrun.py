"""A run keeps the prompt it started with: a prompt file edited mid-run (v1 text to v2 JSON with a
schema) stops the next task that reads it, before v1's answers are judged by v2 or anything is
sent again."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e
DAGS = Path(__file__).parent / "dags"

V1 = """\
version: v1
model: gpt-4o-mini
user: "Label this comment: {{ comment }}"
output_format: text
"""


def test_a_prompt_file_edited_during_the_run_stops_the_next_task_naming_both_and_nothing_is_judged_by_it(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text(V1, encoding="utf-8")
    with openai_dag_env(airflow_home, tmp_path, dags=DAGS) as (url, env):
        env["ABP_MIDRUN_PROMPT"] = str(prompt)
        proc = run_airflow(env, "dags", "test", "prompt_changed_midrun")
        stats = httpx.get(f"{url}/_emulator/stats").json()
    output = proc.stdout + proc.stderr
    assert "version: v2" in prompt.read_text(), tail(proc)  # the records callable edited it mid-run
    assert proc.returncode != 0, tail(proc)
    assert "renders prompt 'v2'" in output and "started with prompt 'v1'" in output, tail(proc)
    assert "Put prompt 'v1' back and clear this task" in output
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    [run] = ledger.runs("prompt_changed_midrun")
    assert run["prompt_version"] == "v1" and run["finished_at"] is None
    # submit, the first task after prepare that reads the prompt, stopped before it created a batch
    assert (stats["batches_created"], stats["sync_requests"]) == (0, 0)
    items = list(ledger.iter_items("prompt_changed_midrun", run["run_id"], columns=["state", "error_code"]))
    assert len(items) == 6 and {(i["state"], i["error_code"]) for i in items} == {("staged", None)}
