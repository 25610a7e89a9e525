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
- ``GET /api/trend?workload=&nights=``: a workload's latest runs as a trend, oldest first (JSON),
  from the runs table and the reports publish stored, never from item rows (:mod:`.trend`);
- ``GET /static/trend.js``: the page's own script, which draws the trend chart from that JSON;
- ``GET /icon.svg``: the menu icon.

Permissions: every route asks Airflow's auth manager (:mod:`.access`). A run, its items, errors
and cost are shown only to a user who may read the runs of the DAG that recorded it; lists are
filtered to those DAGs; a workload's review queue needs read access to every DAG that ran it,
and its actions edit access to each. The ledger is the configured one (``[batch_provider]
ledger_conn_id``, else ``ledger_url``): no request chooses which database the server opens.

The plugin is in three parts: the ledger's read queries are in the ledger
(:mod:`airflow_batch_provider.ledger.reads` and the ledger's own read methods; no SQL here), the
view model is :mod:`.view` (pure functions from those frozen records to what the page and the
JSON show), and this module holds the routes, their permission checks and the loaders that join
the two; the review queue's pages, actions and form token are in :mod:`.review`.

Reading uses a read-only engine (SQLite ``mode=ro``, PostgreSQL
``default_transaction_read_only``); only the review actions write, through the ledger's own
review API, which records each in the audit table. HTML is rendered server side by Jinja2 with
autoescaping and loads no external resource; the one script is the plugin's own ``trend.js``
(same origin, no inline script), which draws the trend chart from ``/api/trend`` and whose
figures the page also shows as a table without it. The Content Security Policy allows nothing
else; the action form carries a token bound to the user and the workload.
No connection URL or credential is ever rendered; a ledger that cannot be read is reported by
error class, the details go to the server log.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from airflow_batch_provider.core.states import ATTENTION_STATES
from airflow_batch_provider.ledger import Ledger, reads
from airflow_batch_provider.ledger.deliveries import refused_rows
from airflow_batch_provider.ledger.reads import DagSet, RunRecord
from airflow_batch_provider.links.batch import console_templates, console_url
from airflow_batch_provider.plugins import deliveries, trend, view
from airflow_batch_provider.plugins.access import Access, Method, StaticAccess, allowed_all, readable
from airflow_batch_provider.plugins.review import (
    AUDIT_SHOWN,
    MAX_ACTION_ITEMS,
    MAX_REASON,
    REVIEW_ACTIONS,
    REVIEW_PAGE,
    TriggerRun,
    apply_review_action,
    form_token,
    iter_review,
    only_dag,
    review_page,
    server_secret,
    trigger_airflow_run,
)
from airflow_batch_provider.plugins.view import RunView

if TYPE_CHECKING:
    from jinja2 import Environment


log = logging.getLogger(__name__)

#: A run that has not finished is refreshed every this many seconds.
REFRESH_SECONDS: Final = 15
#: Most runs one request lists.
MAX_RUNS: Final = 200
LedgerUrl = Callable[[], str]
#: Gives the access of the request's user.
AccessFor = Callable[..., Access]


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


# --------------------------------------------------------------------------- loading (ledger -> view)
#
# Each loader reads records through the ledger (``ledger.reads`` and the ledger's own read
# methods) and builds what the page shows with the pure functions of :mod:`.view`.


def run_views(ledger: Ledger, runs: Iterable[RunRecord]) -> list[RunView]:
    """Build the views of ``runs``, counting items live only for the runs without a recorded report.

    :param ledger: the ledger
    :param runs: the runs
    """
    now = datetime.now(timezone.utc)
    return [
        view.run_view(
            run,
            ledger.count_states(run.workload, run.run_id) if view.recorded_states(run) is None else None,
            now,
        )
        for run in runs
    ]


def list_runs(ledger: Ledger, workload: str | None, limit: int, dags: DagSet) -> list[RunView]:
    """Return the latest runs of ``dags``, newest first.

    :param ledger: the ledger
    :param workload: only this workload
    :param limit: at most this many (capped at :data:`MAX_RUNS`)
    :param dags: only runs of these DAGs (``None`` in it: runs recorded without a DAG)
    """
    return run_views(ledger, reads.recent_runs(ledger, dags, workload, max(1, min(limit, MAX_RUNS))))


def find_run(ledger: Ledger, workload: str, run_id: str) -> RunView | None:
    """Return one run, or ``None`` when the ledger has no such run.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    found = reads.find_run(ledger, workload, run_id)
    return None if found is None else run_views(ledger, [found])[0]


def run_detail(ledger: Ledger, run: RunView) -> dict[str, Any]:
    """Return one run in detail (JSON-safe): states, routes, jobs, report, items needing attention.

    :param ledger: the ledger
    :param run: the run
    """
    routes = view.recorded_routes(run)
    if routes is None:
        routes = view.live_routes(ledger.count_routes(run.workload, run.run_id))
    templates = console_templates()
    jobs = [
        view.job_row(
            job, console_url(job.provider, job.batch_id, templates=templates) if job.batch_id else None
        )
        for job in ledger.get_jobs(run.workload, run.run_id)
    ]
    attention: list[Mapping[str, Any]] = []
    if view.attention_total(run):
        for row in ledger.iter_items(
            run.workload,
            run.run_id,
            states=ATTENTION_STATES,
            columns=list(view.ATTENTION_FIELDS),
            page=view.ATTENTION_SAMPLE,
        ):
            attention.append(dict(row))
            if len(attention) >= view.ATTENTION_SAMPLE:
                break
    paid = sum(int(row["cost_nusd"] or 0) for row in ledger.attempt_totals(run.workload, run.run_id))
    return view.run_detail(run, routes=routes, jobs=jobs, attention=attention, paid_so_far_nusd=paid)


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
    env.filters.update(money=view.money, percent=view.percent, when=view.when, clock=view.clock)
    env.globals.update(
        duration=view.duration,
        bar_segments=view.bar_segments,
        delivery_table=deliveries.delivery_table,
        consumer_table=deliveries.consumer_table,
        share=view.share,
        qs=view.qs,
        state_colors=view.STATE_COLORS,
        refresh_seconds=REFRESH_SECONDS,
        night_choices=trend.NIGHT_CHOICES,
    )
    return env


# --------------------------------------------------------------------------- the app

SECURITY_HEADERS: Final[Mapping[str, str]] = {
    # No external resource and no inline script: the plugin's own script (same origin), which
    # fetches the page's JSON (same origin), inline styles and same-origin images only. The Airflow
    # UI shows the page in a same-origin iframe, so framing is allowed from the same origin only.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
        "img-src 'self' data:; frame-ancestors 'self'; base-uri 'none'; form-action 'self'"
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
    secret = form_secret or server_secret()
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
        return frozenset(readable(access, (d for _w, d in reads.run_dags(ledger))))

    def require_run(access: Access, run: RunView | None, workload: str, run_id: str) -> RunView:
        if run is None:
            raise HTTPException(404, f"the ledger has no run {run_id!r} of workload {workload!r}")
        if not access.allowed("GET", run.dag_id):
            raise Forbidden(f"You may not read the runs of the DAG that recorded run {run_id!r}.")
        return run

    def require_workload(ledger: Ledger, access: Access, workload: str, method: Method) -> set[str | None]:
        dags = {d for _w, d in reads.run_dags(ledger, workload)}
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
        nights: int = Query(trend.DEFAULT_NIGHTS, ge=1, le=trend.MAX_NIGHTS),
    ) -> Response:
        def load(ledger: Ledger) -> dict[str, Any]:
            dags = readable_dags(ledger, access)
            runs = list_runs(ledger, workload, limit, dags)
            latest = run_detail(ledger, runs[0]) if runs else None
            shown = trend.workload_trend(ledger, workload, nights, dags) if workload and runs else None
            return {
                "workloads": reads.workload_summaries(ledger, dags),
                "runs": runs,
                "detail": latest,
                "trend": shown,
            }

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
            lambda ledger: [
                run_detail(ledger, r)
                for r in run_views(ledger, reads.runs_of_dag_run(ledger, dag_id, run_id))
            ]
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
                "in_doubt": view.in_doubt_rows(ledger.jobs_in_doubt(workload)),
                "refused_deliveries": deliveries.refused_delivery_rows(refused_rows(ledger, workload)),
                "audit": view.audit_rows(ledger.audit_log(workload, limit=AUDIT_SHOWN)),
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
        body = view.review_csv(rows) if format == "csv" else view.review_jsonl(rows)
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
                dag_id = only_dag(dags, workload)
                if action != "redrive":
                    raise HTTPException(400, "only a re-drive can go to a run triggered now")
                if not access.allowed("POST", dag_id):
                    raise Forbidden(f"You may not trigger runs of DAG {dag_id!r}.")
            try:
                moved = apply_review_action(
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
        back = f"{root}/review?{view.qs(workload=workload, error_code=every, **done)}"
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
                "in_doubt": view.in_doubt_rows(ledger.jobs_in_doubt(workload)),
                "refused_deliveries": deliveries.refused_delivery_rows(refused_rows(ledger, workload)),
            }

        return JSONResponse(read(load), headers=dict(SECURITY_HEADERS))

    @app.get("/api/trend")
    def api_trend(
        access: Access = access_dep,
        workload: str = Query(...),
        nights: int = Query(trend.DEFAULT_NIGHTS, ge=1, le=trend.MAX_NIGHTS),
    ) -> JSONResponse:
        def load(ledger: Ledger) -> dict[str, Any]:
            dags = {d for _w, d in reads.run_dags(ledger, workload)}
            if not dags:
                raise HTTPException(404, f"the ledger has no run of workload {workload!r}")
            shown = frozenset(readable(access, dags))
            if not shown:
                raise Forbidden(f"You may not read the runs of any DAG that runs workload {workload!r}.")
            return trend.workload_trend(ledger, workload, nights, shown)

        return JSONResponse(read(load), headers=dict(SECURITY_HEADERS))

    @app.get("/static/trend.js", include_in_schema=False)
    def trend_js() -> Response:
        headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}
        return Response(trend.script(), media_type="text/javascript; charset=utf-8", headers=headers)

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        return Response(ICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    return app


def _unavailable(exc: BaseException) -> str:
    """A message about an unreadable ledger that names no URL, host or credential."""
    return (
        f"Could not read the configured ledger ({type(exc).__name__}). The API server log has the details; "
        "check [batch_provider] ledger_url or ledger_conn_id, and that the database is reachable from the "
        "API server."
    )
