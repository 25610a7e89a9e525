"""The self-hosted part of a run's cost report: GPU time per job, beside provider batch prices.

No Airflow or Kubernetes import: the publish step calls this for every run, and it returns
nothing for a run without self-hosted jobs.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from airflow_batch_provider.adapters.registry import compare_models
from airflow_batch_provider.core.gpu_planner import provider_quotes
from airflow_batch_provider.core.pricing import PriceTable, format_usd
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import Ledger

NANO: Decimal = Decimal(10**9)


def infrastructure_cost(ledger: Ledger, workload: str, run_id: str) -> Decimal:
    """USD of GPU time recorded for the run's self-hosted jobs (0 if none).

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run id
    """
    return sum((Decimal(r["cost_nusd"]) for r in ledger.infra_costs(workload, run_id)), Decimal(0)) / NANO


def self_hosted_section(
    ledger: Ledger, workload: str, run_id: str, usage: Usage, items: int, prices: PriceTable
) -> dict[str, Any] | None:
    """GPU time and cost per job, and what the run's tokens would cost at each provider's batch price.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run id
    :param usage: the run's tokens (every attempt)
    :param items: the run's items
    :param prices: the price table
    """
    rows = ledger.infra_costs(workload, run_id)
    if not rows:
        return None
    total = sum((Decimal(r["cost_nusd"]) for r in rows), Decimal(0)) / NANO
    gpu_seconds = sum(int(r["gpu_seconds"]) * int(r["gpu_count"]) for r in rows)
    jobs = [
        {
            "job_id": r["job_id"],
            "pod": r["pod_name"],
            "gpu": f"{r['gpu_count']} x {r['gpu_type']}",
            "gpu_seconds": int(r["gpu_seconds"]) * int(r["gpu_count"]),
            "usd_per_gpu_hour": str(Decimal(r["usd_per_gpu_hour_micros"]) / Decimal(10**6)),
            "cost_usd": str(Decimal(r["cost_nusd"]) / NANO),
            "outcome": r["outcome"],
            "reason": r["reason"],
        }
        for r in rows
    ]
    quotes = provider_quotes(usage, items, prices, compare_models())
    lines = [
        f"self-hosted GPU time: {gpu_seconds:,} GPU-seconds in {len(rows)} pod(s), {format_usd(total, 4)}"
    ]
    lines += [
        f"  {j['job_id']}: {j['gpu_seconds']} GPU-s x ${j['usd_per_gpu_hour']}/h = ${j['cost_usd']} ({j['outcome']}"
        + (f", {j['reason']})" if j["reason"] else ")")
        for j in jobs
    ]
    lines.append(f"same {usage.total_tokens:,} tokens at provider batch prices:")
    lines += [f"  {q.provider:<10} {q.model:<20} {format_usd(Decimal(str(q.total_usd)), 4)}" for q in quotes]
    return {
        "gpu_seconds": gpu_seconds,
        "infrastructure_usd": str(total),
        "jobs": jobs,
        "provider_batch_equivalent": [
            {"provider": q.provider, "model": q.model, "usd": q.total_usd, "usd_per_item": q.usd_per_item}
            for q in quotes
        ],
        "table": "\n".join(lines),
    }
