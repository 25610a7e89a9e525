"""``airflow-batch``: look after a ledger from a shell: the review queue, jobs in doubt, leases.

The ledger is found the way the operators find it: ``--ledger-url``, else ``--conn-id``, else
Airflow's ``[batch_provider] ledger_conn_id`` connection, else ``[batch_provider] ledger_url``
(default: the embedded SQLite file in ``$AIRFLOW_HOME``). Airflow is imported only for the last
three. Every action that changes items or jobs is written to the ledger's audit table with the
``--actor`` (default: the login name) and the reason.

Examples::

    airflow-batch review list --workload feedback --error-code context_length_exceeded
    airflow-batch review redrive --workload feedback --app-id 42 --reason "prompt fixed"
    airflow-batch review resolve --workload feedback --error-code content_filter --note "answered by hand"
    airflow-batch jobs in-doubt
    airflow-batch jobs resolve 'feedback:manual__2026-01-01:r1:c00000' --batch-id batch_abc --note "found in console"
    airflow-batch lease show --workload feedback
    airflow-batch fallback list
    airflow-batch fallback redrive --workload feedback --run-id scheduled__2026-01-01 --reason "run was killed"
    airflow-batch lease release --workload feedback --run-id scheduled__2026-01-01 --reason "run was killed"
    airflow-batch ledger prune --workload feedback --keep-runs 30 --dry-run
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TextIO

from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.refused_review import refused_review_rows
from airflow_batch_provider.ledger.runs import finished_run


def resolve_ledger_url(ledger_url: str | None, conn_id: str | None) -> str:
    """Return the ledger's SQLAlchemy URL, resolved like the operators and the progress view do.

    :param ledger_url: ``--ledger-url``, used as given
    :param conn_id: ``--conn-id``, a ledger connection
    """
    if ledger_url:
        return ledger_url
    from airflow_batch_provider.hooks.ledger import LedgerHook
    from airflow_batch_provider.settings import get_setting

    return LedgerHook(conn_id or get_setting("ledger_conn_id", "") or None).url()


def _actor(value: str | None) -> str:
    if value:
        return value
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


#: ``-o/--output`` choices, as Airflow's own list commands have them
OUTPUTS = ("table", "json", "yaml")


def _emit(out: TextIO, rows: Sequence[Any], output: str, columns: Sequence[str]) -> None:
    dicts = [asdict(r) for r in rows]
    if output == "json":
        out.write(json.dumps(dicts, default=str, indent=2) + "\n")
        return
    if output == "yaml":
        import yaml

        out.write(yaml.safe_dump(json.loads(json.dumps(dicts, default=str)), sort_keys=False))
        return
    if not dicts:
        out.write("(none)\n")
        return
    out.write("\t".join(columns) + "\n")
    for d in dicts:
        out.write("\t".join("" if d[c] is None else str(d[c]) for c in columns) + "\n")


def _address(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "item_keys": args.item_key or None,
        "app_ids": args.app_id or None,
        "error_code": args.error_code,
    }


def _review(ledger: Ledger, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "list":
        rows = ledger.review_items(args.workload, args.error_code, limit=args.limit, offset=args.offset)
        # the refused rows come with the first page (they are few: each waits for the next delivery)
        refused = (
            [] if args.offset else refused_review_rows(ledger, args.workload, args.error_code, args.limit)
        )
        if args.output != "table":
            _emit(out, [*rows, *refused], args.output, ())
            return 0
        if rows or not refused:
            _emit(
                out,
                rows,
                "table",
                ("item_key", "prompt_version", "app_id", "error_code", "attempts", "run_id"),
            )
        if refused:
            gap = "\n" if rows else ""
            out.write(f"{gap}rows a sink refused (the answer is fine; the next delivery tries again):\n")
            _emit(
                out,
                refused,
                "table",
                ("sink", "app_id", "prompt_version", "run_id", "since", "error_message"),
            )
        return 0
    actor = _actor(args.actor)
    if args.action == "redrive":
        n = ledger.redrive(args.workload, **_address(args), actor=actor, reason=args.reason)
        out.write(f"re-drove {n} item(s) of {args.workload!r} to pending; the next run sends them\n")
    elif args.action == "resolve":
        n = ledger.resolve_review(args.workload, **_address(args), actor=actor, note=args.note)
        out.write(f"resolved {n} review item(s) of {args.workload!r}\n")
    else:
        n = ledger.skip_review(args.workload, **_address(args), actor=actor, reason=args.reason)
        out.write(f"skipped {n} review item(s) of {args.workload!r}\n")
    return 0


def _jobs(ledger: Ledger, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "in-doubt":
        rows = ledger.jobs_in_doubt(args.workload)
        _emit(out, rows, args.output, ("job_id", "provider", "lines", "in_doubt_at", "in_doubt_reason"))
        return 0
    job = ledger.resolve_job(args.job_id, args.batch_id, _actor(args.actor), args.note)
    out.write(
        f"job {job.job_id!r} is now {job.state!r}"
        + (f" (batch {job.batch_id})" if job.batch_id else "")
        + "\n"
    )
    if job.batch_id and finished_run(ledger, job.workload, job.run_id) is not None:
        out.write(
            f"its items wait for that batch's answers; run {job.run_id!r} is finished (its report stays as "
            "published), so the next run of the workload harvests the batch once it has ended (its prepare "
            "or publish) and prices it in its own report under late_harvest: start one; do not re-drive them\n"
        )
    elif job.batch_id:
        out.write(
            f"its items wait for that batch's answers: run {job.run_id!r} harvests the batch once it has "
            "ended (its publish at the latest), or the next run of the workload does; do not re-drive them\n"
        )
    else:
        out.write(
            f"no batch exists: re-drive its items in review to send them (`airflow-batch review redrive "
            f"--workload {job.workload} --error-code in_doubt --reason ...`)\n"
        )
    return 0


def _lease(ledger: Ledger, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        lease = ledger.workload_lease(args.workload)
        _emit(
            out,
            [lease] if lease else [],
            args.output,
            ("workload", "run_id", "dag_id", "owner", "acquired_at"),
        )
        return 0
    held = ledger.workload_lease(args.workload)
    if not ledger.release_workload_lease(
        args.workload, args.run_id, actor=_actor(args.actor), reason=args.reason
    ):
        holder = f"run {held.run_id!r}" if held else "no run"
        out.write(
            f"workload {args.workload!r} is not held by run {args.run_id!r} ({holder} holds it); nothing released\n"
        )
        return 1
    out.write(f"released workload {args.workload!r} from run {args.run_id!r}\n")
    return 0


def _fallback(ledger: Ledger, args: argparse.Namespace, out: TextIO) -> int:
    from airflow_batch_provider.services.stranded import settle_stranded_fallback, stranded_fallback

    if args.action == "list":
        rows = stranded_fallback(ledger, args.workload)
        _emit(out, rows, args.output, ("workload", "run_id", "items", "holds_lease", "since"))
        return 0
    why = args.reason if args.action == "redrive" else args.note
    n = settle_stranded_fallback(
        ledger, args.workload, args.run_id, args.action, actor=_actor(args.actor), reason=why
    )
    if args.action == "redrive":
        out.write(
            f"re-drove {n} item(s) that run {args.run_id!r} left in fallback to pending; the next run sends them\n"
        )
    else:
        out.write(f"resolved {n} item(s) that run {args.run_id!r} left in fallback\n")
    return 0 if n else 1


def _ledger(ledger: Ledger, args: argparse.Namespace, out: TextIO) -> int:
    from airflow_batch_provider.ledger.retention import RetentionPolicy, describe, prune

    policy = RetentionPolicy(keep_runs=args.keep_runs, keep_days=args.keep_days)
    report = prune(
        ledger,
        args.workload,
        policy,
        dry_run=args.dry_run,
        actor=_actor(args.actor),
        batch_rows=args.batch_rows,
    )
    if args.output == "table":
        out.write(describe(report))
    else:
        _emit(out, [report], args.output, ())
    return 0


def build_parser(prog: str = "airflow-batch") -> argparse.ArgumentParser:
    """The command line (``airflow-batch --help``, or ``airflow batch --help``).

    :param prog: the name it is run as
    """
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger (default: from Airflow's config)")
    parser.add_argument(
        "--conn-id", help="an Airflow ledger connection (default: [batch_provider] ledger_conn_id)"
    )
    groups = parser.add_subparsers(dest="group", required=True)

    def common(p: argparse.ArgumentParser, workload: bool = True) -> None:
        if workload:
            p.add_argument("--workload", required=True)
        p.add_argument(
            "-o", "--output", choices=OUTPUTS, default="table", help="output format (default: table)"
        )
        p.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
        p.add_argument("--actor", help="who acts (default: the login name)")

    def address(p: argparse.ArgumentParser) -> None:
        p.add_argument("--item-key", action="append", help="an item key (repeatable)")
        p.add_argument("--app-id", action="append", help="an application id (repeatable)")
        p.add_argument("--error-code", help="only items with this error code")

    review = groups.add_parser("review", help="the review queue").add_subparsers(dest="action", required=True)
    listing = review.add_parser(
        "list", help="list open review items, and rows a sink refused (error code sink_refused)"
    )
    common(listing)
    listing.add_argument("--error-code")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--offset", type=int, default=0)
    for name, text, why in (
        ("redrive", "send items back to pending, attempts 0 (the next run sends them)", "--reason"),
        ("resolve", "mark review items resolved; they stay out of every run", "--note"),
        ("skip", "mark review items skipped; they stay out of every run", "--reason"),
    ):
        p = review.add_parser(name, help=text)
        common(p)
        address(p)
        p.add_argument(why, required=True)

    jobs = groups.add_parser("jobs", help="jobs whose create call is in doubt").add_subparsers(
        dest="action", required=True
    )
    doubt = jobs.add_parser("in-doubt", help="list jobs in doubt")
    common(doubt, workload=False)
    doubt.add_argument("--workload")
    resolve = jobs.add_parser("resolve", help="settle a job in doubt")
    common(resolve, workload=False)
    resolve.add_argument("job_id")
    found = resolve.add_mutually_exclusive_group(required=True)
    found.add_argument("--batch-id", help="the provider batch that was created for it")
    found.add_argument("--absent", action="store_true", help="proven: no batch exists; it may be created")
    resolve.add_argument("--note", required=True, help="what was checked")

    lease = groups.add_parser("lease", help="which run holds a workload").add_subparsers(
        dest="action", required=True
    )
    common(lease.add_parser("show", help="show the holding run"))
    release = lease.add_parser("release", help="release a dead run's lease (check it is dead first)")
    common(release)
    release.add_argument("--run-id", required=True)
    release.add_argument("--reason", required=True)

    fallback = groups.add_parser(
        "fallback", help="items a dead run left in fallback (sent to the real-time API, never settled)"
    ).add_subparsers(dest="action", required=True)
    stranded = fallback.add_parser(
        "list", help="list them per run, and whether the run still holds the workload"
    )
    common(stranded, workload=False)
    stranded.add_argument("--workload")
    for name, text, why in (
        (
            "redrive",
            "close their lost real-time attempts and send them back to pending (the next run sends them)",
            "--reason",
        ),
        (
            "resolve",
            "close their lost real-time attempts and resolve them; they stay out of every run",
            "--note",
        ),
    ):
        p = fallback.add_parser(name, help=text + "; the run must no longer hold the workload")
        common(p)
        p.add_argument("--run-id", required=True, help="the dead run")
        p.add_argument(why, required=True)

    ledger_group = groups.add_parser("ledger", help="the ledger's history").add_subparsers(
        dest="action", required=True
    )
    pruning = ledger_group.add_parser(
        "prune",
        help="remove old runs' attempts, jobs and extra lines by a retention policy "
        "(items, review, audit, deliveries and run reports stay)",
    )
    common(pruning)
    pruning.add_argument("--keep-runs", type=int, help="keep the newest this many runs (at least 1)")
    pruning.add_argument("--keep-days", type=float, help="keep the runs started in the last this many days")
    pruning.add_argument("--dry-run", action="store_true", help="print what would go; remove nothing")
    pruning.add_argument(
        "--batch-rows", type=int, default=2000, help="rows per transaction at most (default 2000)"
    )
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, prog: str = "airflow-batch") -> int:
    """Run the command line; return the exit status (0: done, 1: nothing done, 2: an error).

    :param argv: arguments (default: ``sys.argv[1:]``)
    :param out: where to write (default: standard output)
    :param prog: the name it is run as (in help and error messages)
    """
    out = out or sys.stdout
    args = build_parser(prog).parse_args(argv)
    try:
        ledger = Ledger.from_url(resolve_ledger_url(args.ledger_url, args.conn_id))
        try:
            handler = {
                "review": _review,
                "jobs": _jobs,
                "lease": _lease,
                "fallback": _fallback,
                "ledger": _ledger,
            }[args.group]
            return handler(ledger, args, out)
        finally:
            ledger.engine.dispose()
    except BatchProviderError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
