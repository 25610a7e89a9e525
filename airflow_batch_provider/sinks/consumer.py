"""``Consumer``: a side effect per final answer that cannot be upserted (a ticket, an email, an API call).

Given in ``batch_inference_group(sinks=[...])`` beside the table sinks, it becomes a
``deliver_<name>`` task after ``publish`` (or give it to ``BatchConsumeOperator`` on its own). Its
function is called once per answer with a :class:`~airflow_batch_provider.ledger.handoffs.HandOff`
whose ``key`` is the idempotency key to pass on to the external API; what each call did is
recorded in the ledger (see :mod:`airflow_batch_provider.services.consumers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger.handoffs import HandOff

_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")


@dataclass(frozen=True)
class Consumer:
    """Act once on each final answer: call ``act`` with its hand-off, then acknowledge it.

    :param name: the name its hand-offs are recorded under and its task is named after
        (``deliver_<name>``); letters, digits and ``_``. Renaming it starts over: every answer is
        handed to the new name again, with new keys
    :param act: called with one :class:`~airflow_batch_provider.ledger.handoffs.HandOff` (``key``,
        ``app_id``, ``prompt_version``, ``output``); pass ``key`` on as the external system's
        idempotency key. Raise to fail this item (recorded with the message; the others go on)
    :param where: which answers to act on (``None``: all); one it leaves out is not offered again
        until its answer changes
    :param page_size: hand-offs offered at once
    """

    name: str
    act: Callable[[HandOff], object]
    where: Callable[[HandOff], bool] | None = None
    page_size: int = 100

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigurationError(
                f"Consumer name={self.name!r}; use 1 to 64 letters, digits and '_' (it names a task and "
                "the ledger's records of its hand-offs), e.g. 'escalations'."
            )
        if not callable(self.act):
            raise ConfigurationError(
                f"Consumer {self.name!r} act={self.act!r}; give a function of one HandOff, e.g. one that "
                "posts it with the header Idempotency-Key: handoff.key."
            )
        if self.where is not None and not callable(self.where):
            raise ConfigurationError(
                f"Consumer {self.name!r} where={self.where!r}; give a function of one HandOff returning "
                "True for the answers to act on, or None for all."
            )
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ConfigurationError(f"Consumer {self.name!r} page_size={self.page_size!r}; use 1 or more.")

    @property
    def sink_name(self) -> str:
        """The name its hand-offs are recorded under."""
        return self.name

    def wants(self, handoff: HandOff) -> bool:
        """Whether ``where`` keeps this answer.

        :param handoff: the hand-off
        """
        return self.where is None or bool(self.where(handoff))
