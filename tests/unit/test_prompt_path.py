from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.prompt_path import resolve_prompt_path

PROMPT_YAML = "version: v1\nmodel: gpt-4o-mini\nuser: '{{ text }}'\n"


def test_a_relative_prompt_path_is_found_beside_the_dag_file_from_any_working_directory(
    tmp_path: Path,
) -> None:
    dags = tmp_path / "dags"
    (dags / "prompts").mkdir(parents=True)
    (dags / "prompts" / "p.yaml").write_text(PROMPT_YAML, encoding="utf-8")
    (dags / "wl.py").write_text(
        textwrap.dedent(
            """
            import pendulum
            from airflow.sdk import DAG
            from airflow_batch_provider.pipeline import batch_inference_group

            with DAG("wl", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
                batch_inference_group(
                    workload="w", records="file:///x.jsonl", prompt="prompts/p.yaml", batch_conn_id="c"
                )
            print(dag.get_task("w.prepare").prompt)
            """
        ),
        encoding="utf-8",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [sys.executable, str(dags / "wl.py")], cwd=elsewhere, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == str((dags / "prompts" / "p.yaml").resolve())


def test_a_prompt_path_that_names_no_file_fails_when_the_dag_is_parsed() -> None:
    with (
        pytest.raises(
            ConfigurationError, match=r"prompt='prompts/missing.yaml': no file at .*prompts/missing.yaml"
        ),
        DAG("t", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")),
    ):
        batch_inference_group(
            workload="w", records="file:///x.jsonl", prompt="prompts/missing.yaml", batch_conn_id="c"
        )


def test_a_prompt_that_is_not_a_local_path_is_left_as_it_is() -> None:
    template = PromptTemplate(version="v1", model="m", user="{{ text }}")
    assert resolve_prompt_path(template) is template
    assert resolve_prompt_path("s3://bucket/p.yaml") == "s3://bucket/p.yaml"
    assert resolve_prompt_path("{{ var.value.prompt }}") == "{{ var.value.prompt }}"


def test_an_absolute_prompt_path_stays_absolute(tmp_path: Path) -> None:
    prompt = tmp_path / "p.yaml"
    prompt.write_text(PROMPT_YAML, encoding="utf-8")
    assert resolve_prompt_path(str(prompt), base=Path("/nowhere")) == str(prompt)
