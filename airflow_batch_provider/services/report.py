"""The run's report: cost by route from the ledger, the failed and in-doubt batches, what was discarded.

A batch of a finished run harvested by this run (``late_harvest``) is priced here, once: its job,
items and attempts moved to this run before it was applied; the finished run's report is history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from airflow_batch_provider.core.cost import AttemptRecord
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.adoption import adopted_jobs
from airflow_batch_provider.ledger.extra_lines import iter_extra_lines
from airflow_batch_provider.ledger.inheritance import inherited as inherited_lines
from airflow_batch_provider.ledger.late_harvest import late_harvests
from airflow_batch_provider.ledger.prompt_changes import prompt_changed_section
from airflow_batch_provider.ledger.reads import review_counts
from airflow_batch_provider.ledger.stranded_attempts import stranded, stranded_records
from airflow_batch_provider.services.submit import IN_DOUBT
from airflow_batch_provider.settings import load_prices


def batch_pricer(
    provider: str, model: str, override: str | Mapping[str, Any] | None
) -> Callable[[Usage], Decimal]:
    """Return a function pricing one batch line's usage for ``model``.

    :param provider: adapter name
    :param model: model name
    :param override: pricing override (file path or dict)
    """
    from airflow_batch_provider.core.pricing import cost

    price = load_prices(override).price(provider, model)
    return lambda usage: cost(usage, price, "batch")


def extra_records(ledger: Ledger, workload: str, run_id: str) -> list[AttemptRecord]:
    """The run's billed lines beyond its items' answers, as discarded attempts with their reason.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    return [
        AttemptRecord(
            usage=row["usage"],
            mode="batch",
            discarded=True,
            reason=row["kind"],
            provider=row["provider"],
            model=row["model"],
        )
        for row in iter_extra_lines(ledger, workload, run_id)
    ]


def job_outcomes(ledger: Ledger, workload: str, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The run's jobs that did not simply complete: failed batches, in-doubt jobs, partial harvests.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    failed: list[dict[str, Any]] = []
    doubt: list[dict[str, Any]] = []
    incomplete: list[dict[str, Any]] = []
    for job in ledger.get_jobs(workload, run_id):
        entry = {
            "job_id": job.job_id,
            "round": job.round,
            "batch_id": job.batch_id,
            "lines": job.lines,
            "error": job.error,
        }
        if job.batch_state == "failed":
            failed.append(entry)
        if job.state == IN_DOUBT:
            doubt.append(entry)
        if job.batch_id and job.state not in ("downloaded", "reconciled") and job.state != "sync":
            incomplete.append({**entry, "state": job.state, "batch_state": job.batch_state})
    return {"failed_batches": failed, "in_doubt_jobs": doubt, "incomplete_jobs": incomplete}


def moved_section(title: str, rows: list[dict[str, Any]], line: Callable[[dict[str, Any]], str]) -> str:
    """The report table's lines for what this run took on from other runs (empty when nothing).

    :param title: the section's title
    :param rows: the moves (late harvests, adoptions, inheritances)
    :param line: one row's line
    """
    if not rows:
        return ""
    return f"\n{title}: {len(rows)}\n" + "\n".join(line(r) for r in rows)


def build_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    provider: str,
    pricing_override: str | Mapping[str, Any] | None,
    *,
    max_attempts: int | None = None,
) -> dict[str, Any]:
    """Compute the run's cost report from the ledger (JSON-safe dict, with a ``table`` text).

    Besides the cost (see :func:`~airflow_batch_provider.core.cost.compute_run_cost`), it lists
    the batches that ended ``failed``, the jobs still in doubt (nothing was created again for
    them; their items are in review), the jobs whose result files never came complete, and how
    many real-time requests may have been paid twice (sent, answer lost in a crash, sent again),
    and the size of the workload's open review queue as the run leaves it (``review_queue``).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param provider: provider name for pricing
    :param pricing_override: pricing override
    :param max_attempts: the attempts cap; with it, items sent through the real-time API after
        exhausting their batch attempts are their own route (``exhausted_sync`` in
        ``items_by_route``, and the ``exhausted_sync`` section with what they paid); without it
        every real-time item is route ``fallback``
    """
    from airflow_batch_provider.core.cost import DUPLICATE, ItemCostRecord, compute_run_cost
    from airflow_batch_provider.services.fallback import POSSIBLY_PAID_TWICE

    paid_twice = 0
    exhausted: list[tuple[str, Usage, str]] = []  # (app_id, usage of its real-time answers, model)

    def attempt_record(a: Mapping[str, Any], resend: Usage | None) -> AttemptRecord:
        if a["mode"] == "sync" and a["error_code"] == POSSIBLY_PAID_TWICE:
            # Sent, answered, and the answer lost in a crash: the provider billed it, and the usage
            # is unknown. It is priced as the resend of the same request was (the closest figure
            # there is), as a paid and discarded duplicate, never as free.
            return AttemptRecord(usage=resend or a["usage"], mode="sync", discarded=True, reason=DUPLICATE)
        return AttemptRecord(
            usage=a["usage"],
            mode=a["mode"],
            discarded=a["discarded"],
            # A discarded success (a late or second answer for an item that already had one) is
            # paid twice; the same work done synchronously would be paid once.
            reason=(DUPLICATE if a["outcome"] == "succeeded" else a["error_code"])
            if a["discarded"]
            else None,
        )

    def records() -> Iterator[ItemCostRecord]:
        nonlocal paid_twice
        for row in ledger.iter_cost_rows(workload, run_id):
            batch_tries = sum(1 for a in row["attempts"] if a["mode"] == "batch" and not a["discarded"])
            route = row["route"]
            if max_attempts is not None and route == "fallback" and batch_tries >= max_attempts:
                # sent real-time because its batch attempts ran out, not because of the deadline
                route = "exhausted_sync"
                for a in row["attempts"]:
                    if a["mode"] == "sync":
                        exhausted.append((row["app_id"], a["usage"], row["model"]))
            lost = [
                a for a in row["attempts"] if a["mode"] == "sync" and a["error_code"] == POSSIBLY_PAID_TWICE
            ]
            paid_twice += len(lost)
            resend = next(
                (
                    a["usage"]
                    for a in reversed(row["attempts"])
                    if a["mode"] == "sync"
                    and a["outcome"] == "succeeded"
                    and a["error_code"] != POSSIBLY_PAID_TWICE
                ),
                None,
            )
            attempts = tuple(attempt_record(a, resend if lost else None) for a in row["attempts"])
            route = route or ("resubmitted" if sum(1 for a in attempts if a.mode == "batch") > 1 else "batch")
            yield ItemCostRecord(
                app_id=row["app_id"],
                state=row["state"],
                route=route,  # type: ignore[arg-type]
                provider=provider,
                model=row["model"],
                attempts=attempts,
                last_usage=row["last_usage"],
            )

    from airflow_batch_provider.services.vllm_report import infrastructure_cost, self_hosted_section

    prices = load_prices(pricing_override)
    infra = infrastructure_cost(ledger, workload, run_id)
    # billed lines beyond the items' answers, and the answers of items a dead run kept (stranded)
    extra = [*extra_records(ledger, workload, run_id), *stranded_records(ledger, workload, run_id)]
    report = compute_run_cost(records(), prices, infrastructure_cost=infra, extra_lines=extra)
    out = report.to_dict()
    jobs = job_outcomes(ledger, workload, run_id)
    table = report.render_table()
    # Self-hosted (vLLM) jobs: GPU time per job, beside the same tokens at provider batch prices.
    hosted = self_hosted_section(ledger, workload, run_id, report.usage, report.items, prices)
    if hosted is not None:
        out["self_hosted"] = hosted
        table += "\n" + hosted["table"]
    for title, key in (
        ("failed batches", "failed_batches"),
        ("jobs in doubt (never created again; items in review)", "in_doubt_jobs"),
        ("jobs whose result files never came complete", "incomplete_jobs"),
    ):
        if jobs[key]:
            lines = [f"  {j['job_id']} batch {j['batch_id']}: {j['error'] or '-'}" for j in jobs[key]]
            table += f"\n{title}: {len(jobs[key])}\n" + "\n".join(lines)
    late = late_harvests(ledger, workload, run_id)
    # an earlier, finished run's batch (resolved after its publish): priced here, once
    table += moved_section(
        "late_harvest (batches of finished runs harvested and priced by this run)",
        late,
        lambda j: f"  {j['job_id']} batch {j['batch_id']} of run {j['from_run']}: {j['items']} items",
    )
    adopted = adopted_jobs(ledger, workload, run_id)
    # a dead run's jobs in flight, taken up by this run after it took the workload over
    table += moved_section(
        "adopted (jobs in flight of dead runs whose workload this run took over)",
        adopted,
        lambda j: f"  {j['job_id']} batch {j['batch_id'] or '-'} of run {j['from_run']}: {j['items']} items",
    )
    inherited = inherited_lines(ledger, workload, run_id)
    # what a dead run harvested and never reported, taken on with its workload: priced here, once
    table += moved_section(
        "inherited (harvested and never reported by dead runs whose workload this run took over)",
        inherited,
        lambda j: (
            f"  run {j['from_run']}: {j['attempts']} answers, {j['extra_lines']} other lines, {j['items']} items"
        ),
    )
    left = stranded(ledger, workload, run_id)
    # a dead run's billed answers whose items stay with it (fallback, no longer in the input)
    table += moved_section(
        "stranded (billed answers of items left with dead runs whose workload this run took over)",
        left,
        lambda j: f"  run {j['from_run']}: {j['attempts']} answers, jobs {', '.join(j['jobs'])}",
    )
    if paid_twice:
        table += (
            f"\nreal-time requests possibly paid twice: {paid_twice} (a crash lost the answer after the "
            "provider was called; the item was sent again)"
        )
    if exhausted:
        from airflow_batch_provider.core.pricing import cost

        paid = sum((cost(u, prices.price(provider, m), "sync") for _, u, m in exhausted), Decimal(0))
        items = len({app_id for app_id, _, _ in exhausted})
        out["exhausted_sync"] = {"items": items, "paid": str(paid)}
        table += (
            f"\nexhausted_sync (batch attempts exhausted, then the real-time API): {items} items, "
            f"${paid.quantize(Decimal('0.000001'))} (route exhausted_sync above; paid as fallback)"
        )
    else:
        out["exhausted_sync"] = {"items": 0, "paid": "0"}
    out.update(jobs)
    out["late_harvest"] = late
    out["adopted"] = adopted
    out["inherited"] = inherited
    out["stranded"] = left
    out["possibly_paid_twice"] = paid_twice
    out["prompt_changed"] = prompt_changed_section(ledger, workload, run_id)
    if out["prompt_changed"]["items"]:
        edits = out["prompt_changed"]["edits"]
        table += (
            "\nprompt_changed (sent and paid again: the prompt's content changed under the same version): "
        )
        table += f"{out['prompt_changed']['items']} items\n" + "\n".join(
            f"  {e['prompt_version']}: sha256 {e['previous_sha256'][:12]} -> {e['sha256'][:12]}: {e['items']} items "
            "(bump `version` to keep old answers comparable)"
            for e in edits
        )
    out["table"] = table
    out["states"] = ledger.count_states(workload, run_id)
    # the workload's open review queue as this run leaves it (every run's items, as the review page
    # counts them): the page's trend draws it from the report, which pruning keeps
    out["review_queue"] = sum(review_counts(ledger, workload).values())
    return out
