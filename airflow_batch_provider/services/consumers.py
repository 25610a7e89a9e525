"""Hand a run's final answers to a consumer that acts on each once: open a ticket, send an email.

For side effects that cannot be upserted. The consumer pages through the answers it has not
acknowledged (:func:`~airflow_batch_provider.ledger.handoffs.pending_for`, which records each
offer first), and for each hand-off its filter keeps, calls its function with the hand-off, whose
``key`` is the idempotency key to pass on to the external system (stable per item, prompt version
and consumer: a new prompt version is a new key). Then:

- the function returned: the hand-off is acknowledged at once, one ledger write per item. A crash
  between the external call and the acknowledgement (fail point ``consume.after_act``) makes the
  next try call it again for that one item, with the same key, which the external system can
  recognise; acknowledging once per page would save writes but repeat up to a page of calls after
  a crash, so each item is acknowledged on its own;
- the function raised: the hand-off is recorded ``refused`` with the message (the review list
  shows it under ``sink_refused``) and the others go on; the next try offers it again, same key;
- the filter left it out: recorded ``left_out`` (per page), so that it is not offered again until
  its answer changes (a new answer under the same prompt version is judged again).

An acknowledged hand-off is never offered again. No Airflow here: the consumer brings its function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from airflow_batch_provider.core.failpoints import failpoint
from airflow_batch_provider.ledger.handoffs import HandOff, acknowledge, pending_for, settle
from airflow_batch_provider.ledger.store import Ledger
from airflow_batch_provider.services.delivery import MESSAGES_SHOWN


@runtime_checkable
class HandOffConsumer(Protocol):
    """What a hand-off needs of a consumer (e.g. :class:`~airflow_batch_provider.sinks.consumer.Consumer`)."""

    @property
    def sink_name(self) -> str:
        """The name its hand-offs are recorded under (unique among the workload's sinks)."""
        ...

    @property
    def page_size(self) -> int:
        """Hand-offs offered at once."""
        ...

    def wants(self, handoff: HandOff) -> bool:
        """Whether to act on this answer (``False``: left out until the answer changes).

        :param handoff: the hand-off
        """
        ...

    def act(self, handoff: HandOff) -> object:
        """Act on one hand-off, passing ``handoff.key`` on as the idempotency key; raise on failure.

        :param handoff: the hand-off
        """
        ...


@dataclass
class HandOffCounts:
    """What one try of a consumer did.

    :param consumer: the consumer's name
    :param acted: hand-offs acted on and acknowledged
    :param left_out: hand-offs its filter left out
    :param failed: hand-offs its function failed on (recorded ``refused``)
    :param messages: the first failure messages, ``app_id: message``
    """

    consumer: str
    acted: int = 0
    left_out: int = 0
    failed: int = 0
    messages: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counts as a small dict (XCom, the report)."""
        return {
            "consumer": self.consumer,
            "acted": self.acted,
            "left_out": self.left_out,
            "failed": self.failed,
            "messages": list(self.messages),
        }


def consume(ledger: Ledger, workload: str, run_id: str, consumer: HandOffConsumer) -> HandOffCounts:
    """Hand the run's final answers the consumer has not acknowledged to it, one at a time.

    :param ledger: the ledger
    :param workload: workload name
    :param run_id: the run whose published answers are handed over
    :param consumer: the consumer
    """
    name = consumer.sink_name
    counts = HandOffCounts(name)
    after: tuple[str, str] | None = None
    while page := pending_for(ledger, workload, name, run_id, consumer.page_size, after):
        left_out = [h.key for h in page if not _hand_over(ledger, workload, consumer, h, counts)]
        counts.left_out += settle(ledger, workload, name, left_out, "left_out")
        after = (page[-1].item_key, page[-1].prompt_version)
    return counts


def _hand_over(
    ledger: Ledger, workload: str, consumer: HandOffConsumer, handoff: HandOff, counts: HandOffCounts
) -> bool:
    """Act on one hand-off and record what became of it; ``False`` when the filter leaves it out."""
    try:
        if not consumer.wants(handoff):
            return False
        consumer.act(handoff)
    except Exception as exc:  # the user's code: recorded for this item, the others go on
        message = f"{type(exc).__name__}: {exc}"
        settle(ledger, workload, consumer.sink_name, [handoff.key], "refused", message)
        counts.failed += 1
        if len(counts.messages) < MESSAGES_SHOWN:
            counts.messages.append(f"{handoff.app_id}: {message}")
        return True
    failpoint("consume.after_act")
    counts.acted += acknowledge(ledger, workload, consumer.sink_name, [handoff.key])
    return True
