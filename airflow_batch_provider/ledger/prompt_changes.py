"""A prompt edited in place: the same version, other content, and the items it sends again.

An item's input hash covers the request as it is sent (the rendered prompt too), so an edit of a
prompt's wording under the same ``version`` changes every item it renders: each one is prepared
again and paid again (its old answer was asked with other words). That is a reason, and the
ledger records it: :meth:`Ledger.upsert_items` writes one ``abp_prompt_changes`` row per item it
sends again only because the prompt changed (an item its last run answered, or that was held in
review, whose run recorded other content for the same version), with both digests. Prepare warns
(:func:`edited_in_place`), and the run's report counts such items apart
(:func:`prompt_changed_section`). To keep old answers comparable, bump ``version`` instead.
SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, func, select

from airflow_batch_provider.ledger import schema as s

if TYPE_CHECKING:
    from airflow_batch_provider.ledger.store import Ledger


@dataclass(frozen=True)
class PromptEdit:
    """An earlier run of the workload that recorded other content for the same prompt version.

    :param run_id: that run
    :param version: the prompt version both runs render
    :param previous_sha256: the content digest that run recorded
    :param sha256: the content digest this run renders
    """

    run_id: str
    version: str
    previous_sha256: str
    sha256: str

    def warning(self, workload: str, run_id: str, prompt_name: str) -> str:
        """The warning prepare logs: the prompt, both digests and the remedy.

        :param workload: workload name
        :param run_id: the run preparing
        :param prompt_name: the prompt's name (or its version when it has none)
        """
        return (
            f"prompt {prompt_name!r} (version {self.version!r}) of workload {workload!r} changed in place: "
            f"run {self.run_id!r} recorded content sha256 {self.previous_sha256[:12]}, run {run_id!r} renders "
            f"sha256 {self.sha256[:12]} under the same version. Every item whose request it changes is "
            "sent and paid again (counted as prompt_changed in the run's report), and its new answer "
            f"is not comparable with the old one although both say {self.version!r}. Bump `version` to "
            "keep old answers comparable; put the old wording back to keep them without paying again."
        )


def edited_in_place(
    ledger: Ledger, workload: str, run_id: str, version: str, sha256: str
) -> PromptEdit | None:
    """The latest earlier run of the workload whose prompt had ``version`` and other content.

    ``None``: no earlier run rendered this version, or every one rendered the same content.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run preparing (left out)
    :param version: the prompt version this run renders
    :param sha256: the content digest this run renders
    """
    c = s.runs.c
    q = (
        select(c.run_id, c.prompt_sha256)
        .where(
            c.workload == workload,
            c.run_id != run_id,
            c.prompt_version == version,
            c.prompt_sha256.is_not(None),
            c.prompt_sha256 != sha256,
        )
        .order_by(c.started_at.desc())
        .limit(1)
    )
    with ledger.engine.connect() as conn:
        found = conn.execute(q).first()
    if found is None:
        return None
    return PromptEdit(str(found.run_id), version, str(found.prompt_sha256), sha256)


def run_prompt_digests(
    conn: Connection, workload: str, run_ids: Collection[str]
) -> dict[str, tuple[str, str]]:
    """The prompt (version, content digest) each of ``run_ids`` recorded (runs without one left out).

    :param conn: an open connection
    :param workload: workload name
    :param run_ids: the runs
    """
    if not run_ids:
        return {}
    c = s.runs.c
    q = select(c.run_id, c.prompt_version, c.prompt_sha256).where(
        c.workload == workload, c.run_id.in_(sorted(run_ids)), c.prompt_sha256.is_not(None)
    )
    return {str(r.run_id): (str(r.prompt_version), str(r.prompt_sha256)) for r in conn.execute(q)}


def changed_prompt(
    prompts: dict[str, tuple[str, str]], previous_run_id: str, run_id: str, version: str
) -> tuple[str, str] | None:
    """(previous digest, this run's digest) when the item's last run rendered ``version`` otherwise.

    :param prompts: :func:`run_prompt_digests` of both runs
    :param previous_run_id: the run that last prepared the item
    :param run_id: the run preparing it now
    :param version: the item's prompt version
    """
    before, now = prompts.get(previous_run_id), prompts.get(run_id)
    if before is None or now is None or before[0] != version or now[0] != version or before[1] == now[1]:
        return None
    return before[1], now[1]


def record_prompt_changes(
    conn: Connection,
    workload: str,
    run_id: str,
    now: datetime,
    rows: Sequence[tuple[str, str, str, str, str]],
) -> None:
    """Record the items ``run_id`` sends again because the prompt changed in place (once each).

    :param conn: an open connection (the upsert's transaction)
    :param workload: workload name
    :param run_id: the run preparing
    :param now: the timestamp
    :param rows: (item key, prompt version, previous run, previous digest, digest)
    """
    if not rows:
        return
    c = s.prompt_changes.c
    keys = sorted({(key, version) for key, version, *_ in rows})
    have = {
        (str(r.item_key), str(r.prompt_version))
        for r in conn.execute(
            select(c.item_key, c.prompt_version).where(
                c.workload == workload, c.run_id == run_id, c.item_key.in_(sorted({k for k, _ in keys}))
            )
        )
    }
    fresh = [r for r in rows if (r[0], r[1]) not in have]
    if fresh:
        conn.execute(
            s.prompt_changes.insert(),
            [
                {
                    "workload": workload,
                    "run_id": run_id,
                    "item_key": key,
                    "prompt_version": version,
                    "previous_run_id": previous_run,
                    "previous_sha256": previous,
                    "prompt_sha256": digest,
                    "created_at": now,
                }
                for key, version, previous_run, previous, digest in fresh
            ],
        )


def prompt_changed_section(ledger: Ledger, workload: str, run_id: str) -> dict[str, Any]:
    """The report's ``prompt_changed``: how many items the run sent again for an in-place edit.

    ``{"items": 0}`` when none; otherwise also the version, the digests the items were last
    prepared with and the one the run renders.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the Airflow run id
    """
    c = s.prompt_changes.c
    q = (
        select(c.prompt_version, c.previous_sha256, c.prompt_sha256, func.count().label("n"))
        .where(c.workload == workload, c.run_id == run_id)
        .group_by(c.prompt_version, c.previous_sha256, c.prompt_sha256)
        .order_by(c.prompt_version, c.previous_sha256)
    )
    with ledger.engine.connect() as conn:
        found = list(conn.execute(q))
    if not found:
        return {"items": 0}
    return {
        "items": sum(int(r.n) for r in found),
        "edits": [
            {
                "prompt_version": str(r.prompt_version),
                "previous_sha256": str(r.previous_sha256),
                "sha256": str(r.prompt_sha256),
                "items": int(r.n),
            }
            for r in found
        ],
    }
