from __future__ import annotations

import importlib
import re
from pathlib import Path

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


def test_the_readme_documents_every_declared_option_and_no_other() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Configuration (`[batch_provider]`", 1)[1].split("\n## ", 1)[0]
    documented = {
        name
        for row in section.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])
    }
    assert documented == set(get_provider_info()["config"]["batch_provider"]["options"])


def test_airflow_lists_the_provider_and_its_connection_types(airflow_home: dict[str, str]) -> None:
    proc = run_airflow(airflow_home, "providers", "list", "--output", "json")
    assert proc.returncode == 0, tail(proc)
    assert "airflow-batch-provider" in proc.stdout
    hooks = run_airflow(airflow_home, "providers", "hooks", "--output", "json")
    assert hooks.returncode == 0, tail(hooks)
    assert "openai_batch" in hooks.stdout
    links = run_airflow(airflow_home, "providers", "links", "--output", "json")
    assert links.returncode == 0, tail(links)
    assert "airflow_batch_provider.links.batch.BatchConsoleLink" in links.stdout
    assert "airflow_batch_provider.links.batch.LedgerRunLink" in links.stdout


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


# -- connection forms, read the way Airflow's providers manager and UI read them ---------------------

BATCH_TYPES = ("openai_batch", "anthropic_batch", "gemini_batch", "bedrock_batch")


def _connection_types() -> dict[str, dict[str, object]]:
    return {entry["connection-type"]: entry for entry in get_provider_info()["connection-types"]}


def test_every_connection_type_declares_a_named_form_without_importing_its_hook() -> None:
    import jsonschema

    types = _connection_types()
    assert set(BATCH_TYPES) <= set(types)
    for conn_type, entry in types.items():
        assert entry["hook-name"], conn_type
        behaviour = entry["ui-field-behaviour"]
        assert set(behaviour) == {"hidden-fields", "relabeling", "placeholders"}, conn_type
        for name, field in entry.get("conn-fields", {}).items():
            assert field["label"] and field["description"], (conn_type, name)
            jsonschema.Draft7Validator.check_schema(field["schema"])
            assert "null" in field["schema"]["type"], f"{conn_type}.{name} must allow an empty form field"
            if "default" in field["schema"]:
                jsonschema.validate(field["schema"]["default"], field["schema"])


def test_the_clouds_get_named_fields_for_project_region_role_and_buckets() -> None:
    types = _connection_types()
    assert {"organization", "project", "api_type"} <= set(types["openai_batch"]["conn-fields"])
    assert {"aws_conn_id", "region_name", "role_arn", "s3_uri", "output_s3_uri"} <= set(
        types["bedrock_batch"]["conn-fields"]
    )
    assert {"vertexai", "project", "location", "gcs_prefix", "gcp_conn_id"} <= set(
        types["gemini_batch"]["conn-fields"]
    )
    # AWS keys live in the aws connection named by aws_conn_id, not in the Bedrock form
    assert {"login", "password"} <= set(types["bedrock_batch"]["ui-field-behaviour"]["hidden-fields"])


def test_every_declared_field_is_read_by_the_package() -> None:
    """A field that nothing reads is a form that lies; catches a rename in an adapter."""
    from pathlib import Path

    from airflow_batch_provider.hooks.vllm_pod_settings import VllmPodSettings

    package = Path(__file__).resolve().parents[2] / "airflow_batch_provider"
    source = "\n".join(
        p.read_text(encoding="utf-8") for p in package.rglob("*.py") if p.name != "get_provider_info.py"
    )
    pod_settings = set(VllmPodSettings.__dataclass_fields__)  # read as a whole by from_extra
    for conn_type, entry in _connection_types().items():
        for name in entry.get("conn-fields", {}):
            read = name in pod_settings if conn_type == "vllm_kubernetes" else f'"{name}"' in source
            assert read, f"{conn_type}.{name} is declared but never read"


def test_airflows_providers_manager_and_ui_see_the_forms() -> None:
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManager()
    runtime = ProvidersManagerTaskRuntime()
    behaviours = manager.field_behaviours
    widgets = manager.connection_form_widgets
    for conn_type in BATCH_TYPES:
        assert conn_type in behaviours, conn_type
        assert runtime.hooks[conn_type] is not None, conn_type
    assert behaviours["openai_batch"]["relabeling"]["password"] == "API key"
    assert widgets["extra__bedrock_batch__role_arn"].field["schema"]["title"] == "Batch job role ARN"
    meta = {m.connection_type: m for m in HookMetaService.hook_meta_data()}
    gemini = meta["gemini_batch"]
    assert gemini.hook_name == "Gemini Batch"
    assert gemini.extra_fields is not None and "location" in gemini.extra_fields
    assert (
        gemini.standard_fields is not None
        and gemini.standard_fields.password.title == "API key (Developer API)"
    )


def test_every_module_that_defines_an_operator_sensor_trigger_or_hook_is_named_in_the_metadata() -> None:
    import ast

    package = Path(__file__).resolve().parents[2] / "airflow_batch_provider"
    suffix = {"operators": "Operator", "sensors": "Sensor", "triggers": "Trigger", "hooks": "Hook"}
    info = get_provider_info()
    for section, ending in suffix.items():
        named = {module for entry in info[section] for module in entry["python-modules"]}
        defining = {
            f"airflow_batch_provider.{section}.{path.stem}"
            for path in (package / section).glob("*.py")
            for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.ClassDef)
            and node.name.endswith(ending)
            and not node.name.startswith("_")
            and "Base" not in node.name
        }
        assert defining, f"the scan must find the {section} the package defines"
        assert defining <= named, (
            f"{section} defined but not in get_provider_info: {sorted(defining - named)}"
        )
