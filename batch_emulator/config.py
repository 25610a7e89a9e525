"""Emulator settings: where it listens, how fast time runs, and the provider limits it enforces."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from batch_emulator.faults import FaultConfig

DEFAULT_PORT: Final = 8089
MIB: Final = 1024 * 1024


def is_loopback(host: str) -> bool:
    """Return True when ``host`` names only this machine (``localhost`` or a loopback address).

    :param host: host name or IP literal
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Timings:
    """How long each batch phase lasts, in seconds of emulated time at ``time_scale`` 1.0.

    Real durations are these values multiplied by :attr:`EmulatorConfig.time_scale`.

    :param validating_s: time in ``validating`` before a batch starts (or fails validation)
    :param in_progress_s: time to work through all items; items finish evenly spread over it
    :param finalizing_s: time in ``finalizing`` before the batch is ``completed``
    :param cancelling_s: time in ``cancelling`` before a cancelled batch is ``cancelled``
    :param completion_window_s: the window reported in ``expires_at`` (not scaled: 24 hours)
    :param rate_window_s: the window of the sync rpm/tpm limiter (scaled like the phases)
    """

    validating_s: float = 2.0
    in_progress_s: float = 10.0
    finalizing_s: float = 2.0
    cancelling_s: float = 2.0
    completion_window_s: float = 86_400.0
    rate_window_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"Timings.{f.name} is negative; give a duration of 0 or more seconds.")


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything the emulator needs at start.

    :param host: address to bind; only loopback addresses are accepted
    :param port: TCP port (0 picks a free one)
    :param time_scale: multiplier on every phase duration (0.05 makes a default batch finish in 0.7 s)
    :param seed: seed of every deterministic decision (faults, output order, ids)
    :param faults: the fault injection settings at start
    :param timings: phase durations before scaling
    :param data_dir: where file bytes, batch items and results are kept on disk (``None``: a
        temporary folder, removed with the emulator); the emulator's memory stays flat in a
        batch's size either way
    :param max_batch_requests: most request lines in one batch input file (OpenAI: 50,000)
    :param max_batch_bytes: largest batch input file (OpenAI: 200 MB)
    :param max_file_bytes: largest upload of any purpose (OpenAI: 512 MB)
    :param context_window_tokens: prompts longer than this fail with ``context_length_exceeded``
    :param cache_min_tokens: shortest shared prefix that prompt caching applies to (OpenAI: 1024)
    :param cache_increment_tokens: cached tokens are rounded down to a multiple of this (OpenAI: 128)
    :param api_key: when set, requests must carry ``Authorization: Bearer <api_key>``
    :param s3_endpoint: S3-compatible endpoint URL the Bedrock routes read inputs from and write outputs
        to (``None``: boto3's default, i.e. AWS)
    :param gcs_endpoint: GCS JSON API endpoint the Vertex AI routes read inputs from and write outputs
        to (``None``: Google's)
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    time_scale: float = 1.0
    seed: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)
    timings: Timings = field(default_factory=Timings)
    data_dir: Path | None = None
    max_batch_requests: int = 50_000
    max_batch_bytes: int = 200 * MIB
    max_file_bytes: int = 512 * MIB
    context_window_tokens: int = 128_000
    cache_min_tokens: int = 1024
    cache_increment_tokens: int = 128
    api_key: str | None = field(default=None, repr=False)
    s3_endpoint: str | None = None
    gcs_endpoint: str | None = None

    def __post_init__(self) -> None:
        if not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address; the emulator binds only to this machine "
                "(use 127.0.0.1, ::1 or localhost)."
            )
        if self.time_scale < 0:
            raise ValueError(f"time_scale {self.time_scale} is negative; use 0 (instant) or more.")
        if self.cache_increment_tokens < 1:
            raise ValueError("cache_increment_tokens must be at least 1.")

    def scaled(self, seconds: float) -> float:
        """Return real seconds for a duration given at ``time_scale`` 1.0.

        :param seconds: unscaled duration
        """
        return seconds * self.time_scale

    def runtime_view(self) -> dict[str, Any]:
        """Return the JSON form served by ``GET /_emulator/config``."""
        return {
            "seed": self.seed,
            "time_scale": self.time_scale,
            "timings": asdict(self.timings),
            "faults": self.faults.to_dict(),
        }

    def updated(self, patch: Mapping[str, Any]) -> EmulatorConfig:
        """Return a copy with a partial ``PUT /_emulator/config`` body applied.

        Accepted keys: ``seed``, ``time_scale``, ``timings`` (partial) and ``faults`` (partial).

        :param patch: the partial update
        :raises ValueError: unknown keys or invalid values
        """
        allowed = {"seed", "time_scale", "timings", "faults"}
        unknown = sorted(set(patch) - allowed)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; accepted keys are {sorted(allowed)}.")
        changes: dict[str, Any] = {}
        if "seed" in patch:
            changes["seed"] = int(patch["seed"])
        if "time_scale" in patch:
            changes["time_scale"] = float(patch["time_scale"])
        if "timings" in patch:
            timing_patch = _mapping(patch["timings"], "timings")
            names = {f.name for f in fields(Timings)}
            bad = sorted(set(timing_patch) - names)
            if bad:
                raise ValueError(f"unknown timings keys {bad}; accepted keys are {sorted(names)}.")
            changes["timings"] = replace(self.timings, **{k: float(v) for k, v in timing_patch.items()})
        if "faults" in patch:
            changes["faults"] = self.faults.merged(_mapping(patch["faults"], "faults"))
        return replace(self, **changes)


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name!r} must be a JSON object, got {type(value).__name__}.")
    return value
