"""airflow-batch-provider: asynchronous LLM batch inference for Apache Airflow 3."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"

#: the oldest Apache Airflow this package runs on (the floor pyproject.toml declares)
MIN_AIRFLOW_VERSION = "3.3.0"


def _release(text: str) -> tuple[int, ...]:
    """The numeric release of a version (``3.3.2rc1`` -> ``(3, 3, 2)``), as Airflow's own guard compares."""
    match = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def check_airflow_version(installed: str | None) -> None:
    """Refuse an Apache Airflow older than ``MIN_AIRFLOW_VERSION``, naming both and the fix.

    :param installed: the installed ``apache-airflow`` version (``None``: not installed as a distribution)
    :raises RuntimeError: it is older
    """
    if installed is not None and _release(installed) < _release(MIN_AIRFLOW_VERSION):
        raise RuntimeError(
            f"The package airflow-batch-provider {__version__} needs Apache Airflow {MIN_AIRFLOW_VERSION}+, "
            f"and Airflow {installed} is installed; upgrade Airflow (pip install "
            f"'apache-airflow>={MIN_AIRFLOW_VERSION}'), or install an earlier release of this package."
        )


try:
    _installed: str | None = version("apache-airflow")
except PackageNotFoundError:  # a source checkout of Airflow itself: nothing to compare
    _installed = None
check_airflow_version(_installed)
