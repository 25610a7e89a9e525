"""The stateful workload: one workload's runs driven task by task in-process, for the property test.

A :class:`StatefulWorkload` is the chaos workload (``tests/reliability/dags/chaos_workload.py``)
without Airflow's processes: each task of ``batch_inference_group`` is its real operator, built
with the arguments the group gives it and run by calling its ``execute`` (the sensor: one
``poke``) with a small task context, against the real ledger (SQLite or PostgreSQL), the real
adapters over HTTP and a real emulator. What a DAG run does is a list of task keys in the order
Airflow would run them (:meth:`StatefulWorkload.plan`); a task's result is its XCom. So the public
operations are plain methods a state machine can call in any order:

- :meth:`~StatefulWorkload.start_run`, :meth:`~StatefulWorkload.step` (run the next task of a run),
  :meth:`~StatefulWorkload.clear` (a run, or one task and what follows it),
- a kill at a fail point (:func:`~tests.support.stateful_run.killing_at`: the named point raises
  :class:`~tests.support.stateful_run.Killed`, which no ``except Exception`` catches, instead of
  SIGKILLing this process; the task is left failed),
- :meth:`~StatefulWorkload.edit_record`, :attr:`~StatefulWorkload.prompt` (bump or edit it),
- :meth:`~StatefulWorkload.cli` (``review redrive|resolve|skip``, ``jobs resolve``),
- emulator faults (:meth:`~StatefulWorkload.fault`), a damaged downloaded result file
  (:meth:`~StatefulWorkload.damage_result_file`), a deadline that passes
  (:meth:`~StatefulWorkload.pass_deadline`).

The emulator runs on its own clock, moved forward only by :meth:`StatefulWorkload.advance_clock`
(:data:`CLOCK_STEP_S`: longer than any batch phase), so a batch ends when the emulator says so (a
stuck batch never does), a job in doubt stays in doubt until its batch has ended, and no step
sleeps.
:mod:`tests.support.stateful_invariants` checks the ledger and reports against the emulator after
every step.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import redirect_stderr
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import httpx

from airflow_batch_provider import cli
from airflow_batch_provider.core.options import BudgetOptions, ChunkOptions, DeadlineOptions
from airflow_batch_provider.core.policy import PollPolicy
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.staging import run_key
from tests.support.stateful_run import PAST, NotYet, Run, SleptInSlot, TaskKey, killing_at, prompt_variant

WORKLOAD: Final = "stateful"
DAG_ID: Final = "stateful_workload"
CONN_ID: Final = "stateful_batch"
#: emulated seconds a wait task moves the emulator's clock: more than any batch phase lasts
CLOCK_STEP_S: Final = 3600.0
FAST_POLL: Final = PollPolicy(initial_interval=0.01, factor=1.0, max_interval=0.01)
#: provider -> (connection type, path added to the emulator URL, model)
PROVIDERS: Final[Mapping[str, tuple[str, str, str]]] = {
    "openai": ("openai_batch", "/v1", "gpt-4o-mini"),
    "anthropic": ("anthropic_batch", "", "claude-3-5-haiku-20241022"),
}
#: the tasks of one round, in the order Airflow runs them (each one mapped over the round's jobs)
ROUND_TASKS: Final = ("upload", "submit", "wait", "harvest", "download", "reconcile")


class StatefulWorkload:
    """One workload (one ledger, one staging area) whose runs are driven task by task.

    :param url: the emulator's base URL (reset by the caller for each example)
    :param ledger_url: the ledger
    :param root: a folder for staging and the Anthropic spool
    :param provider: ``openai`` or ``anthropic``
    :param items: records in the input
    :param chunk: requests per job
    :param attempts: rounds per run
    :param budget_usd: each run's budget (``None``: none)
    """

    def __init__(
        self,
        url: str,
        ledger_url: str,
        root: Path,
        *,
        provider: str = "openai",
        items: int = 6,
        chunk: int = 3,
        attempts: int = 2,
        budget_usd: str | None = None,
    ) -> None:
        conn_type, suffix, model = PROVIDERS[provider]
        self.budget = BudgetOptions(budget_usd=budget_usd)
        self.url = url
        self.ledger_url = ledger_url
        self.root = root
        self.provider = provider
        self.model = model
        self.chunk = chunk
        self.attempts = attempts
        self.records: list[dict[str, str]] = [
            {"id": f"r{i:03d}", "text": f"the parcel {i} arrived"} for i in range(items)
        ]
        self.prompt = prompt_variant(model, "v1")
        self.runs: list[Run] = []
        #: app id -> times its input was changed (a resend of a succeeded item needs one, or a re-drive)
        self.edits: dict[str, int] = {}
        #: prompt version -> the distinct contents it was given in place (a wording edited under
        #: the same version): each one after the first may resend its items, for the reason the
        #: ledger records (``abp_prompt_changes``)
        self.prompt_contents: dict[str, set[str]] = {"v1": {self.prompt.fingerprint}}
        #: job id -> the fingerprint of the prompt its requests were rendered with (the run's, when
        #: the step that made the job ran): a job a run adopts keeps the prompt it was sent with
        self.job_prompts: dict[str, str] = {}
        #: custom ids whose billed answer line :meth:`damage_result_file` cut short (unreadable usage)
        self.damaged: list[str] = []
        #: lines :meth:`damage_result_file` made unreadable (cut short, or a broken copy added)
        self.damaged_lines = 0
        #: item keys a person re-drove, with how often
        self.redriven: dict[str, int] = {}
        #: a run's lease task refused the workload while only a dead run held it (one line each)
        self.lease_refusals: list[str] = []
        #: waits that slept in their worker slot instead of deferring (bug 7), for the invariants
        self.slot_sleeps: list[str] = []
        extra: dict[str, Any] = {}
        if provider == "anthropic":
            extra = {
                "spool_dir": str(root / "spool"),
                "create_retry_initial_s": 0.01,
                "create_retry_max_s": 0.02,
                "timeout": 2.0,
            }
        connection = {"conn_type": conn_type, "host": url + suffix, "password": "sk-stateful", "extra": extra}
        self.env = {
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(connection),
            "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": ledger_url,
            "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT": f"file://{root / 'staging'}",
        }
        self.common: dict[str, Any] = {"workload": WORKLOAD, "batch_conn_id": CONN_ID}
        self._ledger: Ledger | None = None
        #: one client for the emulator's test endpoints
        self.http = httpx.Client(timeout=30)

    # ------------------------------------------------------------------ the world

    def ledger(self) -> Ledger:
        """The workload's ledger (one engine per workload)."""
        if self._ledger is None:
            self._ledger = Ledger.from_url(self.ledger_url)
        return self._ledger

    def close(self) -> None:
        """Dispose of the ledger's engine."""
        if self._ledger is not None:
            self._ledger.engine.dispose()
            self._ledger = None
        self.http.close()

    def fault(self, **faults: Any) -> None:
        """Set emulator faults (``FaultConfig`` fields), merged into the current ones."""
        self.http.put(f"{self.url}/_emulator/config", json={"faults": faults}).raise_for_status()

    def advance_clock(self, seconds: float = CLOCK_STEP_S) -> None:
        """Move the emulator's clock forward (its batches progress as if that time had passed)."""
        self.http.post(f"{self.url}/_emulator/clock", json={"advance_s": seconds}).raise_for_status()

    def staging_dir(self) -> Path:
        return self.root / "staging"

    def rejects(self, run_id: str) -> list[str]:
        """Application ids in the run's ``rejects.jsonl``."""
        path = self.staging_dir() / WORKLOAD / run_key(run_id) / "rejects.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(str(json.loads(line).get("id") or ""))
        return out

    # ------------------------------------------------------------------ user operations

    def edit_record(self, index: int, text: str | None) -> str:
        """Change one input record's text (``None``: drop the field, a bad record); return its id.

        :param index: which record
        :param text: the new text
        """
        record = self.records[index % len(self.records)]
        if text is None:
            record.pop("text", None)
        else:
            record["text"] = text
        self.edits[record["id"]] = self.edits.get(record["id"], 0) + 1
        self._changed()
        return record["id"]

    def duplicate_record(self, index: int, bad: bool) -> str:
        """Add a second record with one record's id (``bad``: without its text); return the id.

        :param index: which record
        :param bad: the duplicate cannot be rendered
        """
        record = dict(self.records[index % len(self.records)])
        if bad:
            record.pop("text", None)
        else:
            record["text"] = "a second opinion on " + record.get("text", "it")
        self.records.append(record)
        self.edits[record["id"]] = self.edits.get(record["id"], 0) + 1
        self._changed()
        return record["id"]

    def set_prompt(self, version: str, wording: str = "") -> None:
        """Bump the prompt (a new version) or edit it in place (same version, other wording).

        :param version: the version
        :param wording: the change of wording
        """
        self.prompt = prompt_variant(self.model, version, wording)
        self.prompt_contents.setdefault(version, set()).add(self.prompt.fingerprint)
        self._changed()

    def _changed(self) -> None:
        for run in self.runs:
            run.published_after_change = True

    def kill_process(self, run: Run) -> None:
        """Kill the run's process where no scheduler watches it (its DagRun stays ``running``).

        :param run: the run
        """
        if not run.finished:
            run.killed = True

    def pass_deadline(self, run: Run) -> None:
        """The run's deadline passes: its later tasks see a deadline in the past."""
        run.deadline = PAST

    def cli(self, *args: str) -> tuple[int, str]:
        """Run ``abp-ledger`` (:func:`airflow_batch_provider.cli.main`) on the ledger; return status and output.

        :param args: its arguments after ``--ledger-url``
        """
        out, err = io.StringIO(), io.StringIO()
        with redirect_stderr(err):
            try:
                code = cli.main(["--ledger-url", self.ledger_url, *args], out=out)
            except SystemExit as exc:  # argparse refused
                code = int(exc.code or 2)
        return code, out.getvalue() + err.getvalue()

    def damage_result_file(self, how: str) -> str | None:
        """Damage the first downloaded output file that reconcile has not read yet; return its path.

        :param how: ``html`` (an error page instead of the file), ``truncate`` (its last line cut
            short), ``lose`` (the file deleted), ``error_first`` / ``error_after`` (an error line for
            its first custom id before / after that id's answer) or ``malformed_after`` (a broken
            copy of its first line after it: a bad duplicate of a good answer) or
            ``error_in_error_file`` (an error line for its first custom id in the error file)
        """
        from sqlalchemy import select

        from airflow_batch_provider.ledger import schema as s

        with self.ledger().engine.connect() as conn:
            rows = conn.execute(
                select(s.jobs.c.output_path, s.jobs.c.error_path).where(
                    s.jobs.c.workload == WORKLOAD,
                    s.jobs.c.output_path.is_not(None),
                    s.jobs.c.reconciled_at.is_(None),
                )
            ).all()
        for output_path, error_path in rows:
            path = Path(str(output_path).removeprefix("file://"))
            if not path.exists():
                continue
            if how == "error_in_error_file" and error_path:
                line = path.read_bytes().splitlines()[:1]
                errors = Path(str(error_path).removeprefix("file://"))
                if line and errors.exists():
                    twin = json.dumps(_twin_line(json.loads(line[0]))).encode() + b"\n"
                    errors.write_bytes(errors.read_bytes() + twin)
                    return str(errors)
                continue
            if how == "html":
                path.write_bytes(b"<html><body><h1>502 Bad Gateway</h1></body></html>\n")
            elif how == "truncate":
                data = path.read_bytes().rstrip(b"\n")
                self._note_cut(data.rsplit(b"\n", 1)[-1], data.splitlines()[:-1])
                path.write_bytes(data[: max(1, len(data) - 20)])
            elif how == "lose":
                path.unlink()
            else:
                lines = path.read_bytes().splitlines()
                if not lines:
                    continue
                if how == "malformed_after":
                    extra = lines[0][: len(lines[0]) // 2]
                    self.damaged_lines += 1
                else:
                    extra = json.dumps(_twin_line(json.loads(lines[0]))).encode()
                path.write_bytes(
                    b"\n".join([extra, *lines] if how == "error_first" else [*lines, extra]) + b"\n"
                )
            return str(path)
        return None

    def _note_cut(self, last: bytes, before: list[bytes]) -> None:
        """Remember a line about to be cut short, unless it was unreadable already.

        :param last: the line
        :param before: the lines before it (an intact copy there keeps its answer readable)
        """
        try:
            line = json.loads(last)
        except ValueError:
            return  # damaged already: cutting it again damages no other line
        self.damaged_lines += 1
        if _is_answer(line) and last not in before:
            self.damaged.append(str(line["custom_id"]))

    # ------------------------------------------------------------------ runs

    def start_run(self) -> Run:
        """A new DAG run of the workload (the next day's logical date)."""
        run = Run(f"manual__2026-03-{len(self.runs) + 1:02d}T00:00:00+00:00")
        self.runs.append(run)
        return run

    def plan(self, run: Run) -> Iterator[TaskKey]:
        """The run's task keys in the order Airflow runs them, up to the first one not done.

        :param run: the run
        """
        for key in (("lease", 0, 0), ("prepare", 1, 0)):
            yield key
            if key not in run.done:
                return
        manifests: list[dict[str, Any]] = run.done[("prepare", 1, 0)] or []
        for round_ in range(1, self.attempts + 1):
            if round_ > 1:
                key = ("resubmit", round_, 0)
                yield key
                if key not in run.done:
                    return
                manifests = run.done[key] or []
            for task in ROUND_TASKS:
                for index in range(len(manifests)):
                    key = (task, round_, index)
                    yield key
                    if key not in run.done:
                        return
        yield ("deadline_branch", 0, 0)
        if ("deadline_branch", 0, 0) not in run.done:
            return
        if run.done[("deadline_branch", 0, 0)] == "sync_fallback":
            yield ("sync_fallback", 0, 0)
            if ("sync_fallback", 0, 0) not in run.done:
                return
        yield ("publish", 0, 0)

    def next_task(self, run: Run) -> TaskKey | None:
        """The run's next task, or ``None`` when it is finished."""
        if run.finished or run.killed:
            return None
        keys = list(self.plan(run))
        return keys[-1] if keys[-1] not in run.done else None

    def clear(self, run: Run, key: TaskKey | None = None) -> None:
        """Clear the run (``key`` ``None``) or one of its tasks and everything after it.

        :param run: the run
        :param key: the task
        """
        order = list(self.plan(run))
        cut = 0 if key is None or key not in order else order.index(key)
        for k in order[cut:]:
            run.done.pop(k, None)
        run.finished = False
        run.abandoned = False
        run.killed = False

    def step(self, run: Run, kill_at: str | None = None) -> TaskKey | None:
        """Run the run's next task (a kill armed at ``kill_at``); return its key.

        A task that fails (an exception, a kill) is left not done, as Airflow leaves it failed;
        the exception propagates. :class:`NotYet`: the wait goes on.

        :param run: the run
        :param kill_at: a fail point to arm for this task
        """
        key = self.next_task(run)
        if key is None:
            return None
        run.tries[key] = run.tries.get(key, 0) + 1
        finished_before = key[0] == "publish" and self._finished_in_ledger(run)
        in_flight = self._items_a_batch_holds() if key[0] == "prepare" else frozenset()
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            if kill_at is not None:
                with killing_at(kill_at):
                    result = self._execute(run, key)
            else:
                result = self._execute(run, key)
        except Exception:
            if key[0] == "lease":
                self._check_lease_refusal(run)
            raise
        finally:
            self._note_job_prompts(run)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        run.done[key] = result
        if key[0] == "prepare":
            run.records = [dict(r) for r in self.records]
            run.prompt_version = self.prompt.version
            run.prompt = self.prompt
            run.in_flight_at_prepare = in_flight
        if key[0] == "publish":
            run.finished = True
            run.publish_followed_change = run.published_after_change
            run.published_after_change = False
            run.published_while_finished = finished_before
        return key

    def _note_job_prompts(self, run: Run) -> None:
        """Remember the prompt of each job the step made (the run's, which every task of it renders)."""
        from sqlalchemy import select

        from airflow_batch_provider.ledger import schema as s

        with self.ledger().engine.connect() as conn:
            ids = conn.execute(select(s.jobs.c.job_id).where(s.jobs.c.workload == WORKLOAD)).scalars().all()
        prompt = (run.prompt or self.prompt).fingerprint
        for job_id in ids:
            self.job_prompts.setdefault(str(job_id), prompt)

    def _items_a_batch_holds(self) -> frozenset[tuple[str, str]]:
        """The items in flight in a job whose batch exists or may exist (read from the ledger's rows)."""
        from sqlalchemy import and_, or_, select

        from airflow_batch_provider.ledger import schema as s

        i, j = s.items.c, s.jobs.c
        q = (
            select(i.item_key, i.prompt_version)
            .select_from(s.items.join(s.jobs, j.job_id == i.job_id))
            .where(
                i.workload == WORKLOAD,
                i.state.in_(("staged", "submitted")),
                or_(
                    j.batch_id.is_not(None),
                    j.state.in_(("submitting", "in_doubt")),
                    and_(j.claim_owner.is_not(None), j.state == "staged"),
                ),
            )
        )
        with self.ledger().engine.connect() as conn:
            return frozenset((str(k), str(v)) for k, v in conn.execute(q))

    def _finished_in_ledger(self, run: Run) -> bool:
        """Whether the ledger holds the run finished now (its report recorded, not reopened)."""
        from airflow_batch_provider.ledger.runs import finished_run

        return finished_run(self.ledger(), WORKLOAD, run.run_id) is not None

    def _wait_deferrable(self, sensor: Any, context: dict[str, Any], task_id: str, key: TaskKey) -> Any:
        """Run a deferrable wait once: its result, or :class:`NotYet` when it defers.

        A deferral is the trigger's turn: the next step runs the wait again, as the trigger's
        ``recheck`` resumes it. A ``time.sleep`` in the task is a worker slot held while nothing
        happens: it is recorded (:attr:`StatefulWorkload.slot_sleeps`) and the task stopped.

        :param sensor: the wait task, deferrable
        :param context: the task context
        :param task_id: the task, for the record
        :param key: the task key
        """
        from airflow.sdk.exceptions import TaskDeferred

        from airflow_batch_provider.sensors import batch as sensors

        workload = self

        class Clock:
            """The sensor module's ``time``: its ``sleep`` is recorded and stops the task."""

            def __getattr__(self, name: str) -> Any:
                return getattr(time, name)

            def sleep(self, seconds: float) -> None:
                workload.slot_sleeps.append(
                    f"{task_id}[{key[2]}] slept {seconds:.2f}s in its worker slot instead of deferring"
                )
                raise SleptInSlot(task_id)

        module = vars(sensors)
        saved = module["time"]
        module["time"] = Clock()
        try:
            return sensor.execute(context)
        except TaskDeferred as exc:
            raise NotYet(f"{task_id}[{key[2]}]: deferred") from exc
        finally:
            module["time"] = saved

    def _check_lease_refusal(self, run: Run) -> None:
        """Record a refusal of the workload when the run holding it is dead (killed, failed, finished).

        :param run: the run whose lease task failed
        """
        lease = self.ledger().workload_lease(WORKLOAD)
        holder = next((r for r in self.runs if lease is not None and r.run_id == lease.run_id), None)
        if holder is None or holder is run:
            return
        if holder.killed or holder.abandoned or holder.finished:
            why = "killed" if holder.killed else "failed" if holder.abandoned else "finished"
            self.lease_refusals.append(
                f"run {run.run_id} refused the workload, held by run {holder.run_id}, which is {why}"
            )

    def _context(self, run: Run, key: TaskKey) -> dict[str, Any]:
        task, round_, index = key
        suffix = "" if round_ <= 1 else f"_{round_}"
        task_id = f"{WORKLOAD}.{task}{suffix if task in ROUND_TASKS else ''}"
        ti = SimpleNamespace(
            dag_id=DAG_ID,
            task_id=task_id,
            map_index=index if task in ROUND_TASKS else -1,
            try_number=run.tries.get(key, 1),
            xcom_push=lambda key, value: None,
        )
        return {"run_id": run.run_id, "ti": ti, "dag": SimpleNamespace(dag_id=DAG_ID)}

    def _deadline(self, run: Run) -> DeadlineOptions:
        return DeadlineOptions(run.deadline, "sync_fallback", harvest_timeout_s=0.5)

    def _input(self, run: Run, key: TaskKey) -> Any:
        task, round_, index = key
        previous = {"submit": "upload", "wait": "submit", "harvest": "wait", "download": "harvest"}
        if task == "upload":
            source = ("prepare", 1, 0) if round_ == 1 else ("resubmit", round_, 0)
            return run.done[source][index]
        if task == "reconcile":
            return run.done[("download", round_, index)]
        return run.done[(previous[task], round_, index)]

    def _execute(self, run: Run, key: TaskKey) -> Any:
        from airflow_batch_provider.operators import batch as ops
        from airflow_batch_provider.operators.deadline import (
            BatchDeadlineBranchOperator,
            BatchDeadlineHarvestOperator,
        )
        from airflow_batch_provider.operators.fallback import BatchSyncFallbackOperator
        from airflow_batch_provider.operators.takeover import PASS_THROUGH_ROUTES
        from airflow_batch_provider.sensors.batch import BatchStatusSensor

        task, round_, _ = key
        context = self._context(run, key)
        task_id = context["ti"].task_id
        common = self.common
        deadline = self._deadline(run)
        # a bad record is rejected and the run goes on (the default ratio would stop it at prepare)
        chunking = ChunkOptions(max_requests=self.chunk, max_reject_ratio=0.5)
        operator: Any
        if task == "lease":
            operator = ops.BatchWorkloadLeaseOperator(task_id=task_id, **common)
        elif task == "prepare":
            records = [dict(r) for r in self.records]
            operator = ops.BatchPrepareOperator(
                task_id=task_id,
                records=lambda ctx: iter(records),
                prompt=self.prompt,
                chunking=chunking,
                budget=self.budget,  # as the group hands it: prepare refuses an estimate over it
                **common,
            )
        elif task == "resubmit":
            operator = ops.BatchResubmitOperator(
                task_id=task_id,
                round_number=round_,
                max_attempts=self.attempts,
                chunking=chunking,
                deadline=deadline,
                budget=self.budget,
                **common,
            )
        elif task == "upload":
            operator = ops.BatchUploadOperator(task_id=task_id, job=self._input(run, key), **common)
        elif task == "submit":
            operator = ops.BatchSubmitOperator(
                task_id=task_id, job=self._input(run, key), prompt=self.prompt, budget=self.budget, **common
            )
        elif task == "wait":
            waited = self._input(run, key)
            # a job in doubt (no batch id) waits as the group's deferrable sensor does, so a wait
            # that sleeps in its worker slot instead of deferring is seen (bug 7)
            in_doubt = not waited.get("batch_id") and waited.get("route") not in PASS_THROUGH_ROUTES
            sensor = BatchStatusSensor(
                task_id=task_id,
                batch=waited,
                batch_conn_id=CONN_ID,
                poll=FAST_POLL,
                deadline=deadline.at(),
                deferrable=in_doubt,
            )
            if in_doubt:
                return self._wait_deferrable(sensor, context, task_id, key)
            poked = sensor.poke(context)  # type: ignore[arg-type]
            if poked is False or (hasattr(poked, "is_done") and not poked.is_done):
                raise NotYet(f"{task_id}[{key[2]}]: not done yet")
            return poked.xcom_value if hasattr(poked, "xcom_value") else None
        elif task == "harvest":
            operator = BatchDeadlineHarvestOperator(
                task_id=task_id, batch=self._input(run, key), deadline=deadline, poll=FAST_POLL, **common
            )
        elif task == "download":
            operator = ops.BatchDownloadOperator(task_id=task_id, batch=self._input(run, key), **common)
        elif task == "reconcile":
            operator = ops.BatchReconcileOperator(
                task_id=task_id, batch=self._input(run, key), prompt=self.prompt, budget=self.budget, **common
            )
        elif task == "deadline_branch":
            branch = BatchDeadlineBranchOperator(
                task_id=task_id,
                workload=WORKLOAD,
                ledger_conn_id=None,
                deadline=deadline,
                publish_task_id="publish",
                policy_task_id="sync_fallback",
            )
            return branch.choose_branch(context)  # type: ignore[arg-type]
        elif task == "sync_fallback":
            operator = BatchSyncFallbackOperator(
                task_id=task_id, prompt=self.prompt, budget=self.budget, **common
            )
        elif task == "publish":
            operator = ops.BatchPublishOperator(
                task_id=task_id, max_attempts=self.attempts, prompt=self.prompt, budget=self.budget, **common
            )
        else:  # pragma: no cover - the plan names only the tasks above
            raise AssertionError(task)
        if task != "lease":
            operator.pre_execute(context)
        return operator.execute(context)


def _is_answer(line: dict[str, Any]) -> bool:
    """Tell a success line (a billed answer) from an error line.

    :param line: an OpenAI (``response``) or Anthropic (``result``) result line
    """
    if "response" in line:  # OpenAI
        return bool(line["response"]) and line["response"].get("status_code") == 200
    return bool(line.get("result")) and line["result"].get("type") == "succeeded"


def _twin_line(line: dict[str, Any]) -> dict[str, Any]:
    """An error result line for ``line``'s custom id.

    :param line: an OpenAI (``response``) or Anthropic (``result``) result line
    """
    twin = json.loads(json.dumps(line))
    if "response" in twin:  # OpenAI
        twin["response"] = {
            "status_code": 500,
            "body": {"error": {"message": "server error", "type": "server_error"}},
        }
        return twin
    twin["result"] = {"type": "errored", "error": {"type": "api_error", "message": "overloaded"}}
    return twin


def airflow_says(workload: StatefulWorkload) -> Callable[[str | None, str | None], str | None]:
    """What Airflow would answer for a run's state (``dagrun_state``), from the machine's runs.

    :param workload: the workload
    """

    def state(dag_id: str | None, run_id: str | None) -> str | None:
        for run in workload.runs:
            if run.run_id == run_id:
                if run.finished:
                    return "success"
                return "failed" if run.abandoned else "running"
        return None

    return state


def airflow_task_instances(workload: StatefulWorkload) -> Callable[[str, str], list[Any] | None]:
    """What Airflow knows of a run's task instances (``holder_task_instances``), from the machine's runs.

    A killed run's task instance is still ``running`` with its last heartbeat long ago (dead by
    the scheduler's heartbeat rule); any other unfinished run has one running that beat just now.

    :param workload: the workload
    """
    from datetime import UTC, datetime

    from airflow_batch_provider.operators.liveness import TaskInstanceSign

    def signs(dag_id: str, run_id: str) -> list[Any] | None:
        for run in workload.runs:
            if run.run_id == run_id:
                if run.finished:
                    return [TaskInstanceSign("publish", -1, "success", datetime.now(UTC))]
                seen = datetime(2001, 1, 1, tzinfo=UTC) if run.killed else datetime.now(UTC)
                return [TaskInstanceSign(f"{WORKLOAD}.prepare", -1, "running", seen)]
        return None

    return signs
