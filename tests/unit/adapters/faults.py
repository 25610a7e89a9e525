"""Arming the emulator's create faults and reading its own record, for the adapter tests."""

from __future__ import annotations

from typing import Any

import httpx

#: connection extras that make the create rule fast in tests (no real waits, a short timeout)
FAST_CREATE: dict[str, Any] = {"create_retry_initial_s": 0.01, "create_retry_max_s": 0.02, "timeout": 2.0}


def arm(url: str, *script: str, **faults: Any) -> None:
    """Set create faults (``"create:500_after"`` ...) and any other fault settings.

    :param url: the emulator's base URL
    :param script: ``create_script`` entries
    :param faults: other fault settings
    """
    patch = {"create_script": list(script), "create_slow_s": 3.5, **faults}
    httpx.put(f"{url}/_emulator/config", json={"faults": patch}).raise_for_status()


def batches(url: str, provider: str) -> list[dict[str, Any]]:
    """Every batch the emulator created for a provider, from its own record.

    :param url: the emulator's base URL
    :param provider: ``openai``, ``anthropic``, ``gemini`` or ``bedrock``
    """
    record = httpx.get(f"{url}/_emulator/record").json()
    return list(record["batches"].get(provider, []))


def advance(url: str, seconds: float) -> float:
    """Move the emulator clock forward; return its new time.

    :param url: the emulator's base URL
    :param seconds: how far
    """
    answer = httpx.post(f"{url}/_emulator/clock", json={"advance_s": seconds})
    answer.raise_for_status()
    return float(answer.json()["now"])
