"""A toy provider added with one file and one registry entry, run through the whole contract suite.

The steps are those of ``docs/add-a-provider.md``: the adapter module
(``tests/unit/adapters/toy_provider.py``, with its :class:`ProviderDeclaration`), one registry entry
(made here, for the tests of this module only), and a contract profile; nothing else in the package
changes. The provider-free layers then know it from its declaration alone: the retry table, the
console link, the GPU planner, the connection list Airflow reads, the "Test" button.

The contract suite's tests are imported and run here unchanged against the toy adapter, which
speaks the emulator's OpenAI-compatible batch routes over plain ``httpx``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_batch_provider.adapters import entries, registry
from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.entries import Registration
from tests.unit.adapters import test_contract as suite
from tests.unit.adapters.test_contract import Contract, Emulator, Profile, emulator
from tests.unit.adapters.toy_provider import TOY_CONN_TYPE, ToyBatchAdapter

__all__ = ["emulator"]  # the contract suite's emulator fixture, for the tests collected below

# Every test of the contract suite, collected here too: against this module's ``contract`` fixture.
globals().update({name: test for name, test in vars(suite).items() if name.startswith("test_")})

#: What differs for the toy provider, declared as the contract suite declares every provider's.
TOY_PROFILE = Profile(
    model="gpt-4o-mini",
    id_field="custom_id",
    system_path=("body", "messages", 0, "content"),
    user_path=("body", "messages", 1, "content"),
    model_path=("body", "model"),
    reports_counts=True,
    fault_codes={"rate_500": "server_error", "rate_context_length": "context_length_exceeded"},
    emulated_as="openai",
)


@pytest.fixture(scope="module", autouse=True)
def toy_registered() -> Iterator[None]:
    """The one registry entry of the toy provider, for this module's tests (undone after them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(
            entries.BUILTIN, TOY_CONN_TYPE, Registration("tests.unit.adapters.toy_provider:ToyBatchAdapter")
        )
        registry.retryable_errors.cache_clear()
        yield
    registry.retryable_errors.cache_clear()


@pytest.fixture
def contract(emulator: Emulator) -> Contract:
    """The contract suite's subject: the toy adapter, found through the registry by its connection type."""
    emulator.http.post("/_emulator/reset").raise_for_status()
    settings = AdapterSettings(api_key="sk-test", base_url=f"{emulator.url}/v1")
    return Contract(
        name="toy",
        adapter=registry.adapter_class(TOY_CONN_TYPE)(settings),
        url=emulator.url,
        model=TOY_PROFILE.model,
        profile=TOY_PROFILE,
        settings=settings,
        http=emulator.http,
    )


def test_one_registry_entry_wires_the_toy_connection_type_to_its_adapter_the_generic_hook_and_a_lane() -> (
    None
):
    from airflow_batch_provider.hooks.batch import BatchHook, hook_class

    assert registry.adapter_class(TOY_CONN_TYPE) is ToyBatchAdapter
    assert (ToyBatchAdapter.name, ToyBatchAdapter.conn_type) == ("toy", TOY_CONN_TYPE)
    assert ToyBatchAdapter.limits.max_requests == 1_000 and not ToyBatchAdapter.runs_in_pod
    assert TOY_CONN_TYPE in registry.known_conn_types()
    assert hook_class(TOY_CONN_TYPE) is BatchHook
    assert registry.lane(TOY_CONN_TYPE) == "provider"
    assert "toy" in registry.providers_accepting("chat") and "toy" not in registry.providers_accepting(
        "embedding"
    )


def test_the_toy_declaration_reaches_the_retry_table_the_console_link_and_the_gpu_planner() -> None:
    from airflow_batch_provider.links.batch import console_url

    assert registry.classify_outcome(None, "toy_busy") == "failed_retryable"
    assert registry.classify_outcome(400, "toy_refused") == "failed_permanent"
    assert registry.retryable_errors_by_provider()["toy"] == {"toy_busy"}
    page = console_url("toy", "b-1", templates=None, base_url="https://api.toy.example/v1")
    assert page == "https://console.toy.example/batches/b-1"
    assert console_url("toy", "b-1", base_url="https://proxy.example/v1") is None  # another host's batch
    assert registry.compare_models()["toy"] == "toy-small"


def test_airflow_lists_the_toy_connection_type_with_the_generic_hook_and_the_default_form() -> None:
    from airflow_batch_provider.get_provider_info import get_provider_info

    listed = {entry["connection-type"]: entry for entry in get_provider_info()["connection-types"]}
    toy = listed[TOY_CONN_TYPE]
    assert toy["hook-class-name"] == "airflow_batch_provider.hooks.batch.BatchHook"
    assert toy["ui-field-behaviour"]["relabeling"] == {
        "host": "API base URL (optional)",
        "password": "API key",
    }


def test_the_test_button_of_a_toy_connection_runs_the_adapters_probe(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.hooks.batch import BatchHook

    emulator.http.post("/_emulator/reset").raise_for_status()
    fields = {"conn_type": TOY_CONN_TYPE, "host": f"{emulator.url}/v1", "password": "sk-test"}
    monkeypatch.setenv("AIRFLOW_CONN_TOY_DEFAULT", json.dumps(fields))
    ok, message = BatchHook("toy_default").test_connection()
    assert ok, message
    assert message.startswith("toy_batch connection 'toy_default' works:") and "listed 0 batch(es)" in message
    assert "sk-test" not in message
