"""The floor environment of ``tests/support/floor_env.py``, built once per test run for this folder's tests.

Where: ``ABP_FLOOR_VENV`` when set (``make test`` names ``.venv-lowest``, which ``make test-lowest``
then lowers to every floor, so CI builds the floor environment once), else the run's temporary
folder (shared by the xdist workers of one run). A file lock lets one worker build it while the
others wait; the run's id, recorded in it, makes the next run build it afresh.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.support import floor_env as floors

RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


@pytest.fixture(scope="session")
def floor_env(tmp_path_factory: pytest.TempPathFactory) -> floors.FloorEnv:
    """Airflow at the wheel's declared floor, with the wheel installed by the README's ``pip install`` line."""
    named = os.environ.get("ABP_FLOOR_VENV")
    base = tmp_path_factory.getbasetemp()
    root = (
        Path(named).resolve()
        if named
        else (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "floor-venv"
    )
    root.parent.mkdir(parents=True, exist_ok=True)
    # the lock lies outside the tree (the folder of ABP_FLOOR_VENV may be a checkout)
    lock_path = Path(tempfile.gettempdir()) / f"abp-floor-{hashlib.sha256(bytes(root)).hexdigest()[:16]}.lock"
    with open(lock_path, "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = floors.load(root)
        return built if built is not None and built.run == RUN else floors.create(root, RUN)
