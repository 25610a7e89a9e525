"""Provider-wide settings from the ``[batch_provider]`` Airflow config section.

Each value can also come from the environment as ``AIRFLOW__BATCH_PROVIDER__<KEY>``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.core.policy import PollPolicy

if TYPE_CHECKING:
    from airflow_batch_provider.core.pricing import PriceTable


def get_setting(key: str, default: str) -> str:
    """Return a ``[batch_provider]`` config value.

    :param key: option name
    :param default: value when unset
    """
    from airflow.providers.common.compat.sdk import conf

    value = conf.get("batch_provider", key, fallback=None)
    return str(value) if value not in (None, "") else default


def default_poll_policy() -> PollPolicy:
    """The poll policy from the ``[batch_provider]`` config (the group's and a lone sensor's default).

    Options: ``poll_initial_interval``, ``poll_factor``, ``poll_max_interval``,
    ``poll_max_consecutive_errors`` and ``poll_timeout``.
    """
    return PollPolicy(
        initial_interval=float(get_setting("poll_initial_interval", "30")),
        factor=float(get_setting("poll_factor", "1.5")),
        max_interval=float(get_setting("poll_max_interval", "600")),
        max_consecutive_errors=int(get_setting("poll_max_consecutive_errors", "5")),
        timeout=float(get_setting("poll_timeout", str(26 * 3600))),
    )


def airflow_home() -> Path:
    """Return ``$AIRFLOW_HOME`` (default ``~/airflow``)."""
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")


def default_ledger_url() -> str:
    """The embedded ledger: ``ledger_url`` from config, else SQLite in ``$AIRFLOW_HOME``."""
    return get_setting("ledger_url", f"sqlite:///{airflow_home() / 'batch_ledger.sqlite'}")


def default_staging_root() -> str:
    """Where chunks and downloads are staged: ``staging_root`` from config, else a local folder."""
    return get_setting("staging_root", f"file://{airflow_home() / 'batch_staging'}")


def load_prices(override: str | Mapping[str, Any] | None = None) -> PriceTable:
    """The price table: the shipped one, merged with ``override`` or else ``[batch_provider] pricing_override``.

    :param override: a JSON file path, JSON text or mapping given by the DAG
    """
    from airflow_batch_provider.core.pricing import PriceTable

    return PriceTable.load(
        override if override is not None else (get_setting("pricing_override", "") or None)
    )
