"""A toy provider, added the way ``docs/add-a-provider.md`` says: this one file and one registry entry.

``ToyBatchAdapter`` drives an OpenAI-compatible batch API with plain ``httpx`` (no provider SDK),
the shape a small vendor's batch API has; the tests point it at the bundled emulator's
OpenAI-compatible routes. Everything the rest of the package needs to know of the provider is its
:class:`~airflow_batch_provider.adapters.declaration.ProviderDeclaration`; the registry entry is
made by the test (``tests/unit/adapters/test_toy_provider.py``), as a real provider's is one line
in ``adapters/entries.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import IO, Any, ClassVar, Final, Literal

import httpx

from airflow_batch_provider.adapters.base import (
    CUSTOM_ID_HEADER,
    AdapterSettings,
    AsyncRealtimeClient,
    AsyncStatusClient,
    BatchAdapter,
    BatchRef,
    BatchStatus,
    InputRef,
    Limits,
    RealtimeReply,
    parse_jsonl_results,
    unsupported_reply,
)
from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.core.ratelimit import parse_retry_after
from airflow_batch_provider.core.requests import CanonicalRequest, RequestKind
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.core.states import BATCH_STATES
from airflow_batch_provider.exceptions import ConfigurationError

#: The connection type of the toy provider (the registry entry's key).
TOY_CONN_TYPE: Final = "toy_batch"
#: The metadata key the toy keeps a batch's idempotency key under (how :meth:`find` finds it).
KEY_FIELD: Final = "toy_idempotency_key"
CHAT_URL: Final = "/v1/chat/completions"


def _status(batch: Mapping[str, Any]) -> BatchStatus:
    raw = str(batch.get("status") or "")
    counts = batch.get("request_counts") or {}
    return BatchStatus(
        state=raw if raw in BATCH_STATES else "in_progress",  # type: ignore[arg-type]
        total=int(counts.get("total") or 0),
        completed=int(counts.get("completed") or 0),
        failed=int(counts.get("failed") or 0),
        raw_state=raw,
    )


def _usage(body: Mapping[str, Any]) -> Usage:
    usage = body.get("usage") or {}
    return Usage(
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
    )


def _result(custom_id: str, line: Mapping[str, Any]) -> ItemResult:
    """One result line (``{"custom_id", "response": {"status_code", "body"}, "error"}``) as a result."""
    if line.get("error"):
        code = str(line["error"].get("code") or "error")
        return ItemResult(
            custom_id,
            classify_outcome(None, code),
            error_code=code,
            error_message=line["error"].get("message"),
        )
    response = line.get("response") or {}
    return _answer(custom_id, int(response.get("status_code") or 0), response.get("body") or {})


def _answer(custom_id: str, status: int, body: Mapping[str, Any]) -> ItemResult:
    if status != 200:
        error = body.get("error") or {}
        code = str(error.get("code") or error.get("type") or status)
        return ItemResult(
            custom_id,
            classify_outcome(status, code),
            usage=_usage(body),
            error_code=code,
            error_message=error.get("message"),
        )
    text = body["choices"][0]["message"]["content"]
    return ItemResult(custom_id, "succeeded", output=text, usage=_usage(body))


class _ToyStatus(AsyncStatusClient):
    def __init__(self, settings: AdapterSettings) -> None:
        self._http = httpx.AsyncClient(
            base_url=str(settings.base_url), headers=_headers(settings), timeout=30
        )

    async def status(self, ref: BatchRef) -> BatchStatus:
        response = await self._http.get(f"/batches/{ref.batch_id}")
        response.raise_for_status()
        return _status(response.json())

    async def close(self) -> None:
        await self._http.aclose()


class _ToyRealtime(AsyncRealtimeClient):
    def __init__(self, adapter: ToyBatchAdapter) -> None:
        self._adapter = adapter
        self._http = httpx.AsyncClient(
            base_url=str(adapter.settings.base_url), headers=_headers(adapter.settings), timeout=30
        )

    async def complete(self, request: CanonicalRequest, custom_id: str) -> RealtimeReply:
        try:
            self._adapter.check_kind(request)
        except ConfigurationError as exc:
            return unsupported_reply(custom_id, exc)
        response = await self._http.post(
            "/chat/completions", json=self._adapter.body(request), headers={CUSTOM_ID_HEADER: custom_id}
        )
        retry_after = parse_retry_after(response.headers) if response.status_code in (429, 503) else None
        return RealtimeReply(
            _answer(custom_id, response.status_code, response.json()), retry_after=retry_after
        )

    async def close(self) -> None:
        await self._http.aclose()


def _headers(settings: AdapterSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_key}"}


class ToyBatchAdapter(BatchAdapter):
    """The toy provider's batch API: files, batches and results, OpenAI-compatible, over ``httpx``."""

    declaration: ClassVar[ProviderDeclaration] = ProviderDeclaration(
        name="toy",
        conn_type=TOY_CONN_TYPE,
        limits=Limits(max_requests=1_000, max_bytes=10 * 1024 * 1024),
        retryable_errors=frozenset({"toy_busy"}),
        console_url="https://console.toy.example/batches/{batch_id}",
        console_hosts=frozenset({"api.toy.example"}),
        compare_model="toy-small",
    )
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat"})

    def __init__(self, settings: AdapterSettings) -> None:
        super().__init__(settings)
        if not settings.base_url:
            raise ConfigurationError("the toy connection has no host; set it to the API base URL (…/v1).")
        self.http = httpx.Client(base_url=settings.base_url, headers=_headers(settings), timeout=30)

    def probe(self) -> str:
        page = self.http.get("/batches", params={"limit": 1})
        page.raise_for_status()
        return f"{self.settings.base_url} listed {len(page.json()['data'])} batch(es) on the first page"

    def body(self, request: CanonicalRequest) -> dict[str, Any]:
        messages = [{"role": "system", "content": request.system}] if request.system else []
        return {"model": request.model, "messages": [*messages, *request.messages], **request.params}

    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        self.check_kind(request)
        line = {"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": self.body(request)}
        return json.dumps(line, separators=(",", ":")).encode()

    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        del size
        response = self.http.post("/files", data={"purpose": "batch"}, files={"file": (name, chunk.read())})
        response.raise_for_status()
        return InputRef("file", str(response.json()["id"]))

    def submit(
        self,
        input_ref: InputRef,
        key: str,
        metadata: Mapping[str, str],
        kind: RequestKind = "chat",
        *,
        created_after: datetime | None = None,
    ) -> BatchRef:
        del kind
        found = self.find(key, created_after=created_after)
        if found is not None:
            return found
        labels = {**{k: str(v) for k, v in metadata.items()}, KEY_FIELD: key}
        response = self.http.post(
            "/batches",
            json={
                "input_file_id": input_ref.value,
                "endpoint": CHAT_URL,
                "completion_window": "24h",
                "metadata": labels,
            },
        )
        response.raise_for_status()
        return BatchRef(self.name, str(response.json()["id"]), key)

    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        not_before = self.find_not_before(created_after)
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100, **({"after": after} if after else {})}
            page = self.http.get("/batches", params=params)
            page.raise_for_status()
            body = page.json()
            for batch in body["data"]:
                if (batch.get("metadata") or {}).get(KEY_FIELD) == key:
                    return BatchRef(self.name, str(batch["id"]), key)
                if not_before is not None and float(batch.get("created_at") or 0) < not_before:
                    return None
            if not body.get("has_more") or not body["data"]:
                return None
            after = str(body["data"][-1]["id"])

    def status(self, ref: BatchRef) -> BatchStatus:
        response = self.http.get(f"/batches/{ref.batch_id}")
        response.raise_for_status()
        return _status(response.json())

    def async_client(self) -> AsyncStatusClient:
        return _ToyStatus(self.settings)

    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        batch = self.http.get(f"/batches/{ref.batch_id}")
        batch.raise_for_status()
        file_id = batch.json().get("output_file_id" if kind == "output" else "error_file_id")
        if not file_id:
            return 0
        written = 0
        with self.http.stream("GET", f"/files/{file_id}/content") as response:
            response.raise_for_status()
            for part in response.iter_bytes():
                sink.write(part)
                written += len(part)
        return written

    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        return parse_jsonl_results(lines, "custom_id", _result)

    def cancel(self, ref: BatchRef) -> None:
        self.http.post(f"/batches/{ref.batch_id}/cancel").raise_for_status()

    def realtime_client(self) -> AsyncRealtimeClient:
        return _ToyRealtime(self)
