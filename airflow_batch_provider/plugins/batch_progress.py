"""Airflow UI page for batch progress and cost (placeholder until the page lands)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class BatchProgressPlugin(AirflowPlugin):
    """Registers the LLM batch progress page."""

    name = "llm_batch"
