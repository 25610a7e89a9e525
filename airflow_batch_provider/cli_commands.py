"""``airflow batch ...``: the ``airflow-batch`` command line as an Airflow CLI command group.

Declared under the provider info's ``cli`` key, so ``airflow batch --help`` lists it beside
Airflow's own groups. Each subcommand hands its arguments to :func:`airflow_batch_provider.cli.main`
(one parser, one behaviour for both spellings)::

    airflow batch review list --workload feedback -o yaml
    airflow batch jobs in-doubt -o json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from airflow_batch_provider import cli

#: the subcommands and what they look after (the ``airflow-batch`` groups)
GROUPS: dict[str, str] = {
    "review": "the review queue: list, redrive, resolve, skip (-o table|json|yaml)",
    "jobs": "jobs whose create call is in doubt: in-doubt, resolve",
    "lease": "which run holds a workload: show, release",
    "fallback": "items a dead run left in fallback: list, redrive, resolve",
    "ledger": "the ledger's history: prune (a retention policy; --dry-run prints what would go)",
}


#: ``airflow-batch`` options that come before the group; here they may come anywhere
GLOBAL_OPTIONS = ("--ledger-url", "--conn-id")


def forwarded(group: str, rest: list[str]) -> list[str]:
    """The ``airflow-batch`` arguments of ``airflow batch GROUP REST...``: global options moved first.

    :param group: ``review``, ``jobs``, ``lease``, ``fallback`` or ``ledger``
    :param rest: what followed the group
    """
    front: list[str] = []
    back: list[str] = []
    tokens = iter(rest)
    for token in tokens:
        name = token.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            front.append(token)
            if "=" not in token:
                front.append(next(tokens, ""))
        else:
            back.append(token)
    return [*front, group, *back]


def _forward(group: str) -> Any:
    def run(args: argparse.Namespace) -> None:
        status = cli.main(forwarded(group, list(args.rest)), prog="airflow batch")
        if status:
            sys.exit(status)

    run.__name__ = f"batch_{group}"
    return run


def get_batch_cli_commands() -> list[Any]:
    """Return the ``batch`` command group (Airflow's ``GroupCommand``), for the provider info's ``cli`` key."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand

    rest = Arg(("rest",), nargs=argparse.REMAINDER, help="the action and its options (ACTION --help)")
    return [
        GroupCommand(
            name="batch",
            help="LLM batch ledger: the review queue, jobs in doubt, workload leases, stranded fallback, prune",
            subcommands=[
                ActionCommand(name=name, help=text, func=_forward(name), args=(rest,))
                for name, text in GROUPS.items()
            ],
        )
    ]
