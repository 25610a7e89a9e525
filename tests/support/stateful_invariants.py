"""The exactly-once invariants, checked after every step of the stateful property test.

:func:`check` compares a :class:`~tests.support.stateful.StatefulWorkload`'s ledger and published
reports with the emulator's own record (``GET /_emulator/record``). It reuses the chaos suite's
pieces (:func:`~tests.support.bill.expected_bill`, :func:`~tests.support.bill.item_key_of`,
:func:`~tests.support.chaos.check_input_files`) and checks, always:

- *sent once per recorded attempt*: no custom id is in two batches, and every custom id the
  provider received (batch or real-time) is an attempt the ledger recorded;
- *sent again only for a recorded reason*: an item answered and billed twice at one prompt
  version had its earlier answer harvested and refused (a retryable outcome), or its input
  changed in between, or the ledger recorded that the prompt's content changed under that
  version (``abp_prompt_changes``, an in-place edit; and it records one only for a version the
  machine did edit in place, once per run and item); an answer that was billed and never harvested, or harvested as a success,
  is a reason for nothing (a re-drive of it pays twice);
- *a run keeps its prompt*: a ``v1`` (text) answer is never ``invalid_output`` (only the JSON
  schema of ``v2`` can refuse one);
- *the budget holds*: no run's report says it paid more than its budget;
- *a finished run is history*: its report and its attempts stay as its publish left them, until
  that run itself is cleared and published again (and then, when neither input nor prompt
  changed, to the same report); only the attempts it never harvested (a batch resolved after its
  publish) move with their job to the run that harvests them late (``late_harvest``);

and, once every run is finished (publish ran):

- *every input row in exactly one final state or rejected* (the last run's input, at its prompt
  version), and its item holds that input (a good record of an id over a bad one with the same
  id, a fixed record over the one that went to review);
- *no batch the ledger does not know*;
- *the reported billed usage equals the emulator's bill* (the documented upper bound for
  interrupted real-time sends allowed, as in the chaos suite; a batch the ledger knows only as a
  job still in doubt is left out until it is resolved: the report lists the job instead; a job
  resolved after its run published that no later run could harvest yet keeps its items
  ``submitted`` and its batch out of the bill likewise), less
  on both sides what no one can read: the reports' ``unreadable.estimated_usage`` and the billed
  usage of the lines that reached reconcile damaged (the emulator's ``truncated``, the lines
  :meth:`~tests.support.stateful.StatefulWorkload.damage_result_file` cut); each such answer has
  an unreadable line naming it, priced at an estimate above zero (never free), and no more lines
  are unreadable than were damaged (an identical damaged copy is one answer, priced once).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import pairwise
from typing import Any

from sqlalchemy import select

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.core.states import FINAL_STATES, IN_FLIGHT_STATES
from airflow_batch_provider.exceptions import ItemError
from airflow_batch_provider.ledger import schema as s
from tests.support.bill import expected_bill, usage_minus
from tests.support.stateful import WORKLOAD, StatefulWorkload
from tests.support.stateful_run import Run, comparable_report


@dataclass
class History:
    """What the checker remembers between steps: each finished run's report and attempts.

    :param reports: run id -> its comparable report at its last publish
    :param attempts: run id -> its attempts at its last publish
    """

    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    #: run id -> (started_at, finished_at) in ``abp_runs`` at the last check
    runs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    #: (item key, prompt version) -> the run that owned the item at the last check
    owners: dict[tuple[str, str], str] = field(default_factory=dict)


def _snapshot(workload: StatefulWorkload) -> dict[str, Any]:
    with workload.ledger().engine.connect() as conn:
        items = [
            dict(r) for r in conn.execute(select(s.items).where(s.items.c.workload == WORKLOAD)).mappings()
        ]
        jobs = [dict(r) for r in conn.execute(select(s.jobs).where(s.jobs.c.workload == WORKLOAD)).mappings()]
        attempts = [
            dict(r)
            for r in conn.execute(
                select(s.attempts).where(s.attempts.c.workload == WORKLOAD).order_by(s.attempts.c.created_at)
            ).mappings()
        ]
        prompt_changes = [
            dict(r)
            for r in conn.execute(
                select(s.prompt_changes).where(s.prompt_changes.c.workload == WORKLOAD)
            ).mappings()
        ]
        extra = [
            dict(r)
            for r in conn.execute(
                select(s.extra_lines).where(s.extra_lines.c.workload == WORKLOAD)
            ).mappings()
        ]
        run_rows = list(conn.execute(select(s.runs).where(s.runs.c.workload == WORKLOAD)).mappings())
        runs = {r["run_id"]: json.loads(r["report_json"]) if r["report_json"] else None for r in run_rows}
    return {
        "items": items,
        "jobs": jobs,
        "attempts": attempts,
        "reports": runs,
        "extra_lines": extra,
        "prompt_changes": prompt_changes,
        "run_rows": {r["run_id"]: (r["started_at"], r["finished_at"]) for r in run_rows},
    }


def _attempt_rows(attempts: list[dict[str, Any]], run_id: str) -> list[tuple[Any, ...]]:
    cols = ("job_id", "custom_id", "item_key", "prompt_version", "attempt", "mode", "outcome", "discarded")
    tokens = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_tokens")
    return sorted(tuple(a[c] for c in cols + tokens) for a in attempts if a["run_id"] == run_id)


def check(workload: StatefulWorkload, history: History, published: Collection[str] = ()) -> list[str]:
    """Check the invariants now; return the violations, one line each (empty: they hold).

    :param workload: the workload
    :param history: what earlier checks remembered (updated here)
    :param published: the runs whose publish task ran since the last check (a step that runs
        every run to its end publishes several)
    """
    response = workload.http.get(f"{workload.url}/_emulator/record")
    response.raise_for_status()
    record: dict[str, Any] = response.json()
    snap = _snapshot(workload)
    attempts: list[dict[str, Any]] = snap["attempts"]
    by_custom_id = {a["custom_id"]: a for a in attempts}
    out: list[str] = []

    # sent once per recorded attempt
    batches = [(p, b) for p, bs in record.get("batches", {}).items() for b in bs]
    seen: dict[str, list[str]] = defaultdict(list)
    for _, batch in batches:
        for custom_id in batch["custom_ids"]:
            seen[custom_id].append(batch["id"])
    # A recorded attempt is a (job, custom id) row: an item whose input changed is prepared afresh
    # and its attempts count from 1 again, so a later job may send the same custom id. That is
    # two recorded attempts, not one sent twice, when each batch is a different job the ledger
    # knows and each job recorded the custom id; a batch the ledger does not know (a job in
    # doubt) or two batches of one job are a custom id sent twice.
    job_of = {str(j["batch_id"]): str(j["job_id"]) for j in snap["jobs"] if j.get("batch_id")}
    recorded = {(a["job_id"], a["custom_id"]) for a in attempts}
    for custom_id, ids in sorted(seen.items()):
        jobs = [job_of.get(i) for i in ids]
        distinct_attempts = len(set(jobs)) == len(jobs) and all(
            job is not None and (job, custom_id) in recorded for job in jobs
        )
        if len(ids) > 1 and not distinct_attempts:
            out.append(f"custom id {custom_id} sent in {len(ids)} batches: {ids}")
        if custom_id not in by_custom_id:
            out.append(f"custom id {custom_id} sent in batch {ids[0]} with no attempt in the ledger")
    for answers in record.get("realtime", {}).values():
        for answer in answers:
            cid = answer.get("custom_id")
            if cid and cid not in by_custom_id:
                out.append(f"real-time answer for {cid} with no attempt in the ledger")

    # sent again only for a recorded reason: every billed answer but the last of an item and
    # prompt version was harvested and refused, or the input changed after it
    # A billed line is the attempt of the job whose batch billed it: custom ids repeat across
    # prompt versions and changed inputs (each counts its attempts from 1), so a custom id alone
    # names no attempt. A batch the ledger does not know (a job in doubt) and a real-time answer
    # go to the latest attempt of that custom id (of a real-time send, for the latter).
    by_job_cid = {(a["job_id"], a["custom_id"]): a for a in attempts}
    sync_by_cid = {a["custom_id"]: a for a in attempts if a["mode"] == "sync"}
    billed: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for _, batch in batches:
        for custom_id in batch.get("billed") or {}:
            attempt = by_job_cid.get((job_of.get(batch["id"]), custom_id)) or by_custom_id.get(custom_id)
            if attempt is not None:
                billed[(attempt["item_key"], attempt["prompt_version"])].append(attempt)
    for answers in record.get("realtime", {}).values():
        for answer in answers:
            cid = answer.get("custom_id") or ""
            attempt = sync_by_cid.get(cid) or by_custom_id.get(cid)
            if attempt is not None:
                billed[(attempt["item_key"], attempt["prompt_version"])].append(attempt)
    app_of = {i["item_key"]: i["app_id"] for i in snap["items"]}
    # the ledger's recorded reason for a prompt edited in place, never invented
    prompt_changed: dict[tuple[str, str], int] = defaultdict(int)
    for change in snap["prompt_changes"]:
        prompt_changed[(change["item_key"], change["prompt_version"])] += 1
        if len(workload.prompt_contents.get(change["prompt_version"], ())) < 2:
            out.append(
                f"item {change['item_key']} ({change['prompt_version']}) recorded as sent again for a prompt "
                f"edited in place (run {change['run_id']}), but that version was never edited in place"
            )
    for (key, version), lines in sorted(billed.items()):
        if len(lines) < 2:
            continue
        ordered = sorted(lines, key=lambda a: (a["attempt"], a["created_at"]))
        # an answer sent under one wording of the prompt and the next under another: the prompt was
        # edited in place between them (a run that took over a dead run's batch harvests answers of
        # the wording that batch was sent with, and the next run sends the new wording)
        reworded = sum(
            1
            for a, b in pairwise(ordered)
            if None not in (workload.job_prompts.get(a["job_id"]), workload.job_prompts.get(b["job_id"]))
            and workload.job_prompts[a["job_id"]] != workload.job_prompts[b["job_id"]]
        )
        edits = workload.edits.get(app_of.get(key, key), 0) + max(prompt_changed[(key, version)], reworded)
        unexplained = [
            a
            for a in ordered[:-1]
            if a["outcome"] in (None, "succeeded") and a["error_code"] != "possibly_paid_twice"
        ]
        if len(unexplained) > edits:
            detail = [(a["custom_id"], a["outcome"], a["error_code"]) for a in ordered]
            out.append(
                f"item {key} ({version}) answered and billed {len(ordered)} times, {len(unexplained)} of them "
                f"never harvested or harvested as a success, with {edits} input changes "
                f"({prompt_changed[(key, version)]} of them a recorded in-place prompt edit): {detail}"
            )

    # a run keeps its prompt: a v1 (text) answer is never judged by v2's JSON schema
    for a in attempts:
        if a["prompt_version"] == "v1" and (
            a["outcome"] == "invalid_output" or a["error_code"] == "invalid_output"
        ):
            out.append(
                f"v1 answer {a['custom_id']} (run {a['run_id']}) judged invalid_output: by another prompt's schema"
            )
    # a run's budget holds for everything it pays
    if workload.budget.budget_usd is not None:
        limit = Decimal(str(workload.budget.budget_usd))
        for run_id, report in snap["reports"].items():
            if report and Decimal(report["paid"]) > limit:
                out.append(f"run {run_id} paid ${report['paid']}, over its budget of ${limit}")

    # a finished run is history
    reports: Mapping[str, Any] = snap["reports"]
    for run in workload.runs:
        report = reports.get(run.run_id)
        now = comparable_report(report) if report else None
        rows = _attempt_rows(attempts, run.run_id)
        if run.run_id in published and now is not None:
            before = history.reports.get(run.run_id)
            if run.published_while_finished and before is not None and before != now:
                out.append(
                    f"finished run {run.run_id} was published again while the ledger held it finished "
                    f"(history: a later run followed it) and its report was rewritten: {_diff(before, now)}"
                )
            elif (
                before is not None
                and run.report is not None
                and not run.publish_followed_change
                and before != now
            ):
                out.append(
                    f"run {run.run_id} published again with nothing changed and its report differs: "
                    f"{_diff(before, now)}"
                )
            history.reports[run.run_id] = now
            history.attempts[run.run_id] = rows
            run.report = now
            continue
        if run.run_id in history.reports and run.finished:
            if now != history.reports[run.run_id]:
                out.append(
                    f"finished run {run.run_id}'s report changed: {_diff(history.reports[run.run_id], now or {})}"
                )
                history.reports[run.run_id] = now or {}
            # a batch resolved after the run published is harvested by a later run: the attempts
            # the run never harvested (no outcome) move with their job to that run, nothing else
            kept = _left_by_late_harvest(history.attempts[run.run_id], attempts, run.run_id)
            if rows != kept:
                gone = sorted(set(kept) - set(rows))[:3]
                new = sorted(set(rows) - set(kept))[:3]
                out.append(f"finished run {run.run_id}'s attempts changed: was {gone}, now {new}")
                history.attempts[run.run_id] = rows

    out += _history_kept(history, snap)

    # a run whose workload only a dead run holds takes it over (a killed run keeps nothing)
    out += workload.lease_refusals
    workload.lease_refusals.clear()
    # a wait never holds its worker slot asleep: a job in doubt defers between look-ups (bug 7)
    out += workload.slot_sleeps
    workload.slot_sleeps.clear()

    if workload.runs and all(r.finished or r.killed for r in workload.runs) and workload.runs[-1].finished:
        out += _at_rest(workload, record, snap)
    return out


def _history_kept(history: History, snap: dict[str, Any]) -> list[str]:
    """A finished run a later run followed stays finished, and keeps no item a later run owns.

    Only the workload's newest run is reopened by a cleared prepare; an older finished run's
    rerun neither reopens it nor takes an item from a run that started after it (bug 6). Compared
    with the last check, so a step that does both in one go is seen.
    """
    out: list[str] = []
    rows: dict[str, tuple[Any, Any]] = snap["run_rows"]
    for run_id, (started, finished) in sorted(history.runs.items()):
        later = sorted(r for r, (s2, _) in history.runs.items() if s2 > started)
        if finished is not None and rows.get(run_id, (None, None))[1] is None and later:
            out.append(f"finished run {run_id} was reopened although run {later[0]} started after it")
    for item in snap["items"]:
        address = (item["item_key"], item["prompt_version"])
        owner = history.owners.get(address)
        moved_to = str(item["run_id"])
        if owner is None or owner == moved_to or owner not in history.runs or moved_to not in rows:
            continue
        owner_started, owner_finished = history.runs[owner]
        if owner_finished is not None and rows[moved_to][0] < owner_started:
            out.append(
                f"item {address[0]} ({address[1]}) moved from finished run {owner} to run {moved_to}, "
                "which started before it"
            )
    history.runs = dict(rows)
    history.owners = {(i["item_key"], i["prompt_version"]): str(i["run_id"]) for i in snap["items"]}
    return out


#: Where the attempt rows of :func:`_attempt_rows` hold the job id, the custom id and the outcome.
_JOB, _CUSTOM_ID, _OUTCOME = 0, 1, 6
#: The emulator's neutral statuses of a batch that has ended.
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})


def _left_by_late_harvest(
    before: list[tuple[Any, ...]], attempts: list[dict[str, Any]], run_id: str
) -> list[Any]:
    """A finished run's attempt rows as they must be now: those it published, less the unharvested ones moved on.

    An attempt with no outcome when the run published (its job resolved to a batch after that)
    leaves the run with its job when a later run harvests the batch (``late_harvest``).
    """
    moved = {(a["job_id"], a["custom_id"]) for a in attempts if a["run_id"] != run_id}
    return [r for r in before if not (r[_OUTCOME] is None and (r[_JOB], r[_CUSTOM_ID]) in moved)]


def _awaiting_late_harvest(
    workload: StatefulWorkload, record: dict[str, Any], snap: dict[str, Any]
) -> set[str]:
    """Jobs of finished runs resolved to a batch that no later run could harvest yet.

    A job resolved after its run published is harvested by the next run of the workload, once its
    batch has ended (``late_harvest``); until then its items are ``submitted`` (guarded) and its
    batch is left out of the bill (the run's report lists the job under ``in_doubt_jobs``). Such a
    job counts as waiting while its batch still runs at the emulator, or while its run is the last.
    """
    status = {b["id"]: b["status"] for bs in record.get("batches", {}).values() for b in bs}
    last = workload.runs[-1].run_id
    return {
        str(j["job_id"])
        for j in snap["jobs"]
        if j.get("batch_id")
        and j["state"] not in ("downloaded", "reconciled", "sync", "in_doubt", "submitting")
        and snap["reports"].get(j["run_id"]) is not None
        and (j["run_id"] == last or status.get(j["batch_id"]) not in _ENDED)
    }


def _at_rest(workload: StatefulWorkload, record: dict[str, Any], snap: dict[str, Any]) -> list[str]:
    out: list[str] = []
    last = workload.runs[-1]
    waiting = _awaiting_late_harvest(workload, record, snap)
    version = last.prompt_version
    rejected = set(workload.rejects(last.run_id))
    killed = {r.run_id for r in workload.runs if r.killed}
    rows = {(i["item_key"], i["prompt_version"]): i for i in snap["items"]}
    # the input the last run read is the input its items hold (a good record of an id wins over a
    # bad one; a fixed record replaces the one that went to review)
    renderable: dict[str, set[str]] = defaultdict(set)
    for rec in last.records:
        if "text" in rec and last.prompt is not None:
            renderable[rec["id"]].add(last.prompt.render(rec).input_hash)
    for app_id, hashes in sorted(renderable.items()):
        row = rows.get((item_key(app_id), version))
        # an item a batch held when the last run read the input keeps the input that batch was
        # sent with (the send guard: never sent again while a batch may answer it); the next run
        # sends its new input (docs/reliability.md, "An input changed while its item is in flight")
        held = (item_key(app_id), version) in last.in_flight_at_prepare and row is not None
        if held and row["state"] in FINAL_STATES:
            continue
        if row is not None and row["input_hash"] not in hashes:
            out.append(
                f"input row {app_id} ({version}): the item holds another input than the last run read "
                f"(state {row['state']}, {row['error_code']})"
            )
    # a good record of an id is the item whatever a bad copy of that id says: the item never sits
    # in review with a bad copy's reason (the good one unsent)
    for app_id, reasons in sorted(_bad_copy_reasons(last).items()):
        row = rows.get((item_key(app_id), version))
        if (
            app_id in renderable
            and row is not None
            and row["state"] == "review"
            and row["error_code"] in reasons
        ):
            out.append(
                f"input row {app_id} ({version}): has a good record but is in review with a bad copy's "
                f"reason ({row['error_code']})"
            )
    for rec in last.records:
        row = rows.get((item_key(rec["id"]), version))
        if row is None:
            if rec["id"] not in rejected:
                out.append(f"input row {rec['id']} ({version}): no item and not rejected")
        elif row["state"] == "fallback" and row["run_id"] in killed:
            continue  # a real-time send a killed run left is a person's (docs/operating.md)
        elif row["state"] in IN_FLIGHT_STATES and row["run_id"] in killed:
            # a killed run's batches are adopted by the run that took its workload over: once that
            # run finished, nothing it could send or harvest is left with the dead run
            out.append(
                f"input row {rec['id']} ({version}): {row['state']} with killed run {row['run_id']} after "
                "a later run took the workload over and finished (its batch harvested by nobody)"
            )
        elif row["state"] not in FINAL_STATES and not (
            row["state"] == "submitted" and row["job_id"] in waiting
        ):
            out.append(f"input row {rec['id']} ({version}): {row['state']} after every run finished")

    known = {str(j["batch_id"]) for j in snap["jobs"] if j.get("batch_id")}
    # a job in doubt is the ledger knowing a batch may exist without its id: its batch is known
    in_doubt = {j["job_id"] for j in snap["jobs"] if j["state"] == "in_doubt"}
    doubted = {a["custom_id"] for a in snap["attempts"] if a["job_id"] in in_doubt}
    for provider, batches in record.get("batches", {}).items():
        for b in batches:
            if b["id"] not in known and not (b["custom_ids"] and set(b["custom_ids"]) <= doubted):
                out.append(
                    f"{provider} batch {b['id']} ({b['request_count']} requests, {b['status']}) not in the ledger"
                )

    sync_attempts: dict[str, list[Any]] = defaultdict(list)
    for a in snap["attempts"]:
        if a["mode"] == "sync":
            sync_attempts[a["item_key"]].append(a)
    # a batch the ledger knows only as a job in doubt is not priced until a person (or a wait
    # task) resolves it: the report lists the job under in_doubt_jobs instead
    # and so is one resolved after its run published that no later run could harvest yet
    pending = {str(j["batch_id"]) for j in snap["jobs"] if j["job_id"] in waiting}
    settled = {
        provider: [
            b
            for b in batches
            if (b["id"] in known or not (b["custom_ids"] and set(b["custom_ids"]) <= doubted))
            and b["id"] not in pending
        ]
        for provider, batches in record.get("batches", {}).items()
    }
    bill = expected_bill(
        {**record, "batches": settled}, sync_attempts, workload.provider, workload.model, workload.damaged
    )
    # A line that reached reconcile damaged (truncated by the emulator or in the downloaded file)
    # has unreadable usage: each is priced at an estimate from its request, never free, and
    # reported apart; what is left is the bill of every readable line, exactly (docs/cost.md).
    usage, paid, estimated, estimated_paid, lines = Usage(), Decimal(0), Usage(), Decimal(0), 0
    for run in workload.runs:
        report = snap["reports"].get(run.run_id)
        if report is None and run.killed:
            continue  # killed before its publish: what it paid is the next run's to report
        if report is None:
            out.append(f"run {run.run_id} published no report")
            continue
        usage += Usage(**report["usage"])
        paid += Decimal(report["paid"])
        estimated += Usage(**report["unreadable"]["estimated_usage"])
        estimated_paid += Decimal(report["unreadable"]["paid"])
        lines += report["unreadable"]["lines"]
    if usage_minus(usage, estimated) != bill.readable_usage:
        out.append(
            f"the reports count {usage} ({estimated} of it estimated for unreadable lines), the emulator "
            f"billed {bill.usage} ({bill.unreadable_usage} of it for lines that reached reconcile damaged)"
        )
    if paid - estimated_paid != bill.readable_paid:
        out.append(
            f"the reports say ${paid} (${estimated_paid} estimated for unreadable lines), the emulator's "
            f"bill is ${bill.paid} (${bill.unreadable_paid} for lines that reached reconcile damaged)"
        )
    # every damaged line is priced, never free: each billed answer that reached reconcile damaged
    # has an unreadable line naming it, and no line is unreadable that nobody damaged (an identical
    # damaged copy is one answer, priced once)
    unreadable = [e for e in snap["extra_lines"] if e["kind"] == "unreadable"]
    unpriced = sorted(bill.unreadable_ids - {e["custom_id"] for e in unreadable})
    if unpriced:
        out.append(f"billed answers that reached reconcile damaged, not priced as unreadable: {unpriced[:5]}")
    damaged = (
        sum(len(b.get("truncated") or ()) for bs in settled.values() for b in bs) + workload.damaged_lines
    )
    if lines != len(unreadable) or lines > damaged:
        out.append(
            f"the reports price {lines} unreadable lines ({len(unreadable)} in the ledger), "
            f"at most {damaged} lines reached reconcile damaged"
        )
    free = [
        (e["job_id"], e["ordinal"])
        for e in unreadable
        if not (e["estimated"] and e["input_tokens"] + e["output_tokens"] > 0)
    ]
    if free:
        out.append(f"unreadable lines priced as free, not at an estimate: {free[:5]}")
    return out


def _bad_copy_reasons(run: Run) -> dict[str, set[str]]:
    """The reject codes of the run's records that its prompt cannot render, by application id.

    :param run: the run (its input and prompt as its prepare read them)
    """
    reasons: dict[str, set[str]] = defaultdict(set)
    if run.prompt is None:
        return reasons
    for rec in run.records:
        try:
            run.prompt.render(rec)
        except ItemError as exc:
            reasons[rec["id"]].add(exc.code)
    return reasons


def _diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return "; ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys[:6])
