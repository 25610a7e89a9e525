"""Airflow UI page for LLM batch progress and cost.

The plugin mounts a FastAPI app at ``/llm-batch`` on the Airflow API server (see
:mod:`airflow_batch_provider.plugins.api`; every route asks Airflow's auth manager) and adds two
external views to the UI: an "LLM batch" entry in the navigation (under *Browse*), and an "LLM
batch" tab on every DAG run, which shows the ledger runs recorded by that DAG under that run id.

Every Airflow component loads plugins, so this module imports nothing heavy: the FastAPI app is
built on its first request, in the API server only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from threading import Lock
from typing import Any, Final

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX: Final = "/llm-batch"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class LazyBatchApp:
    """An ASGI app that builds :func:`~airflow_batch_provider.plugins.api.create_app` on first use.

    :param factory: builds the real app (default: ``create_app()`` with Airflow authentication)
    """

    def __init__(self, factory: Callable[[], Any] | None = None) -> None:
        self._factory = factory
        self._app: Any = None
        self._lock = Lock()

    @property
    def app(self) -> Any:
        """The real FastAPI app (built now if it was not yet)."""
        if self._app is None:
            with self._lock:
                if self._app is None:
                    if self._factory is None:
                        from airflow_batch_provider.plugins.api import create_app

                        self._app = create_app()
                    else:
                        self._app = self._factory()
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def __repr__(self) -> str:
        return "airflow_batch_provider.plugins.api:create_app"


batch_app = LazyBatchApp()


class BatchProgressPlugin(AirflowPlugin):
    """Registers the LLM batch progress and cost page."""

    name = "llm_batch"
    fastapi_apps = [{"app": batch_app, "url_prefix": URL_PREFIX, "name": "LLM batch"}]
    external_views = [
        {
            "name": "LLM batch",
            "href": f"{URL_PREFIX}/",
            "icon": f"{URL_PREFIX}/icon.svg",
            "url_route": "llm-batch",
            "destination": "nav",
            "category": "browse",
        },
        {
            "name": "LLM batch",
            "href": f"{URL_PREFIX}/dag-run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
            "icon": f"{URL_PREFIX}/icon.svg",
            "url_route": "llm-batch-run",
            "destination": "dag_run",
        },
    ]
