"""The registry's entries: one per provider, a leaf module that imports no adapter and no hook."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from airflow_batch_provider.adapters.entries import (
    BUILTIN,
    GENERIC_HOOK,
    Registration,
    known_conn_types,
    primary_conn_type,
    registration,
    registrations,
)
from airflow_batch_provider.exceptions import ConfigurationError
from tests.unit.test_layers import PACKAGE, imported_modules


@pytest.mark.parametrize("conn_type", sorted(BUILTIN))
def test_every_entry_names_an_adapter_and_a_hook_of_its_own_connection_type_and_form_name(
    conn_type: str,
) -> None:
    entry = BUILTIN[conn_type]
    adapter = getattr(importlib.import_module(entry.module), entry.class_name)
    module, _, name = entry.hook.rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert adapter.conn_type == conn_type == hook.conn_type
    assert hook.hook_name == entry.hook_name
    assert hook.default_conn_name == f"{conn_type}_default"


def test_an_alias_resolves_to_the_entry_of_the_type_it_stands_for_and_is_listed_once() -> None:
    assert primary_conn_type("openai") == "openai_batch"
    assert registration("openai") is BUILTIN["openai_batch"]
    assert "openai" in known_conn_types() and "openai" not in registrations()
    assert primary_conn_type("anthropic_batch") == "anthropic_batch"


def test_an_unknown_connection_type_is_refused_naming_the_known_ones_and_the_entry_point_group() -> None:
    with pytest.raises(ConfigurationError) as err:
        registration("smtp")
    assert "'smtp'" in str(err.value) and "bedrock_batch" in str(err.value)
    assert "airflow_batch_provider.adapters" in str(err.value)


def test_an_entry_without_a_hook_gets_the_generic_hook() -> None:
    entry = Registration("some.module:SomeAdapter")
    assert (entry.module, entry.class_name, entry.hook) == ("some.module", "SomeAdapter", GENERIC_HOOK)


def test_the_entries_and_the_contract_module_import_no_adapter_no_hook_and_not_the_registry() -> None:
    """The import circle base.py <-> registry.py is gone: base asks the leaf module instead."""
    adapters = PACKAGE / "adapters"
    for module in ("entries.py", "base.py", "declaration.py"):
        found = {name for _, name in imported_modules(adapters / module, PACKAGE.parent)}
        upward = sorted(
            name
            for name in found
            if name.startswith("airflow_batch_provider.")
            and name.split(".")[1] not in ("core", "exceptions")
            and not name.startswith(
                ("airflow_batch_provider.adapters.entries", "airflow_batch_provider.adapters.declaration")
            )
        )
        assert upward == [], f"{module} imports {upward}"


def test_importing_the_contract_module_loads_no_adapter_nor_the_registry() -> None:
    code = (
        "import json, sys\n"
        "import airflow_batch_provider.adapters.base\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('airflow_batch_provider.adapters.'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [
        "airflow_batch_provider.adapters.base",
        "airflow_batch_provider.adapters.declaration",
        "airflow_batch_provider.adapters.entries",
    ]
