"""Importing the Airflow glue must not load any provider SDK (they are optional extras)."""

from __future__ import annotations

import json
import subprocess
import sys

SDKS = ("openai", "anthropic", "google.genai", "boto3", "botocore", "aiobotocore", "kubernetes")
GLUE = (
    "airflow_batch_provider.operators.batch",
    "airflow_batch_provider.sensors.batch",
    "airflow_batch_provider.triggers.batch",
    "airflow_batch_provider.hooks.batch",
    "airflow_batch_provider.hooks.ledger",
    "airflow_batch_provider.pipeline",
    "airflow_batch_provider.adapters.registry",
    "airflow_batch_provider.adapters.openai",
    "airflow_batch_provider.adapters.anthropic",
    "airflow_batch_provider.adapters.gemini",
    "airflow_batch_provider.adapters.bedrock",
    "airflow_batch_provider.hooks.anthropic",
    "airflow_batch_provider.hooks.gemini",
    "airflow_batch_provider.hooks.bedrock",
    "airflow_batch_provider.operators.deadline",
    "airflow_batch_provider.operators.fallback",
    "airflow_batch_provider.plugins.batch_progress",
)


def loaded_after_import(modules: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        f"sdks = {list(SDKS)!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if any(m == s or m.startswith(s + '.') for s in sdks))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_operators_sensors_triggers_hooks_and_adapters_loads_no_provider_sdk() -> None:
    assert loaded_after_import(GLUE) == []


def test_the_check_itself_sees_an_sdk_when_one_is_imported() -> None:
    assert "openai" in loaded_after_import(("openai",))
