"""``airflow batch ...``: the ledger command line inside Airflow's, run as a real ``airflow`` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from airflow_batch_provider.cli_commands import forwarded
from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import airflow_command
from tests.unit.ledger.store_support import WL
from tests.unit.test_cli import two_in_review


def airflow(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow")
    return subprocess.run(
        [*airflow_command(), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_global_options_may_follow_the_action_in_the_airflow_spelling() -> None:
    assert forwarded("review", ["list", "--workload", "w", "--ledger-url", "sqlite://", "-o", "yaml"]) == [
        "--ledger-url", "sqlite://", "review", "list", "--workload", "w", "-o", "yaml",
    ]  # fmt: skip
    assert forwarded("jobs", ["in-doubt", "--conn-id=led"]) == ["--conn-id=led", "jobs", "in-doubt"]


def test_airflow_batch_lists_the_review_queue_as_a_table_json_or_yaml(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ledger = Ledger.from_url(url)
    try:
        two_in_review(ledger)
    finally:
        ledger.engine.dispose()
    helped = airflow(tmp_path, "batch", "--help")
    assert helped.returncode == 0, helped.stderr
    assert all(group in helped.stdout for group in ("review", "jobs", "lease", "fallback", "ledger"))
    base = ("batch", "review", "list", "--workload", WL, "--ledger-url", url)
    as_json = airflow(tmp_path, *base, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert sorted(r["app_id"] for r in json.loads(as_json.stdout)) == ["a", "b"]
    as_yaml = airflow(tmp_path, *base, "-o", "yaml")
    assert sorted(r["app_id"] for r in yaml.safe_load(as_yaml.stdout)) == ["a", "b"]
    table = airflow(tmp_path, *base)
    assert table.stdout.splitlines()[0].startswith("item_key\tprompt_version\tapp_id"), table.stdout
