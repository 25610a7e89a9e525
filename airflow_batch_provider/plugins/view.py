"""The page's view model: pure functions from the ledger's frozen records to what the page and the JSON show.

Nothing here reads the ledger or knows the request: :mod:`.api` loads the records
(:mod:`airflow_batch_provider.ledger.reads` and the ledger's own read methods), hands them to
these functions, and renders or returns what they build. Every value they return is JSON-safe
except :class:`RunView` (a frozen record with :meth:`RunView.summary` for the JSON).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider.core.money import from_nusd
from airflow_batch_provider.core.pricing import decimal_str, format_usd
from airflow_batch_provider.core.states import ATTENTION_STATES, OPEN_STATES, USABLE_STATES
from airflow_batch_provider.ledger.reads import RunRecord

if TYPE_CHECKING:
    from airflow_batch_provider.ledger.records import AuditRow, ItemRow, JobRow

log = logging.getLogger(__name__)

#: An unfinished run older than this is shown as stale and no longer refreshed.
STALE_AFTER: Final = timedelta(hours=48)
#: Items needing attention listed per run (the rest are counted).
ATTENTION_SAMPLE: Final = 25
#: Columns of an item needing attention, as the run's detail lists them.
ATTENTION_FIELDS: Final[tuple[str, ...]] = ("app_id", "state", "attempts", "error_code", "error_message")
#: Display order of item states in the bar and the tables: done first, then open, then failed.
STATE_ORDER: Final[tuple[str, ...]] = (
    "succeeded",
    "unchanged",
    "fallback",
    "submitted",
    "staged",
    "pending",
    "failed_retryable",
    "expired",
    "cancelled",
    "failed_permanent",
    "review",
    "skipped",
)
STATE_COLORS: Final[Mapping[str, str]] = {
    "succeeded": "#2f9e44",
    "unchanged": "#8ccf9a",
    "fallback": "#7048e8",
    "submitted": "#1c7ed6",
    "staged": "#74c0fc",
    "pending": "#adb5bd",
    "failed_retryable": "#f08c00",
    "expired": "#ffd43b",
    "cancelled": "#868e96",
    "failed_permanent": "#e03131",
    "review": "#a61e4d",
    "skipped": "#dee2e6",
}
#: Display order of the routes an item took (``exhausted_sync``: the real-time API after its batch
#: attempts ran out; ``fallback``: the real-time API at the deadline).
ROUTE_ORDER: Final[tuple[str, ...]] = ("batch", "resubmitted", "fallback", "exhausted_sync", "unchanged")
# Job columns the page and the JSON show. Staging paths and provider file ids are left out: they
# name buckets and folders, which a progress page has no need to reveal.
JOB_FIELDS: Final[tuple[str, ...]] = (
    "job_id",
    "round",
    "chunk_index",
    "provider",
    "model",
    "kind",
    "state",
    "batch_id",
    "batch_state",
    "lines",
    "size_bytes",
    "result_lines",
    "malformed_lines",
    "duplicate_lines",
    "unknown_lines",
    "missing",
    "error",
    "created_at",
    "submitted_at",
    "finished_at",
    "reconciled_at",
)

#: Returns the configured ledger's SQLAlchemy URL (with credentials: never log or show it).


# --------------------------------------------------------------------------- runs


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def iso(value: datetime | None) -> str | None:
    """A moment as an ISO string in UTC (``None`` stays ``None``).

    :param value: the moment (naive: UTC)
    """
    moment = _utc(value)
    return None if moment is None else moment.isoformat()


def ordered(counts: Mapping[str, int], order: Sequence[str]) -> dict[str, int]:
    """The non-zero counts in ``order``, then any others by name.

    :param counts: counts by name
    :param order: the names in display order
    """
    known = {k: counts[k] for k in order if counts.get(k)}
    extra = {k: v for k, v in sorted(counts.items()) if k not in known and v}
    return {**known, **extra}


def parse_report(raw: str | None) -> dict[str, Any] | None:
    """The cost report a run stored, or ``None`` when it has none (or it is not a JSON object).

    :param raw: ``abp_runs.report_json``
    """
    if not raw:
        return None
    try:
        loaded = json.loads(raw)
    except ValueError:
        log.warning("a run's report_json is not JSON; shown as missing")
        return None
    return loaded if isinstance(loaded, dict) else None


def _recorded(report: Mapping[str, Any] | None, *keys: str) -> dict[str, int] | None:
    found: Any = None
    for key in keys:  # the first key with a non-empty value, else the last one's value
        found = (report or {}).get(key)
        if found:
            break
    return {str(k): int(v) for k, v in found.items()} if isinstance(found, dict) else None


def recorded_states(run: RunRecord) -> dict[str, int] | None:
    """A finished run's items by state as its report recorded them; ``None``: count them live.

    A finished run is shown as its report recorded it: a later run of the workload takes its items
    over (they carry the latest run id), so counting them now would show an empty run.

    :param run: the run
    """
    if run.finished_at is None:
        return None
    return report_states(parse_report(run.report_json))


def report_states(report: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The items by state a stored report recorded (``None``: it recorded none).

    :param report: the parsed report (:func:`parse_report`)
    """
    return _recorded(report, "states", "items_by_state")


@dataclass(frozen=True)
class RunView(RunRecord):
    """What the page knows about one run: its record, and what the view made of it.

    :param states: items by state (as its report recorded them, else counted live)
    :param report: the cost report publish wrote, if it has (parsed)
    :param stale: unfinished and older than :data:`STALE_AFTER`
    """

    states: dict[str, int]
    report: dict[str, Any] | None
    stale: bool

    @property
    def finished(self) -> bool:
        """Publish has written the report."""
        return self.finished_at is not None

    @property
    def items(self) -> int:
        """Items in the run."""
        return sum(self.states.values())

    @property
    def usable(self) -> int:
        """Items holding a usable result."""
        return sum(n for state, n in self.states.items() if state in USABLE_STATES)

    @property
    def open(self) -> int:
        """Items still in flight."""
        return sum(n for state, n in self.states.items() if state in OPEN_STATES)

    def summary(self) -> dict[str, Any]:
        """A JSON-safe summary."""
        report = self.report or {}
        return {
            "workload": self.workload,
            "run_id": self.run_id,
            "dag_id": self.dag_id,
            "provider": self.provider,
            "model": self.model,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "finished": self.finished,
            "stale": self.stale,
            "items": self.items,
            "usable_results": self.usable,
            "open_items": self.open,
            "states": self.states,
            "paid": report.get("paid"),
            "sync_equivalent": report.get("sync_equivalent"),
            "savings": report.get("savings"),
            "cost_per_usable_result": report.get("cost_per_usable_result"),
            "currency": report.get("currency", "USD"),
        }


def run_view(run: RunRecord, live_states: Mapping[str, int] | None, now: datetime) -> RunView:
    """What the page shows of one run.

    :param run: the run's record
    :param live_states: its items by state counted now (used when :func:`recorded_states` is ``None``)
    :param now: the current time (for :data:`STALE_AFTER`)
    """
    states = recorded_states(run)
    if states is None:
        states = dict(live_states or {})
    return RunView(
        **{f.name: getattr(run, f.name) for f in fields(RunRecord)},
        states=ordered(states, STATE_ORDER),
        report=parse_report(run.report_json),
        stale=run.finished_at is None and run.started_at is not None and now - run.started_at > STALE_AFTER,
    )


def recorded_routes(run: RunView) -> dict[str, int] | None:
    """A finished run's items by route as its report recorded them; ``None``: count them live.

    :param run: the run
    """
    return _recorded(run.report, "items_by_route") if run.finished else None


def live_routes(by_state_and_route: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Items by route from the ledger's ``(state, route)`` counts (``-``: no route yet, left out).

    :param by_state_and_route: ``Ledger.count_routes``
    """
    routes: dict[str, int] = {}
    for (_state, route), n in by_state_and_route.items():
        if route != "-":
            routes[route] = routes.get(route, 0) + n
    return routes


def attention_total(run: RunView) -> int:
    """Items of the run a person should look at (:data:`ATTENTION_STATES`).

    :param run: the run
    """
    return sum(run.states.get(st, 0) for st in ATTENTION_STATES)


def job_row(job: JobRow, console: str | None) -> dict[str, Any]:
    """One batch job as the page shows it (:data:`JOB_FIELDS` and its console link).

    :param job: the job
    :param console: the provider's console page of its batch, if known
    """
    values = {k: getattr(job, k) for k in JOB_FIELDS}
    shown = {k: (iso(v) if isinstance(v, datetime) else v) for k, v in values.items()}
    shown["console_url"] = console if job.batch_id else None
    return shown


def run_detail(
    run: RunView,
    *,
    routes: Mapping[str, int],
    jobs: Sequence[dict[str, Any]],
    attention: Sequence[Mapping[str, Any]],
    paid_so_far_nusd: int,
) -> dict[str, Any]:
    """One run in detail (JSON-safe): states, routes, jobs, report, items needing attention.

    :param run: the run
    :param routes: items by route (:func:`recorded_routes`, else :func:`live_routes`)
    :param jobs: its jobs (:func:`job_row`)
    :param attention: a sample of its items needing attention (:data:`ATTENTION_FIELDS`)
    :param paid_so_far_nusd: what its attempts cost so far, in nano-dollars
    """
    return {
        **run.summary(),
        "routes": ordered(routes, ROUTE_ORDER),
        "jobs": list(jobs),
        "paid_so_far": decimal_str(from_nusd(paid_so_far_nusd)),
        "attention": {
            "total": attention_total(run),
            "sample": [{c: row[c] for c in ATTENTION_FIELDS} for row in attention[:ATTENTION_SAMPLE]],
        },
        "report": dict(run.report) if run.report else None,
    }


# --------------------------------------------------------------------------- the review queue

#: Columns of a review item, in the order of the page, the CSV and the JSON.
REVIEW_FIELDS: Final[tuple[str, ...]] = (
    "app_id",
    "item_key",
    "prompt_version",
    "error_code",
    "error_message",
    "attempts",
    "cost_so_far",
    "run_id",
    "updated_at",
)


def review_rows(items: Sequence[ItemRow], costs: Mapping[tuple[str, str], int]) -> list[dict[str, Any]]:
    """Review items as the page, the CSV and the JSON show them (:data:`REVIEW_FIELDS`).

    :param items: the items
    :param costs: what each item's attempts cost so far, in nano-dollars, by ``(item_key, prompt_version)``
    """
    return [
        {
            "app_id": i.app_id,
            "item_key": i.item_key,
            "prompt_version": i.prompt_version,
            "error_code": i.error_code,
            "error_message": i.error_message,
            "attempts": i.attempts,
            "cost_so_far": decimal_str(from_nusd(costs.get((i.item_key, i.prompt_version), 0))),
            "run_id": i.run_id,
            "updated_at": iso(i.updated_at),
        }
        for i in items
    ]


def review_page(
    workload: str,
    error_code: str | None,
    counts: Mapping[str, int],
    rows: Sequence[dict[str, Any]],
    offset: int,
) -> dict[str, Any]:
    """One page of a workload's review queue with its counts (JSON-safe).

    :param workload: workload name
    :param error_code: the filter (``None``: every item)
    :param counts: the open queue by error code (``-``: none)
    :param rows: the page's items (:func:`review_rows`)
    :param offset: how many came before them
    """
    total = counts.get(error_code, 0) if error_code else sum(counts.values())
    return {
        "workload": workload,
        "error_code": error_code,
        "by_error_code": dict(counts),
        "total": total,
        "offset": offset,
        "items": list(rows),
    }


def in_doubt_rows(jobs: Iterable[JobRow]) -> list[dict[str, Any]]:
    """Batches whose creation could not be confirmed, with what is known of each (JSON-safe).

    :param jobs: the jobs in doubt
    """
    return [
        {
            "job_id": j.job_id,
            "run_id": j.run_id,
            "round": j.round,
            "chunk_index": j.chunk_index,
            "provider": j.provider,
            "model": j.model,
            "lines": j.lines,
            "idempotency_key": j.idempotency_key,
            "batch_id": j.batch_id,
            "reason": j.in_doubt_reason,
            "since": iso(j.in_doubt_at),
            "claims": j.claim_count,
        }
        for j in jobs
    ]


def audit_rows(rows: Iterable[AuditRow]) -> list[dict[str, Any]]:
    """Audit rows as the review page shows them (JSON-safe), in the order given.

    :param rows: the audit rows
    """
    return [
        {
            "at": iso(a.at),
            "actor": a.actor,
            "action": a.action,
            "item_count": a.item_count,
            "target": a.target,
            "reason": a.reason,
        }
        for a in rows
    ]


_FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """A CSV cell that a spreadsheet shows as text: a leading ``= + - @`` (a formula) gets a ``'``.

    Error messages come from providers and input records: a cell must never run as a formula.

    :param value: the value
    """
    text = "" if value is None else str(value)
    return f"'{text}" if text.startswith(_FORMULA_START) else text


def review_csv(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """Yield the review queue as CSV text, header first.

    :param rows: review rows (:data:`REVIEW_FIELDS`)
    """
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(REVIEW_FIELDS)
    for row in rows:
        writer.writerow([csv_cell(row[f]) for f in REVIEW_FIELDS])
        if buf.tell() > 64_000:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def review_jsonl(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """Yield the review queue as JSON lines.

    :param rows: review rows
    """
    for row in rows:
        yield json.dumps({f: row[f] for f in REVIEW_FIELDS}, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- formatting


def _decimal(value: Any) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def money(value: Any, currency: str = "USD") -> str:
    """Format an exact amount for display: cents from $1 up, more places below.

    :param value: a decimal string, number or ``None``
    :param currency: the currency code (``USD`` shows as ``$``)
    """
    amount = _decimal(value)
    if amount is None:
        return "n/a"
    if amount == 0 or abs(amount) >= 1:
        places = 2
    elif abs(amount) >= Decimal("0.01"):
        places = 4
    else:
        # Per-result costs are often fractions of a cent: keep three significant digits.
        places = max(4, 2 - amount.adjusted())
    text = format_usd(amount, places)
    return text if currency == "USD" else f"{text.replace('$', '')} {currency}"


def percent(value: Any) -> str:
    """Format a ratio (``0.5``) as ``50.0%``.

    :param value: a decimal string, number or ``None``
    """
    ratio = _decimal(value)
    return "" if ratio is None else f"{(ratio * 100).quantize(Decimal('0.1'))}%"


def when(value: datetime | str | None) -> str:
    """Format a moment as ``2026-11-29 15:05:18 UTC``.

    :param value: a datetime or ISO string
    """
    if value is None:
        return "-"
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    utc = _utc(moment)
    return "-" if utc is None else utc.strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(value: datetime | str | None) -> str:
    """Format a moment as ``15:05:18`` (UTC); the page puts the full date in a tooltip.

    :param value: a datetime or ISO string
    """
    full = when(value)
    return full if full == "-" else full[11:19]


def duration(start: datetime | None, end: datetime | None) -> str:
    """Format the time between two moments (``45 s``, ``12 min``, ``3 h 05 min``).

    :param start: the start
    :param end: the end (``None``: now)
    """
    if start is None:
        return "-"
    seconds = int(((end or datetime.now(timezone.utc)) - start).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def share(part: int, total: int) -> str:
    """Format ``part / total`` as a percentage that never rounds a partial share to 0% or 100%.

    :param part: the part
    :param total: the whole
    """
    if total <= 0:
        return ""
    if part == total:
        return "100%"
    pct = Decimal(100 * part) / Decimal(total)
    if 0 < pct < Decimal("0.1"):
        return "<0.1%"
    return f"{pct.quantize(Decimal('0.1'), rounding='ROUND_DOWN')}%"


def bar_segments(
    states: Mapping[str, int], width: float = 100.0, min_width: float = 0.6
) -> list[dict[str, Any]]:
    """Lay out a stacked bar: one segment per state, in :data:`STATE_ORDER`.

    A state with items stays visible: its segment is at least ``min_width`` wide, and the other
    segments shrink to make room, so the bar keeps its total width.

    :param states: items by state
    :param width: total width
    :param min_width: narrowest segment of a state that has items
    """
    counts = {k: v for k, v in ordered(states, STATE_ORDER).items() if v > 0}
    total = sum(counts.values())
    if total <= 0:
        return []
    raw = {k: width * n / total for k, n in counts.items()}
    small = {k for k, w in raw.items() if w < min_width}
    room = width - min_width * len(small)
    big_total = sum(w for k, w in raw.items() if k not in small)
    x = 0.0
    out = []
    for state, n in counts.items():
        w = min_width if state in small else (raw[state] * room / big_total if big_total else 0.0)
        out.append(
            {
                "state": state,
                "count": n,
                "x": round(x, 3),
                "width": round(w, 3),
                "color": STATE_COLORS.get(state, "#495057"),
                "share": share(n, total),
            }
        )
        x += w
    return out


def qs(**params: Any) -> str:
    """Build a query string from the parameters that are set (the template escapes it for HTML).

    :param params: query parameters; ``None`` values are left out
    """
    from urllib.parse import urlencode

    return urlencode({k: v for k, v in params.items() if v is not None})
