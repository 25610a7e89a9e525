"""The per-item ledger: SQLAlchemy Core on SQLite (embedded default) or PostgreSQL."""

from __future__ import annotations

from airflow_batch_provider.ledger.store import Ledger

__all__ = ["Ledger"]
