"""What an operator's ``execute()`` reads from Airflow's settings, pointed at a test's own folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", system="Label it.")
RUN = "manual__2026-11-29T00:00:00+00:00"


def configure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    """A SQLite ledger and local staging under ``tmp_path`` as the configured ones, and connection ``ops_test`` (OpenAI); the ledger.

    :param monkeypatch: the test's monkeypatch (the settings are environment variables)
    :param tmp_path: the test's folder
    """
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", url)
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", f"file://{tmp_path / 'staging'}")
    monkeypatch.setenv("AIRFLOW_CONN_OPS_TEST", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    return Ledger.from_url(url)
