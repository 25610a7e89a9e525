"""The site plugins folder (``plugins/``) as Airflow loads it: its macro and its notifier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What a worker does: load the plugins of the configured folder, then use the macro and the notifier.
PROBE = """
import json, sys
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
plugins_manager.integrate_macros_plugins()
from airflow.sdk.execution_time import macros
from airflow_batch_provider.notifications import BatchAlerts, BatchEvent
from abp_site import JsonLinesNotifier

published = {
    "items_by_state": {"succeeded": 990, "review": 10, "skipped": 0},
    "paid_usd": "12.3456",
    "cost_per_usable_result_usd": "0.01247",
}
event = BatchEvent("batch_failed", "reviews", "run-1", "batch b1 failed", details={"batch_id": "b1"})
BatchAlerts(notifiers=[JsonLinesNotifier(path="{{ params.out }}")]).emit({"params": {"out": sys.argv[1]}}, event)
print(json.dumps({
    "plugins": sorted(p["name"] for p in plugins_manager.get_plugin_info()),
    "errors": plugins_manager.get_import_errors(),
    "cost": macros.abp_site.run_cost(published),
    "before": macros.abp_site.run_cost(None),
}))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    tmp_path = tmp_path_factory.mktemp("site")
    out = tmp_path / "events.jsonl"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "false",
    }
    # run outside the checkout: with its root on sys.path, the editable install's
    # airflow_batch_provider.egg-info there would list the package's entry points a second time
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), out


def test_airflow_loads_the_site_plugin_from_the_plugins_folder_without_errors(
    loaded: tuple[dict[str, object], Path],
) -> None:
    info, _ = loaded
    assert "abp_site" in info["plugins"]  # type: ignore[operator]
    assert info["errors"] == {}


def test_the_macro_says_what_a_run_cost_and_before_publish_that_it_is_not_known(
    loaded: tuple[dict[str, object], Path],
) -> None:
    info, _ = loaded
    assert info["cost"] == "$12.35 paid for 1000 items (10 review, 990 succeeded), $0.0125 per usable result"
    assert info["before"] == "cost not known yet (the run has not published)"


def test_the_notifier_writes_each_event_the_alerts_hand_it_to_its_rendered_path(
    loaded: tuple[dict[str, object], Path],
) -> None:
    _, out = loaded
    (line,) = out.read_text(encoding="utf-8").splitlines()
    event = json.loads(line)
    assert (event["kind"], event["workload"], event["run_id"]) == ("batch_failed", "reviews", "run-1")
    assert event["details"] == {"batch_id": "b1"}
