"""Local provider emulator (ASGI) for the demo and the tests.

It serves OpenAI-compatible Files, Batch, Chat Completions and Embeddings endpoints on a loopback
address, with batch lifecycles computed from elapsed time, a deterministic stand-in model
(:mod:`~airflow_batch_provider.emulator.model`) and deterministic fault injection
(:mod:`~airflow_batch_provider.emulator.faults`). It imports no provider SDK.

Start it with ``python -m airflow_batch_provider.emulator --port 8089``, in-process with
:func:`create_app`, or in a test with :func:`~airflow_batch_provider.emulator.testing.run_emulator`.
"""

from __future__ import annotations

from airflow_batch_provider.emulator.config import EmulatorConfig, Timings
from airflow_batch_provider.emulator.faults import FaultConfig

__all__ = ["EmulatorConfig", "FaultConfig", "Timings", "create_app", "run_emulator"]


def __getattr__(name: str) -> object:
    # FastAPI and uvicorn load only when the app is wanted, so that the configuration classes
    # stay importable without the ``emulator`` extra.
    if name == "create_app":
        from airflow_batch_provider.emulator.app import create_app

        return create_app
    if name == "run_emulator":
        from airflow_batch_provider.emulator.testing import run_emulator

        return run_emulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
