"""The built wheel goes into an existing Airflow at the floor it declares, changes none of Airflow, and
Airflow's own CLI sees the provider there (issue 21's "done when"; ``tests/docs/conftest.py`` builds
the environment, ``tests/support/floor_env.py`` says how).

The same checks against the development environment (Airflow at constraints.txt's pin, the package
editable) are ``tests/unit/test_get_provider_info.py`` and ``tests/unit/test_cli_commands.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from airflow_batch_provider.get_provider_info import get_provider_info
from tests.support.floor_env import FloorEnv

pytestmark = pytest.mark.airflow_e2e


def test_pip_installing_the_wheel_into_airflow_at_its_floor_changes_no_airflow_distribution(
    floor_env: FloorEnv,
) -> None:
    before, after = floor_env.before, floor_env.after
    assert before["apache-airflow"] == floor_env.airflow_floor, (
        "the deployment runs Airflow at the wheel's floor"
    )
    assert "airflow-batch-provider" not in before and "airflow-batch-provider" in after
    airflow = sorted(name for name in before if name.startswith("apache-airflow"))
    assert len(airflow) > 3, f"the deployment holds Airflow and its providers: {airflow}"
    changed = {
        name: f"{before[name]} -> {after.get(name, 'removed')}"
        for name in airflow
        if after.get(name) != before[name]
    }
    assert not changed, f"pip install of the wheel changed Airflow's own distributions: {changed}"


def test_airflow_at_its_floor_lists_the_providers_links_and_runs_airflow_batch(
    floor_env: FloorEnv, tmp_path: Path
) -> None:
    env = {
        **floor_env.environ(),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }

    def airflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(floor_env.bin / "airflow"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    links = airflow("providers", "links", "--output", "json")
    assert links.returncode == 0, links.stdout[-3000:] + links.stderr[-3000:]
    missing = [link for link in get_provider_info()["extra-links"] if link not in links.stdout]
    assert not missing, f"`airflow providers links` does not list {missing}: {links.stdout[-3000:]}"
    helped = airflow("batch", "--help")
    assert helped.returncode == 0, helped.stdout[-3000:] + helped.stderr[-3000:]
    assert all(group in helped.stdout for group in ("review", "jobs", "lease", "fallback")), helped.stdout
