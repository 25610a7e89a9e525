from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.adapters.registry import BUILTIN, adapter_class, known_conn_types
from airflow_batch_provider.exceptions import ConfigurationError


def test_the_openai_connection_types_resolve_to_the_openai_adapter() -> None:
    assert adapter_class("openai_batch") is OpenAIBatchAdapter
    assert adapter_class("openai") is OpenAIBatchAdapter


def test_every_builtin_entry_names_an_adapter_class() -> None:
    for conn_type in BUILTIN:
        cls = adapter_class(conn_type)
        assert cls.conn_type in BUILTIN, conn_type


def test_an_unknown_connection_type_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as err:
        adapter_class("smtp")
    message = str(err.value)
    assert "'smtp'" in message and "openai_batch" in message and "entry-point" in message
    assert "openai_batch" in known_conn_types()


def test_the_retry_table_is_the_union_of_every_declared_word_and_the_transports() -> None:
    from airflow_batch_provider.adapters.registry import (
        classify_outcome,
        retryable_errors,
        retryable_errors_by_provider,
    )
    from airflow_batch_provider.core.ratelimit import TRANSPORT_ERRORS

    by_provider = retryable_errors_by_provider()
    assert by_provider["transport"] == TRANSPORT_ERRORS
    assert by_provider["anthropic"] == adapter_class("anthropic_batch").declaration.retryable_errors
    assert retryable_errors() == frozenset().union(*by_provider.values())
    # a provider's own word is retryable whatever the status, an unknown word is not
    assert classify_outcome(400, "ThrottlingException") == "failed_retryable"
    assert classify_outcome(400, "ValidationException") == "failed_permanent"


def test_the_lane_hook_and_declaration_of_a_connection_type_come_from_its_one_entry() -> None:
    from airflow_batch_provider.adapters.registry import declaration, hook_path, lane

    assert lane("vllm_kubernetes") == "pod" and lane("openai") == "provider"
    assert (
        hook_path("openai")
        == hook_path("openai_batch")
        == "airflow_batch_provider.hooks.batch.OpenAIBatchHook"
    )
    assert declaration("gemini_batch").name == "gemini"


def test_the_console_pages_and_the_planners_models_are_the_declared_ones() -> None:
    from airflow_batch_provider.adapters.registry import compare_models, console_hosts, console_urls

    assert console_urls() == {"openai": "https://platform.openai.com/batches/{batch_id}"}
    assert console_hosts() == {"openai": frozenset({"api.openai.com"})}
    assert compare_models() == {
        "openai": "gpt-4.1-nano",
        "anthropic": "claude-haiku-4-5",
        "gemini": "gemini-2.5-flash",
        "bedrock": "amazon.nova-lite",
    }


def test_airflow_is_told_exactly_the_registered_connection_types_and_every_form_belongs_to_one() -> None:
    from airflow_batch_provider.get_provider_info import _forms, get_provider_info

    listed = [
        (e["connection-type"], e["hook-class-name"], e["hook-name"])
        for e in get_provider_info()["connection-types"]
    ]
    assert listed == [(t, e.hook, e.hook_name) for t, e in BUILTIN.items()]
    assert set(_forms()) <= set(BUILTIN), "a form for a connection type nothing serves"


def core_provider_words(core: Path) -> list[str]:
    """List ``file:line -> value`` for each string constant of ``core`` that is a provider's fact.

    Docstrings are skipped (they may name providers as examples); only values count.

    :param core: the ``core`` folder to scan
    """
    import ast

    from airflow_batch_provider.adapters.registry import declarations
    from airflow_batch_provider.core.ratelimit import TRANSPORT_ERRORS

    facts: set[str] = set(BUILTIN)
    for declared in declarations().values():
        facts |= {declared.name, declared.conn_type, *declared.retryable_errors}
        facts |= {v for v in (declared.console_url, declared.compare_model) if v}
    facts -= TRANSPORT_ERRORS  # no provider's: what this package's own clients report
    found = []
    for path in sorted(core.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            constant = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if constant and id(node) not in docstrings and node.value in facts:
                found.append(f"{path.name}:{node.lineno} -> {node.value!r}")
    return found


def test_core_holds_no_providers_facts_they_are_passed_in_from_the_declarations() -> None:
    core = Path(__file__).resolve().parents[3] / "airflow_batch_provider" / "core"
    assert core_provider_words(core) == []


def test_the_core_scan_sees_a_provider_table(tmp_path: Path) -> None:
    (tmp_path / "table.py").write_text(
        '"""Doc naming openai."""\nMODELS = {"openai": "gpt-4.1-nano"}\n', encoding="utf-8"
    )
    assert core_provider_words(tmp_path) == ["table.py:2 -> 'openai'", "table.py:2 -> 'gpt-4.1-nano'"]
