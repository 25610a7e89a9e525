"""Self-hosted lane: ``vllm run-batch`` in a Kubernetes pod, behind the adapter contract.

The pod itself is started by :class:`~airflow_batch_provider.operators.vllm_pod.VllmBatchPodOperator`
(a ``KubernetesPodOperator``) in place of submit and wait: this adapter declares
:attr:`VllmKubernetesAdapter.runs_in_pod`, and ``batch_inference_group`` builds the pod task for
it. What stays here is what every lane shares: the batch line format (OpenAI's, which
``vllm run-batch`` reads), staging into the exchange volume the pod mounts, downloading the pod's
output, and parsing vLLM's output lines, whose error shapes differ from OpenAI's:

- a handler error: ``response.status_code`` 4xx/5xx, ``response.body`` null, ``error`` an object
  ``{"error": {"message", "type", "param", "code"}}``;
- a routing error (unsupported url, stream mode): ``status_code`` 400, ``body`` null, ``error`` a
  bare string;
- lines missing after a crash (vLLM writes in input order and flushes each line): nothing to
  parse; the ledger marks those items ``missing`` and the next round retries only them.

Staging: with ``file://`` staging the exchange folder (connection extra ``exchange_path``) is a
volume both Airflow workers and the pod mount (``hostPath`` or a ReadWriteMany PVC, extra
``exchange_pvc``); the pod sees it at ``exchange_mount_path`` (default ``/exchange``). With
``s3://`` or ``gs://`` staging the pod task hands the pod presigned URLs instead and records the
pod's output as the job's download (this adapter's :meth:`~VllmKubernetesAdapter.download` is
then not asked). Nothing in the pod needs object-store credentials.

Deadline fallback: the connection's host (and password, if the server wants a key) may name an
OpenAI-compatible real-time endpoint of the same model, e.g. ``vllm serve`` at
``http://vllm-online:8000/v1``; the ``sync_fallback`` deadline policy sends what the deadline
left open there (:meth:`~VllmKubernetesAdapter.realtime_client`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any, ClassVar, Literal

from airflow_batch_provider.adapters.base import (
    AdapterSettings,
    AsyncRealtimeClient,
    AsyncStatusClient,
    BatchAdapter,
    BatchRef,
    BatchStatus,
    InputRef,
    Limits,
    parse_jsonl_results,
)
from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.adapters.vllm_input import CHAT_URL, EMBEDDINGS_URL, engine_refusal
from airflow_batch_provider.core.requests import CanonicalRequest, RequestKind
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.exceptions import ConfigurationError, ItemError

__all__ = ["CHAT_URL", "EMBEDDINGS_URL", "VllmKubernetesAdapter", "parse_vllm_line"]


def exchange_folder(extra: Mapping[str, Any]) -> Path:
    """The exchange folder as the Airflow worker sees it (connection extra ``exchange_path``).

    :param extra: the connection extras
    :raises ConfigurationError: the extra is missing
    """
    value = extra.get("exchange_path")
    if not value:
        raise ConfigurationError(
            "the vllm_kubernetes connection has no 'exchange_path' extra: set it to the folder the "
            "workers and the vLLM pods both mount (hostPath or a ReadWriteMany PVC)."
        )
    return Path(str(value).removeprefix("file://"))


def output_name(key: str) -> str:
    """File name of a job's output in the exchange folder.

    :param key: the job's idempotency key
    """
    return f"{key}.output.jsonl"


def input_name(key: str) -> str:
    """File name of a job's input in the exchange folder.

    :param key: the job's idempotency key
    """
    return f"{key}.jsonl"


def _usage(body: Mapping[str, Any] | None) -> Usage:
    usage = (body or {}).get("usage") or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return Usage(
        input_tokens=int(usage.get("prompt_tokens") or 0) - cached,
        output_tokens=int(usage.get("completion_tokens") or 0),
        cached_input_tokens=cached,
    )


def parse_vllm_line(custom_id: str, line: Mapping[str, Any]) -> ItemResult:
    """Turn one ``vllm run-batch`` output line into a neutral result.

    The status code decides, not only ``error`` (vLLM reports a failure with a non-2xx status and
    a null body); ``error`` may be an object (nested ``error``) or a bare string.

    :param custom_id: the line's custom id
    :param line: the parsed line
    """
    response = line.get("response") or {}
    status = int(response.get("status_code") or 0)
    body = response.get("body")
    error = line.get("error")
    if error is not None or not 200 <= status < 300 or not isinstance(body, Mapping):
        message: str | None
        code: str
        if isinstance(error, str):
            message, code = error, str(status or "error")
        elif isinstance(error, Mapping):
            nested = error.get("error")
            inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else error
            message = inner.get("message")
            code = str(inner.get("code") or inner.get("type") or status or "error")
        else:
            message, code = f"status {status} with no body", str(status or "error")
        return ItemResult(
            custom_id,
            classify_outcome(status or None, code),
            usage=_usage(body if isinstance(body, Mapping) else None),
            error_code=code,
            error_message=message,
            raw={"status_code": status, "request_id": response.get("request_id")},
        )
    if body.get("object") == "list":
        vectors: Any = [d.get("embedding") for d in body.get("data") or []]
        output: Any = vectors[0] if len(vectors) == 1 else vectors
        finish = None
    else:
        choice = (body.get("choices") or [{}])[0]
        output = (choice.get("message") or {}).get("content")
        finish = choice.get("finish_reason")
    return ItemResult(
        custom_id,
        "succeeded",
        output=output,
        usage=_usage(body),
        raw={"finish_reason": finish, "request_id": response.get("request_id")},
    )


class _NoAsyncStatus(AsyncStatusClient):
    async def status(self, ref: BatchRef) -> BatchStatus:
        raise ConfigurationError(
            f"job {ref.idempotency_key} runs in a vLLM pod; the pod task waits for it, not a sensor."
        )


class VllmKubernetesAdapter(BatchAdapter):
    """``vllm run-batch`` in a Kubernetes pod (connection type ``vllm_kubernetes``).

    Connection extras: see :class:`~airflow_batch_provider.hooks.vllm_pod_settings.VllmPodSettings`.
    """

    #: ``lane="pod"``: the lane runs each chunk as a pod task instead of submit + wait (the
    #: pipeline reads it as :attr:`runs_in_pod`).
    declaration: ClassVar[ProviderDeclaration] = ProviderDeclaration(
        name="vllm",
        conn_type="vllm_kubernetes",
        limits=Limits(max_requests=50_000, max_bytes=200 * 1024 * 1024),
        lane="pod",
    )
    #: What ``vllm run-batch`` serves that the lane formats: ``/v1/chat/completions`` and
    #: ``/v1/embeddings`` (score, rerank and audio have no request kind here; ``/v1/responses``,
    #: ``/v1/completions`` and ``/v1/moderations`` the engine does not serve).
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat", "embedding"})

    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        if request.kind == "embedding":
            url, body = EMBEDDINGS_URL, {"model": request.model, "input": request.text, **request.params}
        else:
            messages: list[Mapping[str, Any]] = []
            if request.system:
                messages.append({"role": "system", "content": request.system})
            messages.extend(request.messages)
            url, body = CHAT_URL, {"model": request.model, "messages": messages, **request.params}
        line = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
        refusal = engine_refusal(line)
        if refusal is not None:  # one such line would fail the engine's whole file, every round
            raise ItemError(
                request.app_id,
                "engine_invalid_request",
                f"vllm run-batch would refuse its line ({custom_id}) and with it every line of the chunk: "
                f"{refusal}. Fix the prompt's params or the record; the other items go on.",
            )
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        folder = exchange_folder(self.settings.extra)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / name
        if target.exists() and target.stat().st_size == size:
            return InputRef("uri", target.as_uri())
        partial = target.with_name(target.name + ".part")
        with partial.open("wb") as fh:
            shutil.copyfileobj(chunk, fh)
        partial.replace(target)
        return InputRef("uri", target.as_uri())

    def submit(
        self,
        input_ref: InputRef,
        key: str,
        metadata: Mapping[str, str],
        kind: RequestKind = "chat",
        *,
        created_after: datetime | None = None,
    ) -> BatchRef:
        raise ConfigurationError(
            f"job {key}: the vllm_kubernetes lane runs each chunk in a pod task "
            "(VllmBatchPodOperator), not through submit; build the workload with batch_inference_group."
        )

    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        return None  # a pod is found by its job label, in the pod task

    def status(self, ref: BatchRef) -> BatchStatus:
        done = (exchange_folder(self.settings.extra) / output_name(ref.idempotency_key)).exists()
        return BatchStatus("completed" if done else "in_progress", raw_state="pod")

    def async_client(self) -> AsyncStatusClient:
        return _NoAsyncStatus()

    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        if kind == "errors":
            return 0  # vLLM writes errors inline, in the output file
        path = exchange_folder(self.settings.extra) / output_name(ref.idempotency_key)
        if not path.exists():
            return 0  # the pod died before writing anything: every item is missing
        with path.open("rb") as fh:
            written = 0
            while block := fh.read(1 << 20):
                sink.write(block)
                written += len(block)
        return written

    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        return parse_jsonl_results(lines, "custom_id", parse_vllm_line)

    def cancel(self, ref: BatchRef) -> None:
        """Nothing to cancel here: the pod task deletes its pod on kill."""

    def realtime_client(self) -> AsyncRealtimeClient:
        """The deadline fallback's real-time API: the OpenAI-compatible server at the connection's host.

        :raises ConfigurationError: the connection names no such server
        """
        if not self.settings.base_url:
            raise ConfigurationError(
                "the vllm_kubernetes connection has no host: the sync_fallback deadline policy needs an "
                "OpenAI-compatible real-time endpoint of the same model there (e.g. `vllm serve` at "
                "http://vllm-online:8000/v1); set the host, or choose publish_pending or skip."
            )
        from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter

        settings = AdapterSettings(api_key=self.settings.api_key or "EMPTY", base_url=self.settings.base_url)
        return OpenAIBatchAdapter(settings).realtime_client()
