"""The ``anthropic_batch`` hook: its default connection, its adapter and its named fields, its Test button."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_batch_provider.adapters.anthropic import AnthropicBatchAdapter
from airflow_batch_provider.hooks.anthropic import AnthropicBatchHook
from airflow_batch_provider.hooks.batch import hook_class
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

KEY = "sk-ant-right"


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with run_emulator(EmulatorConfig(api_key=KEY)) as base_url:
        yield base_url


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "anthropic_batch", **fields})
    )


def test_the_hook_of_the_anthropic_connection_type_is_this_one_and_reads_its_default_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert hook_class("anthropic_batch") is AnthropicBatchHook
    assert AnthropicBatchHook.default_conn_name == "anthropic_batch_default"
    _connection(monkeypatch, "anthropic_batch_default", host="http://127.0.0.1:1", password="k")
    assert AnthropicBatchHook().batch_conn_id == "anthropic_batch_default"
    assert isinstance(AnthropicBatchHook().get_adapter(), AnthropicBatchAdapter)


def test_the_named_fields_of_the_connection_reach_the_adapter_and_the_key_stays_out_of_its_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = {"default_max_tokens": 512, "prompt_caching": True, "json_output": "tool", "max_retries": 1}
    _connection(monkeypatch, "ant_fields", host="http://127.0.0.1:1", password="sk-ant-secret", extra=extra)
    adapter = AnthropicBatchHook("ant_fields").get_adapter()
    assert adapter.settings.api_key == "sk-ant-secret"
    assert {k: adapter.settings.extra[k] for k in extra} == extra
    assert "sk-ant-secret" not in repr(adapter.settings)


def test_the_test_button_answers_yes_for_the_right_key_and_no_for_a_wrong_one_naming_the_connection(
    emulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connection(monkeypatch, "ant_ok", host=emulator, password=KEY)
    _connection(monkeypatch, "ant_bad", host=emulator, password="sk-ant-wrong")
    ok, message = AnthropicBatchHook("ant_ok").test_connection()
    assert ok and "ant_ok" in message and "works" in message, message
    bad, refusal = AnthropicBatchHook("ant_bad").test_connection()
    assert not bad and "ant_bad" in refusal and "failed" in refusal, refusal
    assert KEY not in message + refusal and "sk-ant-wrong" not in refusal
