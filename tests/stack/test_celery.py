"""The distributed form of ``make stack``: CeleryExecutor, a Redis broker, two Celery workers that
share nothing on disk, the ledger on PostgreSQL and staging on S3 (moto on loopback).

The nightly DAG (3,000 comments in three chunks) runs there; its mapped tasks must run on both
workers, every item must end final, no batch be created twice and no item paid twice, and the
staged files must be in S3, not in any worker's folder.

It is part of ``make test`` (about 3 minutes on two cores, 5 under load) and needs Debian's
``redis-server`` (``.ci/run`` installs it where it is missing, as it does chromium) and the Celery
provider (the ``stack`` extra). Without ``redis-server`` it skips, with the install hint, except
under CI (``CI=true``), where a missing broker is a failure: CI never passes by skipping it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from airflow_batch_provider.core.states import OPEN_STATES
from airflow_batch_provider.ledger import Ledger
from tests.stack.test_stack import login, wait_for
from tests.support.ci import missing_program, under_ci

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "nightly_feedback_classification"
WORKLOAD = "feedback_classification"

NO_REDIS: Final = "no redis-server on PATH: apt-get install redis-server (the Celery stack's broker)"


def require_redis_server(ci: bool) -> None:
    """Skip without ``redis-server`` outside CI; under CI, fail (a CI run never passes by skipping).

    :param ci: running under CI (``CI=true``)
    """
    if shutil.which("redis-server") is None:
        missing_program(NO_REDIS, ci)


@pytest.fixture(scope="module")
def celery_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_redis_server(under_ci())
    base = tmp_path_factory.mktemp("celery-stack")
    base.chmod(0o755)
    env = {
        **os.environ,
        "ABP_STACK_DIR": str(base),
        "ABP_STACK_EXECUTOR": "celery",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    script = ["bash", str(REPO / "scripts" / "stack.sh")]
    try:
        up = subprocess.run(
            [*script, "up"], env=env, capture_output=True, text=True, timeout=1200, check=False
        )
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        state = json.loads((base / "state.json").read_text(encoding="utf-8"))
        state["base"] = base
        yield state
    finally:
        down = subprocess.run(
            [*script, "down"], env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert down.returncode == 0, down.stdout + down.stderr


def test_the_nightly_dag_spreads_over_two_workers_that_share_nothing(celery_stack: dict[str, Any]) -> None:
    admin = login(celery_stack, "admin")
    wait_for(
        "the DAG to be parsed", lambda: admin.get(f"/api/v2/dags/{DAG_ID}").status_code == 200 or None, 600
    )
    # unpaused, the scheduler starts the latest nightly run (catchup is off)
    assert admin.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200

    def first_run() -> str | None:
        runs = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
        return runs[0]["dag_run_id"] if runs else None

    run_id = wait_for("the scheduler to start a run", first_run, 300)

    def finished() -> str | None:
        state = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    assert wait_for("the run to finish", finished, 1500, every=5.0) == "success"

    tis = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()
    mapped_hosts = {ti["hostname"] for ti in tis["task_instances"] if ti["map_index"] >= 0 and ti["hostname"]}
    assert mapped_hosts == {"worker-1", "worker-2"}, tis

    ledger = Ledger.from_url(celery_stack["postgres"]["ledger_url"])
    try:
        states = ledger.count_states(WORKLOAD, run_id)
        from sqlalchemy import text

        with ledger.engine.connect() as conn:
            paid_twice = conn.execute(
                text(
                    "SELECT item_key FROM abp_attempts WHERE workload = :w AND outcome = 'succeeded'"
                    " AND NOT discarded GROUP BY item_key HAVING COUNT(*) > 1"
                ),
                {"w": WORKLOAD},
            ).all()
            batches = conn.execute(
                text("SELECT COUNT(*) FROM abp_jobs WHERE workload = :w AND batch_id IS NOT NULL"),
                {"w": WORKLOAD},
            ).scalar_one()
    finally:
        ledger.engine.dispose()
    assert sum(states.values()) == 3000
    assert not {s: n for s, n in states.items() if s in OPEN_STATES}, states
    assert paid_twice == []
    stats = httpx.get(f"{celery_stack['emulator_url']}/_emulator/stats", timeout=30).json()
    assert stats["batches_created"] == batches

    # staged in S3; no worker folder holds a staged or downloaded file
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=celery_stack["s3_endpoint"],
        aws_access_key_id="stack",
        aws_secret_access_key="stack-secret",
        region_name="us-east-1",
    )
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="abp-staging", Prefix="llm-batch/")["Contents"]]
    assert any(k.endswith(".jsonl") for k in keys)
    for worker in ("worker-1", "worker-2"):
        local = [p for p in (celery_stack["base"] / worker).rglob("*.jsonl") if "sample-data" not in p.parts]
        assert local == [], local


def test_without_redis_server_the_celery_stack_skips_outside_ci_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(pytest.skip.Exception, match="apt-get install redis-server"):
        require_redis_server(ci=False)
    with pytest.raises(pytest.fail.Exception, match="CI installs it"):
        require_redis_server(ci=True)
    for value, expected in (("true", True), ("1", True), ("", False), ("false", False)):
        monkeypatch.setenv("CI", value)
        assert under_ci() is expected
