"""Extra links: a batch's console page at its provider and the run's LLM batch page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from airflow_batch_provider.links.batch import (
    BatchConsoleLink,
    LedgerRunLink,
    console_templates,
    console_url,
    run_page_url,
)

RUN = "scheduled__2026-11-29T02:00:00+00:00"


@dataclass
class RecordingTi:
    """Records what a task pushes to XCom (the real push needs a running task)."""

    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


@dataclass(frozen=True)
class Dag:
    dag_id: str


@dataclass(frozen=True)
class TiKey:
    dag_id: str
    task_id: str
    run_id: str
    try_number: int = 1
    map_index: int = -1


def context(ti: RecordingTi) -> dict[str, Any]:
    return {"ti": ti, "dag": Dag("nightly_reviews"), "run_id": RUN}


def test_an_openai_batch_links_to_its_platform_page() -> None:
    assert console_url("openai", "batch_abc") == "https://platform.openai.com/batches/batch_abc"


def test_a_provider_without_a_template_gets_no_console_link() -> None:
    assert console_url("anthropic", "msgbatch_1") is None
    assert console_url("openai", "") is None


def test_configured_templates_add_providers_and_take_the_region_from_an_arn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "AIRFLOW__BATCH_PROVIDER__CONSOLE_URLS",
        '{"bedrock": "https://{region}.console.aws.amazon.com/bedrock/home?region={region}#/batch/{batch_id}"}',
    )
    arn = "arn:aws:bedrock:eu-west-1:123456789012:model-invocation-job/abc123"

    url = console_url("bedrock", arn)

    assert url is not None
    assert url.startswith("https://eu-west-1.console.aws.amazon.com/bedrock/home?region=eu-west-1#/batch/")
    assert "arn%3Aaws%3Abedrock" in url
    assert "openai" in console_templates()


def test_a_batch_id_cannot_break_out_of_its_place_in_the_url() -> None:
    url = console_url("openai", "batch_1/files?after=x#top")
    assert url == "https://platform.openai.com/batches/batch_1%2Ffiles%3Fafter%3Dx%23top"


def test_a_malformed_console_urls_setting_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__CONSOLE_URLS", '["not", "an", "object"]')
    with pytest.raises(ValueError, match=r"JSON object of provider name to URL template"):
        console_templates()


def test_the_run_page_url_carries_the_dag_and_the_run_id_encoded() -> None:
    url = run_page_url("nightly_reviews", RUN, base_url="https://airflow.example.com/prefix/")
    parts = urlsplit(url)

    assert parts.path == "/prefix/llm-batch/dag-run"
    assert parse_qs(parts.query) == {"dag_id": ["nightly_reviews"], "run_id": [RUN]}


def test_a_single_batch_links_to_its_console_page_and_several_to_the_run_page() -> None:
    ti = RecordingTi()
    one = BatchConsoleLink.persist(context(ti), provider="openai", batch_ids=["batch_1"])
    assert one == "https://platform.openai.com/batches/batch_1"
    assert ti.pushed == {BatchConsoleLink().xcom_key: one}

    many = BatchConsoleLink.persist(context(ti), provider="openai", batch_ids=["batch_1", "batch_2"])
    assert urlsplit(many).path.endswith("/llm-batch/dag-run")
    assert ti.pushed[BatchConsoleLink().xcom_key] == many


def test_the_run_link_needs_nothing_stored() -> None:
    link = LedgerRunLink()
    url = link.get_link(None, ti_key=TiKey("nightly_reviews", "submit", RUN))  # type: ignore[arg-type]

    assert parse_qs(urlsplit(url).query) == {"dag_id": ["nightly_reviews"], "run_id": [RUN]}
    ti = RecordingTi()
    assert LedgerRunLink.persist(context(ti)) == url
    assert link.name == "LLM batch run" and BatchConsoleLink().name == "Provider batch"


@pytest.mark.parametrize(
    "base_url",
    ["http://127.0.0.1:8089/v1", "https://my-resource.openai.azure.com", "http://litellm:4000/v1"],
)
def test_a_batch_of_another_openai_compatible_host_never_links_to_platform_openai(base_url: str) -> None:
    assert console_url("openai", "batch_abc", base_url=base_url) is None
    ti = RecordingTi()
    url = BatchConsoleLink.persist(context(ti), provider="openai", batch_ids=["batch_abc"], base_url=base_url)
    assert "platform.openai.com" not in url and "/llm-batch/dag-run?" in url


def test_openai_s_own_host_and_a_configured_template_for_another_host_get_console_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert console_url("openai", "b1", base_url="https://api.openai.com/v1") == (
        "https://platform.openai.com/batches/b1"
    )
    monkeypatch.setenv(
        "AIRFLOW__BATCH_PROVIDER__CONSOLE_URLS", '{"openai": "http://127.0.0.1:8089/v1/batches/{batch_id}"}'
    )
    assert console_url("openai", "b1", base_url="http://127.0.0.1:8089/v1") == (
        "http://127.0.0.1:8089/v1/batches/b1"
    )
