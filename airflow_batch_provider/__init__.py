"""airflow-batch-provider: asynchronous LLM batch inference for Apache Airflow 3."""

from __future__ import annotations

__version__ = "0.1.0"
