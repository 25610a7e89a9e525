"""The review queue of the LLM batch page: its pages and export, its actions and the form that carries them.

A workload's review queue is read a page at a time (:func:`review_page`, :func:`iter_review` for
an export); an action (re-drive, resolve or skip) goes through the ledger's own review API, which
records it in the audit table (:func:`apply_review_action`). The action form carries a token bound
to the user and the workload (:func:`form_token`), keyed by a secret every API server worker shares
(:func:`server_secret`). A re-drive "now" triggers a run of the workload's one DAG
(:func:`only_dag`, :func:`trigger_airflow_run`). The routes and their permission checks are in
:mod:`.api`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from fastapi import HTTPException

from airflow_batch_provider.ledger import Ledger, reads
from airflow_batch_provider.plugins import view

if TYPE_CHECKING:
    from airflow_batch_provider.ledger.records import ItemRow

#: Review items one page lists; an export pages through all of them this many at a time.
REVIEW_PAGE: Final = 200
#: Most items one review action addresses by key.
MAX_ACTION_ITEMS: Final = 1000
#: Longest reason or note a review action takes.
MAX_REASON: Final = 2000
#: Audit rows the review page shows (newest first).
AUDIT_SHOWN: Final = 50
ReviewAction = Literal["redrive", "resolve", "skip"]
REVIEW_ACTIONS: Final[tuple[ReviewAction, ...]] = ("redrive", "resolve", "skip")
#: Triggers a run of a DAG: ``(dag_id, actor, note) -> run_id``.
TriggerRun = Callable[[str, str, str], str]


def _review_rows(ledger: Ledger, workload: str, items: Sequence[ItemRow]) -> list[dict[str, Any]]:
    return view.review_rows(items, reads.item_costs(ledger, workload, [i.item_key for i in items]))


def review_page(
    ledger: Ledger, workload: str, error_code: str | None, limit: int = REVIEW_PAGE, offset: int = 0
) -> dict[str, Any]:
    """Return one page of a workload's review queue with its counts (JSON-safe).

    :param ledger: the ledger
    :param workload: workload name
    :param error_code: only items with this error code
    :param limit: at most this many items
    :param offset: skip this many first
    """
    counts = reads.review_counts(ledger, workload)
    items = ledger.review_items(workload, error_code=error_code, limit=limit, offset=offset)
    return view.review_page(workload, error_code, counts, _review_rows(ledger, workload, items), offset)


def iter_review(ledger: Ledger, workload: str, error_code: str | None) -> Iterator[dict[str, Any]]:
    """Yield every item of a workload's review queue, a page at a time.

    :param ledger: the ledger
    :param workload: workload name
    :param error_code: only items with this error code
    """
    offset = 0
    while True:
        items = ledger.review_items(workload, error_code=error_code, limit=REVIEW_PAGE, offset=offset)
        yield from _review_rows(ledger, workload, items)
        if len(items) < REVIEW_PAGE:
            return
        offset += len(items)


def form_token(secret: bytes, actor: str, workload: str) -> str:
    """The token the action form carries: binds a POST to the user and workload it was shown for.

    :param secret: the server's secret
    :param actor: the user
    :param workload: the workload
    """
    message = json.dumps([actor, workload]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def server_secret() -> bytes:
    """``[api_auth] jwt_secret`` (shared by every API server worker), else a secret of this process."""
    try:
        from airflow.providers.common.compat.sdk import conf

        configured = conf.get("api_auth", "jwt_secret", fallback="") or ""
    except Exception:  # outside Airflow a process secret does as well
        configured = ""
    if configured:
        return hashlib.sha256(b"llm-batch-review-form\n" + configured.encode()).digest()
    return secrets.token_bytes(32)


def only_dag(dags: set[str | None], workload: str) -> str:
    """The one DAG a workload's re-drive can trigger; refuse (409) when there is not exactly one.

    :param dags: the DAGs the workload's runs recorded (``None``: a run recorded without one)
    :param workload: the workload
    """
    named = [d for d in dags if d is not None]
    if len(dags) != 1 or not named:
        raise HTTPException(
            409,
            f"workload {workload!r} is run by {len(named)} DAG(s) recorded"
            f"{' and by runs with no DAG recorded' if None in dags else ''}: trigger the run you want yourself",
        )
    return named[0]


def trigger_airflow_run(dag_id: str, actor: str, note: str) -> str:
    """Trigger a manual run of ``dag_id`` in Airflow's metadata database; return its run id.

    A paused DAG's run waits until the DAG is unpaused, as one triggered from the UI does.

    :param dag_id: the DAG
    :param actor: who asked (recorded as the triggering user)
    :param note: the run's note
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    run = trigger_dag(
        dag_id, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=actor, note=note[:1000]
    )
    if run is None:
        raise HTTPException(409, f"Airflow did not create a run of DAG {dag_id!r}")
    return str(run.run_id)


def apply_review_action(
    ledger: Ledger,
    action: str,
    workload: str,
    item_keys: list[str] | None,
    error_code: str | None,
    actor: str,
    reason: str,
) -> int:
    """Run one review action through the ledger's review API (which writes the audit row); return the items moved.

    :param ledger: the ledger, opened for actions
    :param action: ``redrive``, ``resolve`` or ``skip``
    :param workload: the workload
    :param item_keys: the items addressed by key (``None``: by ``error_code``)
    :param error_code: every item in review with this code (``None``: by key)
    :param actor: the user
    :param reason: the reason (a resolve's note)
    """
    if action == "redrive":
        return ledger.redrive(
            workload, item_keys=item_keys, error_code=error_code, actor=actor, reason=reason
        )
    if action == "resolve":
        return ledger.resolve_review(
            workload, item_keys=item_keys, error_code=error_code, actor=actor, note=reason
        )
    return ledger.skip_review(
        workload, item_keys=item_keys, error_code=error_code, actor=actor, reason=reason
    )
