"""The chaos harness: run a small workload in real Airflow processes, kill them, resume, check.

One :class:`ChaosRun` is one DAG run of ``tests/reliability/dags/chaos_workload.py`` against the
emulator (started by the caller with :func:`~batch_emulator.testing.run_emulator`):

- :meth:`ChaosRun.attempt` runs (or, with ``resume``, clears and reruns) the DAG run in a fresh
  process (``python -m tests.support.chaos_dagrun``: ``airflow dags test`` with a fixed run id), with
  a fail point armed (``ABP_FAILPOINTS``, see :mod:`airflow_batch_provider.core.failpoints`) or a
  kill at a step boundary (``ABP_CHAOS_KILL_AFTER``: the process SIGKILLs itself right after a
  task's ``execute`` returned, before Airflow records it);
- :meth:`ChaosRun.survive` does that for each kill of a list (each one must really kill the
  process, or the case fails: a kill point that is never reached proves nothing), then resumes
  the run as a user would, until it succeeds;
- :func:`check_invariants` compares the ledger and the published reports with the emulator's own
  record of what it received (``GET /_emulator/record``) and returns a :class:`Verdict`.

Every case adds its counts to :data:`TALLY` (kills, faults, items, lost, paid twice), which the
suite prints at the end (``tests/reliability/conftest.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import httpx
from sqlalchemy import select

from airflow_batch_provider.core.failpoints import ENV_VAR as FAILPOINTS_ENV
from airflow_batch_provider.core.failpoints import FAILPOINTS
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.core.states import FINAL_STATES
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.staging import run_key
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import batch_env
from tests.support.bill import expected_bill

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DAGS: Final = REPO_ROOT / "tests" / "reliability" / "dags"
DAG_ID: Final = "chaos_workload"
WORKLOAD: Final = "chaos"
KILL_AFTER_ENV: Final = "ABP_CHAOS_KILL_AFTER"
#: how often a run is resumed after its kills before the case gives up
MAX_RESUMES: Final = 3
#: seconds one DAG run process may take before the harness stops it (a hang guard, not a speed
#: limit: such an attempt is ``timed_out``, never taken for the armed kill)
RUN_TIMEOUT_S: Final = 420.0

#: provider -> (connection type, path added to the emulator URL, model)
PROVIDERS: Final[Mapping[str, tuple[str, str, str]]] = {
    "openai": ("openai_batch", "/v1", "gpt-4o-mini"),
    "anthropic": ("anthropic_batch", "", "claude-3-5-haiku-20241022"),
}


@dataclass(frozen=True)
class Kill:
    """One way to kill the run's process.

    :param failpoint: a name of :data:`~airflow_batch_provider.core.failpoints.FAILPOINTS`, with an
        optional ``=N`` (the N-th time the process reaches it)
    :param after_task: ``<task id>[:<map index>]``: SIGKILL right after that task's ``execute``
    """

    failpoint: str | None = None
    after_task: str | None = None

    def __post_init__(self) -> None:
        if (self.failpoint is None) == (self.after_task is None):
            raise ValueError("a Kill names exactly one of failpoint or after_task")
        if self.failpoint is not None and self.failpoint.partition("=")[0] not in FAILPOINTS:
            raise ValueError(f"unknown fail point {self.failpoint!r}; known: {sorted(FAILPOINTS)}")

    @property
    def label(self) -> str:
        """``failpoint:<name>`` or ``after:<task>``."""
        return f"failpoint:{self.failpoint}" if self.failpoint else f"after:{self.after_task}"

    def env(self) -> dict[str, str]:
        """The environment variables that arm this kill."""
        if self.failpoint is not None:
            return {FAILPOINTS_ENV: self.failpoint}
        assert self.after_task is not None
        return {KILL_AFTER_ENV: f"{WORKLOAD}.{self.after_task}"}


@dataclass(frozen=True)
class Attempt:
    """One process that ran (part of) the DAG run.

    :param returncode: its exit status (``-9``: killed by SIGKILL)
    :param output: its stdout and stderr
    :param kill: the kill that was armed, if any
    :param timed_out: the harness stopped the process after :data:`RUN_TIMEOUT_S` (a hang, or a
        machine too busy): its SIGKILL is not the armed kill, whatever the exit status says
    """

    returncode: int
    output: str
    kill: Kill | None = None
    timed_out: bool = False

    @property
    def killed(self) -> bool:
        """True when the process died of SIGKILL by itself (the armed kill), not by the harness's timeout."""
        return self.returncode == -signal.SIGKILL and not self.timed_out

    def tail(self, chars: int = 3000) -> str:
        """The errors the process logged (at most 12 lines) and the end of its output, for messages."""
        errors = [line[:400] for line in self.output.splitlines() if "[error" in line or "Error:" in line]
        head = "\n".join(errors[-12:])
        stopped = (
            f"the harness stopped it after {RUN_TIMEOUT_S:.0f} s (timed out)\n" if self.timed_out else ""
        )
        return f"{stopped}errors logged:\n{head}\n... output ends with:\n{self.output[-chars:]}"


@dataclass
class Tally:
    """What the suite exercised, summed over the cases of one session."""

    cases: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    items: int = 0
    lost: int = 0
    paid_twice: int = 0
    unknown_batches: int = 0
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "cases": self.cases,
            "kill_points": len({label.partition("=")[0] for label in self.kills}),
            "kills": sum(self.kills.values()),
            "kills_by_point": dict(sorted(self.kills.items())),
            "faults": sum(self.faults.values()),
            "faults_by_kind": dict(sorted(self.faults.items())),
            "items": self.items,
            "lost": self.lost,
            "paid_twice": self.paid_twice,
            "unknown_batches": self.unknown_batches,
            "failures": list(self.failures),
        }

    def raw(self) -> dict[str, Any]:
        """What :meth:`add` takes: the counts as plain JSON values (an xdist worker sends them)."""
        return {
            "cases": self.cases,
            "kills": dict(self.kills),
            "faults": dict(self.faults),
            "items": self.items,
            "lost": self.lost,
            "paid_twice": self.paid_twice,
            "unknown_batches": self.unknown_batches,
            "failures": list(self.failures),
        }

    def add(self, raw: dict[str, Any]) -> None:
        """Add another session's counts (:meth:`raw` of an xdist worker) to these.

        :param raw: the counts
        """
        self.cases += raw["cases"]
        self.kills.update(raw["kills"])
        self.faults.update(raw["faults"])
        self.items += raw["items"]
        self.lost += raw["lost"]
        self.paid_twice += raw["paid_twice"]
        self.unknown_batches += raw["unknown_batches"]
        self.failures.extend(raw["failures"])


#: the session's counts (printed and, with ``ABP_CHAOS_SUMMARY=<path>``, written as JSON)
TALLY: Final = Tally()


@contextmanager
def chaos_emulator(faults: Mapping[str, Any] | None = None, *, time_scale: float = 0.02) -> Iterator[str]:
    """Serve the emulator with these faults (``FaultConfig`` settings by name); yield its base URL.

    At time scale 0.02 a batch takes about 0.3 s, so a run's time is Airflow's, not the batches'.

    :param faults: fault settings, e.g. ``{"create_script": ["create:500_after"]}``
    :param time_scale: the emulator's time scale
    """
    config = EmulatorConfig(seed=7, time_scale=time_scale, faults=FaultConfig.from_mapping(faults or {}))
    with run_emulator(config) as url:
        yield url


def records(n: int) -> list[dict[str, str]]:
    """``n`` clean records for the workload.

    :param n: how many
    """
    moods = ("arrived late", "works great", "is fine", "broke on day two")
    return [{"id": f"r{i:04d}", "text": f"the parcel {i} {moods[i % len(moods)]}"} for i in range(n)]


class ChaosRun:
    """One DAG run of the chaos workload, with its own Airflow metadata database.

    :param airflow_home: the session's migrated Airflow home environment (its database is copied)
    :param shared: folder of the ledger (unless ``ledger_url``) and staging; two runs of one
        workload share it
    :param name: this run's name (its Airflow home is ``shared/<name>``)
    :param emulator_url: the emulator's base URL
    :param provider: ``openai`` or ``anthropic``
    :param items: records in the input
    :param chunk: requests per job
    :param attempts: rounds
    :param deadline: ISO 8601 duration after which ``sync_fallback`` takes over (``None``: none)
    :param ledger_url: the ledger (default: SQLite in ``shared``)
    :param day: day of March 2026 of the run's logical date (two runs need two days)
    :param logical_date: the run's logical date and start (ISO 8601; overrides ``day``); a run with
        a deadline needs one close to now, since its deadline counts from the run's start
    :param settings: extra ``[batch_provider]`` settings
    :param sink: deliver the answers into a SQLite table (``results`` in ``shared/<name>-sink.sqlite``)
    :param consumer: hand the answers to a consumer that records each call's key
        (``shared/<name>-consumer.log``, see :meth:`consumer_calls`)
    """

    def __init__(
        self,
        airflow_home: Mapping[str, str],
        shared: Path,
        name: str,
        emulator_url: str,
        *,
        provider: str = "openai",
        items: int = 30,
        chunk: int = 10,
        attempts: int = 2,
        deadline: str | None = None,
        ledger_url: str | None = None,
        day: int = 1,
        logical_date: str | None = None,
        settings: Mapping[str, str] | None = None,
        sink: bool = False,
        consumer: bool = False,
    ) -> None:
        conn_type, suffix, model = PROVIDERS[provider]
        self.provider = provider
        self.model = model
        self.items = items
        self.name = name
        home = shared / name
        home.mkdir(parents=True, exist_ok=True)
        source_home = Path(airflow_home["AIRFLOW_HOME"])
        shutil.copy(source_home / "airflow.db", home / "airflow.db")
        base = dict(airflow_home)
        base.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            }
        )
        extra = dict(settings or {})
        if ledger_url is not None:
            extra["ledger_url"] = ledger_url
        connection = {"conn_type": conn_type, "host": emulator_url + suffix, "password": "sk-chaos"}
        connections: dict[str, dict[str, Any]] = {"chaos_batch": connection}
        self.sink_path: Path | None = None
        if sink:
            self.sink_path = shared / f"{name}-sink.sqlite"
            with closing(sqlite3.connect(self.sink_path)) as db:
                db.execute("CREATE TABLE results (item_id TEXT PRIMARY KEY, answer TEXT)")
                db.commit()
            connections["chaos_sink"] = {"conn_type": "sqlite", "host": str(self.sink_path)}
        self.env = batch_env(base, shared, connections, **extra)
        if sink:
            self.env["ABP_CHAOS_SINK"] = "1"
        self.consumer_log: Path | None = shared / f"{name}-consumer.log" if consumer else None
        if self.consumer_log is not None:
            self.env["ABP_CHAOS_CONSUMER"] = str(self.consumer_log)
        input_path = shared / f"{name}-records.jsonl"
        input_path.write_text("".join(json.dumps(r) + "\n" for r in records(items)), encoding="utf-8")
        self.env.update(
            {
                "ABP_CHAOS_RECORDS": str(input_path),
                "ABP_CHAOS_MODEL": model,
                "ABP_CHAOS_CHUNK": str(chunk),
                "ABP_CHAOS_ATTEMPTS": str(attempts),
            }
        )
        if deadline is not None:
            self.env["ABP_CHAOS_DEADLINE"] = deadline
        for name_ in (FAILPOINTS_ENV, KILL_AFTER_ENV):
            self.env.pop(name_, None)
        self.ledger_url = self.env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"]
        self.logical_date = logical_date or f"2026-03-{day:02d}T00:00:00+00:00"
        self.run_id = f"manual__{self.logical_date}"
        self.attempts: list[Attempt] = []

    def _command(self, resume: bool) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "tests.support.chaos_dagrun",
            DAG_ID,
            self.logical_date,
            self.logical_date,
        ]
        return [*args, "--resume"] if resume else args

    def start(self, kill: Kill | None = None, *, resume: bool = False) -> subprocess.Popen[str]:
        """Start one process that runs (or resumes) the DAG run; see :meth:`finish`.

        :param kill: the kill to arm
        :param resume: clear the run's task instances first (the run was killed or failed)
        """
        env = dict(self.env)
        if kill is not None:
            env.update(kill.env())
        log = (Path(self.env["AIRFLOW_HOME"]) / f"attempt-{len(self.attempts)}.log").open("w")
        return subprocess.Popen(
            self._command(resume),
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def finish(self, proc: subprocess.Popen[str], kill: Kill | None = None) -> Attempt:
        """Wait for a process from :meth:`start` and record its attempt.

        :param proc: the process
        :param kill: the kill that was armed
        """
        timed_out = False
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        assert proc.stdout is None
        log = Path(self.env["AIRFLOW_HOME"]) / f"attempt-{len(self.attempts)}.log"
        attempt = Attempt(proc.returncode, log.read_text(errors="replace"), kill, timed_out)
        self.attempts.append(attempt)
        if attempt.killed and kill is not None:
            TALLY.kills[kill.label] += 1
        return attempt

    def attempt(self, kill: Kill | None = None, *, resume: bool = False) -> Attempt:
        """Run (or resume) the DAG run in one process and wait for it.

        :param kill: the kill to arm
        :param resume: clear the run's task instances first
        """
        return self.finish(self.start(kill, resume=resume), kill)

    def resume_until_done(self, *, resume: bool = True) -> Attempt:
        """Resume the run until a process ends with the run successful (at most :data:`MAX_RESUMES`).

        :param resume: the run was started before (clear it first)
        :raises AssertionError: the run never succeeded
        """
        last: Attempt | None = None
        for _ in range(MAX_RESUMES):
            last = self.attempt(resume=resume)
            if last.returncode == 0:
                return last
            resume = True
        assert last is not None
        raise AssertionError(
            f"run {self.run_id} did not succeed after {MAX_RESUMES} resumes "
            f"(last exit status {last.returncode}):\n{last.tail()}"
        )

    def survive(self, kills: Sequence[Kill]) -> list[str]:
        """Apply each kill in turn (each on a resume of the previous), then resume until done.

        :param kills: the kills, in order
        :return: the kills that did not kill (not reached); the caller fails the case on them
        """
        missed: list[str] = []
        for index, kill in enumerate(kills):
            attempt = self.attempt(kill, resume=index > 0)
            if not attempt.killed:
                missed.append(f"{kill.label} (exit status {attempt.returncode})")
        self.resume_until_done(resume=bool(kills))
        return missed

    def describe(self) -> str:
        """One line per attempt: the kill armed and how the process ended (for the test's output)."""
        lines = [f"{self.name} ({self.provider}, {self.run_id}):"]
        for index, attempt in enumerate(self.attempts):
            ended = (
                "timed out"
                if attempt.timed_out
                else "killed"
                if attempt.killed
                else f"exit {attempt.returncode}"
            )
            armed = attempt.kill.label if attempt.kill else "no kill"
            lines.append(f"  attempt {index}: {armed}: {ended}")
        return "\n".join(lines)

    def ledger(self) -> Ledger:
        """The run's ledger."""
        return Ledger.from_url(self.ledger_url)

    def sink_rows(self) -> list[tuple[str, str]]:
        """The sink table's rows (``item_id``, ``answer``), in id order."""
        assert self.sink_path is not None, "this run has no sink"
        with closing(sqlite3.connect(self.sink_path)) as db:
            return [
                (str(a), str(b))
                for a, b in db.execute("SELECT item_id, answer FROM results ORDER BY item_id")
            ]

    def consumer_calls(self) -> list[tuple[str, str]]:
        """Every call the consumer made (application id, idempotency key), in the order made."""
        assert self.consumer_log is not None, "this run has no consumer"
        if not self.consumer_log.exists():
            return []
        lines = self.consumer_log.read_text(encoding="utf-8").splitlines()
        return [(app_id, key) for app_id, key in (line.split() for line in lines)]

    def published_answers(self) -> list[tuple[str, str]]:
        """The run's published usable answers (application id, answer), in id order."""
        ledger = self.ledger()
        r = s.published.c
        q = select(r.app_id, r.output_json).where(
            r.workload == WORKLOAD, r.run_id == self.run_id, r.state.in_(["succeeded", "unchanged"])
        )
        with ledger.engine.connect() as conn:
            rows = [(str(a), json.loads(o)) for a, o in conn.execute(q)]
        ledger.engine.dispose()
        return sorted((a, o if isinstance(o, str) else json.dumps(o, sort_keys=True)) for a, o in rows)

    def rejects(self) -> int:
        """Lines in the run's ``rejects.jsonl`` (0 when it has none)."""
        staging = Path(self.env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
        path = staging / WORKLOAD / run_key(self.run_id) / "rejects.jsonl"
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def emulator_record(base_url: str, *, settle_s: float = 60.0) -> dict[str, Any]:
    """The emulator's record, once every batch in it that can end has ended (billed is known).

    A batch stuck in progress never ends by itself; it is returned as it is after ``settle_s``.

    :param base_url: the emulator's base URL
    :param settle_s: how long to wait for the batches to end
    :raises AssertionError: the emulator has no record endpoint
    """
    deadline = time.monotonic() + settle_s
    while True:
        response = httpx.get(f"{base_url}/_emulator/record", timeout=30)
        assert response.status_code == 200, (
            f"GET /_emulator/record answered {response.status_code}: the emulator keeps no record of "
            f"what it received, so the invariant cannot be checked: {response.text[:300]}"
        )
        record: dict[str, Any] = response.json()
        pending = [b for bs in record.get("batches", {}).values() for b in bs if b.get("billed") is None]
        if not pending or time.monotonic() > deadline:
            return record
        time.sleep(0.3)


def emulator_counters(base_url: str) -> dict[str, int]:
    """The emulator's counters (``GET /_emulator/stats``)."""
    counters: dict[str, int] = httpx.get(f"{base_url}/_emulator/stats", timeout=30).json()["counters"]
    return counters


@dataclass(frozen=True)
class Verdict:
    """The invariant, checked after a case; each list names the violations it found.

    :param rows: input rows of the runs
    :param lost: rows not in exactly one final state nor rejected (``id: why``)
    :param sent_twice: custom ids the provider received in more than one batch
    :param unknown_batches: batch ids at the emulator that no ledger job names
    :param paid_twice: item keys billed for more than one answer (counted; a violation only when
        the ledger does not record each of them, see ``unrecorded_payments``)
    :param unrecorded_payments: item keys billed for more answers than the ledger has attempts
    :param cost_mismatch: the published cost against what the emulator billed, when they differ
    :param states: final state -> items, over the runs
    :param batches: batches the emulator created
    """

    rows: int
    lost: list[str]
    sent_twice: list[str]
    unknown_batches: list[str]
    paid_twice: list[str]
    unrecorded_payments: list[str]
    cost_mismatch: list[str]
    states: dict[str, int]
    batches: int
    inputs: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        """Every violation, one line each (empty when the invariant holds)."""
        out = [f"lost: {x}" for x in self.lost]
        out += [f"custom id sent in two batches: {x}" for x in self.sent_twice]
        out += [f"batch the ledger does not know: {x}" for x in self.unknown_batches]
        out += [f"billed more often than the ledger knows: {x}" for x in self.unrecorded_payments]
        out += [f"cost: {x}" for x in self.cost_mismatch]
        out += [f"input files: {x}" for x in self.inputs]
        return out

    def explain(self) -> str:
        """A failure message: the violations (the first 30) and the states."""
        lines = self.violations
        head = "\n  ".join(lines[:30]) + (f"\n  ... {len(lines) - 30} more" if len(lines) > 30 else "")
        return f"{len(lines)} violations of the invariant:\n  {head}\nstates: {self.states}"


def check_invariants(base_url: str, runs: Sequence[ChaosRun]) -> Verdict:
    """Check the invariant for runs of one workload (one ledger) against the emulator's record.

    (a) every input row is an item in exactly one final state, or rejected (the ledger keeps one
    row per item of a workload, so for two runs of the same records it is checked over both); (b)
    no custom id was sent in two batches, and no item was billed for more answers than the ledger
    has attempts for it (a real-time answer is attributed by its ``x-abp-custom-id`` header); (c)
    every batch at the emulator is a job's batch in the ledger; (d) the cost the runs published
    equals what the emulator billed (batches at the batch price, real-time answers at full price),
    token for token and to the exact decimal, plus, for each real-time send a kill interrupted
    before the emulator completed it, exactly its resend's price (the report cannot know and
    prices every interrupted send as paid). The session's :data:`TALLY` gets the counts.

    :param base_url: the emulator
    :param runs: the runs (sharing one ledger)
    """
    record = emulator_record(base_url)
    ledger = runs[0].ledger()
    with ledger.engine.connect() as conn:
        items = [
            dict(r) for r in conn.execute(select(s.items).where(s.items.c.workload == WORKLOAD)).mappings()
        ]
        jobs = [dict(r) for r in conn.execute(select(s.jobs).where(s.jobs.c.workload == WORKLOAD)).mappings()]
        known_attempts = Counter(
            r.item_key
            for r in conn.execute(select(s.attempts.c.item_key).where(s.attempts.c.workload == WORKLOAD))
        )
        # real-time attempts in the order they were made: an interrupted send (``possibly_paid_twice``)
        # is priced like the resend after it, whether or not the provider completed it
        sync_attempts: dict[str, list[Any]] = defaultdict(list)
        for r in conn.execute(
            select(s.attempts)
            .where(s.attempts.c.workload == WORKLOAD, s.attempts.c.mode == "sync")
            .order_by(s.attempts.c.created_at)
        ).mappings():
            sync_attempts[r["item_key"]].append(r)
        reports = {
            r["run_id"]: json.loads(r["report_json"]) if r["report_json"] else None
            for r in conn.execute(select(s.runs).where(s.runs.c.workload == WORKLOAD)).mappings()
        }
    by_app: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        by_app[item["app_id"]].append(item)
    ours = {run.run_id for run in runs}
    rejected = sum(run.rejects() for run in runs)
    lost: list[str] = []
    states: Counter[str] = Counter()
    ids = sorted({rec["id"] for run in runs for rec in records(run.items)})
    for app_id in ids:
        rows_of = by_app.get(app_id, [])
        finals = [i for i in rows_of if i["state"] in FINAL_STATES and i["run_id"] in ours]
        if len(finals) == 1 and len(rows_of) == 1:
            states[finals[0]["state"]] += 1
        elif not rows_of and rejected:
            rejected -= 1
            states["rejected"] += 1
        else:
            lost.append(f"{app_id}: {[(i['run_id'], i['state']) for i in rows_of] or 'no item'}")
    rows = len(ids)

    batches = [(provider, b) for provider, bs in record.get("batches", {}).items() for b in bs]
    seen: dict[str, list[str]] = defaultdict(list)
    for _, batch in batches:
        for custom_id in batch["custom_ids"]:
            seen[custom_id].append(batch["id"])
    sent_twice = [f"{cid} in {ids}" for cid, ids in sorted(seen.items()) if len(ids) > 1]
    known = {str(j["batch_id"]) for j in jobs if j.get("batch_id")}
    unknown = [
        f"{provider} {b['id']} ({b['request_count']} requests, {b['status']}, created #{b['creation_index']})"
        for provider, b in batches
        if b["id"] not in known and not any(b["id"].endswith(k) or k.endswith(b["id"]) for k in known)
    ]

    bill = expected_bill(record, sync_attempts, runs[0].provider, runs[0].model)
    billed_answers, expected_usage, expected_paid = bill.answers, bill.usage, bill.paid
    paid_twice = [f"{key} ({n} answers billed)" for key, n in sorted(billed_answers.items()) if n > 1]
    unrecorded = [
        f"{key}: {n} answers billed, {known_attempts[key]} attempts in the ledger"
        for key, n in sorted(billed_answers.items())
        if n > known_attempts[key]
    ]

    mismatch: list[str] = []
    published_paid = Decimal(0)
    published_usage = Usage()
    for run in runs:
        report = reports.get(run.run_id)
        if report is None:
            mismatch.append(f"run {run.run_id} published no report")
            continue
        published_paid += Decimal(report["paid"])
        published_usage += Usage(**report["usage"])
    if published_usage != expected_usage:
        mismatch.append(f"the reports count {published_usage}, the emulator billed {expected_usage}")
    if published_paid != expected_paid:
        mismatch.append(f"the reports say ${published_paid}, the emulator's usage costs ${expected_paid}")

    verdict = Verdict(
        inputs=check_input_files(base_url, jobs),
        rows=rows,
        lost=lost,
        sent_twice=sent_twice,
        unknown_batches=unknown,
        paid_twice=paid_twice,
        unrecorded_payments=unrecorded,
        cost_mismatch=mismatch,
        states=dict(states),
        batches=len(batches),
    )
    for run in runs:
        print(run.describe())
    print(
        f"verdict: {len(verdict.violations)} violations, states {verdict.states}, {verdict.batches} batches"
    )
    TALLY.cases += 1
    TALLY.items += rows
    TALLY.lost += len(lost)
    TALLY.paid_twice += len(paid_twice)
    TALLY.unknown_batches += len(unknown)
    return verdict


def check_input_files(base_url: str, jobs: Sequence[Mapping[str, Any]]) -> list[str]:
    """(e) Each chunk was uploaded once and its batch was created from the file its job recorded.

    Against the emulator's OpenAI files and batches (other providers take their chunks inline):
    no two files carry one job's key, and the input file of each job's batch is the ``input_ref``
    the upload task recorded for it.

    :param base_url: the emulator
    :param jobs: the ledger's job rows of the workload
    """
    auth = {"Authorization": "Bearer sk-chaos"}
    files = httpx.get(f"{base_url}/v1/files", params={"limit": 10_000}, headers=auth, timeout=30).json()[
        "data"
    ]
    by_name = Counter(str(f["filename"]) for f in files)
    problems = [f"{name} uploaded {n} times" for name, n in sorted(by_name.items()) if n > 1]
    for job in jobs:
        if job.get("input_kind") != "file" or not job.get("batch_id"):
            continue
        batch = httpx.get(f"{base_url}/v1/batches/{job['batch_id']}", headers=auth, timeout=30).json()
        if batch.get("input_file_id") != job["input_ref"]:
            problems.append(
                f"job {job['job_id']} recorded {job['input_ref']}, its batch {job['batch_id']} read "
                f"{batch.get('input_file_id')}"
            )
    return problems


def count_faults(base_url: str, kinds: Iterable[str] = ()) -> dict[str, int]:
    """Add the faults the emulator injected to :data:`TALLY` and return them by kind.

    Counted: every ``<provider>.create_faults.<fault>`` counter, batches that ended ``failed``,
    ``cancelled`` or ``expired`` and the unbilled lines of completed batches (from the record), plus the named ``kinds`` the case injected in other ways.

    :param base_url: the emulator
    :param kinds: other faults the case injected, one name per injection
    """
    found: Counter[str] = Counter(kinds)
    for name, value in emulator_counters(base_url).items():
        provider, _, rest = name.partition(".")
        if rest.startswith("create_faults.") and value:
            found[f"{provider} create {rest.removeprefix('create_faults.')}"] += value
    for provider, batches in emulator_record(base_url, settle_s=0).get("batches", {}).items():
        for batch in batches:
            if batch["status"] in ("failed", "cancelled", "expired"):
                found[f"{provider} batch {batch['status']}"] += 1
            elif batch["status"] == "completed" and batch.get("billed") is not None:
                errored = len(set(batch["custom_ids"]) - set(batch["billed"]))
                if errored:
                    found[f"{provider} item error or missing line"] += errored
    TALLY.faults.update(found)
    return dict(found)


def summary_path() -> Path | None:
    """Where to write the session's :data:`TALLY` as JSON (``ABP_CHAOS_SUMMARY``), if anywhere."""
    value = os.environ.get("ABP_CHAOS_SUMMARY")
    return Path(value) if value else None
