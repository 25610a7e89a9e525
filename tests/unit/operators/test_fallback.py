"""``BatchSyncFallbackOperator`` in real processes: killed between the provider's answer and the ledger.

The emulator's own count of real-time requests is the truth the ledger's ``possibly_paid_twice``
is checked against.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.options import FallbackLimits
from airflow_batch_provider.core.ratelimit import RetryPolicy
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.operators.fallback import BatchSyncFallbackOperator
from airflow_batch_provider.services.fallback import FallbackSettings, possibly_paid_twice
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator

WORKLOAD = "wl"
RUN = "scheduled__2026-11-30T06:00:00+00:00"
PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", params={"max_tokens": 16})
ITEMS = 6
REPO = Path(__file__).resolve().parents[3]

# The task as a worker runs it: the operator's execute in its own process.
TASK = """
import json, sys
from airflow_batch_provider.core.options import FallbackLimits
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.operators.fallback import BatchSyncFallbackOperator
prompt = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", params={"max_tokens": 16})
op = BatchSyncFallbackOperator(
    task_id="sync_fallback", workload="wl", batch_conn_id="emu", prompt=prompt, limits=FallbackLimits(concurrency=1)
)
print(json.dumps(op.execute({"run_id": sys.argv[1]})))
"""


@pytest.fixture
def emulator() -> Iterator[str]:
    with run_emulator(EmulatorConfig(time_scale=0.05)) as url:
        yield url


def sync_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/_emulator/stats", timeout=10) as resp:
        return int(json.loads(resp.read())["sync_requests"])


def run_task(env: dict[str, str], failpoints: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**env, "ABP_FAILPOINTS": failpoints} if failpoints else env
    return subprocess.run(
        [sys.executable, "-c", TASK, RUN],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_fallback_killed_after_an_answer_resumes_and_counts_the_double_payment_the_provider_saw(
    tmp_path: Path, emulator: str
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ledger = Ledger.from_url(url)
    ledger.start_run(WORKLOAD, RUN, "openai", PROMPT.model)
    ledger.upsert_items(
        WORKLOAD,
        RUN,
        [
            PreparedItem(item_key(f"c{i}"), PROMPT.render({"id": f"c{i}", "text": f"comment {i}"}))
            for i in range(ITEMS)
        ],
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": url,
        "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT": f"file://{tmp_path / 'staging'}",
        "AIRFLOW_CONN_EMU": json.dumps(
            {"conn_type": "openai_batch", "host": f"{emulator}/v1", "password": "k"}
        ),
    }
    env.pop("ABP_FAILPOINTS", None)

    killed = run_task(env, "fallback.after_send=3")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert sync_requests(emulator) == 3
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": 2, "fallback": 1, "pending": ITEMS - 3}

    resumed = run_task(env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": ITEMS}
    paid_twice = sync_requests(emulator) - ITEMS
    assert paid_twice == 1
    assert summary["possibly_paid_twice"] == paid_twice == possibly_paid_twice(ledger, WORKLOAD, RUN)
    # The report prices the lost answer (the provider billed it) like its resend: paid, discarded.
    from airflow_batch_provider.services.report import build_report

    with urllib.request.urlopen(f"{emulator}/_emulator/record", timeout=10) as resp:
        record = json.loads(resp.read())
    billed = [entry["usage"] for entry in record["realtime"]["openai"]]
    assert len(billed) == ITEMS + 1
    report = build_report(ledger, WORKLOAD, RUN, "openai", None)
    assert report["possibly_paid_twice"] == 1
    assert report["usage"]["input_tokens"] == sum(u["input_tokens"] for u in billed)
    assert report["usage"]["output_tokens"] == sum(u["output_tokens"] for u in billed)


def test_the_settings_come_from_the_arguments_then_the_connection_then_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extras = {"rpm_limit": 60, "tpm_limit": 9000, "rate_headroom": 0.75, "tpm_output": "actual"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KEYED", json.dumps({"conn_type": "openai_batch", "password": "k", "extra": extras})
    )
    monkeypatch.setenv("AIRFLOW_CONN_PLAIN", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__FALLBACK_HEADROOM", "0.5")
    given = BatchSyncFallbackOperator(
        task_id="f",
        workload=WORKLOAD,
        batch_conn_id="keyed",
        prompt=PROMPT,
        limits=FallbackLimits(rpm=10, tpm=1000, concurrency=2),
    )
    assert replace(given.settings(), retry=RetryPolicy()) == FallbackSettings(
        10, 1000, 2, headroom=0.75, output_charge="actual", quota_key="keyed"
    )
    from_conn = BatchSyncFallbackOperator(
        task_id="f", workload=WORKLOAD, batch_conn_id="keyed", prompt=PROMPT
    )
    assert (from_conn.settings().rpm, from_conn.settings().tpm) == (60, 9000)
    from_config = BatchSyncFallbackOperator(
        task_id="f", workload=WORKLOAD, batch_conn_id="plain", prompt=PROMPT
    )
    assert (from_config.settings().headroom, from_config.settings().quota_key) == (0.5, "plain")


def test_a_dag_caps_the_real_time_tries_of_an_item_through_its_fallback_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_C", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    # the one retry cap a DAG could not set: batch_inference_group(fallback=...) reaches every
    # real-time sender (the deadline's fallback, exhausted="sync", below-minimum chunks)
    capped = BatchSyncFallbackOperator(
        task_id="f",
        workload=WORKLOAD,
        batch_conn_id="c",
        prompt=PROMPT,
        limits=FallbackLimits(rpm=10, tpm=1000, attempts=2),
        retry=RetryPolicy(max_attempts=7, initial_delay=0.5),
    )
    assert capped.settings().retry == RetryPolicy(max_attempts=2, initial_delay=0.5)
    plain = BatchSyncFallbackOperator(
        task_id="f",
        workload=WORKLOAD,
        batch_conn_id="c",
        prompt=PROMPT,
        limits=FallbackLimits(rpm=10, tpm=1000),
    )
    assert plain.settings().retry == RetryPolicy()
    assert FallbackLimits.from_dict(FallbackLimits(attempts=2).to_dict()) == FallbackLimits(attempts=2)
    assert FallbackLimits.from_dict({"rpm": 5}) == FallbackLimits(rpm=5)  # a dict stored before the field
    with pytest.raises(ConfigurationError, match=r"FallbackLimits\(attempts=0\)"):
        FallbackLimits(attempts=0)


def test_the_old_name_still_imports_and_warns_that_it_is_deprecated() -> None:
    from airflow_batch_provider.operators import fallback

    with pytest.warns(DeprecationWarning, match="BatchSyncFallbackOperator"):
        old = fallback.SyncFallbackOperator
    assert old is BatchSyncFallbackOperator


def test_every_operator_of_the_package_is_named_batch_verb_operator() -> None:
    import inspect
    import pkgutil

    from airflow.sdk import BaseOperator

    import airflow_batch_provider.operators as package

    names = {
        name
        for info in pkgutil.iter_modules(package.__path__)
        for name, obj in inspect.getmembers(importlib.import_module(f"{package.__name__}.{info.name}"))
        if inspect.isclass(obj)
        and issubclass(obj, BaseOperator)
        and obj.__module__.startswith(package.__name__)
    }
    # the self-hosted lane's pod task keeps the engine's name first (``VllmBatchPodOperator``),
    # the way the cncf provider names its pod operators by what runs in the pod
    assert names and [n for n in sorted(names) if not re.fullmatch(r"(Vllm)?Batch[A-Z]\w*Operator", n)] == []


def seeded_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: str, extra: dict[str, object]
) -> Ledger:
    """A ledger with ``ITEMS`` open items and the environment of an in-process fallback task."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", url)
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", f"file://{tmp_path / 'staging'}")
    conn = {"conn_type": "openai_batch", "host": f"{emulator}/v1", "password": "k", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_EMU", json.dumps(conn))
    ledger = Ledger.from_url(url)
    ledger.start_run(WORKLOAD, RUN, "openai", PROMPT.model)
    ledger.upsert_items(
        WORKLOAD,
        RUN,
        [
            PreparedItem(item_key(f"c{i}"), PROMPT.render({"id": f"c{i}", "text": f"comment {i}"}))
            for i in range(ITEMS)
        ],
    )
    return ledger


def fallback_task(**kw: Any) -> BatchSyncFallbackOperator:
    return BatchSyncFallbackOperator(
        task_id="sync_fallback", workload=WORKLOAD, batch_conn_id="emu", prompt=PROMPT, **kw
    )


def test_the_deadline_fallback_over_the_budget_sends_nothing_and_skips_its_items_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: str
) -> None:
    from airflow_batch_provider.core.options import BudgetOptions

    ledger = seeded_ledger(tmp_path, monkeypatch, emulator, {})
    out = fallback_task(budget=BudgetOptions(budget_usd="0.0000001")).execute({"run_id": RUN})  # type: ignore[arg-type]
    assert sync_requests(emulator) == 0
    assert out["refused"] == ITEMS and Decimal(out["needed"]) > Decimal("0.0000001")
    assert ledger.count_states(WORKLOAD, RUN) == {"skipped": ITEMS}
    rows = list(ledger.iter_items(WORKLOAD, RUN, columns=["error_code", "error_message"]))
    assert {r["error_code"] for r in rows} == {"over_budget"}
    assert all(
        "budget of $1E-7" in r["error_message"] or "budget of $0.0000001" in r["error_message"] for r in rows
    )


def test_the_deadline_fallback_told_to_win_over_the_budget_sends_and_shows_the_overrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: str
) -> None:
    from airflow_batch_provider.core.options import BudgetOptions

    ledger = seeded_ledger(tmp_path, monkeypatch, emulator, {})
    task = fallback_task(budget=BudgetOptions(budget_usd="0.0000001"), over_budget="send")
    out = task.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert sync_requests(emulator) == ITEMS
    assert ledger.count_states(WORKLOAD, RUN) == {"succeeded": ITEMS}
    assert Decimal(out["over_budget_by"]) > 0


def test_the_deadline_fallback_over_the_budget_is_a_budget_alert_like_every_real_time_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: str
) -> None:
    from airflow_batch_provider.core.options import BudgetOptions
    from airflow_batch_provider.notifications import BatchAlerts, BatchEvent

    told: list[BatchEvent] = []
    seeded_ledger(tmp_path, monkeypatch, emulator, {})
    alerts = BatchAlerts(notifiers=[lambda context, event: told.append(event)])
    task = fallback_task(budget=BudgetOptions(budget_usd="0.0000001"), alerts=alerts)
    out = task.execute({"run_id": RUN})  # type: ignore[arg-type]
    assert out["refused"] == ITEMS and sync_requests(emulator) == 0
    assert [e.kind for e in told] == ["budget_refused"]
    assert told[0].details["items"] == ITEMS and Decimal(told[0].details["needed"]) > Decimal("0.0000001")
    assert "The items are in skipped" in told[0].message  # where the fallback's refused items went
