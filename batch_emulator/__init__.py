"""Local provider emulator (ASGI) for the demo and the tests.

It serves OpenAI-compatible Files, Batch, Chat Completions and Embeddings endpoints on a loopback
address, with batch lifecycles computed from elapsed time, a deterministic stand-in model
(:mod:`~batch_emulator.model`) and deterministic fault injection
(:mod:`~batch_emulator.faults`). It imports no provider SDK.

Start it with ``python -m batch_emulator --port 8089``, in-process with
:func:`create_app`, or in a test with :func:`~batch_emulator.testing.run_emulator`.
"""

from __future__ import annotations

from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.faults import FaultConfig

__all__ = ["EmulatorConfig", "FaultConfig", "Timings", "create_app", "run_emulator"]


def __getattr__(name: str) -> object:
    # FastAPI and uvicorn load only when the app is wanted, so that the configuration classes
    # stay importable without the ``emulator`` extra.
    if name == "create_app":
        from batch_emulator.app import create_app

        return create_app
    if name == "run_emulator":
        from batch_emulator.testing import run_emulator

        return run_emulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
