"""Fail points: a named one kills its process with SIGKILL on the N-th hit; an unknown name is refused."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_batch_provider.core.failpoints import ENV_VAR, FAILPOINTS, failpoint

PACKAGE = Path(__file__).resolve().parents[3] / "airflow_batch_provider"
REACH = """
from airflow_batch_provider.core.failpoints import failpoint
for i in range(1, 4):
    print(i, flush=True)
    failpoint("submit.after_create")
print("survived", flush=True)
"""


def _reach(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    return subprocess.run(
        [sys.executable, "-c", REACH], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


def test_an_armed_point_kills_its_process_with_sigkill_on_the_nth_hit_and_nothing_after_runs() -> None:
    killed = _reach({ENV_VAR: "reconcile.mid, submit.after_create=2"})
    assert killed.returncode == -9
    assert killed.stdout.split() == ["1", "2"]


def test_an_unarmed_or_other_point_costs_nothing_and_the_process_goes_on() -> None:
    for env in ({}, {ENV_VAR: "reconcile.mid"}):
        survived = _reach(env)
        assert survived.returncode == 0 and survived.stdout.split() == ["1", "2", "3", "survived"]


def test_a_name_not_declared_is_refused_so_a_typo_never_silently_fails_to_fire() -> None:
    with pytest.raises(KeyError, match="declare it in FAILPOINTS"):
        failpoint("submit.after_creat")


def test_every_point_the_package_reaches_is_declared_and_every_declared_one_is_reached() -> None:
    reached = {
        node.args[0].value
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "failpoint"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert reached == set(FAILPOINTS)
