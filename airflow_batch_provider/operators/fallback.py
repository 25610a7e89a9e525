"""``BatchSyncFallbackOperator``: send what the deadline left open to the provider's real-time API.

Runs in a worker (not the triggerer). The sending, its rate limits and its resumability live in
:mod:`airflow_batch_provider.services.fallback`: an item is marked sent (state ``fallback``, an
open ``sync`` attempt) before its call and its answer recorded after; a rerun of this task
resumes the run's items left in ``fallback`` by a crash, sends them again and counts them as
``possibly_paid_twice``. Each attempt is priced at STANDARD (synchronous) rates from the usage
the provider reports. Items end ``succeeded`` (route ``fallback``) or ``review`` with the
provider's error.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.core.options import BudgetOptions, FallbackLimits
from airflow_batch_provider.core.ratelimit import RetryPolicy
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.operators.base import BatchBaseOperator, PromptSource
from airflow_batch_provider.services.fallback import FALLBACK_FROM, FallbackSettings
from airflow_batch_provider.services.realtime import realtime_limits

if TYPE_CHECKING:
    from airflow.sdk import Context


class BatchSyncFallbackOperator(BatchBaseOperator):
    """Send the run's items still open at the deadline through the real-time API, at full price.

    The limits are the API key's: every fallback (and below-minimum chunk) sending on the same
    connection, in any task or process, shares one window kept in the ledger, so that together
    they use at most ``headroom`` of the key's limits and leave the rest to the real-time
    application. Set them on the connection (extras ``rpm_limit``, ``tpm_limit``,
    ``rate_headroom``, ``tpm_output``; ``quota_key`` to share one window between connections of
    the same key) or here.

    :param prompt: the workload's prompt (for output validation)
    :param limits: requests per minute, tokens per minute, requests in flight and headroom (what
        it leaves unset comes from the connection's extras ``rpm_limit``, ``tpm_limit``,
        ``rate_headroom``, else ``[batch_provider] fallback_rpm`` 500, ``fallback_tpm`` 200000,
        ``fallback_concurrency`` 16, ``fallback_headroom`` 1.0)
    :param window_s: the rate window in seconds (60 for per-minute limits)
    :param retry: retry policy per item (default :class:`RetryPolicy`)
    :param budget: the run's budget (sends that would pass it are refused: their items go to
        ``skipped`` with error ``over_budget``) and its ``pricing_override`` prices the answers
    :param over_budget: ``refuse`` (default) or ``send``: the deadline wins over the budget, and
        the overrun is in the summary and the log (``DeadlineOptions(over_budget=...)``)
    """

    ui_color = "#f6d5c1"

    def __init__(
        self,
        *,
        prompt: PromptSource,
        limits: FallbackLimits | None = None,
        window_s: float = 60.0,
        retry: RetryPolicy | None = None,
        budget: BudgetOptions | None = None,
        over_budget: str = "refuse",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.over_budget = over_budget
        self.prompt = prompt
        self.limits = limits or FallbackLimits()
        self.window_s = window_s
        self.retry = retry or RetryPolicy()
        self.budget = budget or BudgetOptions()

    def settings(self) -> FallbackSettings:
        """The limits, from :attr:`limits`, the connection's extras or the ``[batch_provider]`` config."""
        return realtime_limits(
            self.limits,
            extras=self.adapter.settings.extra,
            quota_key=self.batch_conn_id,
            window_s=self.window_s,
            retry=self.retry,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        run_id = context["run_id"]
        template = self.run_template(self.prompt, context)
        rows = list(self.ledger.iter_item_rows(self.workload, run_id, states=FALLBACK_FROM, shape=OpenItem))
        if not rows:
            self.log.info("no open items: nothing to send synchronously")
            return {"items": 0}
        summary = self.send_in_real_time(
            context,
            rows,
            template,
            limits=self.limits,
            budget=self.budget,
            refused_state="skipped",
            over_budget=self.over_budget,
            window_s=self.window_s,
            retry=self.retry,
        )
        self.log.info("fallback done: %s", summary)
        return summary

    def on_kill(self) -> None:
        """Change nothing in the ledger: the sends are resumable as they stand.

        An item whose request was sent and whose answer was not recorded stays in ``fallback``
        with an open attempt; the next run of this task (or publish) finds it, closes it as
        ``possibly_paid_twice`` and sends it again (or ``answer_lost``), and reports it. This task
        holds no claim, and marking an item now would claim knowledge of an answer nobody has.
        """
        self.log.warning(
            "killed while sending %s's open items through the real-time API: items sent without a recorded "
            "answer are closed as possibly_paid_twice and sent again by the next try",
            self.workload,
        )


def __getattr__(name: str) -> Any:
    """Keep the old name importable for a while: ``SyncFallbackOperator`` warns and is the new class.

    :param name: the attribute asked for
    """
    if name == "SyncFallbackOperator":
        warnings.warn(
            "SyncFallbackOperator is deprecated: use BatchSyncFallbackOperator (same class, named like "
            "its siblings); the old name will be removed in a future release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return BatchSyncFallbackOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
