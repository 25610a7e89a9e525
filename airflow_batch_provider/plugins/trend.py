"""The workload's trend: one point per run (night) from the run-level record alone.

Every figure comes from the ``abp_runs`` row and the report publish stored in it (items by
state, cost per usable result, savings, the review queue as the run left it, items by route),
never from item rows: a retention policy that prunes old runs' items keeps these, so the trend
reaches as far back as the runs kept. :func:`night` and :func:`trend` are pure functions, like
:mod:`.view`; :func:`workload_trend` loads the runs for them in one query of the runs table
(:func:`airflow_batch_provider.ledger.reads.recent_runs`), and :mod:`.api` returns the result as
JSON or renders it as the page's table; ``static/trend.js`` (:func:`script`) draws the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider.ledger import reads
from airflow_batch_provider.ledger.reads import DagSet, RunRecord
from airflow_batch_provider.plugins.view import (
    STATE_COLORS,
    STATE_ORDER,
    iso,
    ordered,
    parse_report,
    report_states,
)

if TYPE_CHECKING:
    from airflow_batch_provider.ledger import Ledger

#: Runs the trend shows unless asked for another number.
DEFAULT_NIGHTS: Final = 30
#: The choices of the page's selector (the last: every run kept, up to :data:`MAX_NIGHTS`).
NIGHT_CHOICES: Final[tuple[int, ...]] = (30, 90, 365, 1000)
#: Most runs one trend request shows.
MAX_NIGHTS: Final = 1000
#: Routes through the real-time API: the deadline's fallback, and items whose batch attempts ran out.
REALTIME_ROUTES: Final[tuple[str, ...]] = ("fallback", "exhausted_sync")
#: The figures of a night, in the order the chart and the table show them (``states`` first).
METRICS: Final[tuple[str, ...]] = ("cost_per_usable_result", "savings", "review_queue", "realtime_share")


def _ratio(part: int, whole: int) -> str | None:
    if whole <= 0:
        return None
    return str((Decimal(part) / Decimal(whole)).quantize(Decimal("0.000001")))


def _amount(value: Any) -> str | None:
    if value is None or value == "":
        return None
    try:
        return str(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return None


def night(run: RunRecord) -> dict[str, Any]:
    """One run as a point of the trend (JSON-safe); a run not published yet has no figures.

    :param run: the run's record (its report is the one publish stored)
    """
    report = parse_report(run.report_json) if run.finished_at is not None else None
    rep: Mapping[str, Any] = report or {}
    states = ordered(report_states(report) or {}, STATE_ORDER)
    items = sum(states.values())
    routes = rep.get("items_by_route")
    realtime = sum(int(routes.get(r) or 0) for r in REALTIME_ROUTES) if isinstance(routes, Mapping) else None
    queue = rep.get("review_queue")
    return {
        "run_id": run.run_id,
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "published": report is not None,
        "currency": str(rep.get("currency") or "USD"),
        "items": items if report is not None else None,
        "states": states,
        "usable_results": rep.get("usable_results"),
        "paid": _amount(rep.get("paid")),
        "cost_per_usable_result": _amount(rep.get("cost_per_usable_result")),
        "savings": _amount(rep.get("savings")),
        # reports written before the queue was recorded have none: a gap, not a zero
        "review_queue": queue if isinstance(queue, int) else None,
        "realtime_items": realtime,
        "realtime_share": None if realtime is None else _ratio(realtime, items),
    }


def trend(workload: str, runs: Sequence[RunRecord], nights: int) -> dict[str, Any]:
    """A workload's trend over its latest ``nights`` runs, oldest first (JSON-safe).

    :param workload: workload name
    :param runs: its runs, newest first, at most ``nights + 1`` (one more says older runs exist)
    :param nights: how many runs were asked for
    """
    points = [night(r) for r in reversed(runs[:nights])]
    seen: dict[str, int] = {}
    for p in points:
        for state, n in p["states"].items():
            seen[state] = seen.get(state, 0) + n
    currencies = {p["currency"] for p in points if p["published"]}
    return {
        "workload": workload,
        "nights_requested": nights,
        "older_runs": len(runs) > nights,
        "currency": currencies.pop() if len(currencies) == 1 else ("mixed" if currencies else "USD"),
        "states": list(ordered(seen, STATE_ORDER)),
        "colors": {state: STATE_COLORS.get(state, "#495057") for state in seen},
        "metrics": list(METRICS),
        "nights": points,
    }


def workload_trend(ledger: Ledger, workload: str, nights: int, dags: DagSet) -> dict[str, Any]:
    """Return a workload's trend over its latest ``nights`` runs recorded by ``dags`` (JSON-safe).

    One query of the runs table (the reports are in it): no item row is read.

    :param ledger: the ledger
    :param workload: workload name
    :param nights: how many runs (capped at :data:`MAX_NIGHTS`)
    :param dags: only runs of these DAGs
    """
    nights = max(1, min(nights, MAX_NIGHTS))
    return trend(workload, reads.recent_runs(ledger, dags, workload, nights + 1), nights)


@cache
def script() -> bytes:
    """The page's chart script (``plugins/static/trend.js``, shipped in the package)."""
    from importlib.resources import files

    return files("airflow_batch_provider.plugins").joinpath("static", "trend.js").read_bytes()
