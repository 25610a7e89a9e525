"""The tests' Airflow processes serve the newest execution API version, and what it needs, whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import AIRFLOW_SITE

PROBE = """
import json, sys
from airflow.api_fastapi.execution_api.app import create_task_execution_api_app
from airflow.api_fastapi.execution_api.versions import bundle
app = create_task_execution_api_app()
app._cadwyn_initialize()  # what the first in-process request does: every kept version's routes
print(json.dumps([v.value for v in bundle.versions]))
"""


def _versions(site: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABP_ALL_API")}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(AIRFLOW_SITE) if site else "", env.get("PYTHONPATH", "")])
    )
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_tests_airflow_serves_the_newest_api_version_and_builds_its_routes_with_fewer_versions() -> None:
    full, kept = _versions(site=False), _versions(site=True)
    assert kept[0] == full[0]  # the version the in-process client speaks
    assert set(kept) < set(full)
    assert kept == sorted(kept, reverse=True)
