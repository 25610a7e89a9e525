"""Metrics reach a real StatsD socket through Airflow's own Stats client, with the names documented."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

EMIT = """
import json, sys
from airflow_batch_provider import metrics
report = json.loads(sys.argv[1])
metrics.record_run(report, workload="feedback", provider="openai")
metrics.record_batch("completed", workload="feedback", provider="openai")
metrics.record_batch("Failed/odd state", workload="feedback", provider="openai")
metrics.record_poll_error("ReadTimeout", workload="feedback", provider="openai")
metrics.record_fallback_request(200, workload="feedback", provider="openai")
metrics.record_fallback_request(429, workload="feedback", provider="openai")
metrics.record_alert("batch_in_doubt")
metrics.record_run({"items_by_state": {"succeeded": "not a number"}, "paid": "n/a"}, workload="w", provider=None)
print("done")
"""

REPORT = {
    "items_by_state": {"succeeded": 90, "review": 10, "skipped": 0},
    "items_by_route": {"batch": 95, "fallback": 5},
    "paid": "1.234567",
    "usage": {"input_tokens": 5000, "output_tokens": 700, "cached_input_tokens": 0, "cache_write_tokens": 0},
    "cost_per_usable_result": "0.0137174",
    "savings": "1.2",
}


def test_each_metric_reaches_statsd_under_its_documented_name() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(1.0)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sock.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    try:
        result = subprocess.run(
            [sys.executable, "-c", EMIT, json.dumps(REPORT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        lines: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                lines.extend(sock.recv(65535).decode().splitlines())
            except TimeoutError:
                break
    finally:
        sock.close()

    got = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in lines}
    p = "airflow.batch_provider"
    assert got[f"{p}.items.succeeded"] == "90|c"
    assert got[f"{p}.items.review"] == "10|c"
    assert f"{p}.items.skipped" not in got  # nothing to count
    assert got[f"{p}.routes.fallback"] == "5|c"
    assert got[f"{p}.cost.micro_usd"] == "1234567|c"
    assert got[f"{p}.tokens.input"] == "5000|c" and got[f"{p}.tokens.output"] == "700|c"
    assert got[f"{p}.run.cost_per_usable_result"] == "0.0137174|g"
    assert got[f"{p}.batches.completed"] == "1|c"
    assert got[f"{p}.batches.failed_odd_state"] == "1|c"
    assert got[f"{p}.poll_errors"] == "1|c"
    assert got[f"{p}.fallback.rate_limited"] == "1|c"
    assert got[f"{p}.alerts.batch_in_doubt"] == "1|c"
    assert sum(1 for line in lines if line.startswith(f"{p}.fallback.requests:")) == 2
