"""Canonical JSON and SHA-256 helpers shared by requests, chunks and idempotency keys."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Serialise ``value`` the same way every time: sorted keys, no spaces, UTF-8 kept.

    :param value: any JSON-serialisable value
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: str | bytes) -> str:
    """Return the hex SHA-256 of text (as UTF-8) or bytes.

    :param data: what to hash
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def short_hash(*parts: str, length: int = 16) -> str:
    """Return a short, stable hex digest of several strings (joined unambiguously).

    :param parts: the strings
    :param length: number of hex characters to keep
    """
    return sha256_hex("\x1f".join(parts))[:length]
