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


def test_every_setting_the_package_reads_is_declared_in_the_config_section() -> None:
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "airflow_batch_provider"
    read = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "get_setting"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                read.add(node.args[0].value)
    assert "ledger_conn_id" in read, "the scan must see the settings read through get_setting"
    declared = set(get_provider_info()["config"]["batch_provider"]["options"])
    assert read <= declared, f"read but not declared: {sorted(read - declared)}"


def test_the_ledger_url_is_masked_as_sensitive_and_the_plugin_is_listed() -> None:
    info = get_provider_info()
    assert info["config"]["batch_provider"]["options"]["ledger_url"]["sensitive"] is True
    (plugin,) = info["plugins"]
    module, _, cls = plugin["plugin-class"].rpartition(".")
    assert getattr(importlib.import_module(module), cls).name == plugin["name"]
