"""``python -m airflow_batch_provider.gpu_planner``: the planner compared with every declared provider."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.adapters.registry import compare_models
from airflow_batch_provider.core import gpu_planner as core_planner
from airflow_batch_provider.gpu_planner import main

ARGS = ["--params-b", "8", "--precision", "fp8", "--gpu", "H100", "--items", "1000"]
ARGS += ["--input-tokens", "500", "--output-tokens", "100", "--usd-per-gpu-hour", "50", "--json"]


def test_the_command_compares_with_the_model_each_adapter_declares(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(ARGS) == 0
    quotes = {q["provider"]: q["model"] for q in json.loads(capsys.readouterr().out)["providers"]}
    assert quotes == compare_models()
    assert set(quotes) == {"openai", "anthropic", "gemini", "bedrock"}


def test_the_core_planner_alone_compares_with_no_provider(capsys: pytest.CaptureFixture[str]) -> None:
    assert core_planner.main(ARGS) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["providers"] == [] and data["cheaper"] == "self-hosted"
