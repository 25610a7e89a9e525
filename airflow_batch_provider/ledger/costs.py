"""The ledger's costs room: what a run's attempts and self-hosted jobs cost, and the run's published results.

Money is integer nano-dollars in the tables (:mod:`airflow_batch_provider.core.money`); the
readers here give dollars or plain rows for the cost report.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.engine import RowMapping

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.money import from_nusd
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.bulk import chunks, pair_filter
from airflow_batch_provider.ledger.item_reads import ItemReadRoom


class CostRoom(ItemReadRoom):
    """Costs and the published results (a room of :class:`~airflow_batch_provider.ledger.Ledger`).

    It reads the run's items through :class:`~airflow_batch_provider.ledger.item_reads.ItemReadRoom`.
    """

    def record_infra_cost(self, row: Mapping[str, Any]) -> None:
        """Record (or replace) the infrastructure cost of one self-hosted job.

        :param row: the ``abp_infra_costs`` columns (``job_id``, ``workload``, ``run_id``,
            ``gpu_count``, ``gpu_seconds``, ``usd_per_gpu_hour_micros``, ``cost_nusd``, ``outcome`` ...)
        """
        with self.engine.begin() as conn:
            conn.execute(s.infra_costs.delete().where(s.infra_costs.c.job_id == row["job_id"]))
            conn.execute(s.infra_costs.insert().values(**row))

    def infra_costs(self, workload: str, run_id: str) -> list[dict[str, Any]]:
        """Return the infrastructure cost rows of a run, by job id.

        :param workload: the workload
        :param run_id: the run id
        """
        query = (
            select(s.infra_costs)
            .where(s.infra_costs.c.workload == workload, s.infra_costs.c.run_id == run_id)
            .order_by(s.infra_costs.c.job_id)
        )
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def attempt_totals(self, workload: str, run_id: str) -> list[dict[str, Any]]:
        """Return usage and cost of this run's attempts, grouped by mode, outcome and discard.

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        a = s.attempts.c
        q = (
            select(
                a.mode,
                a.outcome,
                a.discarded,
                func.count().label("lines"),
                func.coalesce(func.sum(a.input_tokens), 0).label("input_tokens"),
                func.coalesce(func.sum(a.output_tokens), 0).label("output_tokens"),
                func.coalesce(func.sum(a.cached_input_tokens), 0).label("cached_input_tokens"),
                func.coalesce(func.sum(a.cache_write_tokens), 0).label("cache_write_tokens"),
                func.coalesce(func.sum(a.cost_nusd), 0).label("cost_nusd"),
            )
            .where(a.workload == workload, a.run_id == run_id)
            .group_by(a.mode, a.outcome, a.discarded)
        )
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def run_cost(self, workload: str, run_id: str) -> Decimal:
        """Return what this run's attempts have cost so far, in dollars.

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        a = s.attempts.c
        q = select(func.coalesce(func.sum(a.cost_nusd), 0)).where(a.workload == workload, a.run_id == run_id)
        with self.engine.connect() as conn:
            return from_nusd(int(conn.execute(q).scalar_one()))

    def count_routes(self, workload: str, run_id: str) -> dict[tuple[str, str], int]:
        """Return this run's items by (state, route).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        q = (
            select(s.items.c.state, s.items.c.route, func.count())
            .where(s.items.c.workload == workload, s.items.c.run_id == run_id)
            .group_by(s.items.c.state, s.items.c.route)
        )
        with self.engine.connect() as conn:
            return {(st, rt or "-"): int(n) for st, rt, n in conn.execute(q)}

    def publish(self, workload: str, run_id: str) -> int:
        """Copy this run's final items into the results table (upsert by item).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        now = utcnow()
        count = 0
        cols = ["item_key", "prompt_version", "app_id", "state", "output_json"]
        for batch in chunks(self.iter_items(workload, run_id, columns=cols)):
            with self.engine.begin() as conn:
                keys = [(r["item_key"], r["prompt_version"]) for r in batch]
                p = s.published.c
                conn.execute(
                    s.published.delete().where(
                        p.workload == workload, pair_filter(p.item_key, p.prompt_version, keys)
                    )
                )
                conn.execute(
                    s.published.insert(),
                    [{**dict(r), "workload": workload, "run_id": run_id, "published_at": now} for r in batch],
                )
                count += len(batch)
        return count

    def iter_cost_rows(self, workload: str, run_id: str) -> Iterator[dict[str, Any]]:
        """Yield one dict per item of the run with its attempts' usage, for the cost report.

        Keys: ``app_id``, ``state``, ``route``, ``model``, ``attempts`` (list of dicts with
        ``usage``, ``mode``, ``discarded``, ``outcome``, ``error_code``) and, for unchanged items,
        ``last_usage`` (the usage of the earlier success they reuse, or ``None``).

        :param workload: workload name
        :param run_id: the Airflow run id
        """
        a = s.attempts.c
        cols = ["app_id", "state", "route", "model", "attempts", "job_id", "custom_id"]
        for page in chunks(self.iter_items(workload, run_id, columns=cols)):
            keys = [(r["item_key"], r["prompt_version"]) for r in page]
            by_item: dict[tuple[str, str], list[dict[str, Any]]] = {}
            by_version: dict[str, list[str]] = {}
            for key, version in keys:
                by_version.setdefault(version, []).append(key)
            with self.engine.connect() as conn:
                # One query per version, and on SQLite ``run_id || ''`` rather than ``run_id``:
                # otherwise SQLite (no statistics) searches the (workload, run_id) index and reads
                # every attempt of the run for each page of 1,000 keys (quadratic: 0.33 s a page at
                # a million items, publish 555 s); this way each page is found by the (workload,
                # key, version) index (0.03 s a page at a million). PostgreSQL chooses with its
                # statistics: there the same trick read the whole attempts table per page when a
                # night changed a few percent (3.2 ms a page at 9,350 attempts, 0.2 ms by the
                # run's index; docs/benchmarks.md, night thirty).
                run_of = a.run_id.concat("") if self.engine.dialect.name == "sqlite" else a.run_id
                rows = (
                    att
                    for version, ks in by_version.items()
                    for att in conn.execute(
                        select(s.attempts)
                        .where(
                            a.workload == workload,
                            run_of == run_id,
                            a.prompt_version == version,
                            a.item_key.in_(ks),
                        )
                        .order_by(a.created_at, a.attempt)
                    ).mappings()
                )
                for att in rows:
                    if att["outcome"] is None:
                        continue
                    by_item.setdefault((att["item_key"], att["prompt_version"]), []).append(
                        {
                            "usage": _usage_of(att),
                            "mode": att["mode"],
                            "discarded": bool(att["discarded"]),
                            "outcome": att["outcome"],
                            "error_code": att["error_code"],
                        }
                    )
                earlier = [
                    (r["job_id"], r["custom_id"]) for r in page if r["state"] == "unchanged" and r["job_id"]
                ]
                last: dict[tuple[str, str], Usage] = {}
                if earlier:
                    for att in conn.execute(
                        select(s.attempts).where(
                            pair_filter(a.custom_id, a.job_id, [(cid, jid) for jid, cid in earlier])
                        )
                    ).mappings():
                        last[(att["job_id"], att["custom_id"])] = _usage_of(att)
            for r in page:
                yield {
                    "app_id": r["app_id"],
                    "state": r["state"],
                    "route": r["route"],
                    "model": r["model"],
                    "attempts": by_item.get((r["item_key"], r["prompt_version"]), []),
                    "last_usage": last.get((r["job_id"], r["custom_id"]))
                    if r["state"] == "unchanged"
                    else None,
                }


def _usage_of(row: RowMapping) -> Usage:
    return Usage(
        input_tokens=int(row["input_tokens"] or 0),
        output_tokens=int(row["output_tokens"] or 0),
        cached_input_tokens=int(row["cached_input_tokens"] or 0),
        cache_write_tokens=int(row["cache_write_tokens"] or 0),
    )
