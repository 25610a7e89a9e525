"""Every DAG in dags/ imports cleanly in a real Airflow and is built the way users expect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# BundleDagBag, as the DAG processor and the task runner use: the DAG folder is on sys.path.
CODE = (
    "import json; from pathlib import Path\n"
    "from airflow.configuration import conf\n"
    "from airflow.dag_processing.dagbag import BundleDagBag\n"
    "folder = Path(conf.get('core', 'dags_folder'))\n"
    "bag = BundleDagBag(dag_folder=folder, bundle_path=folder)\n"
    "print(json.dumps({'errors': {k: v[-2000:] for k, v in bag.import_errors.items()},"
    " 'dags': {d.dag_id: {'tags': sorted(d.tags), 'tasks': [t.task_id for t in d.tasks],"
    " 'catchup': d.catchup} for d in bag.dags.values()}}))\n"
)


def load_dagbag(env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def dagbag(airflow_home: dict[str, str]) -> dict[str, Any]:
    return load_dagbag(airflow_home)


def test_every_dag_imports_without_errors(dagbag: dict[str, Any]) -> None:
    assert dagbag["errors"] == {}
    assert dagbag["dags"]


def test_a_broken_dag_file_is_reported_as_an_import_error(
    airflow_home: dict[str, str], tmp_path: Any
) -> None:
    (tmp_path / "broken.py").write_text("from airflow.sdk import DAG\nraise RuntimeError('boom')\n")
    found = load_dagbag({**airflow_home, "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)})
    assert [Path(k).name for k in found["errors"]] == ["broken.py"]


def test_every_dag_has_tags_no_catchup_and_the_batch_tasks(dagbag: dict[str, Any]) -> None:
    dags = dagbag["dags"]
    for dag_id, info in dags.items():
        assert info["tags"], dag_id
        assert info["catchup"] is False, dag_id
    tasks = dags["nightly_feedback_classification"]["tasks"]
    for task in ("prepare", "submit", "wait", "download", "reconcile", "resubmit_2", "publish"):
        assert f"feedback_classification.{task}" in tasks
