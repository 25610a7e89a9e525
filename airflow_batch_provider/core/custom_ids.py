"""Deterministic, reversible ``custom_id`` values within the strictest provider charset.

A ``custom_id`` is ``<item key>__a<attempt>c<chunk>``:

- the item key is the application id itself when it fits ``[A-Za-z0-9_-]{1,48}``, otherwise
  ``x-`` followed by 40 hex characters of SHA-256 over the application id (the ledger keeps the
  mapping, and a unique constraint on the key turns a collision into an error, not a mix-up);
- ``attempt`` counts the jobs the item has been sent in (1 for the first), ``chunk`` is the chunk
  index within that attempt's round.

The whole stays within ``^[A-Za-z0-9_-]{1,64}$`` (Anthropic's and Bedrock's rule, the strictest)
and parses back from the right, so application ids that themselves contain ``__`` are safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from airflow_batch_provider.core.hashing import sha256_hex

CUSTOM_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_KEY_LENGTH: Final = 48
MAX_ATTEMPT: Final = 99
MAX_CHUNK: Final = 99_999
_KEY_OK: Final = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
_PARSE: Final = re.compile(r"^(?P<key>[A-Za-z0-9_-]+)__a(?P<attempt>\d{1,2})c(?P<chunk>\d{1,5})$")


@dataclass(frozen=True)
class ParsedCustomId:
    """The parts of a ``custom_id``.

    :param key: the item key (application id or its hashed stand-in)
    :param attempt: attempt number, from 1
    :param chunk: chunk index within the attempt's round
    """

    key: str
    attempt: int
    chunk: int


def item_key(app_id: str) -> str:
    """Return the charset-safe key for an application id.

    :param app_id: the application's id
    """
    if _KEY_OK.fullmatch(app_id) and not app_id.startswith("x-"):
        return app_id
    return "x-" + sha256_hex(app_id)[:40]


def make_custom_id(key: str, attempt: int, chunk: int) -> str:
    """Build the ``custom_id`` of one item in one job.

    :param key: the item key from :func:`item_key`
    :param attempt: attempt number, 1 to 99
    :param chunk: chunk index, 0 to 99,999
    """
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt {attempt} is outside 1..{MAX_ATTEMPT}; lower max_attempts.")
    if not 0 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk {chunk} is outside 0..{MAX_CHUNK}; raise the chunk size.")
    if not _KEY_OK.fullmatch(key):
        raise ValueError(f"item key {key!r} is not [A-Za-z0-9_-]{{1,48}}; build it with item_key().")
    return f"{key}__a{attempt}c{chunk}"


def parse_custom_id(custom_id: str) -> ParsedCustomId:
    """Split a ``custom_id`` back into key, attempt and chunk.

    :param custom_id: a value made by :func:`make_custom_id`
    :raises ValueError: the value was not made by this module
    """
    match = _PARSE.fullmatch(custom_id)
    if match is None:
        raise ValueError(
            f"custom_id {custom_id!r} is not of the form <key>__a<attempt>c<chunk>; "
            "it was not produced by this provider."
        )
    return ParsedCustomId(match["key"], int(match["attempt"]), int(match["chunk"]))
