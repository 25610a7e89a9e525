"""The LLM batch page: a small read-only FastAPI app over the ledger, mounted by the plugin.

Routes (relative to the mount, ``/llm-batch`` in Airflow):

- ``GET /``: workloads, recent runs, and the latest (or the selected) run in detail;
- ``GET /run?workload=&run_id=``: one run in detail (HTML);
- ``GET /dag-run?dag_id=&run_id=``: the runs of the ledger recorded under an Airflow run id (the
  DAG run tab of the Airflow UI points here);
- ``GET /api/runs?workload=&limit=``: recent runs (JSON);
- ``GET /api/runs/{workload}/{run_id}``: one run (JSON): states, routes, jobs, report (a workload
  whose name holds ``/`` cannot be addressed here; ``/run`` takes any name as a query parameter);
- ``GET /icon.svg``: the menu icon.

Everything is read-only: the ledger is opened without creating tables, SQLite in ``mode=ro`` and
PostgreSQL with ``default_transaction_read_only``. HTML is rendered server side by Jinja2 with
autoescaping, needs no script and no external resource, and is served with a Content Security
Policy that allows neither. No connection URL or credential is ever rendered; a ledger that
cannot be read is reported by connection id and error class, the details go to the server log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Final

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from airflow_batch_provider.core.pricing import decimal_str, format_usd
from airflow_batch_provider.core.states import OPEN_STATES, USABLE_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import from_nusd

if TYPE_CHECKING:
    from jinja2 import Environment

log = logging.getLogger(__name__)

#: A run that has not finished is refreshed every this many seconds.
REFRESH_SECONDS: Final = 15
#: An unfinished run older than this is shown as stale and no longer refreshed.
STALE_AFTER: Final = timedelta(hours=48)
#: Most runs one request lists.
MAX_RUNS: Final = 200
#: Items needing attention listed per run (the rest are counted).
ATTENTION_SAMPLE: Final = 25
ATTENTION_STATES: Final = ("review", "failed_permanent", "pending", "skipped")
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
ROUTE_ORDER: Final[tuple[str, ...]] = ("batch", "resubmitted", "fallback", "unchanged")
_CONN_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,250}$")
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

LedgerOpener = Callable[[str | None], Ledger]
ConnIdParam = Annotated[
    str | None, Query(description="ledger connection id (default: the configured ledger)")
]


class LedgerUnavailable(Exception):
    """The ledger could not be opened or read; the message is safe to show."""


# --------------------------------------------------------------------------- opening the ledger


def readonly_url(url: str) -> tuple[str, dict[str, Any]]:
    """Return a URL and ``create_engine`` arguments that open the ledger read-only.

    SQLite files open with ``mode=ro`` (a missing file is an error, not a new empty ledger);
    PostgreSQL over psycopg2 gets ``default_transaction_read_only=on``. Other URLs are returned
    as they are.

    :param url: the ledger's SQLAlchemy URL
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            return url, {}
        ro = parsed.set(database=f"file:{database}", query={**parsed.query, "mode": "ro", "uri": "true"})
        return ro.render_as_string(hide_password=False), {"connect_args": {"timeout": 30}}
    if backend == "postgresql" and parsed.get_driver_name() == "psycopg2":
        return url, {"connect_args": {"options": "-c default_transaction_read_only=on"}}
    return url, {}


@cache
def open_readonly(url: str) -> Ledger:
    """Open the ledger at ``url`` read-only, without creating or migrating anything (one engine per URL).

    :param url: the ledger's SQLAlchemy URL (with credentials: never log or show it)
    """
    from sqlalchemy import create_engine

    ro_url, kwargs = readonly_url(url)
    return Ledger(create_engine(ro_url, future=True, pool_pre_ping=True, **kwargs))


def default_opener(conn_id: str | None) -> Ledger:
    """Open the ledger of a connection, or the configured one, read-only.

    Without ``conn_id``, ``[batch_provider] ledger_conn_id`` names the connection; without that,
    the embedded ledger (``[batch_provider] ledger_url``) is read.

    :param conn_id: a ``postgres``/``sqlite`` ledger connection id, or ``None``
    """
    from airflow_batch_provider.hooks.ledger import LedgerHook
    from airflow_batch_provider.settings import get_setting

    conn_id = conn_id or get_setting("ledger_conn_id", "") or None
    return open_readonly(LedgerHook(conn_id).url())


# --------------------------------------------------------------------------- reading


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _iso(value: datetime | None) -> str | None:
    moment = _utc(value)
    return None if moment is None else moment.isoformat()


def _ordered(counts: Mapping[str, int], order: Sequence[str]) -> dict[str, int]:
    known = {k: counts[k] for k in order if counts.get(k)}
    extra = {k: v for k, v in sorted(counts.items()) if k not in known and v}
    return {**known, **extra}


def _report(raw: str | None) -> dict[str, Any] | None:
    import json

    if not raw:
        return None
    try:
        loaded = json.loads(raw)
    except ValueError:
        log.warning("a run's report_json is not JSON; shown as missing")
        return None
    return loaded if isinstance(loaded, dict) else None


def _has_tables(ledger: Ledger) -> bool:
    from sqlalchemy import inspect

    return bool(inspect(ledger.engine).has_table("abp_runs"))


def _paid_so_far(ledger: Ledger, workload: str, run_id: str) -> str:
    total = sum(int(row["cost_nusd"] or 0) for row in ledger.attempt_totals(workload, run_id))
    return decimal_str(from_nusd(total))


@dataclass(frozen=True)
class RunView:
    """What the page knows about one run.

    :param workload: workload name
    :param run_id: the Airflow run id
    :param provider: provider (adapter) name
    :param model: model name
    :param started_at: when prepare recorded it
    :param finished_at: when publish wrote its report
    :param states: items by state
    :param report: the cost report publish wrote, if it has
    :param stale: unfinished and older than :data:`STALE_AFTER`
    """

    workload: str
    run_id: str
    provider: str | None
    model: str | None
    started_at: datetime | None
    finished_at: datetime | None
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
            "provider": self.provider,
            "model": self.model,
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
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


def _run_view(ledger: Ledger, row: Mapping[str, Any], now: datetime) -> RunView:
    started = _utc(row["started_at"])
    finished = _utc(row["finished_at"])
    report = _report(row.get("report_json"))
    # A finished run is shown as its report recorded it: a later run of the workload takes its
    # items over (they carry the latest run id), so counting them now would show an empty run.
    recorded = (report or {}).get("states") or (report or {}).get("items_by_state")
    if finished is not None and isinstance(recorded, dict):
        states = {str(k): int(v) for k, v in recorded.items()}
    else:
        states = ledger.count_states(row["workload"], row["run_id"])
    return RunView(
        workload=str(row["workload"]),
        run_id=str(row["run_id"]),
        provider=row.get("provider"),
        model=row.get("model"),
        started_at=started,
        finished_at=finished,
        states=_ordered(states, STATE_ORDER),
        report=report,
        stale=finished is None and started is not None and now - started > STALE_AFTER,
    )


def list_runs(ledger: Ledger, workload: str | None, limit: int) -> list[RunView]:
    """Return the latest runs, newest first.

    :param ledger: the ledger
    :param workload: only this workload
    :param limit: at most this many (capped at :data:`MAX_RUNS`)
    """
    if not _has_tables(ledger):
        return []
    now = datetime.now(timezone.utc)
    rows = ledger.runs(workload or None, limit=max(1, min(limit, MAX_RUNS)))
    return [_run_view(ledger, dict(row), now) for row in rows]


def list_workloads(ledger: Ledger) -> list[dict[str, Any]]:
    """Return every workload with its number of runs and its latest start, newest first.

    :param ledger: the ledger
    """
    from sqlalchemy import func, select

    from airflow_batch_provider.ledger import schema as s

    if not _has_tables(ledger):
        return []
    r = s.runs.c
    q = (
        select(r.workload, func.count().label("runs"), func.max(r.started_at).label("last_started"))
        .group_by(r.workload)
        .order_by(func.max(r.started_at).desc())
    )
    with ledger.engine.connect() as conn:
        return [
            {"workload": row.workload, "runs": int(row.runs), "last_started": _utc(row.last_started)}
            for row in conn.execute(q)
        ]


def find_run(ledger: Ledger, workload: str, run_id: str) -> RunView | None:
    """Return one run, or ``None`` when the ledger has no such run.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    from sqlalchemy import select

    from airflow_batch_provider.ledger import schema as s

    if not _has_tables(ledger):
        return None
    with ledger.engine.connect() as conn:
        row = (
            conn.execute(select(s.runs).where(s.runs.c.workload == workload, s.runs.c.run_id == run_id))
            .mappings()
            .first()
        )
    return None if row is None else _run_view(ledger, dict(row), datetime.now(timezone.utc))


def runs_with_id(ledger: Ledger, run_id: str) -> list[RunView]:
    """Return every workload's run recorded under one Airflow run id.

    :param ledger: the ledger
    :param run_id: the Airflow run id
    """
    from sqlalchemy import select

    from airflow_batch_provider.ledger import schema as s

    if not _has_tables(ledger):
        return []
    with ledger.engine.connect() as conn:
        rows = list(
            conn.execute(select(s.runs).where(s.runs.c.run_id == run_id).order_by(s.runs.c.workload))
            .mappings()
            .all()
        )
    now = datetime.now(timezone.utc)
    return [_run_view(ledger, dict(row), now) for row in rows]


def run_detail(ledger: Ledger, run: RunView) -> dict[str, Any]:
    """Return one run in detail (JSON-safe): states, routes, jobs, report, items needing attention.

    :param ledger: the ledger
    :param run: the run
    """
    routes: dict[str, int] = {}
    recorded = (run.report or {}).get("items_by_route")
    if run.finished and isinstance(recorded, dict):
        routes = {str(k): int(v) for k, v in recorded.items()}
    else:
        for (_state, route), n in ledger.count_routes(run.workload, run.run_id).items():
            if route != "-":
                routes[route] = routes.get(route, 0) + n
    jobs = [
        {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in job.items() if k in JOB_FIELDS}
        for job in ledger.jobs_for(run.workload, run.run_id)
    ]
    attention_total = sum(run.states.get(st, 0) for st in ATTENTION_STATES)
    attention: list[dict[str, Any]] = []
    if attention_total:
        cols = ["app_id", "state", "attempts", "error_code", "error_message"]
        for row in ledger.iter_items(
            run.workload, run.run_id, states=ATTENTION_STATES, columns=cols, page=ATTENTION_SAMPLE
        ):
            attention.append({c: row[c] for c in cols})
            if len(attention) >= ATTENTION_SAMPLE:
                break
    report = dict(run.report) if run.report else None
    return {
        **run.summary(),
        "routes": _ordered(routes, ROUTE_ORDER),
        "jobs": jobs,
        "paid_so_far": _paid_so_far(ledger, run.workload, run.run_id),
        "attention": {"total": attention_total, "sample": attention},
        "report": report,
    }


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
    counts = {k: v for k, v in _ordered(states, STATE_ORDER).items() if v > 0}
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


@cache
def _templates() -> Environment:
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("airflow_batch_provider.plugins", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(money=money, percent=percent, when=when, clock=clock)
    env.globals.update(
        duration=duration,
        bar_segments=bar_segments,
        share=share,
        qs=qs,
        state_colors=STATE_COLORS,
        refresh_seconds=REFRESH_SECONDS,
    )
    return env


# --------------------------------------------------------------------------- the app

SECURITY_HEADERS: Final[Mapping[str, str]] = {
    # No script, no external resource: inline styles and same-origin images only. The Airflow UI
    # shows the page in a same-origin iframe, so framing is allowed from the same origin only.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "frame-ancestors 'self'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

ICON_SVG: Final = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="24" height="24">'
    '<rect x="2" y="5" width="20" height="4" rx="1" fill="#2f9e44"/>'
    '<rect x="2" y="11" width="14" height="4" rx="1" fill="#1c7ed6"/>'
    '<rect x="2" y="17" width="8" height="4" rx="1" fill="#adb5bd"/></svg>'
)


def create_app(opener: LedgerOpener | None = None, *, authenticate: bool = True) -> FastAPI:
    """Build the page's FastAPI app.

    :param opener: opens the ledger for a connection id (``None``: the configured ledger);
        default: :func:`default_opener` (read-only)
    :param authenticate: require an Airflow user (JWT bearer token or the UI's session cookie),
        as the Airflow API does. Plugin apps are mounted without Airflow's authentication, so
        this app checks it itself; turn it off only for a server bound to loopback.
    """
    dependencies = []
    if authenticate:
        from airflow.api_fastapi.core_api.security import requires_authenticated

        dependencies.append(Depends(requires_authenticated()))

    open_ledger = opener or default_opener
    app = FastAPI(
        title="LLM batch progress and cost",
        description="Read-only view of the airflow-batch-provider ledger.",
        dependencies=dependencies,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def ledger_for(conn_id: str | None) -> Ledger:
        if conn_id is not None and not _CONN_ID.fullmatch(conn_id):
            raise HTTPException(
                400, f"conn_id must be a connection id (letters, digits, '_', '.', '-'); got {conn_id[:60]!r}"
            )
        try:
            return open_ledger(conn_id)
        except Exception as exc:
            log.exception("the LLM batch page could not open the ledger (conn_id=%s)", conn_id)
            raise LedgerUnavailable(_unavailable(conn_id, exc)) from exc

    def html(name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        context.setdefault("refresh", False)
        context.setdefault("conn_id", None)
        body = _templates().get_template(name).render(root=root, **context)
        return HTMLResponse(body, status_code=status_code, headers=dict(SECURITY_HEADERS))

    def read(conn_id: str | None, fn: Callable[[Ledger], Any]) -> Any:
        ledger = ledger_for(conn_id)
        try:
            return fn(ledger)
        except HTTPException:
            raise
        except Exception as exc:
            log.exception("the LLM batch page could not read the ledger (conn_id=%s)", conn_id)
            raise LedgerUnavailable(_unavailable(conn_id, exc)) from exc

    @app.exception_handler(LedgerUnavailable)
    async def _unavailable_handler(request: Request, exc: LedgerUnavailable) -> Response:
        if "/api/" in request.url.path:
            return JSONResponse({"detail": str(exc)}, status_code=503, headers=dict(SECURITY_HEADERS))
        return html("error.html", request, status_code=503, title="Ledger unavailable", message=str(exc))

    @app.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        workload: str | None = Query(None),
        limit: int = Query(20, ge=1, le=MAX_RUNS),
        conn_id: ConnIdParam = None,
    ) -> Response:
        def load(ledger: Ledger) -> dict[str, Any]:
            runs = list_runs(ledger, workload, limit)
            latest = run_detail(ledger, runs[0]) if runs else None
            return {"workloads": list_workloads(ledger), "runs": runs, "detail": latest}

        data = read(conn_id, load)
        refresh = any(not r.finished and not r.stale for r in data["runs"])
        return html(
            "index.html",
            request,
            workload=workload,
            conn_id=conn_id,
            refresh=refresh,
            title="LLM batch",
            **data,
        )

    @app.get("/run", response_class=HTMLResponse)
    def run_page(
        request: Request,
        workload: str = Query(...),
        run_id: str = Query(...),
        conn_id: ConnIdParam = None,
    ) -> Response:
        def load(ledger: Ledger) -> dict[str, Any] | None:
            run = find_run(ledger, workload, run_id)
            return None if run is None else run_detail(ledger, run)

        detail = read(conn_id, load)
        if detail is None:
            return html(
                "error.html",
                request,
                status_code=404,
                title="No such run",
                message=f"The ledger has no run {run_id!r} of workload {workload!r}.",
            )
        refresh = not detail["finished"] and not detail["stale"]
        return html(
            "run.html",
            request,
            detail=detail,
            conn_id=conn_id,
            refresh=refresh,
            title=f"{workload} · {run_id}",
        )

    @app.get("/dag-run", response_class=HTMLResponse)
    def dag_run_page(
        request: Request,
        run_id: str = Query(...),
        dag_id: str | None = Query(None),
        conn_id: ConnIdParam = None,
    ) -> Response:
        def load(ledger: Ledger) -> list[dict[str, Any]]:
            return [run_detail(ledger, run) for run in runs_with_id(ledger, run_id)]

        details = read(conn_id, load)
        refresh = any(not d["finished"] and not d["stale"] for d in details)
        return html(
            "dag_run.html",
            request,
            details=details,
            dag_id=dag_id,
            run_id=run_id,
            conn_id=conn_id,
            refresh=refresh,
            title=f"LLM batch · {run_id}",
        )

    @app.get("/api/runs")
    def api_runs(
        workload: str | None = Query(None),
        limit: int = Query(20, ge=1, le=MAX_RUNS),
        conn_id: ConnIdParam = None,
    ) -> JSONResponse:
        runs = read(conn_id, lambda ledger: list_runs(ledger, workload, limit))
        return JSONResponse({"runs": [r.summary() for r in runs]}, headers=dict(SECURITY_HEADERS))

    @app.get("/api/runs/{workload}/{run_id:path}")
    def api_run(workload: str, run_id: str, conn_id: ConnIdParam = None) -> JSONResponse:
        def load(ledger: Ledger) -> dict[str, Any] | None:
            run = find_run(ledger, workload, run_id)
            return None if run is None else run_detail(ledger, run)

        detail = read(conn_id, load)
        if detail is None:
            raise HTTPException(404, f"the ledger has no run {run_id!r} of workload {workload!r}")
        return JSONResponse(detail, headers=dict(SECURITY_HEADERS))

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        return Response(ICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    return app


def _unavailable(conn_id: str | None, exc: BaseException) -> str:
    """A message about an unreadable ledger that names no URL, host or credential."""
    where = f"connection {conn_id!r}" if conn_id else "the configured ledger"
    return (
        f"Could not read {where} ({type(exc).__name__}). The API server log has the details; check "
        "[batch_provider] ledger_url or ledger_conn_id, and that the database is reachable from the API server."
    )
