"""Local emulator (ASGI) of the LLM batch providers' APIs, for the demo and the tests.

A package beside ``airflow_batch_provider``, not inside it, installed with the ``emulator`` extra
(``pip install 'airflow-batch-provider[emulator]'``), as moto is for AWS users. It imports nothing
of the provider (its tests check the provider's adapters, so it keeps its own knowledge of each
provider) and no provider SDK at module level.

It serves the OpenAI, Anthropic, Gemini, Bedrock and Vertex AI batch and real-time endpoints on a
loopback address, with batch lifecycles computed from elapsed time, a deterministic stand-in
model (:mod:`~batch_emulator.model`) and deterministic fault injection
(:mod:`~batch_emulator.faults`). Files, batch items and results live in its data directory, so
its memory stays flat as a batch grows. What the routers share is in :mod:`~batch_emulator.common`.

Start it with ``python -m batch_emulator --port 8089`` (or the ``batch-emulator`` script),
in-process with :func:`create_app`, or in a test with :func:`~batch_emulator.testing.run_emulator`.
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
