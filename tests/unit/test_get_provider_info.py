from __future__ import annotations

import importlib

from airflow_batch_provider import __version__
from airflow_batch_provider.get_provider_info import get_provider_info
from tests.support.airflow_run import run_airflow, tail


def test_every_module_and_hook_the_metadata_names_imports() -> None:
    info = get_provider_info()
    assert info["versions"] == [__version__]
    for section in ("operators", "sensors", "triggers", "hooks"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for entry in info["connection-types"]:
        module, _, cls = entry["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == entry["connection-type"]


def test_every_config_option_has_a_description_and_a_default() -> None:
    options = get_provider_info()["config"]["batch_provider"]["options"]
    assert {
        "ledger_url",
        "staging_root",
        "staging_conn_id",
        "pricing_override",
        "poll_initial_interval",
    } <= set(options)
    for name, option in options.items():
        assert option["description"] and option["default"] is not None, name


def test_airflow_lists_the_provider_and_its_connection_types(airflow_home: dict[str, str]) -> None:
    proc = run_airflow(airflow_home, "providers", "list", "--output", "json")
    assert proc.returncode == 0, tail(proc)
    assert "airflow-batch-provider" in proc.stdout
    hooks = run_airflow(airflow_home, "providers", "hooks", "--output", "json")
    assert hooks.returncode == 0, tail(hooks)
    assert "openai_batch" in hooks.stdout
