"""The test suite's Airflow processes: their in-process execution API serves the one version they speak.

``airflow dags test`` and ``airflow tasks test`` run each task against an in-process copy of
Airflow's task execution API (``InProcessExecutionAPI``), a Cadwyn app that on its first request
generates the routes and schemas of every API version Airflow still serves to older workers (nine
in Airflow 3.3): about 6 CPU seconds in each such process, a quarter of a small DAG test's CPU,
spent on versions nothing in the process asks for. The in-process client speaks the newest one.

This module is on ``PYTHONPATH`` only in the environment the tests give the Airflow processes they
start (the ``airflow_home`` fixture, ``tests/conftest.py``); nothing of the package or of a user's
deployment imports it. When Airflow imports its version bundle, the bundle is replaced by one of
the head, the newest dated version (whose schema is the head's) and only what Cadwyn needs besides
(:func:`newest_only`): the same routes and models the in-process client is served. A task
SDK that asked for another version would get Cadwyn's "unknown version" answer and the test would
fail, not pass on a different API. ``ABP_ALL_API_VERSIONS=1`` keeps Airflow's own bundle.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

TARGET = "airflow.api_fastapi.execution_api.versions"


def newest_only(versions: tuple[Any, ...]) -> tuple[Any, ...]:
    """Of a bundle's versions (the head first, then newest first), the head, the newest and what it needs.

    Cadwyn insists that a route kept only for older versions is restored by a change of some
    version older than the head; such a version is kept with its changes, and one version older
    than it closes the bundle (Cadwyn's oldest version carries no changes).

    :param versions: the arguments Airflow gives ``VersionBundle``
    """
    from cadwyn import Version
    from cadwyn.structure.endpoints import EndpointExistedInstruction

    head, dated = versions[0], list(versions[1:])
    last = 0  # the oldest version whose changes must stay (they restore an older route)
    for index, version in enumerate(dated):
        for change in version.changes:
            if any(isinstance(i, EndpointExistedInstruction) for i in change.alter_endpoint_instructions):
                last = index
    if last + 1 >= len(dated):
        return versions  # nothing to leave out
    return (head, *dated[: last + 1], Version(dated[last + 1].value))


class _NewestVersionOnly(MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            import cadwyn

            bundle = cadwyn.VersionBundle

            def trimmed(*versions: Any, **kwargs: Any) -> Any:
                try:
                    kept = newest_only(versions)
                except Exception:  # another Cadwyn or Airflow than this was written for: all of them
                    kept = versions
                return bundle(*kept, **kwargs)

            cadwyn.VersionBundle = trimmed  # only while Airflow's versions module runs
            try:
                execute(module)
            finally:
                cadwyn.VersionBundle = bundle

        loader.exec_module = exec_module
        return spec


if os.environ.get("ABP_ALL_API_VERSIONS") != "1":
    sys.meta_path.insert(0, _NewestVersionOnly())
