"""What the emulator billed, as a run's published reports must count it: the chaos and stateful suites' cost check."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any, Final

from airflow_batch_provider.core.pricing import PriceTable, cost
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.services.fallback import POSSIBLY_PAID_TWICE

_CUSTOM_ID: Final = re.compile(r"^(?P<key>.+)__[as]\d+(?:c\d+)?$")


def item_key_of(custom_id: str) -> str:
    """The item key in a custom id: ``<item key>__a<attempt>c<chunk>`` in a batch, ``<item key>__s<n>``
    for a real-time call (the id itself when it has neither form).

    :param custom_id: the custom id
    """
    match = _CUSTOM_ID.match(custom_id)
    return match.group("key") if match else custom_id


@dataclass(frozen=True)
class Bill:
    """What the emulator billed, as the published reports must count it.

    A billed line that reached the reader damaged (the emulator's ``truncated``, or a line a test
    cut in the downloaded file) has usage nobody can read: the report prices it at an estimate
    from its request and reports it apart (``unreadable``). So the report's usage less its
    ``unreadable.estimated_usage`` must equal :attr:`readable_usage`, exactly (``docs/cost.md``).

    :param usage: the tokens billed (batch and real-time answers)
    :param paid: their cost at the shipped prices
    :param answers: item key -> answers billed for it
    :param unreadable_usage: the part of ``usage`` billed for lines that reached the reader damaged
    :param unreadable_paid: its cost
    :param unreadable_ids: the custom ids of those lines
    """

    usage: Usage
    paid: Decimal
    answers: Counter[str]
    unreadable_usage: Usage = field(default_factory=Usage)
    unreadable_paid: Decimal = Decimal(0)
    unreadable_ids: frozenset[str] = frozenset()

    @property
    def readable_usage(self) -> Usage:
        """The tokens billed for lines the reader could read: what a report knows exactly."""
        return usage_minus(self.usage, self.unreadable_usage)

    @property
    def readable_paid(self) -> Decimal:
        """The cost of :attr:`readable_usage`."""
        return self.paid - self.unreadable_paid


def usage_minus(usage: Usage, part: Usage) -> Usage:
    """``usage`` less ``part``, field by field.

    :param usage: the whole
    :param part: the part taken away
    """
    return Usage(**{f.name: getattr(usage, f.name) - getattr(part, f.name) for f in fields(Usage)})


def expected_bill(
    record: Mapping[str, Any],
    sync_attempts: Mapping[str, Sequence[Any]],
    provider: str,
    model: str,
    damaged: Collection[str] = (),
) -> Bill:
    """The emulator's bill (its record), plus the documented upper bound for interrupted real-time sends.

    Batches are priced at the batch price, real-time answers at full price; for each real-time send
    a kill interrupted before the emulator completed it (``possibly_paid_twice``), exactly its
    resend's price is added (the report cannot know and prices every interrupted send as paid).
    The first answer of each custom id the emulator wrote truncated (its record's ``truncated``) or
    named in ``damaged`` is billed usage the reader could not read (:attr:`Bill.unreadable_usage`).

    :param record: the emulator's record (``GET /_emulator/record``)
    :param sync_attempts: item key -> its real-time attempt rows, in the order they were made
    :param provider: the provider of the real-time sends
    :param model: the model
    :param damaged: custom ids whose billed batch line a test damaged in the downloaded file
    """
    batches = [(source, b) for source, bs in record.get("batches", {}).items() for b in bs]
    billed_answers: Counter[str] = Counter()
    prices = PriceTable.load()
    expected_paid = Decimal(0)
    expected_usage = Usage()
    unreadable_usage, unreadable_paid, unreadable_ids = Usage(), Decimal(0), set()
    for source, batch in batches:
        price = prices.price(source, model)
        cut = set(batch.get("truncated") or ()) | set(damaged)
        for custom_id, tokens in (batch.get("billed") or {}).items():
            usage = Usage(**tokens)
            expected_usage += usage
            expected_paid += cost(usage, price, "batch")
            billed_answers[item_key_of(custom_id)] += 1
            if custom_id in cut:
                unreadable_usage += usage
                unreadable_paid += cost(usage, price, "batch")
                unreadable_ids.add(custom_id)
        for _, tokens in batch.get("billed_again") or []:  # a second answer, priced as a duplicate
            usage = Usage(**tokens)
            expected_usage += usage
            expected_paid += cost(usage, price, "batch")
    billed_sync: Counter[str] = Counter()
    for source, answers in record.get("realtime", {}).items():
        price = prices.price(source, model)
        for answer in answers:
            usage = Usage(**answer["usage"])
            expected_usage += usage
            expected_paid += cost(usage, price, "sync")
            if answer.get("custom_id"):
                billed_answers[item_key_of(answer["custom_id"])] += 1
                billed_sync[item_key_of(answer["custom_id"])] += 1
    # A process killed while real-time requests were in flight cannot know which of them the
    # provider completed: the report prices each interrupted send as paid, like its resend (an
    # upper bound, never free). One the provider never completed (the kill cut its request short)
    # is the only over-count allowed, and exactly the resend's price.
    sync_price = prices.price(provider, model)
    for key, attempts in sync_attempts.items():
        never_completed = len(attempts) - billed_sync[key]
        interrupted = [a for a in attempts if a["error_code"] == POSSIBLY_PAID_TWICE]
        resend = next((a for a in reversed(attempts) if a["error_code"] != POSSIBLY_PAID_TWICE), None)
        if 0 < never_completed <= len(interrupted) and resend is not None:
            usage = Usage(
                input_tokens=resend["input_tokens"],
                output_tokens=resend["output_tokens"],
                cached_input_tokens=resend["cached_input_tokens"],
                cache_write_tokens=resend["cache_write_tokens"],
            )
            for _ in range(never_completed):
                expected_usage += usage
                expected_paid += cost(usage, sync_price, "sync")
    return Bill(
        expected_usage,
        expected_paid,
        billed_answers,
        unreadable_usage,
        unreadable_paid,
        frozenset(unreadable_ids),
    )
