"""Test-session infrastructure: a real PostgreSQL server, an S3-compatible server, free ports.

Nothing here imports Airflow or a provider SDK at module level, so the pure unit tests stay fast.
"""

from __future__ import annotations
