"""What every batch operator shares (``operators/base.py``): the prompt, the run's checks, the Asset extra.

The operators themselves run task by task in ``test_batch.py`` and ``test_prepare.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Asset

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.operators.base import (
    asset_extra,
    check_distributed,
    check_exhausted,
    distributed_executors,
    load_prompt,
)

REPO = Path(__file__).resolve().parents[3]


def test_prepare_under_a_distributed_executor_accepts_postgres_and_object_store_staging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_PG", "postgresql://u:p@db.internal:5432/ledger")
    check_distributed("ledger_pg", "s3://bucket/llm-batch")
    with pytest.raises(ConfigurationError, match="staging is on the local disk"):
        check_distributed("ledger_pg", "file:///tmp/x")
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    check_distributed(None, "file:///tmp/x")  # one machine: the embedded defaults are fine


@pytest.mark.parametrize(
    ("executor", "found"),
    [
        ("CeleryExecutor", ["CeleryExecutor"]),
        ("LocalExecutor, KubernetesExecutor", ["KubernetesExecutor"]),
        ("airflow.providers.edge3.executors.EdgeExecutor", ["EdgeExecutor"]),
        ("my_alias:airflow.providers.celery.executors.celery_executor.CeleryExecutor", ["CeleryExecutor"]),
        ("LocalExecutor", []),
        ("", []),
    ],
)
def test_the_distributed_executors_are_found_in_a_list_an_alias_or_a_class_path(
    executor: str, found: list[str]
) -> None:
    assert distributed_executors(executor) == found


def test_a_prompt_is_itself_its_yaml_file_or_what_a_callable_returns_for_this_run() -> None:
    template = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}")
    assert load_prompt(template) is template
    from_file = load_prompt(str(REPO / "include" / "prompts" / "feedback_classification.yaml"))
    assert isinstance(from_file, PromptTemplate) and from_file.version
    seen: list[Any] = []

    def for_this_run(context: Any) -> PromptTemplate:
        seen.append(context)
        return template

    assert load_prompt(for_this_run, {"run_id": "r1"}) is template and seen == [{"run_id": "r1"}]


def test_a_prompt_callable_that_returns_something_else_is_refused_naming_it() -> None:
    def wrong(context: Any) -> dict[str, str]:
        return {"user": "{{ text }}"}

    with pytest.raises(
        ConfigurationError, match=r"prompt callable 'wrong' returned dict; it must return a PromptTemplate"
    ):
        load_prompt(wrong, {})  # type: ignore[arg-type]


def test_an_unknown_exhausted_route_or_sync_without_a_prompt_is_refused_with_the_choices() -> None:
    check_exhausted("review", None)
    check_exhausted("sync", PromptTemplate(version="v1", model="m", user="x"))
    with pytest.raises(ConfigurationError, match=r"exhausted='retry'; use 'review'.*or 'sync'"):
        check_exhausted("retry", None)
    with pytest.raises(ConfigurationError, match=r"exhausted='sync' needs the workload's prompt"):
        check_exhausted("sync", None)


class _Event:
    def __init__(self) -> None:
        self.extra: dict[str, Any] = {}


class _Events(dict[Any, Any]):
    def __missing__(self, key: Any) -> Any:
        raise KeyError(f"no event for {key}")


def test_the_asset_extra_goes_on_each_outlet_assets_event_and_a_missing_event_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    results, report = Asset("s3://bucket/results"), Asset("s3://bucket/report")
    events = _Events({results: _Event()})
    extra = {"run_id": "r1", "succeeded": 7}
    with caplog.at_level("WARNING"):
        done = asset_extra({"outlet_events": events}, [results, "not an asset", report], extra)
    assert done == 1 and events[results].extra == extra
    assert "carries no extra" in caplog.text and "report" in caplog.text
    assert "not an asset" not in caplog.text  # what is not an Asset has no event to look for
    assert asset_extra({}, [results], extra) == 0  # no outlet events in this context (an old Airflow)
