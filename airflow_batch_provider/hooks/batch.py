"""Connection -> adapter. Behaviour lives in the adapters; this hook only builds them.

Which hook serves a connection type is the registry's entry
(:mod:`airflow_batch_provider.adapters.entries`); the connection forms (named fields, relabelled
and hidden standard fields) are declared in ``get_provider_info.py`` under ``conn-fields`` and
``ui-field-behaviour``, where Airflow 3.2+ reads them without importing the hooks.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import weakref
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseHook

from airflow_batch_provider.adapters.base import (
    AdapterSettings,
    AsyncStatusClient,
    BatchAdapter,
    BatchRef,
    BatchStatus,
)
from airflow_batch_provider.adapters.entries import known_conn_types, registration
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.adapters.registry import adapter_class, hook_path
from airflow_batch_provider.exceptions import ConfigurationError

#: connection type -> the hook class that turns it into adapter settings (the registry's; an
#: alias such as the OpenAI provider's own ``openai`` type is read as the type it stands for)
HOOKS: dict[str, str] = {conn_type: hook_path(conn_type) for conn_type in known_conn_types()}


def settings_from_connection(conn: Any) -> AdapterSettings:
    """Build adapter settings from an Airflow connection; the secret never leaves this object.

    The API base URL is the connection's host (with scheme, e.g. ``http://127.0.0.1:8089/v1``);
    the key is the password; everything else is in extras. Extras the UI form saved empty
    (``null`` or ``""``) are dropped, so an empty field means "default", as if it were absent.

    :param conn: an Airflow connection
    """
    extra = {k: v for k, v in dict(conn.extra_dejson or {}).items() if v is not None and v != ""}
    if conn.login:
        # e.g. an AWS access key id; adapters that need a login read it from extras
        extra.setdefault("login", conn.login)
    base_url = conn.host or extra.pop("base_url", None)
    if base_url and conn.port and "://" in base_url and base_url.count(":") == 1:
        base_url = f"{base_url}:{conn.port}"
    return AdapterSettings(
        api_key=conn.password or extra.pop("api_key", None), base_url=base_url, extra=extra
    )


def hook_class(conn_type: str) -> type[BatchHook]:
    """Return the hook class of a batch connection type (``BatchHook`` for unknown types).

    :param conn_type: e.g. ``bedrock_batch``
    """
    try:
        path = hook_path(conn_type)
    except ConfigurationError:
        return BatchHook  # the adapter registry refuses an unknown type by name
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls if isinstance(cls, type) and issubclass(cls, BatchHook) else BatchHook


class BatchHook(BaseHook):
    """Turn an LLM batch connection into the adapter registered for its connection type.

    Any batch connection id may be passed to this class: the settings are built by the hook of
    the connection's type (so a ``bedrock_batch`` connection gets its AWS credentials from its
    ``aws_conn_id``, a Vertex AI ``gemini_batch`` connection its Google credentials from its
    ``gcp_conn_id``).

    :param batch_conn_id: the connection id
    """

    conn_name_attr = "batch_conn_id"
    # the connection the README creates; operators and the sensor default to it
    default_conn_name = "openai_batch_default"
    conn_type = "openai_batch"
    hook_name = "LLM Batch"

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_conn_id = batch_conn_id

    @classmethod
    def adapter_settings(cls, conn: Any) -> AdapterSettings:
        """Return the adapter settings of a connection of this hook's type.

        Blocking: a cloud hook may read another connection (``aws_conn_id``, ``gcp_conn_id``).

        :param conn: an Airflow connection
        """
        return settings_from_connection(conn)

    def get_conn(self) -> BatchAdapter:
        """Return the adapter for this connection."""
        return self.get_adapter()

    def get_adapter(self) -> BatchAdapter:
        """Return the adapter for this connection (SDK imported now, lazily)."""
        conn = self.get_connection(self.batch_conn_id)
        conn_type = conn.conn_type or ""
        return adapter_class(conn_type)(hook_class(conn_type).adapter_settings(conn))

    @classmethod
    async def aget_adapter(cls, batch_conn_id: str) -> BatchAdapter:
        """Return the adapter, reading the connections without blocking the event loop.

        :param batch_conn_id: the connection id
        """
        conn = await cls.aget_connection(batch_conn_id)
        conn_type = conn.conn_type or ""
        adapter = adapter_class(conn_type)
        # a cloud hook may read its own connection (aws_conn_id, gcp_conn_id): off the loop
        settings = await asyncio.to_thread(hook_class(conn_type).adapter_settings, conn)
        return adapter(settings)

    @classmethod
    async def aget_status_client(cls, batch_conn_id: str) -> AsyncStatusClient:
        """Return an async status client of the connection, shared by the triggers of this event loop.

        Building an SDK client is slow and blocking (an SSL context with its CA store: about 0.1 s
        of CPU and 0.8 MiB each, measured in ``benchmarks/bench_triggers.py``): it is built once per
        connection and event loop, off the loop, and shared; it closes when the last trigger using it
        closes its lease. The connection is read on every call (calls made while a read of it is
        in flight share that read), so a changed connection (a rotated key) gets a new client
        while triggers already running keep theirs.

        :param batch_conn_id: the connection id
        """
        loop = asyncio.get_running_loop()
        reads = _READS.setdefault(loop, {})
        read = reads.get(batch_conn_id)
        if read is None:
            # Triggers that start together read the connection once (Airflow's async read loads
            # the secrets backends synchronously, on the loop, on every call).
            read = reads[batch_conn_id] = asyncio.ensure_future(cls._aread_settings(batch_conn_id))
            read.add_done_callback(lambda done: reads.pop(batch_conn_id, None))
        conn_type, settings = await asyncio.shield(read)
        return await _shared_status_client(conn_type, batch_conn_id, settings)

    @classmethod
    async def _aread_settings(cls, batch_conn_id: str) -> tuple[str, AdapterSettings]:
        conn = await cls.aget_connection(batch_conn_id)
        conn_type = conn.conn_type or ""
        return conn_type, await asyncio.to_thread(hook_class(conn_type).adapter_settings, conn)

    def probe(self, adapter: BatchAdapter) -> str:
        """Make one cheap authenticated read against the API and describe what answered.

        The adapter's public :meth:`~airflow_batch_provider.adapters.base.BatchAdapter.probe`; a hook
        whose check needs more than the API (the self-hosted lane's pod settings) overrides this.

        :param adapter: the adapter of this connection
        :raises Exception: whatever the SDK raises when the API is unreachable or refuses the key
        """
        return adapter.probe()

    def test_connection(self) -> tuple[bool, str]:
        """Check the connection with one read-only API call (the UI's "Test" button).

        :return: ``(True, what answered)`` or ``(False, why not)``; never a secret
        """
        conn_type = self.conn_type
        try:
            conn = self.get_connection(self.batch_conn_id)
            conn_type = conn.conn_type or conn_type
            hook = hook_class(conn_type)(self.batch_conn_id)
            adapter = adapter_class(conn_type)(hook.adapter_settings(conn))
            detail = hook.probe(adapter)
        except Exception as exc:  # the button reports every failure as text
            return False, f"{conn_type} connection {self.batch_conn_id!r} failed: {type(exc).__name__}: {exc}"
        return True, f"{conn_type} connection {self.batch_conn_id!r} works: {detail}"


class OpenAIBatchHook(BatchHook):
    """OpenAI, Azure OpenAI and OpenAI-compatible batch endpoints (``openai_batch``)."""

    conn_type = OpenAIBatchAdapter.conn_type
    default_conn_name = f"{conn_type}_default"
    hook_name = registration(conn_type).hook_name

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)


def _new_status_client(conn_type: str, settings: AdapterSettings) -> AsyncStatusClient:
    """Import the adapter (and its SDK) and build its async status client: blocking, run in a thread."""
    return adapter_class(conn_type)(settings).async_client()


def _fingerprint(conn_type: str, batch_conn_id: str, settings: AdapterSettings) -> str:
    """A digest of what a status client is built from (the secret enters only the digest)."""
    material = json.dumps(
        [conn_type, batch_conn_id, settings.api_key, settings.base_url, settings.extra],
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass
class _Shared:
    """One status client being built or built, and how many leases hold it."""

    built: asyncio.Future[AsyncStatusClient]
    users: int = 0


#: event loop -> connection id -> the read of its settings in flight
_READS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[str, asyncio.Future[tuple[str, AdapterSettings]]]
] = weakref.WeakKeyDictionary()
#: event loop -> settings digest -> the shared client (a closed loop's entries go with it)
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Shared]] = (
    weakref.WeakKeyDictionary()
)


class _StatusLease(AsyncStatusClient):
    """One trigger's hold on a shared status client; ``close`` gives it back (once)."""

    def __init__(
        self, clients: dict[str, _Shared], key: str, shared: _Shared, client: AsyncStatusClient
    ) -> None:
        self._clients = clients
        self._key = key
        self._shared: _Shared | None = shared
        self._client = client

    async def status(self, ref: BatchRef) -> BatchStatus:
        if self._shared is None:
            raise RuntimeError("this status client lease was closed; ask the hook for a new one.")
        return await self._client.status(ref)

    async def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is None:
            return
        shared.users -= 1
        if shared.users == 0:
            if self._clients.get(self._key) is shared:
                del self._clients[self._key]
            await self._client.close()


async def _shared_status_client(
    conn_type: str, batch_conn_id: str, settings: AdapterSettings
) -> AsyncStatusClient:
    """Lease the status client of these settings on the running loop, building it (off the loop) once."""
    clients = _SHARED.setdefault(asyncio.get_running_loop(), {})
    key = _fingerprint(conn_type, batch_conn_id, settings)
    shared = clients.get(key)
    if shared is None:
        shared = clients[key] = _Shared(
            asyncio.ensure_future(asyncio.to_thread(_new_status_client, conn_type, settings))
        )
    shared.users += 1
    try:
        client = await asyncio.shield(shared.built)
    except BaseException:
        shared.users -= 1
        failed = shared.built.done() and (shared.built.cancelled() or shared.built.exception() is not None)
        if failed and clients.get(key) is shared:
            del clients[key]  # a failed build is not kept: the next trigger tries again
        raise
    return _StatusLease(clients, key, shared, client)
