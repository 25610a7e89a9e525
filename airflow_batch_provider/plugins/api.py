"""The LLM batch page: a small FastAPI app over the ledger, mounted by the plugin.

Routes (relative to the mount, ``/llm-batch`` in Airflow):

- ``GET /``: workloads, recent runs, and the latest (or the selected) run in detail;
- ``GET /run?workload=&run_id=``: one run in detail (HTML);
- ``GET /dag-run?dag_id=&run_id=``: the ledger runs of one Airflow DAG run (the DAG run tab of
  the Airflow UI points here);
- ``GET /review?workload=&error_code=``: a workload's review queue, its in-doubt batches and its
  audit trail, with the review actions for a user who may edit the workload's DAG;
- ``GET /review/export?workload=&error_code=&format=csv|jsonl``: the review queue as a file;
- ``POST /review/action``: re-drive, resolve or skip review items (a form of the review page);
- ``GET /api/runs?workload=&limit=``: recent runs (JSON);
- ``GET /api/runs/{workload}/{run_id}``: one run (JSON): states, routes, jobs, report (a workload
  whose name holds ``/`` cannot be addressed here; ``/run`` takes any name as a query parameter);
- ``GET /api/review?workload=&error_code=``: the review queue (JSON);
- ``GET /icon.svg``: the menu icon.

Permissions: every route asks Airflow's auth manager (:mod:`.access`). A run, its items, errors
and cost are shown only to a user who may read the runs of the DAG that recorded it; lists are
filtered to those DAGs; a workload's review queue needs read access to every DAG that ran it,
and its actions edit access to each. The ledger is the configured one (``[batch_provider]
ledger_conn_id``, else ``ledger_url``): no request chooses which database the server opens.

Reading uses a read-only engine (SQLite ``mode=ro``, PostgreSQL
``default_transaction_read_only``); only the review actions write, through the ledger's own
review API, which records each in the audit table. HTML is rendered server side by Jinja2 with
autoescaping, needs no script and no external resource, and is served with a Content Security
Policy that allows neither; the action form carries a token bound to the user and the workload.
No connection URL or credential is ever rendered; a ledger that cannot be read is reported by
error class, the details go to the server log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from airflow_batch_provider.core.pricing import decimal_str, format_usd
from airflow_batch_provider.core.states import ATTENTION_STATES, OPEN_STATES, USABLE_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import from_nusd
from airflow_batch_provider.links.batch import console_templates, console_url
from airflow_batch_provider.plugins.access import Access, Method, StaticAccess, allowed_all, readable

if TYPE_CHECKING:
    from jinja2 import Environment

    from airflow_batch_provider.ledger.records import ItemRow

log = logging.getLogger(__name__)

#: A run that has not finished is refreshed every this many seconds.
REFRESH_SECONDS: Final = 15
#: An unfinished run older than this is shown as stale and no longer refreshed.
STALE_AFTER: Final = timedelta(hours=48)
#: Most runs one request lists.
MAX_RUNS: Final = 200
#: Items needing attention listed per run (the rest are counted).
ATTENTION_SAMPLE: Final = 25
#: Review items one page lists; an export pages through all of them this many at a time.
REVIEW_PAGE: Final = 200
#: Most items one review action addresses by key.
MAX_ACTION_ITEMS: Final = 1000
#: Longest reason or note a review action takes.
MAX_REASON: Final = 2000
ReviewAction = Literal["redrive", "resolve", "skip"]
REVIEW_ACTIONS: Final[tuple[ReviewAction, ...]] = ("redrive", "resolve", "skip")
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
LedgerUrl = Callable[[], str]
#: Gives the access of the request's user.
AccessFor = Callable[..., Access]
#: Triggers a run of a DAG: ``(dag_id, actor, note) -> run_id``.
TriggerRun = Callable[[str, str, str], str]
#: DAG ids whose runs a user may read; ``None`` stands for runs recorded without a DAG.
DagSet = frozenset[str | None]


class LedgerUnavailable(Exception):
    """The ledger could not be opened or read; the message is safe to show."""


class Forbidden(Exception):
    """The user may not see or do this; the message is safe to show."""


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


@cache
def open_for_actions(url: str) -> Ledger:
    """Open the ledger at ``url`` for the review actions (one engine per URL; creates no table).

    :param url: the ledger's SQLAlchemy URL (with credentials: never log or show it)
    """
    from sqlalchemy import create_engine

    kwargs: dict[str, Any] = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}
    return Ledger(create_engine(url, future=True, pool_pre_ping=True, **kwargs))


def configured_ledger_url() -> str:
    """The ledger the page shows: ``[batch_provider] ledger_conn_id``'s, else the embedded one.

    Only configuration chooses it: a request cannot make the server open another connection.
    """
    from airflow_batch_provider.hooks.ledger import LedgerHook
    from airflow_batch_provider.settings import get_setting

    return LedgerHook(get_setting("ledger_conn_id", "") or None).url()


# --------------------------------------------------------------------------- reading
#
# The queries below the marker read ``abp_runs``, ``abp_items`` and ``abp_attempts`` directly:
# the ledger does not offer them yet. They are the page's only SQL, kept here together so that
# they can move into ``Ledger`` (asked for: ``run_dags()``, ``runs(..., dag_ids=)``,
# ``workload_summaries(dag_ids=)``, ``runs_of_dag_run()``, ``review_counts()``, ``item_costs()``).


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


# ---- plugin-side SQL (to move into Ledger) ----------------------------------------------------


def _dag_clause(dags: DagSet) -> Any:
    from sqlalchemy import false, or_

    from airflow_batch_provider.ledger import schema as s

    named = sorted(d for d in dags if d is not None)
    parts = [s.runs.c.dag_id.in_(named)] if named else []
    if None in dags:
        parts.append(s.runs.c.dag_id.is_(None))
    return or_(*parts) if parts else false()


def run_dags(ledger: Ledger, workload: str | None = None) -> list[tuple[str, str | None]]:
    """Return the distinct ``(workload, dag_id)`` pairs of the ledger's runs.

    :param ledger: the ledger
    :param workload: only this workload
    """
    from sqlalchemy import select

    from airflow_batch_provider.ledger import schema as s

    if not _has_tables(ledger):
        return []
    q = select(s.runs.c.workload, s.runs.c.dag_id).distinct()
    if workload is not None:
        q = q.where(s.runs.c.workload == workload)
    with ledger.engine.connect() as conn:
        return [(str(r.workload), r.dag_id) for r in conn.execute(q)]


def list_workloads(ledger: Ledger, dags: DagSet) -> list[dict[str, Any]]:
    """Return each workload with its number of runs (of ``dags``) and its latest start, newest first.

    :param ledger: the ledger
    :param dags: only runs of these DAGs
    """
    from sqlalchemy import func, select

    from airflow_batch_provider.ledger import schema as s

    if not _has_tables(ledger):
        return []
    r = s.runs.c
    q = (
        select(r.workload, func.count().label("runs"), func.max(r.started_at).label("last_started"))
        .where(_dag_clause(dags))
        .group_by(r.workload)
        .order_by(func.max(r.started_at).desc())
    )
    with ledger.engine.connect() as conn:
        return [
            {"workload": row.workload, "runs": int(row.runs), "last_started": _utc(row.last_started)}
            for row in conn.execute(q)
        ]


def _run_rows(ledger: Ledger, *where: Any, limit: int | None = None) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from airflow_batch_provider.ledger import schema as s

    if not _has_tables(ledger):
        return []
    q = select(s.runs).where(*where).order_by(s.runs.c.started_at.desc(), s.runs.c.workload)
    if limit is not None:
        q = q.limit(limit)
    with ledger.engine.connect() as conn:
        return [dict(row) for row in conn.execute(q).mappings()]


def review_counts(ledger: Ledger, workload: str) -> dict[str, int]:
    """Return the open review queue of a workload counted by error code (``-``: none).

    :param ledger: the ledger
    :param workload: workload name
    """
    from sqlalchemy import func, select

    from airflow_batch_provider.ledger import schema as s

    c = s.items.c
    q = (
        select(c.error_code, func.count().label("n"))
        .where(c.workload == workload, c.state == "review", c.review_action.is_(None))
        .group_by(c.error_code)
    )
    with ledger.engine.connect() as conn:
        counts = {str(r.error_code or "-"): int(r.n) for r in conn.execute(q)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def item_costs(ledger: Ledger, workload: str, item_keys: Sequence[str]) -> dict[tuple[str, str], int]:
    """Return what each item's attempts cost so far, in nano-dollars, by ``(item_key, prompt_version)``.

    :param ledger: the ledger
    :param workload: workload name
    :param item_keys: the items
    """
    from sqlalchemy import func, select

    from airflow_batch_provider.ledger import schema as s

    if not item_keys:
        return {}
    a = s.attempts.c
    q = (
        select(a.item_key, a.prompt_version, func.sum(a.cost_nusd).label("nusd"))
        .where(a.workload == workload, a.item_key.in_(sorted(set(item_keys))))
        .group_by(a.item_key, a.prompt_version)
    )
    with ledger.engine.connect() as conn:
        return {(r.item_key, r.prompt_version): int(r.nusd or 0) for r in conn.execute(q)}


# ---- end of plugin-side SQL ---------------------------------------------------------------------


@dataclass(frozen=True)
class RunView:
    """What the page knows about one run.

    :param workload: workload name
    :param run_id: the Airflow run id
    :param dag_id: the DAG that recorded it (``None``: not recorded)
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
    dag_id: str | None
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
            "dag_id": self.dag_id,
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
        dag_id=row.get("dag_id"),
        provider=row.get("provider"),
        model=row.get("model"),
        started_at=started,
        finished_at=finished,
        states=_ordered(states, STATE_ORDER),
        report=report,
        stale=finished is None and started is not None and now - started > STALE_AFTER,
    )


def _views(ledger: Ledger, rows: Iterable[Mapping[str, Any]]) -> list[RunView]:
    now = datetime.now(timezone.utc)
    return [_run_view(ledger, row, now) for row in rows]


def list_runs(ledger: Ledger, workload: str | None, limit: int, dags: DagSet) -> list[RunView]:
    """Return the latest runs of ``dags``, newest first.

    :param ledger: the ledger
    :param workload: only this workload
    :param limit: at most this many (capped at :data:`MAX_RUNS`)
    :param dags: only runs of these DAGs (``None`` in it: runs recorded without a DAG)
    """
    from airflow_batch_provider.ledger import schema as s

    where = [_dag_clause(dags)]
    if workload:
        where.append(s.runs.c.workload == workload)
    return _views(ledger, _run_rows(ledger, *where, limit=max(1, min(limit, MAX_RUNS))))


def find_run(ledger: Ledger, workload: str, run_id: str) -> RunView | None:
    """Return one run, or ``None`` when the ledger has no such run.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    from airflow_batch_provider.ledger import schema as s

    rows = _run_rows(ledger, s.runs.c.workload == workload, s.runs.c.run_id == run_id)
    return _views(ledger, rows)[0] if rows else None


def runs_of_dag_run(ledger: Ledger, dag_id: str, run_id: str) -> list[RunView]:
    """Return every workload's run recorded by one DAG run (matched on the DAG *and* the run id).

    :param ledger: the ledger
    :param dag_id: the DAG
    :param run_id: the Airflow run id
    """
    from airflow_batch_provider.ledger import schema as s

    rows = _run_rows(ledger, s.runs.c.dag_id == dag_id, s.runs.c.run_id == run_id)
    return sorted(_views(ledger, rows), key=lambda r: r.workload)


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
    templates = console_templates()
    jobs = []
    for job in ledger.get_jobs(run.workload, run.run_id):
        values = {k: getattr(job, k) for k in JOB_FIELDS}
        shown = {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in values.items()}
        shown["console_url"] = (
            console_url(job.provider, job.batch_id, templates=templates) if job.batch_id else None
        )
        jobs.append(shown)
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


def _review_rows(ledger: Ledger, items: Sequence[ItemRow], workload: str) -> list[dict[str, Any]]:
    costs = item_costs(ledger, workload, [i.item_key for i in items])
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
            "updated_at": _iso(i.updated_at),
        }
        for i in items
    ]


def review_page(
    ledger: Ledger, workload: str, error_code: str | None, limit: int = REVIEW_PAGE, offset: int = 0
) -> dict[str, Any]:
    """Return one page of a workload's review queue with its counts (JSON-safe).

    :param ledger: the ledger
    :param workload: workload name
    :param error_code: only items with this error code
    :param limit: at most this many items
    :param offset: skip this many first
    """
    counts = review_counts(ledger, workload)
    items = ledger.review_items(workload, error_code=error_code, limit=limit, offset=offset)
    total = counts.get(error_code or "", 0) if error_code else sum(counts.values())
    return {
        "workload": workload,
        "error_code": error_code,
        "by_error_code": counts,
        "total": total,
        "offset": offset,
        "items": _review_rows(ledger, items, workload),
    }


def iter_review(ledger: Ledger, workload: str, error_code: str | None) -> Iterator[dict[str, Any]]:
    """Yield every item of a workload's review queue, a page at a time.

    :param ledger: the ledger
    :param workload: workload name
    :param error_code: only items with this error code
    """
    offset = 0
    while True:
        items = ledger.review_items(workload, error_code=error_code, limit=REVIEW_PAGE, offset=offset)
        yield from _review_rows(ledger, items, workload)
        if len(items) < REVIEW_PAGE:
            return
        offset += len(items)


def in_doubt(ledger: Ledger, workload: str) -> list[dict[str, Any]]:
    """Return the workload's batches whose creation could not be confirmed, with what is known.

    :param ledger: the ledger
    :param workload: workload name
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
            "since": _iso(j.in_doubt_at),
            "claims": j.claim_count,
        }
        for j in ledger.jobs_in_doubt(workload)
    ]


def audit_trail(ledger: Ledger, workload: str, limit: int = 50) -> list[dict[str, Any]]:
    """Return the latest audit rows of a workload, newest first.

    :param ledger: the ledger
    :param workload: workload name
    :param limit: how many
    """
    return [
        {
            "at": _iso(a.at),
            "actor": a.actor,
            "action": a.action,
            "item_count": a.item_count,
            "target": a.target,
            "reason": a.reason,
        }
        for a in ledger.audit_log(workload, limit=limit)
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


def form_token(secret: bytes, actor: str, workload: str) -> str:
    """The token the action form carries: binds a POST to the user and workload it was shown for.

    :param secret: the server's secret
    :param actor: the user
    :param workload: the workload
    """
    message = json.dumps([actor, workload]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _server_secret() -> bytes:
    """``[api_auth] jwt_secret`` (shared by every API server worker), else a secret of this process."""
    try:
        from airflow.configuration import conf

        configured = conf.get("api_auth", "jwt_secret", fallback="") or ""
    except Exception:  # outside Airflow a process secret does as well
        configured = ""
    if configured:
        return hashlib.sha256(b"llm-batch-review-form\n" + configured.encode()).digest()
    return secrets.token_bytes(32)


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


def _airflow_access() -> AccessFor:
    from airflow.api_fastapi.core_api.security import get_user

    from airflow_batch_provider.plugins.access import AirflowAccess

    user_dep = Depends(get_user)

    def access_of(user: Any = user_dep) -> Access:
        return AirflowAccess(user)

    return access_of


def create_app(
    ledger_url: LedgerUrl | None = None,
    *,
    access_for: AccessFor | None = None,
    authenticate: bool = True,
    form_secret: bytes | None = None,
    trigger: TriggerRun | None = None,
) -> FastAPI:
    """Build the page's FastAPI app.

    :param ledger_url: returns the ledger's URL (default: :func:`configured_ledger_url`)
    :param access_for: a FastAPI dependency giving the request's :class:`~.access.Access`
        (default: Airflow's logged-in user, as its auth manager authorizes them)
    :param authenticate: require an Airflow user (JWT bearer token or the UI's session cookie) on
        every route, as the Airflow API does; plugin apps are mounted without Airflow's
        authentication, so this app checks it itself. Without it and without ``access_for``, the
        page reads everything and acts on nothing: only for a server bound to loopback.
    :param form_secret: key of the action form's token (default: derived from
        ``[api_auth] jwt_secret``)
    :param trigger: triggers a run of a DAG for a re-drive "now" (default: :func:`trigger_airflow_run`)
    """
    dependencies = []
    if authenticate:
        from airflow.api_fastapi.core_api.security import requires_authenticated

        dependencies.append(Depends(requires_authenticated()))
    if access_for is None:
        if authenticate:
            access_for = _airflow_access()
        else:
            local = StaticAccess("local", read=None, edit=frozenset())

            def access_for() -> Access:
                return local

    url_of = ledger_url or configured_ledger_url
    access_dep = Depends(access_for)
    secret = form_secret or _server_secret()
    trigger = trigger or trigger_airflow_run
    app = FastAPI(
        title="LLM batch progress and cost",
        description="The airflow-batch-provider ledger: progress, cost and the review queue.",
        dependencies=dependencies,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def url() -> str:
        try:
            return url_of()
        except Exception as exc:
            log.exception("the LLM batch page could not find the configured ledger")
            raise LedgerUnavailable(_unavailable(exc)) from exc

    def read(fn: Callable[[Ledger], Any]) -> Any:
        try:
            ledger = open_readonly(url())
            return fn(ledger)
        except (HTTPException, Forbidden, LedgerUnavailable):
            raise
        except Exception as exc:
            log.exception("the LLM batch page could not read the ledger")
            raise LedgerUnavailable(_unavailable(exc)) from exc

    def html(name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        context.setdefault("refresh", False)
        body = _templates().get_template(name).render(root=root, **context)
        return HTMLResponse(body, status_code=status_code, headers=dict(SECURITY_HEADERS))

    def readable_dags(ledger: Ledger, access: Access) -> DagSet:
        return frozenset(readable(access, (d for _w, d in run_dags(ledger))))

    def require_run(access: Access, run: RunView | None, workload: str, run_id: str) -> RunView:
        if run is None:
            raise HTTPException(404, f"the ledger has no run {run_id!r} of workload {workload!r}")
        if not access.allowed("GET", run.dag_id):
            raise Forbidden(f"You may not read the runs of the DAG that recorded run {run_id!r}.")
        return run

    def require_workload(ledger: Ledger, access: Access, workload: str, method: Method) -> set[str | None]:
        dags = {d for _w, d in run_dags(ledger, workload)}
        if not dags:
            raise HTTPException(404, f"the ledger has no run of workload {workload!r}")
        if not allowed_all(access, method, dags):
            what = "read the runs of" if method == "GET" else "edit"
            raise Forbidden(f"You may not {what} every DAG that runs workload {workload!r}.")
        return dags

    @app.exception_handler(LedgerUnavailable)
    async def _unavailable_handler(request: Request, exc: LedgerUnavailable) -> Response:
        if "/api/" in request.url.path:
            return JSONResponse({"detail": str(exc)}, status_code=503, headers=dict(SECURITY_HEADERS))
        return html("error.html", request, status_code=503, title="Ledger unavailable", message=str(exc))

    @app.exception_handler(Forbidden)
    async def _forbidden_handler(request: Request, exc: Forbidden) -> Response:
        if "/api/" in request.url.path or request.url.path.endswith("/export"):
            return JSONResponse({"detail": str(exc)}, status_code=403, headers=dict(SECURITY_HEADERS))
        return html("error.html", request, status_code=403, title="Forbidden", message=str(exc))

    @app.exception_handler(HTTPException)
    async def _http_handler(request: Request, exc: HTTPException) -> Response:
        if "/api/" in request.url.path or exc.status_code in (401, 405, 422):
            return JSONResponse(
                {"detail": exc.detail}, status_code=exc.status_code, headers=dict(exc.headers or {})
            )
        title = "Not found" if exc.status_code == 404 else "Request refused"
        return html("error.html", request, status_code=exc.status_code, title=title, message=str(exc.detail))

    @app.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        access: Access = access_dep,
        workload: str | None = Query(None),
        limit: int = Query(20, ge=1, le=MAX_RUNS),
    ) -> Response:
        def load(ledger: Ledger) -> dict[str, Any]:
            dags = readable_dags(ledger, access)
            runs = list_runs(ledger, workload, limit, dags)
            latest = run_detail(ledger, runs[0]) if runs else None
            return {"workloads": list_workloads(ledger, dags), "runs": runs, "detail": latest}

        data = read(load)
        refresh = any(not r.finished and not r.stale for r in data["runs"])
        return html("index.html", request, workload=workload, refresh=refresh, title="LLM batch", **data)

    @app.get("/run", response_class=HTMLResponse)
    def run_page(
        request: Request,
        access: Access = access_dep,
        workload: str = Query(...),
        run_id: str = Query(...),
    ) -> Response:
        def load(ledger: Ledger) -> dict[str, Any]:
            return run_detail(
                ledger, require_run(access, find_run(ledger, workload, run_id), workload, run_id)
            )

        detail = read(load)
        refresh = not detail["finished"] and not detail["stale"]
        return html("run.html", request, detail=detail, refresh=refresh, title=f"{workload} · {run_id}")

    @app.get("/dag-run", response_class=HTMLResponse)
    def dag_run_page(
        request: Request,
        access: Access = access_dep,
        dag_id: str = Query(...),
        run_id: str = Query(...),
    ) -> Response:
        if not access.allowed("GET", dag_id):
            raise Forbidden(f"You may not read the runs of DAG {dag_id!r}.")
        details = read(
            lambda ledger: [run_detail(ledger, r) for r in runs_of_dag_run(ledger, dag_id, run_id)]
        )
        refresh = any(not d["finished"] and not d["stale"] for d in details)
        return html(
            "dag_run.html",
            request,
            details=details,
            dag_id=dag_id,
            run_id=run_id,
            refresh=refresh,
            title=f"LLM batch · {run_id}",
        )

    @app.get("/review", response_class=HTMLResponse)
    def review(
        request: Request,
        access: Access = access_dep,
        workload: str = Query(...),
        error_code: str | None = Query(None),
        offset: int = Query(0, ge=0),
        done: str | None = Query(None),
        moved: int | None = Query(None),
        triggered: str | None = Query(None),
        trigger_failed: str | None = Query(None),
    ) -> Response:
        def load(ledger: Ledger) -> dict[str, Any]:
            dags = require_workload(ledger, access, workload, "GET")
            return {
                "queue": review_page(ledger, workload, error_code or None, REVIEW_PAGE, offset),
                "in_doubt": in_doubt(ledger, workload),
                "audit": audit_trail(ledger, workload),
                "may_act": allowed_all(access, "PUT", dags),
                "may_trigger": len(dags) == 1 and None not in dags and allowed_all(access, "POST", dags),
                "dags": sorted(d or "(not recorded)" for d in dags),
            }

        data = read(load)
        return html(
            "review.html",
            request,
            workload=workload,
            error_code=error_code or None,
            token=form_token(secret, access.actor, workload) if data["may_act"] else "",
            done=done if done in REVIEW_ACTIONS else None,
            moved=moved,
            triggered=triggered,
            trigger_failed=trigger_failed,
            page_size=REVIEW_PAGE,
            title=f"Review · {workload}",
            **data,
        )

    @app.get("/review/export")
    def review_export(
        access: Access = access_dep,
        workload: str = Query(...),
        error_code: str | None = Query(None),
        format: Literal["csv", "jsonl"] = Query("csv"),
    ) -> Response:
        ledger = read(lambda ledger: ledger)
        read(lambda ledger: require_workload(ledger, access, workload, "GET"))
        rows = iter_review(ledger, workload, error_code or None)
        body = review_csv(rows) if format == "csv" else review_jsonl(rows)
        media = "text/csv; charset=utf-8" if format == "csv" else "application/x-ndjson"
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in workload)[:80] or "workload"
        headers = {
            **SECURITY_HEADERS,
            "Content-Disposition": f'attachment; filename="review-{safe}.{format}"',
        }
        return StreamingResponse(body, media_type=media, headers=headers)

    @app.post("/review/action")
    async def review_action(request: Request, access: Access = access_dep) -> Response:
        form = await request.form()
        workload = str(form.get("workload") or "")
        action = str(form.get("action") or "")
        reason = str(form.get("reason") or "").strip()
        item_keys = [str(k) for k in form.getlist("item_key")]
        every = str(form.get("every_with_error_code") or "") or None
        if not workload:
            raise HTTPException(400, "the form names no workload")
        if not hmac.compare_digest(str(form.get("token") or ""), form_token(secret, access.actor, workload)):
            raise Forbidden("The form's token does not match: reload the review page and try again.")
        if action not in REVIEW_ACTIONS:
            raise HTTPException(
                400, f"action must be one of {', '.join(REVIEW_ACTIONS)}; got {action[:40]!r}"
            )
        if not reason or len(reason) > MAX_REASON:
            raise HTTPException(
                400, f"give a reason (1 to {MAX_REASON} characters): it goes to the audit table"
            )
        if not item_keys and every is None:
            raise HTTPException(400, "select at least one item, or every item with the filtered error code")
        if len(item_keys) > MAX_ACTION_ITEMS:
            raise HTTPException(400, f"at most {MAX_ACTION_ITEMS} items at once; got {len(item_keys)}")
        trigger_now = form.get("trigger_now") == "1"

        def act() -> dict[str, Any]:
            from airflow_batch_provider.exceptions import LedgerError

            dags = read(lambda ledger: require_workload(ledger, access, workload, "PUT"))
            dag_id = None
            if trigger_now:
                # checked before anything moves, so that a refused trigger changes nothing
                dag_id = _only_dag(dags, workload)
                if action != "redrive":
                    raise HTTPException(400, "only a re-drive can go to a run triggered now")
                if not access.allowed("POST", dag_id):
                    raise Forbidden(f"You may not trigger runs of DAG {dag_id!r}.")
            try:
                moved = _apply_review_action(
                    open_for_actions(url()), action, workload, item_keys or None, every, access.actor, reason
                )
            except LedgerError as exc:
                # the ledger refused it (an item moved meanwhile, a rule of the item states): say why
                log.warning("review action %s on %r refused by the ledger: %s", action, workload, exc)
                raise HTTPException(409, f"The ledger refused the {action}: {exc}") from exc
            log.info("%s %s %d review item(s) of workload %r", access.actor, action, moved, workload)
            out: dict[str, Any] = {"done": action, "moved": moved}
            if dag_id is not None:
                try:
                    out["triggered"] = trigger(
                        dag_id, access.actor, f"re-drive of {moved} review item(s): {reason}"
                    )
                except Exception as exc:
                    # the re-drive stands: the next run sends the items; say the trigger failed
                    log.exception("triggering %s after a re-drive of %r failed", dag_id, workload)
                    out["trigger_failed"] = type(exc).__name__
                else:
                    log.info(
                        "%s triggered run %s of %s after a re-drive", access.actor, out["triggered"], dag_id
                    )
            return out

        done = await run_in_threadpool(act)
        root = request.scope.get("root_path", "").rstrip("/")
        back = f"{root}/review?{qs(workload=workload, error_code=every, **done)}"
        return RedirectResponse(back, status_code=303, headers=dict(SECURITY_HEADERS))

    @app.get("/api/runs")
    def api_runs(
        access: Access = access_dep,
        workload: str | None = Query(None),
        limit: int = Query(20, ge=1, le=MAX_RUNS),
    ) -> JSONResponse:
        runs = read(lambda ledger: list_runs(ledger, workload, limit, readable_dags(ledger, access)))
        return JSONResponse({"runs": [r.summary() for r in runs]}, headers=dict(SECURITY_HEADERS))

    @app.get("/api/runs/{workload}/{run_id:path}")
    def api_run(workload: str, run_id: str, access: Access = access_dep) -> JSONResponse:
        def load(ledger: Ledger) -> dict[str, Any]:
            return run_detail(
                ledger, require_run(access, find_run(ledger, workload, run_id), workload, run_id)
            )

        return JSONResponse(read(load), headers=dict(SECURITY_HEADERS))

    @app.get("/api/review")
    def api_review(
        access: Access = access_dep,
        workload: str = Query(...),
        error_code: str | None = Query(None),
        limit: int = Query(REVIEW_PAGE, ge=1, le=1000),
        offset: int = Query(0, ge=0),
    ) -> JSONResponse:
        def load(ledger: Ledger) -> dict[str, Any]:
            require_workload(ledger, access, workload, "GET")
            return {
                **review_page(ledger, workload, error_code or None, limit, offset),
                "in_doubt": in_doubt(ledger, workload),
            }

        return JSONResponse(read(load), headers=dict(SECURITY_HEADERS))

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        return Response(ICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    return app


def _only_dag(dags: set[str | None], workload: str) -> str:
    """The one DAG a workload's re-drive can trigger; refuse when there is not exactly one."""
    named = [d for d in dags if d is not None]
    if len(dags) != 1 or not named:
        raise HTTPException(
            409,
            f"workload {workload!r} is run by {len(named)} DAG(s) recorded"
            f"{' and by runs with no DAG recorded' if None in dags else ''}: trigger the run you want yourself",
        )
    return named[0]


def trigger_airflow_run(dag_id: str, actor: str, note: str) -> str:
    """Trigger a manual run of ``dag_id`` in Airflow's metadata database; return its run id.

    A paused DAG's run waits until the DAG is unpaused, as one triggered from the UI does.

    :param dag_id: the DAG
    :param actor: who asked (recorded as the triggering user)
    :param note: the run's note
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    run = trigger_dag(
        dag_id, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=actor, note=note[:1000]
    )
    if run is None:
        raise HTTPException(409, f"Airflow did not create a run of DAG {dag_id!r}")
    return str(run.run_id)


def _apply_review_action(
    ledger: Ledger,
    action: str,
    workload: str,
    item_keys: list[str] | None,
    error_code: str | None,
    actor: str,
    reason: str,
) -> int:
    """Run one review action through the ledger's review API (which writes the audit row)."""
    if action == "redrive":
        return ledger.redrive(
            workload, item_keys=item_keys, error_code=error_code, actor=actor, reason=reason
        )
    if action == "resolve":
        return ledger.resolve_review(
            workload, item_keys=item_keys, error_code=error_code, actor=actor, note=reason
        )
    return ledger.skip_review(
        workload, item_keys=item_keys, error_code=error_code, actor=actor, reason=reason
    )


def _unavailable(exc: BaseException) -> str:
    """A message about an unreadable ledger that names no URL, host or credential."""
    return (
        f"Could not read the configured ledger ({type(exc).__name__}). The API server log has the details; "
        "check [batch_provider] ledger_url or ledger_conn_id, and that the database is reachable from the "
        "API server."
    )
