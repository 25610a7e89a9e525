from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from airflow_batch_provider import MIN_AIRFLOW_VERSION, check_airflow_version

PYPROJECT = tomllib.loads(
    (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
)


def test_an_airflow_older_than_the_floor_is_refused_with_both_versions_and_the_fix() -> None:
    with pytest.raises(
        RuntimeError, match=r"needs Apache Airflow 3\.3\.0\+, and Airflow 3\.2\.2 is installed; upgrade"
    ):
        check_airflow_version("3.2.2")


@pytest.mark.parametrize("installed", [MIN_AIRFLOW_VERSION, "3.4.0", "4.0.0.dev0", None])
def test_the_floor_and_newer_airflow_pass_the_guard(installed: str | None) -> None:
    check_airflow_version(installed)


def test_the_guard_and_the_declared_airflow_floor_are_the_same_version() -> None:
    airflow = next(
        Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("apache-airflow>=")
    )
    assert [s.version for s in airflow.specifier if s.operator == ">="] == [MIN_AIRFLOW_VERSION]


def test_the_readme_quick_start_names_the_declared_airflow_floor() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"Into any Airflow environment from {MIN_AIRFLOW_VERSION} on (the declared floor" in readme
