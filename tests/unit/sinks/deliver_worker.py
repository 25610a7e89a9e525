"""One delivery of the sink tests in its own process (a fail point can kill it): ``ledger_url workload run_id``."""

from __future__ import annotations

import sys

from airflow_batch_provider.ledger.store import Ledger
from airflow_batch_provider.services.delivery import deliver
from tests.unit.sinks.target import tickets_sink

if __name__ == "__main__":
    url, workload, run_id = sys.argv[1:4]
    counts = deliver(Ledger.from_url(url), workload, run_id, tickets_sink())
    print(counts.as_dict())
