"""Named fail points: where the chaos suite may kill a task process on purpose.

A fail point is a line in the code where a crash is most harmful (after an intent is written and
before the provider is called, after the provider acted and before the ledger knows). In
production it costs one dictionary look-up. The chaos suite (``tests/reliability``) sets
``ABP_FAILPOINTS`` to a comma-separated list of ``name`` or ``name=N`` entries: the process kills
itself with ``SIGKILL`` the N-th time (default: the first time) it reaches a named point, so that
nothing (no ``finally``, no ``on_kill``, no log flush) runs, exactly as under an OOM kill or a
lost node.

Every point used in the package is listed in :data:`FAILPOINTS`, so the suite can enumerate them
and a typo in either place is caught by a test.
"""

from __future__ import annotations

import os
import signal
from typing import Final

ENV_VAR: Final = "ABP_FAILPOINTS"

#: Every fail point in the package, with what has happened when it fires.
FAILPOINTS: Final[dict[str, str]] = {
    "prepare.after_upsert": "items are in the ledger, nothing is staged",
    "prepare.after_stage": "chunks are staged and their jobs recorded, nothing is submitted",
    "upload.after_upload": "the input file is at the provider, the ledger does not know its id",
    "submit.after_claim": "the job is claimed for its create, nothing is created",
    "submit.after_create": "the provider created the batch, the ledger does not know its id",
    "download.mid": "part of a result file is written to staging",
    "reconcile.mid": "part of a result file is applied to the ledger",
    "fallback.after_send": "a real-time request was answered, the answer is not recorded",
    "deliver.after_sink_commit": "a batch of rows is committed in the sink, the ledger does not know it",
    "consume.after_act": "a consumer acted on a hand-off, the ledger does not know it was acknowledged",
}

_hits: dict[str, int] = {}


def _armed() -> dict[str, int]:
    spec = os.environ.get(ENV_VAR, "")
    armed: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = entry.partition("=")
        armed[name] = int(count) if count else 1
    return armed


def failpoint(name: str) -> None:
    """Kill this process with ``SIGKILL`` if the chaos suite armed ``name`` and its count is reached.

    :param name: one of :data:`FAILPOINTS`
    :raises KeyError: ``name`` is not a declared fail point (a typo would silently never fire)
    """
    if name not in FAILPOINTS:
        raise KeyError(f"unknown fail point {name!r}; declare it in FAILPOINTS")
    if ENV_VAR not in os.environ:
        return
    target = _armed().get(name)
    if target is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= target:
        os.kill(os.getpid(), signal.SIGKILL)
