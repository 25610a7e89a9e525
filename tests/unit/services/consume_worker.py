"""One try of a consumer in its own process (a fail point can kill it): ``ledger_url workload run_id log``.

The consumer appends each hand-off's key to ``log`` and syncs it before returning: the external
system's record of what it was asked, which a SIGKILL right after the call does not undo.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow_batch_provider.ledger.handoffs import HandOff
from airflow_batch_provider.ledger.store import Ledger
from airflow_batch_provider.services.consumers import consume
from airflow_batch_provider.sinks.consumer import Consumer

CONSUMER = "tickets"


def appender(log: Path) -> Consumer:
    """A consumer that records each key it is handed in ``log``, one line per call."""

    def act(handoff: HandOff) -> None:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"{handoff.app_id} {handoff.key}\n")
            fh.flush()
            os.fsync(fh.fileno())

    return Consumer(CONSUMER, act, page_size=2)


if __name__ == "__main__":
    url, workload, run_id, log = sys.argv[1:5]
    ledger = Ledger.from_url(url)
    print(consume(ledger, workload, run_id, appender(Path(log))).as_dict())
    ledger.engine.dispose()
