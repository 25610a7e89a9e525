"""Builders of batch input lines for the emulator tests."""

from __future__ import annotations

from typing import Any


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
