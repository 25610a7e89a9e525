"""Operators of one batch workload run: prepare, submit, download, reconcile, resubmit, publish.

They are thin: the ledger holds state, the adapter talks to the provider, ``core`` decides.
Every operator can be cleared and run again; it converges to the same ledger and never creates a
second provider batch. XCom carries job ids and small manifests only.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from decimal import Decimal
from functools import cached_property
from typing import IO, TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_batch_provider.adapters.base import BatchAdapter, BatchRef
from airflow_batch_provider.core.chunking import Chunker, ChunkInfo, Placed
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.hashing import short_hash
from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.core.states import RETRYABLE_STATES
from airflow_batch_provider.core.validation import check_output
from airflow_batch_provider.exceptions import ConfigurationError, ItemError
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.store import PreparedItem, utcnow
from airflow_batch_provider.settings import load_prices
from airflow_batch_provider.staging import Staging

if TYPE_CHECKING:
    from airflow.sdk import Context
    from sqlalchemy.engine import RowMapping

RecordSource = str | Callable[..., Iterable[Mapping[str, Any]]]


class BatchBaseOperator(BaseOperator):
    """What every batch operator shares: the workload, its connections and staging.

    :param workload: the workload's name (ledger namespace and staging folder)
    :param batch_conn_id: the provider connection (its type picks the adapter)
    :param ledger_conn_id: ``postgres``/``sqlite`` connection of the ledger; ``None`` for the
        embedded SQLite ledger
    :param staging_root: staging URL (``file://``, ``s3://``, ``gs://``); default from config
    :param staging_conn_id: connection of the object store behind ``staging_root``
    """

    template_fields: Sequence[str] = ("workload", "staging_root")
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        workload: str,
        batch_conn_id: str = BatchHook.default_conn_name,
        ledger_conn_id: str | None = None,
        staging_root: str | None = None,
        staging_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload = workload
        self.batch_conn_id = batch_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.staging_root = staging_root
        self.staging_conn_id = staging_conn_id

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger."""
        return LedgerHook(self.ledger_conn_id).get_conn()

    @cached_property
    def adapter(self) -> BatchAdapter:
        """The provider adapter of ``batch_conn_id``."""
        return BatchHook(self.batch_conn_id).get_adapter()

    @cached_property
    def staging(self) -> Staging:
        """The staging area."""
        return Staging(self.staging_root, self.staging_conn_id)

    def job_manifest(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """The small dict that travels through XCom for one job.

        :param job: a ledger job row
        """
        return {
            "job_id": job["job_id"],
            "round": job["round"],
            "chunk": job["chunk_index"],
            "lines": job["lines"],
        }

    def stage_round(
        self,
        context: Context,
        round_: int,
        items: Iterable[RowMapping],
        max_requests: int | None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        """Write ``items`` (ledger rows) into this round's chunks and record one job per chunk.

        Continues an interrupted round: chunks already recorded are kept, and new chunks start
        after them. Items whose line alone exceeds the byte limit go to ``review``.

        :param context: the task context
        :param round_: round number (1 for the first submission)
        :param items: ledger rows with ``item_key``, ``prompt_version``, ``app_id``, ``attempts``,
            ``request_json``
        :param max_requests: a tighter per-chunk request limit
        :param max_bytes: a tighter per-chunk byte limit
        """
        run_id = context["run_id"]
        existing = self.ledger.jobs_for(self.workload, run_id, round_)
        folder = self.staging.run_dir(self.workload, run_id) / f"round-{round_}"
        adapter = self.adapter
        first = max((j["chunk_index"] for j in existing), default=-1) + 1
        versions: dict[str, str] = {}
        rejected: list[tuple[PreparedItem | None, str, str, str]] = []
        model = ""
        kind = "chat"

        def on_close(info: ChunkInfo, placed: list[Placed]) -> None:
            key = "abp-" + short_hash(
                self.workload, run_id, str(round_), str(info.index), info.sha256, length=32
            )
            self.ledger.record_job(
                {
                    "job_id": f"{self.workload}:{run_id}:r{round_}:c{info.index:05d}",
                    "workload": self.workload,
                    "run_id": run_id,
                    "round": round_,
                    "chunk_index": info.index,
                    "provider": adapter.name,
                    "model": model,
                    "idempotency_key": key,
                    "staged_path": str(folder / info.name),
                    "input_sha256": info.sha256,
                    "lines": info.lines,
                    "size_bytes": info.size,
                    "kind": kind,
                },
                [(p.key, versions[p.key], p.custom_id, p.attempt) for p in placed],
            )
            self.log.info(
                "staged chunk %s: %d lines, %d bytes, sha256 %s",
                info.name,
                info.lines,
                info.size,
                info.sha256,
            )

        with Chunker(
            adapter.limits,
            lambda name: self.staging.writer(folder / name),
            on_close=on_close,
            max_requests=max_requests,
            max_bytes=max_bytes,
            first_index=first,
        ) as chunker:
            for row in items:
                request = CanonicalRequest.from_dict(json.loads(row["request_json"]))
                model, kind = request.model, request.kind
                versions[row["item_key"]] = row["prompt_version"]
                try:
                    chunker.add(
                        row["item_key"],
                        row["app_id"],
                        int(row["attempts"]) + 1,
                        lambda cid, r=request: adapter.format_line(r, cid),  # type: ignore[misc]
                    )
                except ItemError as exc:
                    self.log.error("%s", exc)
                    rejected.append(
                        (PreparedItem(row["item_key"], request), row["app_id"], exc.code, str(exc))
                    )
        if rejected:
            self.ledger.reject_items(self.workload, run_id, rejected)
        jobs = self.ledger.jobs_for(self.workload, run_id, round_)
        manifest = {
            "workload": self.workload,
            "run_id": run_id,
            "round": round_,
            "provider": adapter.name,
            "chunks": [
                {
                    "name": str(j["staged_path"]).rsplit("/", 1)[-1],
                    "job_id": j["job_id"],
                    "idempotency_key": j["idempotency_key"],
                    "sha256": j["input_sha256"],
                    "lines": j["lines"],
                    "bytes": j["size_bytes"],
                }
                for j in jobs
            ],
        }
        with self.staging.writer(folder / "manifest.json") as fh:
            fh.write(json.dumps(manifest, indent=2).encode("utf-8"))
        return [self.job_manifest(j) for j in jobs]


class BatchPrepareOperator(BatchBaseOperator):
    """Render records into requests, upsert the ledger, skip unchanged items, stage chunks.

    Bad records (no id, duplicate id, invalid UTF-8 or JSON, a template variable missing, a line
    over the byte limit) are logged with their position and the fix, recorded for review, and the
    other records go on. The task fails only when the share of bad records exceeds
    ``max_reject_ratio`` (after recording them).

    :param records: a path/URL of a JSONL or CSV file (read with ``ObjectStoragePath``), or a
        callable taking the task context and returning an iterable of dicts
    :param prompt: the prompt (or a path to its YAML file)
    :param max_requests_per_chunk: a tighter limit than the provider's, to spread work over jobs
    :param max_bytes_per_chunk: a tighter byte limit per file than the provider's
    :param max_reject_ratio: largest tolerated share of bad records (0..1)
    :param records_conn_id: connection of the object store holding ``records``
    :param budget_usd: the run's budget in USD; when the cost estimate of the staged items (batch
        prices, every item at its output ceiling) exceeds it, the task fails before any submit
    :param pricing_override: a pricing file path or dict merged over the shipped prices
    """

    # ``records`` is rendered by hand when it is a string: Airflow would call a callable template
    # field at render time and keep its (huge) result as a rendered field.

    def __init__(
        self,
        *,
        records: RecordSource,
        prompt: PromptTemplate | str,
        max_requests_per_chunk: int | None = None,
        max_bytes_per_chunk: int | None = None,
        max_reject_ratio: float = 0.1,
        records_conn_id: str | None = None,
        budget_usd: float | str | None = None,
        pricing_override: str | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.budget_usd = budget_usd
        self.pricing_override = pricing_override
        self.records = records
        self.prompt = prompt
        self.max_requests_per_chunk = max_requests_per_chunk
        self.max_bytes_per_chunk = max_bytes_per_chunk
        self.max_reject_ratio = max_reject_ratio
        self.records_conn_id = records_conn_id

    @cached_property
    def template(self) -> PromptTemplate:
        """The prompt template."""
        return PromptTemplate.load(self.prompt)

    def iter_records(self, context: Context) -> Iterator[tuple[int, Mapping[str, Any] | ItemError]]:
        """Yield (position, record or the error that made it unreadable), streaming.

        :param context: the task context
        """
        if callable(self.records):
            for pos, rec in enumerate(self.records(context)):
                yield pos, rec
            return
        from airflow.sdk import ObjectStoragePath

        path = ObjectStoragePath(self.render_template(self.records, context), conn_id=self.records_conn_id)
        if str(path).endswith(".csv"):
            with path.open("rb") as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")
                try:
                    for pos, row in enumerate(csv.DictReader(text)):
                        yield pos, row
                except UnicodeDecodeError as exc:
                    yield (
                        -1,
                        ItemError(
                            None,
                            "invalid_utf8",
                            f"CSV is not UTF-8 ({exc.reason}); re-encode the file as UTF-8.",
                        ),
                    )
            return
        with path.open("rb") as fh:
            for pos, raw_line in enumerate(fh):
                if not raw_line.strip():
                    continue
                try:
                    value = json.loads(raw_line.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    yield (
                        pos,
                        ItemError(
                            None,
                            "invalid_utf8",
                            f"line {pos + 1} is not UTF-8 (byte {exc.start}: {exc.reason}); re-encode the source as UTF-8.",
                            pos,
                        ),
                    )
                    continue
                except ValueError as exc:
                    yield (
                        pos,
                        ItemError(
                            None, "invalid_json", f"line {pos + 1} is not JSON ({exc}); fix the line.", pos
                        ),
                    )
                    continue
                if not isinstance(value, dict):
                    yield pos, ItemError(None, "invalid_json", f"line {pos + 1} is not a JSON object.", pos)
                    continue
                yield pos, value

    def estimate_and_check_budget(self, run_id: str) -> None:
        """Log the cost estimate of the items staged and not yet submitted; stop over the budget.

        :param run_id: the Airflow run id
        :raises BudgetExceededError: the estimate exceeds ``budget_usd`` (nothing was submitted)
        """
        from airflow_batch_provider.core.cost import check_budget, estimate_cost
        from airflow_batch_provider.exceptions import PricingError

        rows = self.ledger.iter_items(self.workload, run_id, states=["staged"], columns=["request_json"])
        requests = (CanonicalRequest.from_dict(json.loads(r["request_json"])) for r in rows)
        try:
            estimate = estimate_cost(
                requests, load_prices(self.pricing_override), "batch", provider=self.adapter.name
            )
        except PricingError as exc:
            if self.budget_usd is not None:
                raise
            self.log.warning("no cost estimate: %s", exc)
            return
        budget = "none" if self.budget_usd is None else f"${self.budget_usd}"
        self.log.info(
            "cost estimate before submit: $%s for %d items (%d input tokens, up to %d output tokens, "
            "batch prices as of %s); budget %s",
            estimate.cost.quantize(Decimal("0.000001")),
            estimate.items,
            estimate.tokens.input,
            estimate.tokens.max_output,
            estimate.prices_as_of,
            budget,
        )
        if self.budget_usd is not None:
            check_budget(estimate, Decimal(str(self.budget_usd)))

    def execute(self, context: Context) -> list[dict[str, Any]]:
        run_id = context["run_id"]
        template = self.template
        ledger = self.ledger
        ledger.start_run(self.workload, run_id, self.adapter.name, template.model)
        seen: dict[str, int] = {}
        rejects_path = self.staging.run_dir(self.workload, run_id) / "rejects.jsonl"
        files = ExitStack()
        opened: list[IO[bytes]] = []

        def rejects_sink() -> IO[bytes]:
            # Every rejected record is kept whole, with its reason, so that nothing is lost.
            if not opened:
                opened.append(files.enter_context(self.staging.writer(rejects_path)))
            return opened[0]

        rejected: list[tuple[PreparedItem | None, str, str, str]] = []
        counts = Counter[str]()

        def prepared() -> Iterator[PreparedItem]:
            for pos, rec in self.iter_records(context):
                counts["records"] += 1
                try:
                    if isinstance(rec, ItemError):
                        raise rec
                    request = template.render(rec, pos)
                    if request.app_id in seen:
                        raise ItemError(
                            request.app_id,
                            "duplicate_id",
                            f"repeats the id of record {seen[request.app_id]}; the first is kept. "
                            "Make application ids unique per workload.",
                            pos,
                        )
                    seen[request.app_id] = pos
                except ItemError as exc:
                    self.log.error("rejected %s", exc)
                    counts["rejected"] += 1
                    raw = (
                        None
                        if isinstance(rec, ItemError)
                        else json.dumps(rec, default=str, ensure_ascii=False)
                    )
                    entry = {
                        "position": pos,
                        "id": exc.app_id,
                        "code": exc.code,
                        "message": str(exc),
                        "record": raw,
                    }
                    rejects_sink().write(json.dumps(entry, ensure_ascii=False).encode("utf-8") + b"\n")
                    if exc.app_id is not None and exc.code != "duplicate_id":
                        rejected.append((None, exc.app_id, exc.code, str(exc)))
                    continue
                yield PreparedItem(item_key(request.app_id), request)

        with files:
            stats = ledger.upsert_items(self.workload, run_id, prepared())
        if rejected:
            # Recorded under the prompt's version so that a fixed record replaces the rejected row.
            fixed = [
                (
                    PreparedItem(
                        item_key(app_id), CanonicalRequest(app_id, template.version, template.model)
                    ),
                    app_id,
                    code,
                    msg,
                )
                for _, app_id, code, msg in rejected
            ]
            ledger.reject_items(self.workload, run_id, fixed)
        if opened:
            self.log.warning(
                "%d rejected records, with their reasons, are in %s", counts["rejected"], rejects_path
            )
        self.log.info(
            "records: %d read, %d rejected; ledger: %d new, %d changed, %d unchanged (skipped), %d already in this run",
            counts["records"],
            counts["rejected"],
            stats.new,
            stats.changed,
            stats.unchanged,
            stats.already_in_run,
        )
        pending = ledger.iter_items(
            self.workload,
            run_id,
            states=["pending"],
            columns=["app_id", "attempts", "request_json"],
        )
        manifests = self.stage_round(
            context, 1, pending, self.max_requests_per_chunk, self.max_bytes_per_chunk
        )
        self.estimate_and_check_budget(run_id)
        total = counts["records"]
        if total and counts["rejected"] / total > self.max_reject_ratio:
            raise ConfigurationError(
                f"{counts['rejected']} of {total} records were rejected ({counts['rejected'] / total:.1%}), more "
                f"than max_reject_ratio={self.max_reject_ratio:.1%}; the good records are staged and the bad ones "
                "are in the log and the ledger (state review). Fix the input, or raise max_reject_ratio."
            )
        self.log.info("round 1: %d jobs staged", len(manifests))
        return manifests


class BatchSubmitOperator(BatchBaseOperator):
    """Upload one staged chunk and create its provider batch, exactly once.

    The job row written by prepare is the intent. Before creating anything, the operator
    re-attaches to a batch the ledger already knows, then asks the provider for a batch with the
    job's idempotency key (a create whose reply was lost); only then does it upload (reusing an
    upload of the same name and size) and create.

    A chunk smaller than the provider's minimum job size (Bedrock: 100 records) is not padded and
    not merged across rounds: its items go through the provider's real-time API right here, at
    full price, rate-limited like the deadline fallback, and the job is marked ``sync``. The
    downstream tasks of that chunk pass through.

    :param job: the job manifest from prepare or resubmit (``job_id``)
    :param prompt: the workload's prompt (output validation on the synchronous path)
    :param pricing_override: pricing file path or dict (synchronous path)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "job")

    def __init__(
        self,
        *,
        job: Mapping[str, Any],
        prompt: PromptTemplate | str | None = None,
        pricing_override: str | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.prompt = prompt
        self.pricing_override = pricing_override

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.ledger.job(self.job["job_id"])
        key = job["idempotency_key"]
        out = {"job_id": job["job_id"], "provider": self.adapter.name, "idempotency_key": key}
        if job["state"] == "sync" or (
            not job["batch_id"] and job["lines"] < self.adapter.limits.min_requests
        ):
            return {**out, **self.send_synchronously(context, job)}
        if job["batch_id"]:
            self.log.info(
                "job %s already submitted as batch %s; re-attaching", job["job_id"], job["batch_id"]
            )
            return {**out, "batch_id": job["batch_id"], "submitted_at": _epoch(job["submitted_at"])}
        found = self.adapter.find(key)
        if found is None:
            path = self.staging.at(job["staged_path"])
            self.staging.verify(path, job["input_sha256"])
            self.ledger.update_job(job["job_id"], state="submitting")
            with path.open("rb") as fh:
                input_ref = self.adapter.stage(fh, f"{key}.jsonl", int(job["size_bytes"]))
            self.ledger.update_job(job["job_id"], input_ref=input_ref.value)
            metadata = {
                "workload": self.workload[:500],
                "run_id": context["run_id"][:500],
                "round": str(job["round"]),
                "chunk": str(job["chunk_index"]),
                "model": job["model"],
            }
            ref = self.adapter.submit(input_ref, key, metadata, kind=job["kind"])
            self.log.info("created batch %s for job %s (%d lines)", ref.batch_id, job["job_id"], job["lines"])
        else:
            ref, input_ref_value = found, job["input_ref"] or ""
            self.log.info("found batch %s created earlier with key %s; re-attaching", found.batch_id, key)
            input_ref = None
        self.ledger.mark_submitted(
            job["job_id"], ref.batch_id, input_ref.value if input_ref else input_ref_value
        )
        return {**out, "batch_id": ref.batch_id, "submitted_at": time.time()}

    def send_synchronously(self, context: Context, job: Mapping[str, Any]) -> dict[str, Any]:
        """Send a below-minimum chunk's items through the real-time API (idempotent per item).

        :param context: the task context
        :param job: the ledger job row
        """
        import asyncio

        from airflow_batch_provider.operators.fallback import fallback_settings, run_fallback

        if self.prompt is None:
            raise ConfigurationError(
                f"job {job['job_id']} has {job['lines']} lines, below {self.adapter.name}'s minimum of "
                f"{self.adapter.limits.min_requests} per batch, and must go through the real-time API, which "
                "needs the prompt: pass prompt= to BatchSubmitOperator (batch_inference_group does)."
            )
        template = PromptTemplate.load(self.prompt)
        self.log.warning(
            "job %s has %d lines, below %s's minimum of %d per batch: sending them through the real-time "
            "API at full price instead of padding the batch",
            job["job_id"],
            job["lines"],
            self.adapter.name,
            self.adapter.limits.min_requests,
        )
        self.ledger.update_job(job["job_id"], state="sync")
        columns = ["app_id", "request_json", "state", "job_id"]
        rows = [
            r
            for r in self.ledger.iter_items(self.workload, context["run_id"], columns=columns)
            if r["job_id"] == job["job_id"] and r["state"] in ("staged", "fallback")
        ]
        summary = asyncio.run(
            run_fallback(
                ledger=self.ledger,
                workload=self.workload,
                run_id=context["run_id"],
                provider=self.adapter.name,
                client=self.adapter.realtime_client(),
                rows=rows,
                template=template,
                settings=fallback_settings(),
                prices=load_prices(self.pricing_override),
            )
        )
        self.log.info("synchronous path for job %s: %s", job["job_id"], summary)
        return {"batch_id": None, "route": "sync", "submitted_at": time.time()}


class BatchDownloadOperator(BatchBaseOperator):
    """Stream a finished batch's output and error files into staging (once).

    :param batch: the sensor's result for one job (``job_id``, ``batch_id``)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "batch")

    def __init__(self, *, batch: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch = batch

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.ledger.job(self.batch["job_id"])
        if job["state"] == "sync":
            return dict(self.batch)  # sent through the real-time API: no files
        ref = BatchRef(self.adapter.name, job["batch_id"], job["idempotency_key"])
        folder = self.staging.run_dir(self.workload, context["run_id"]) / f"round-{job['round']}"
        paths: dict[str, str | None] = {}
        fetched = False
        for kind, column in (("output", "output_path"), ("errors", "error_path")):
            target = folder / f"{kind}-{job['chunk_index']:05d}.jsonl"
            if job[column] and target.exists():
                self.log.info("%s file of batch %s already downloaded to %s", kind, ref.batch_id, target)
                paths[column] = job[column]
                continue
            with self.staging.writer(target) as sink:
                size = self.adapter.download(ref, kind, sink)  # type: ignore[arg-type]
            self.log.info("downloaded %s file of batch %s: %d bytes", kind, ref.batch_id, size)
            paths[column] = str(target)
            fetched = True
        if fetched:
            self.ledger.update_job(job["job_id"], state="downloaded", finished_at=utcnow(), **paths)
        return {**dict(self.batch), **paths}


class BatchReconcileOperator(BatchBaseOperator):
    """Apply a job's downloaded results to the ledger by custom id; mark missing lines.

    Out-of-order lines, duplicates and late answers are handled by the ledger's upserts; a line
    that does not parse is counted and its item ends ``missing`` (retryable).

    :param batch: the download task's result for one job
    :param prompt: the workload's prompt (for output validation)
    :param pricing_override: a pricing file path or dict merged over the shipped prices
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "batch")

    def __init__(
        self,
        *,
        batch: Mapping[str, Any],
        prompt: PromptTemplate | str,
        pricing_override: str | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch = batch
        self.prompt = prompt
        self.pricing_override = pricing_override

    def execute(self, context: Context) -> dict[str, Any]:
        template = PromptTemplate.load(self.prompt)
        job = self.ledger.job(self.batch["job_id"])
        if job["state"] == "sync":
            self.log.info("job %s went through the real-time API; its items are settled", job["job_id"])
            return {"job_id": job["job_id"], "route": "sync"}
        cost_of = batch_pricer(self.adapter.name, job["model"], self.pricing_override)
        malformed: list[MalformedLine] = []

        def results() -> Iterator[ItemResult]:
            for column in ("output_path", "error_path"):
                if not job[column]:
                    continue
                path = self.staging.at(job[column])
                with path.open("rb") as fh:
                    for res in self.adapter.parse_results(fh):
                        if isinstance(res, MalformedLine):
                            malformed.append(res)
                            continue
                        yield check_output(res, template.output_format, template.output_schema)

        stats = self.ledger.apply_results(job["job_id"], results(), cost_of)
        for bad in malformed[:20]:
            self.log.warning("malformed result line %d: %s (%s)", bad.line_number, bad.reason, bad.excerpt)
        missing = self.ledger.mark_missing(job["job_id"])
        self.ledger.update_job(
            job["job_id"],
            state="reconciled",
            result_lines=sum(stats.outcomes.values()),
            malformed_lines=len(malformed),
            duplicate_lines=stats.duplicates,
            unknown_lines=stats.unknown,
            missing=missing,
            reconciled_at=job["reconciled_at"] or utcnow(),
        )
        summary = {
            "job_id": job["job_id"],
            "outcomes": dict(stats.outcomes),
            "late": stats.late,
            "duplicates": stats.duplicates,
            "unknown": stats.unknown,
            "malformed": len(malformed),
            "missing": missing,
        }
        self.log.info("reconciled job %s: %s", job["job_id"], summary)
        return summary


class BatchResubmitOperator(BatchBaseOperator):
    """Stage retryable items (failed with 429/5xx, expired, missing, invalid output) as a new round.

    Items keep their item key; the custom id carries the new attempt number. Items at the
    attempts cap, and permanent failures, go to ``review``.

    :param round_number: the round this task stages (2 for the first resubmission)
    :param max_attempts: attempts cap per item (the first submission counts as 1)
    :param max_requests_per_chunk: a tighter per-chunk request limit
    :param max_bytes_per_chunk: a tighter per-chunk byte limit
    :param deadline: this run's deadline (ISO string or datetime, templated); once it has passed
        (minus ``deadline_margin``) no new round starts and the items are left to the deadline policy
    :param deadline_margin: seconds before ``deadline`` at which waiting stops
    :param budget_usd: the run's budget: a round whose estimate, added to what the run has paid so
        far, exceeds it is not started, and its items go to ``review`` (``budget_exceeded``)
    :param pricing_override: pricing file path or dict (for the estimate)
    """

    template_fields: Sequence[str] = (*BatchBaseOperator.template_fields, "deadline")

    def __init__(
        self,
        *,
        round_number: int,
        max_attempts: int,
        max_requests_per_chunk: int | None = None,
        max_bytes_per_chunk: int | None = None,
        deadline: Any = None,
        deadline_margin: float = 0.0,
        budget_usd: float | str | None = None,
        pricing_override: str | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if round_number < 2 or round_number > max_attempts:
            raise ConfigurationError(
                f"round_number {round_number} must be within 2..max_attempts ({max_attempts})."
            )
        self.round_number = round_number
        self.max_attempts = max_attempts
        self.max_requests_per_chunk = max_requests_per_chunk
        self.max_bytes_per_chunk = max_bytes_per_chunk
        self.deadline = deadline
        self.deadline_margin = deadline_margin
        self.budget_usd = budget_usd
        self.pricing_override = pricing_override

    def execute(self, context: Context) -> list[dict[str, Any]]:
        run_id = context["run_id"]
        from airflow_batch_provider.core.deadline import deadline_passed

        if deadline_passed(self.deadline or None, self.deadline_margin, utcnow()):
            self.log.info(
                "round %d not started: the deadline %s has passed; open items go to the deadline policy",
                self.round_number,
                self.deadline,
            )
            return []
        retry, to_review = self.ledger.retry_candidates(self.workload, run_id, self.max_attempts)
        self.log.info(
            "round %d: %d items to resubmit, %d sent to review", self.round_number, retry, to_review
        )
        items = self.ledger.iter_items(
            self.workload,
            run_id,
            states=sorted(RETRYABLE_STATES),
            columns=["app_id", "attempts", "request_json"],
        )
        eligible = [r for r in items if int(r["attempts"]) < self.max_attempts]
        started = self.ledger.jobs_for(self.workload, run_id, self.round_number)
        if self.budget_usd is not None and eligible and not started and self.over_budget(run_id, eligible):
            return []
        return self.stage_round(
            context, self.round_number, eligible, self.max_requests_per_chunk, self.max_bytes_per_chunk
        )

    def over_budget(self, run_id: str, rows: Sequence[RowMapping]) -> bool:
        """Say whether this round would take the run over its budget; if so, send its items to review.

        :param run_id: the Airflow run id
        :param rows: the items the round would resubmit
        """
        from airflow_batch_provider.core.cost import estimate_cost

        requests = (CanonicalRequest.from_dict(json.loads(r["request_json"])) for r in rows)
        estimate = estimate_cost(
            requests, load_prices(self.pricing_override), "batch", provider=self.adapter.name
        )
        spent = self.ledger.run_cost(self.workload, run_id)
        budget = Decimal(str(self.budget_usd))
        if spent + estimate.cost <= budget:
            self.log.info(
                "round %d estimate $%s; paid so far $%s; budget $%s",
                self.round_number,
                estimate.cost,
                spent,
                budget,
            )
            return False
        message = (
            f"round {self.round_number} not started: ${spent:.6f} already paid plus ${estimate.cost:.6f} estimated "
            f"for {len(rows)} items exceeds the run's budget of ${budget}; raise budget_usd to resubmit them."
        )
        self.log.error("%s They go to review (error code budget_exceeded).", message)
        self.ledger.transition(
            self.workload,
            run_id,
            "review",
            sorted(RETRYABLE_STATES),
            keys=[(r["item_key"], r["prompt_version"]) for r in rows],
            error_code="budget_exceeded",
            error_message=message,
        )
        return True


def batch_pricer(
    provider: str, model: str, override: str | Mapping[str, Any] | None
) -> Callable[[Usage], Decimal]:
    """Return a function pricing one batch line's usage for ``model``.

    :param provider: adapter name
    :param model: model name
    :param override: pricing override (file path or dict)
    """
    from airflow_batch_provider.core.pricing import cost

    price = load_prices(override).price(provider, model)
    return lambda usage: cost(usage, price, "batch")


def _epoch(value: Any) -> float:
    return float(value.timestamp()) if value is not None else time.time()


UNFINISHED_STATES = ("staged", "submitted", "failed_retryable", "expired", "cancelled")


class BatchPublishOperator(BatchBaseOperator):
    """Close the run: settle what is unfinished, publish results and the cost report.

    Items that exhausted their attempts, and permanent failures, go to ``review``. Items still
    open (a round that could not run) go where ``unfinished`` says. Then every item of the run is
    in exactly one final state; the results table is upserted, ``results.jsonl`` and
    ``report.json`` are written to staging, and the report is logged and returned (small).

    :param max_attempts: the attempts cap (as in resubmit)
    :param unfinished: ``review`` (default), ``pending`` (published as pending) or ``skipped``
    :param provider_name: provider name used for pricing (default: the connection's adapter)
    :param pricing_override: pricing file path or dict merged over the shipped prices
    """

    def __init__(
        self,
        *,
        max_attempts: int,
        unfinished: str = "review",
        pricing_override: str | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if unfinished not in ("review", "pending", "skipped"):
            raise ConfigurationError(f"unfinished={unfinished!r}; use 'review', 'pending' or 'skipped'.")
        self.max_attempts = max_attempts
        self.unfinished = unfinished
        self.pricing_override = pricing_override

    def execute(self, context: Context) -> dict[str, Any]:
        run_id = context["run_id"]
        ledger = self.ledger
        _, to_review = ledger.retry_candidates(self.workload, run_id, self.max_attempts)
        settled = ledger.transition(
            self.workload,
            run_id,
            self.unfinished,
            UNFINISHED_STATES,
            error_message="not finished when the run closed",
        )
        if to_review or settled:
            self.log.info(
                "%d items to review (attempts exhausted or permanent), %d unfinished -> %s",
                to_review,
                settled,
                self.unfinished,
            )
        report = build_report(ledger, self.workload, run_id, self.adapter.name, self.pricing_override)
        published = ledger.publish(self.workload, run_id)
        folder = self.staging.run_dir(self.workload, run_id)
        with self.staging.writer(folder / "results.jsonl") as fh:
            for row in ledger.iter_items(
                self.workload,
                run_id,
                columns=["app_id", "state", "route", "output_json", "error_code", "error_message"],
            ):
                line = {
                    "id": row["app_id"],
                    "state": row["state"],
                    "route": row["route"],
                    "output": json.loads(row["output_json"]) if row["output_json"] else None,
                    "error_code": row["error_code"],
                    "error_message": row["error_message"],
                }
                fh.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
        with self.staging.writer(folder / "report.json") as fh:
            fh.write(json.dumps(report, indent=2).encode("utf-8"))
        ledger.finish_run(self.workload, run_id, report)
        self.log.info("published %d items to the results table and %s", published, folder / "results.jsonl")
        self.log.info("\n%s", report["table"])
        return {
            "items_by_state": report["items_by_state"],
            "paid_usd": report["paid"],
            "cost_per_usable_result_usd": report["cost_per_usable_result"],
            "report": str(folder / "report.json"),
        }


def build_report(
    ledger: Ledger,
    workload: str,
    run_id: str,
    provider: str,
    pricing_override: str | Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Compute the run's cost report from the ledger (JSON-safe dict, with a ``table`` text).

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    :param provider: provider name for pricing
    :param pricing_override: pricing override
    """
    from airflow_batch_provider.core.cost import DUPLICATE, AttemptRecord, ItemCostRecord, compute_run_cost

    def records() -> Iterator[ItemCostRecord]:
        for row in ledger.iter_cost_rows(workload, run_id):
            attempts = tuple(
                AttemptRecord(
                    usage=a["usage"],
                    mode=a["mode"],
                    discarded=a["discarded"],
                    # A discarded success (a late or second answer for an item that already had
                    # one) is paid twice; the same work done synchronously would be paid once.
                    reason=(DUPLICATE if a["outcome"] == "succeeded" else a["error_code"])
                    if a["discarded"]
                    else None,
                )
                for a in row["attempts"]
            )
            route = row["route"] or (
                "resubmitted" if sum(1 for a in attempts if a.mode == "batch") > 1 else "batch"
            )
            yield ItemCostRecord(
                app_id=row["app_id"],
                state=row["state"],
                route=route,  # type: ignore[arg-type]
                provider=provider,
                model=row["model"],
                attempts=attempts,
                last_usage=row["last_usage"],
            )

    from airflow_batch_provider.kubernetes.report import infrastructure_cost, self_hosted_section

    prices = load_prices(pricing_override)
    infra = infrastructure_cost(ledger, workload, run_id)
    report = compute_run_cost(records(), prices, infrastructure_cost=infra)
    out = report.to_dict()
    out["table"] = report.render_table()
    out["states"] = ledger.count_states(workload, run_id)
    # Self-hosted (vLLM) jobs: GPU time per job, beside the same tokens at provider batch prices.
    hosted = self_hosted_section(ledger, workload, run_id, report.usage, report.items, prices)
    if hosted is not None:
        out["self_hosted"] = hosted
        out["table"] += "\n" + hosted["table"]
    return out
