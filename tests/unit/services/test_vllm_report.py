"""The self-hosted section of the cost report, from the ledger's infrastructure cost rows."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from airflow_batch_provider.core.pricing import PriceTable
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.vllm_pod_outcome import gpu_cost_nusd
from airflow_batch_provider.services.vllm_report import infrastructure_cost, self_hosted_section


def row(job: str, seconds: int, outcome: str = "completed") -> dict[str, object]:
    return {
        "job_id": job,
        "workload": "w",
        "run_id": "r",
        "pod_name": f"pod-{job}",
        "gpu_type": "H100",
        "gpu_count": 2,
        "gpu_seconds": seconds,
        "usd_per_gpu_hour_micros": 3_600_000,
        "cost_nusd": gpu_cost_nusd(seconds, 2, 3.6),
        "outcome": outcome,
        "reason": None if outcome == "completed" else "oom_killed",
    }


def test_gpu_seconds_times_gpus_times_the_hourly_rate_is_the_cost() -> None:
    assert gpu_cost_nusd(3600, 1, 2.5) == 2_500_000_000
    assert gpu_cost_nusd(1, 2, 3.6) == 2_000_000  # 2 GPU-seconds at $0.001 each


def test_a_rerun_pod_task_replaces_its_job_s_row_and_the_section_sums_every_job(tmp_path: Path) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'l.sqlite'}")
    assert self_hosted_section(ledger, "w", "r", Usage(), 0, PriceTable.load()) is None
    ledger.record_infra_cost(row("j1", 100))
    ledger.record_infra_cost(row("j1", 50, "failed"))  # the same job again: replaced, not added
    ledger.record_infra_cost(row("j2", 10))
    assert infrastructure_cost(ledger, "w", "r") == Decimal(gpu_cost_nusd(60, 2, 3.6)) / 10**9
    section = self_hosted_section(ledger, "w", "r", Usage(1_000_000, 100_000), 1000, PriceTable.load())
    assert section is not None
    assert section["gpu_seconds"] == 120
    assert [j["outcome"] for j in section["jobs"]] == ["failed", "completed"]
    assert "oom_killed" in section["table"]
    assert all(q["usd"] > 0 for q in section["provider_batch_equivalent"])
