"""The ASGI application: provider routers composed from a list, plus the ``/_emulator`` admin API.

A provider router is a module with a ``build_router(state: EmulatorState) -> APIRouter``
function; :data:`PROVIDER_ROUTERS` names the modules mounted by default. Adding a provider means
writing its module and adding one line there (or passing ``routers=`` to :func:`create_app`).

Admin endpoints (JSON):

- ``GET /_emulator/health``: ``{"status": "ok"}``
- ``GET /_emulator/config``: ``{"seed", "time_scale", "timings": {...}, "faults": {...}}``
- ``PUT /_emulator/config``: the same shape, partial; ``faults`` and ``timings`` merge key by key.
  Item and batch faults apply to batches created afterwards; request faults apply at once.
- ``GET /_emulator/stats``: counters (``batches_created``, ``files_uploaded``, ``sync_requests``
  and per-provider ``openai.*`` detail) and every batch's status and request counts
- ``POST /_emulator/reset``: forget all files, batches and counters; restore the start config
- ``POST /_emulator/clock``: ``{"advance_s": 30}`` moves the emulator clock forward (time travel
  for tests); answers ``{"now": <unix seconds>}``
- ``GET /_emulator/record``: the emulator's own record of what it created and billed, for
  invariant checks (a reset clears it)::

    {"now": <unix seconds>,
     "batches": {"<provider>": [            # every batch job ever created, oldest first
        {"id": "batch_...",                   # the provider's id (Bedrock: the job id, not the ARN)
         "creation_index": 0,                 # 0-based among the provider's batches
         "created_at": 1760000000.0,          # emulator clock, unix seconds
         "keys": {"metadata": {...},          # what a client can find it by, where the provider
                  "display_name": "...",      #   has it: OpenAI metadata, Gemini display name,
                  "job_name": "...",          #   Bedrock job name and client request token;
                  "client_token": "..."},     #   {} for Anthropic (it has none)
         "request_count": 3,
         "custom_ids": ["...", ...],          # every request's id, input order
         "status": "completed",               # the neutral status now
         "billed": {"<custom_id>": {"input_tokens": 0, "cached_input_tokens": 0,
                                    "cache_write_tokens": 0, "output_tokens": 0}}
                                              # per item that was processed and billed (an errored,
                                              # expired or cancelled item is absent); null until the
                                              # batch has ended
         "billed_again": [["<custom_id>", {...same four token counts...}], ...]
                                              # second answers billed for an item that already
                                              # had one (fault rate_duplicate_other); null until
                                              # the batch has ended
         "truncated": ["<custom_id>", ...]    # billed items whose output line was written cut in
                                              # half (fault rate_malformed): their usage cannot be
                                              # read from the file (once each, even when the
                                              # line was written twice); null until it ended
        }, ...]},
     "realtime": {"<provider>": [           # every billed real-time answer, in order
        {"custom_id": "..." | null,           # from the x-abp-custom-id request header, if sent
         "at": 1760000000.0,
         "usage": {...same four token counts...}}, ...]}}

  ``input_tokens`` excludes cached input tokens (the package's :class:`Usage` meaning).

Create faults (``faults.create_*``, see :mod:`~batch_emulator.faults`) are applied
by :func:`guard_create` around every create-like handler of every provider.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import CreateOp, retry_after_header
from batch_emulator.store import Clock, EmulatorState

RouterFactory = Callable[[EmulatorState], APIRouter]
#: Header the client puts on a real-time call to name its item; providers ignore it, the
#: emulator records it. Written here again, not imported: the emulator shares no code with the
#: adapters it checks.
CUSTOM_ID_HEADER: Final = "x-abp-custom-id"
__all__ = ["CUSTOM_ID_HEADER", "ApiError", "create_app", "guard_create"]

#: Modules mounted by :func:`create_app` by default; each has ``build_router(state)``.
PROVIDER_ROUTERS: Final[tuple[str, ...]] = (
    "batch_emulator.openai_api",
    "batch_emulator.anthropic_api",
    "batch_emulator.gemini_api",
    "batch_emulator.bedrock_api",
    "batch_emulator.vertex_api",
)


class ApiError(Exception):
    """An error answer with a provider-shaped JSON body; raised by routers, rendered by the app.

    :param status: HTTP status
    :param body: the JSON body, already in the provider's error shape
    :param headers: extra response headers (``Retry-After`` ...)
    """

    def __init__(
        self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = dict(body)
        self.headers = dict(headers or {})


class DroppedConnection(Exception):
    """Raised inside a started answer so that the server drops the connection (fault ``drop_after``)."""


async def _dropped_body() -> AsyncIterator[bytes]:
    yield b"{"
    raise DroppedConnection("emulated fault drop_after: the connection drops mid-answer")


async def guard_create(
    state: EmulatorState,
    provider: str,
    op: CreateOp,
    act: Callable[[], Awaitable[Any]],
    refuse: Callable[[int, Mapping[str, str]], ApiError],
) -> Any:
    """Run one create-like handler under the configured create faults.

    ``429`` and ``500`` answer before ``act`` runs (nothing is created); ``500_after``,
    ``drop_after`` and ``slow_after`` run ``act`` (the object exists) and then lose or delay the
    answer.

    :param state: the shared state
    :param provider: the router
    :param op: ``upload`` or ``create``
    :param act: the handler body; its return value is the answer
    :param refuse: builds the provider-shaped error of a status, with extra headers
    """
    fault = state.take_create_fault(provider, op)
    faults = state.config.faults
    if fault == "429":
        wait = faults.create_retry_after_s
        raise refuse(
            429,
            {"retry-after": retry_after_header(wait), "retry-after-ms": str(int(wait * 1000))},
        )
    if fault == "500":
        raise refuse(500, {})
    answer = await act()
    if fault == "500_after":
        raise refuse(500, {})
    if fault == "drop_after":
        return StreamingResponse(
            _dropped_body(), media_type="application/json", headers={"content-length": "4096"}
        )
    if fault == "slow_after":
        await asyncio.sleep(faults.create_slow_s)
    return answer


def _error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _load_factory(spec: str | RouterFactory) -> RouterFactory:
    if callable(spec):
        return spec
    module = importlib.import_module(spec)
    factory: RouterFactory = module.build_router
    return factory


def create_app(
    config: EmulatorConfig | None = None,
    *,
    routers: Sequence[str | RouterFactory] | None = None,
    clock: Clock | None = None,
) -> FastAPI:
    """Build the emulator application.

    :param config: settings (defaults: :class:`EmulatorConfig` defaults)
    :param routers: provider routers, as module names or factories (default :data:`PROVIDER_ROUTERS`)
    :param clock: the clock (default: wall clock)
    """
    state = EmulatorState(config or EmulatorConfig(), clock)
    app = FastAPI(title="airflow-batch-provider emulator", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.emulator = state

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (
            f"Unknown request URL: {request.method} {request.url.path}."
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        code = "unknown_url" if exc.status_code in (404, 405) else None
        return JSONResponse(_error_body(message, "invalid_request_error", code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_error_body(str(exc.errors()), "invalid_request_error"), status_code=400)

    app.include_router(_admin_router(state))
    for spec in routers if routers is not None else PROVIDER_ROUTERS:
        app.include_router(_load_factory(spec)(state))
    return app


def _admin_router(state: EmulatorState) -> APIRouter:
    router = APIRouter(prefix="/_emulator")

    async def _json_object(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as exc:
            raise ApiError(400, _error_body(f"body is not JSON: {exc}", "invalid_request_error")) from exc
        if not isinstance(body, dict):
            raise ApiError(400, _error_body("body must be a JSON object", "invalid_request_error"))
        return body

    @router.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok"}

    @router.get("/config")
    def get_config() -> dict[str, Any]:
        return state.config.runtime_view()

    @router.put("/config")
    async def put_config(request: Request) -> dict[str, Any]:
        patch = await _json_object(request)
        try:
            return state.update_config(patch).runtime_view()
        except (ValueError, TypeError) as exc:
            raise ApiError(400, _error_body(str(exc), "invalid_request_error")) from exc

    @router.get("/stats")
    def stats() -> dict[str, Any]:
        now = state.now()
        with state.lock:
            counters = dict(state.counters)
            jobs = state.jobs.list()
            batches = {}
            for job in jobs:
                view = job.view(now)
                batches[job.id] = {
                    "provider": job.provider,
                    "creation_index": job.creation_index,
                    "status": view.status,
                    "total": view.total,
                    "completed": view.completed,
                    "failed": view.failed,
                }
        return {
            "batches_created": counters.get("batches_created", 0),
            "files_uploaded": counters.get("files_uploaded", 0),
            "sync_requests": counters.get("sync_requests", 0),
            "counters": counters,
            "batches": batches,
        }

    @router.get("/record")
    def record() -> dict[str, Any]:
        return state.record()

    @router.post("/reset")
    def reset() -> dict[str, Any]:
        state.reset()
        return {"reset": True}

    @router.post("/clock")
    async def clock(request: Request) -> dict[str, Any]:
        body = await _json_object(request)
        try:
            now = state.clock.advance(float(body.get("advance_s", 0)))
        except (ValueError, TypeError) as exc:
            raise ApiError(400, _error_body(str(exc), "invalid_request_error")) from exc
        return {"now": now}

    return router
