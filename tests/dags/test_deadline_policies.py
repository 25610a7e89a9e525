"""Each deadline policy under ``airflow dags test``, against the emulator, with the deadline mid-batch.

The emulator, not the clock, keeps the deadline mid-batch: the one batch of 30 items is stuck
(fault ``stuck_batches`` with ``stuck_after_fraction``): it finishes half its items within a few
seconds and then stays ``in_progress`` until it is cancelled, however slowly the machine starts
Airflow, the lease, prepare and submit. The DAG's deadline, 40 seconds after the run starts, so
always falls while the batch is running with some items done. Then the batch is cancelled and
harvested, and the policy decides the rest. For every policy: each item ends in exactly one final state and route,
every attempt that was paid for is in the report (nothing paid twice without being counted), and
the policy's own outcome shows: fallback items at full price, pending items reported as pending,
skipped items as skipped.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.money import from_nusd, to_nusd
from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.faults import FaultConfig
from tests.support.airflow_run import openai_dag_env, run_airflow

# ``airflow dags test`` of a 40 s deadline runs about a minute alone; the bounds below only guard
# against a hang (seen: 300 s passed under two CPU burners and other work, the run itself a success)
pytestmark = [pytest.mark.airflow_e2e, pytest.mark.timeout(900)]
DAGS_TEST_TIMEOUT_S = 840

ITEMS = 30
DAG_FILE = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import DeadlineOptions, FallbackLimits
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group

PROMPT = PromptTemplate(
    version="v1",
    model="gpt-4o-mini",
    system="Summarise the customer comment in five words.",
    user="Comment {{{{ id }}}}: {{{{ text }}}}",
    params={{"max_tokens": 24}},
)


def records(context):
    for i in range({items}):
        yield {{"id": f"c{{i:03d}}", "text": f"the parcel number {{i}} arrived late but intact"}}


with DAG(dag_id="deadline_{policy}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    batch_inference_group(
        workload="deadline_{policy}",
        records=records,
        prompt=PROMPT,
        batch_conn_id="openai_batch_default",
        max_attempts=2,
        deadline=DeadlineOptions("PT{deadline_s}S", "{policy}", harvest_timeout_s=30),
        fallback=FallbackLimits(rpm=600, tpm=200000, concurrency=8),
        deferrable=False,
    )
"""


def _run_dag(policy: str, airflow_home: dict[str, str], tmp_path: Path) -> tuple[Ledger, str]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"deadline_{policy}.py").write_text(
        textwrap.dedent(DAG_FILE.format(policy=policy, items=ITEMS, deadline_s=40)), encoding="utf-8"
    )
    config = EmulatorConfig(
        time_scale=1.0,
        timings=Timings(validating_s=1.0, in_progress_s=6.0, finalizing_s=1.0, cancelling_s=2.0),
        faults=FaultConfig(stuck_batches=(0,), stuck_after_fraction=0.5),
    )
    polling = {"poll_initial_interval": "0.5", "poll_factor": "1.2", "poll_max_interval": "2"}
    with openai_dag_env(airflow_home, tmp_path, config, dags=dags, password="sk-test", **polling) as (_, env):
        ledger_url = env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"]
        try:
            result = run_airflow(env, "dags", "test", f"deadline_{policy}", timeout=DAGS_TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            # the partial output of a timed-out run is bytes whatever ``text`` says
            partial = b"".join(o for o in (exc.stdout, exc.stderr) if isinstance(o, bytes)).decode(
                errors="replace"
            )
            (tmp_path / "dags_test.log").write_text(partial, encoding="utf-8")
            raise AssertionError(f"airflow dags test ran past {exc.timeout} s:\n{partial[-6000:]}") from exc
    log = result.stdout + result.stderr
    (tmp_path / "dags_test.log").write_text(log, encoding="utf-8")
    assert result.returncode == 0, log[-6000:]
    ledger = Ledger.from_url(ledger_url)
    runs = ledger.runs(f"deadline_{policy}")
    assert len(runs) == 1, log[-3000:]
    return ledger, str(runs[0]["run_id"])


def _attempts(ledger: Ledger, workload: str) -> list[dict[str, Any]]:
    from sqlalchemy import select

    with ledger.engine.connect() as conn:
        rows = conn.execute(select(s.attempts).where(s.attempts.c.workload == workload)).mappings()
        return [dict(r) for r in rows]


def _report(tmp_path: Path, workload: str) -> dict[str, Any]:
    found = list((tmp_path / "staging").rglob("report.json"))
    assert len(found) == 1, found
    report: dict[str, Any] = json.loads(found[0].read_text(encoding="utf-8"))
    assert workload in str(found[0])
    return report


def _results(tmp_path: Path) -> list[dict[str, Any]]:
    (path,) = list((tmp_path / "staging").rglob("results.jsonl"))
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _check_common(ledger: Ledger, workload: str, run_id: str, tmp_path: Path) -> dict[str, Any]:
    """Every item in one final state and route; every paid attempt is in the report."""
    states = ledger.count_states(workload, run_id)
    assert sum(states.values()) == ITEMS
    assert not set(states) & {"staged", "submitted", "fallback", "failed_retryable", "cancelled"}, states
    results = _results(tmp_path)
    assert sorted(r["id"] for r in results) == [f"c{i:03d}" for i in range(ITEMS)]
    attempts = _attempts(ledger, workload)
    # Each item has at most one usable (non-discarded, succeeded) attempt: never paid twice unseen.
    usable: dict[tuple[str, str], int] = {}
    for a in attempts:
        if a["outcome"] == "succeeded" and not a["discarded"]:
            key = (a["item_key"], a["prompt_version"])
            usable[key] = usable.get(key, 0) + 1
    assert all(n == 1 for n in usable.values()), usable
    report = _report(tmp_path, workload)
    paid_in_ledger = from_nusd(sum(int(a["cost_nusd"] or 0) for a in attempts))
    assert Decimal(report["paid"]) == pytest.approx(paid_in_ledger, abs=Decimal("1e-8"))
    assert report["items"] == ITEMS
    assert sum(report["items_by_state"].values()) == ITEMS
    # The deadline fell mid-batch: the batch finished some items and was cancelled for the rest.
    jobs = ledger.get_jobs(workload, run_id)
    assert jobs and jobs[0].batch_state == "cancelled", jobs
    batch_done = sum(
        1 for a in attempts if a["mode"] == "batch" and a["outcome"] == "succeeded" and not a["discarded"]
    )
    assert 0 < batch_done < ITEMS, (batch_done, states)
    assert sum(1 for a in attempts if a["outcome"] == "cancelled") == ITEMS - batch_done
    return {"states": states, "report": report, "attempts": attempts, "batch_done": batch_done}


def test_sync_fallback_finishes_every_item_and_prices_the_fallback_at_full_price(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    ledger, run_id = _run_dag("sync_fallback", airflow_home, tmp_path)
    out = _check_common(ledger, "deadline_sync_fallback", run_id, tmp_path)
    assert out["states"] == {"succeeded": ITEMS}
    routes = ledger.count_routes("deadline_sync_fallback", run_id)
    fallback = routes.get(("succeeded", "fallback"), 0)
    assert (
        fallback == ITEMS - out["batch_done"] and routes.get(("succeeded", "batch"), 0) == out["batch_done"]
    )
    price = PriceTable.load().price("openai", "gpt-4o-mini")
    sync = [a for a in out["attempts"] if a["mode"] == "sync"]
    assert len(sync) == fallback
    for a in sync:
        usage = Usage(
            a["input_tokens"], a["output_tokens"], a["cached_input_tokens"], a["cache_write_tokens"]
        )
        assert a["cost_nusd"] == to_nusd(cost(usage, price, "sync")) > to_nusd(cost(usage, price, "batch"))
    report = out["report"]
    assert report["items_by_route"]["fallback"] == fallback
    assert Decimal(report["paid_by_kind"]["fallback"]) > 0


def test_publish_pending_reports_the_unfinished_items_as_pending(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    ledger, run_id = _run_dag("publish_pending", airflow_home, tmp_path)
    out = _check_common(ledger, "deadline_publish_pending", run_id, tmp_path)
    assert out["states"] == {"succeeded": out["batch_done"], "pending": ITEMS - out["batch_done"]}
    assert not [a for a in out["attempts"] if a["mode"] == "sync"]
    assert out["report"]["items_by_state"]["pending"] == ITEMS - out["batch_done"]
    pending = [r for r in _results(tmp_path) if r["state"] == "pending"]
    assert len(pending) == ITEMS - out["batch_done"] and all(r["output"] is None for r in pending)


def test_skip_reports_the_unfinished_items_as_skipped(airflow_home: dict[str, str], tmp_path: Path) -> None:
    ledger, run_id = _run_dag("skip", airflow_home, tmp_path)
    out = _check_common(ledger, "deadline_skip", run_id, tmp_path)
    assert out["states"] == {"succeeded": out["batch_done"], "skipped": ITEMS - out["batch_done"]}
    assert not [a for a in out["attempts"] if a["mode"] == "sync"]
    assert out["report"]["items_by_state"]["skipped"] == ITEMS - out["batch_done"]
    assert sum(1 for r in _results(tmp_path) if r["state"] == "skipped") == ITEMS - out["batch_done"]
