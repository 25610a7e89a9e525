"""Each provider declares its facts once, on its adapter class."""

from __future__ import annotations

import pytest

from airflow_batch_provider.adapters.declaration import ProviderDeclaration, union_of_words
from airflow_batch_provider.adapters.entries import BUILTIN
from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.core.batch import Limits

LIMITS = Limits(max_requests=10, max_bytes=1_000)


@pytest.mark.parametrize("conn_type", sorted(BUILTIN))
def test_every_adapter_reads_its_name_connection_type_limits_and_lane_from_its_declaration(
    conn_type: str,
) -> None:
    cls = adapter_class(conn_type)
    declared = cls.__dict__["declaration"]
    assert isinstance(declared, ProviderDeclaration)
    assert (cls.name, cls.conn_type, cls.limits) == (declared.name, declared.conn_type, declared.limits)
    assert declared.conn_type == conn_type  # the registry's key is the declared type
    assert cls.runs_in_pod == (declared.lane == "pod")


def test_only_the_self_hosted_lane_runs_in_pods_and_only_batch_apis_are_compared_by_the_planner() -> None:
    declared = {adapter_class(t).declaration for t in BUILTIN}
    assert {d.name for d in declared if d.lane == "pod"} == {"vllm"}
    assert {d.name for d in declared if d.compare_model} == {"openai", "anthropic", "gemini", "bedrock"}


def test_a_declaration_without_a_name_or_with_console_hosts_but_no_page_is_refused_with_the_remedy() -> None:
    with pytest.raises(ValueError, match="both must be non-empty"):
        ProviderDeclaration(name="", conn_type="x_batch", limits=LIMITS)
    with pytest.raises(ValueError, match="no console_url; give the page template"):
        ProviderDeclaration(name="x", conn_type="x_batch", limits=LIMITS, console_hosts=frozenset({"api.x"}))


def test_the_union_of_words_holds_every_declared_word_once() -> None:
    a = ProviderDeclaration("a", "a_batch", LIMITS, retryable_errors=frozenset({"busy", "slow"}))
    b = ProviderDeclaration("b", "b_batch", LIMITS, retryable_errors=frozenset({"busy", "later"}))
    assert union_of_words({"a": a, "b": b}) == {"busy", "slow", "later"}
    assert union_of_words({}) == frozenset()
