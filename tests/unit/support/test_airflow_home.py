from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_conftest_import_loads_neither_airflow_nor_an_sdk() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import tests.conftest; "
        "heavy = sorted(m for m in ('airflow', 'boto3', 'moto', 'psycopg2', 'openai') if m in sys.modules); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code, str(REPO_ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_airflow_home_is_migrated_and_points_at_the_repo_dags(airflow_home: dict[str, str]) -> None:
    home = Path(airflow_home["AIRFLOW_HOME"])
    assert (home / "airflow.db").stat().st_size > 0
    assert "AIRFLOW_HOME" not in os.environ or os.environ["AIRFLOW_HOME"] != str(home)
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run(
        [str(airflow), "config", "get-value", "core", "dags_folder"],
        env=airflow_home,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(REPO_ROOT / "dags")
    result = subprocess.run(
        [str(airflow), "config", "get-value", "core", "load_examples"],
        env=airflow_home,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.stdout.strip() == "False"
