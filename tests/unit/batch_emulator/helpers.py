"""Builders of batch input lines for the emulator tests, and the steps the OpenAI API's tests share."""

from __future__ import annotations

from typing import Any

from batch_emulator import FaultConfig

from .conftest import Emulator

TERMINAL = {"completed", "failed", "expired", "cancelled"}
LONG_SYSTEM = "Classify the sentiment and topic of the review and answer as JSON. " * 80  # ~5,400 bytes


def finish(emu: Emulator, batch_id: str, seconds: float = 20.0) -> Any:
    """Move the emulator's clock ``seconds`` on and retrieve the batch (through the SDK)."""
    emu.advance(seconds)
    return emu.client.batches.retrieve(batch_id)


def expected_decisions(lines: list[dict[str, Any]], faults: FaultConfig, seed: int = 0) -> dict[str, str]:
    """The fault each line's custom id rolls under ``faults`` and ``seed``."""
    return {line["custom_id"]: faults.decide_item(seed, line["custom_id"]).fault for line in lines}


def chat_line(
    custom_id: str, user: str = "hello", system: str | None = None, model: str = "gpt-4o-mini", **body: Any
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages, **body},
    }


def chat_lines(n: int, attempt: int = 1, **kw: Any) -> list[dict[str, Any]]:
    return [
        chat_line(f"item{i:04d}__a{attempt}c0", user=f"Review {i}: the delivery was late", **kw)
        for i in range(n)
    ]
