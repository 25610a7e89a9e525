"""Which result line an item keeps, and the price of every other line the provider billed.

A job's files can hold more than one line for an item, and lines whose usage cannot be read:

- an error line and a success for the same custom id: the success is kept, whatever the order
  (an error line first must not win just because it came first); the error line is
  ``superseded``, priced when it carries usage;
- two successes: the first is kept; a second copy with the same answer and usage is the same
  billed answer written twice (counted as a duplicate, not priced again); a second copy with
  another answer was billed again and is priced as a discarded ``duplicate``;
- a damaged line (truncated JSON): its usage is unreadable, so it is priced at an estimate from
  the item's request (input tokens plus the output ceiling, see
  :func:`~airflow_batch_provider.core.tokens.estimate_request_tokens`), reported apart as
  ``unreadable``, never as free. Its item is ``missing`` (its answer is unreadable), so retried.

The choice needs the set of custom ids that have a success anywhere in the files, so the files
are read twice (streamed both times; only the ids and a digest per kept line are held).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal

from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.core.tokens import estimate_request_tokens
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.extra_lines import ExtraKind, ExtraLine, request_json_of

Line = ItemResult | MalformedLine


def succeeded_ids(lines: Iterable[Line]) -> set[str]:
    """The custom ids that have a success line anywhere in a job's files (the first pass).

    :param lines: the job's parsed lines
    """
    return {line.custom_id for line in lines if isinstance(line, ItemResult) and line.outcome == "succeeded"}


def _digest(res: ItemResult) -> bytes:
    text = json.dumps([res.outcome, res.output, res.usage.__dict__], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).digest()


@dataclass
class LineSorter:
    """The second pass: keeps one line per custom id and collects every other billed line.

    :param succeeded: :func:`succeeded_ids` of the same files
    :param cost_of: prices one line's usage (batch rate)
    """

    succeeded: set[str]
    cost_of: Callable[[Usage], Decimal]
    #: priced lines beyond the kept ones (duplicates and superseded lines with usage)
    extras: list[ExtraLine] = field(default_factory=list)
    #: damaged lines, with their ordinal, priced later by :func:`price_unreadable`
    unreadable: list[tuple[int, MalformedLine]] = field(default_factory=list)
    #: lines that repeated a kept line's id (same or another answer)
    duplicates: int = 0
    #: error lines set aside for a success of the same id
    superseded: int = 0
    _kept: dict[str, bytes] = field(default_factory=dict)
    _damaged: set[tuple[str | None, str]] = field(default_factory=set)

    def kept(self, lines: Iterable[Line]) -> Iterator[ItemResult]:
        """Yield the line each custom id keeps, in reading order; record the rest.

        :param lines: the job's parsed lines, in the same order as the first pass
        """
        for ordinal, line in enumerate(lines):
            if isinstance(line, MalformedLine):
                key = (line.custom_id, line.excerpt)
                if key not in self._damaged:  # the same damaged line written twice is one answer
                    self._damaged.add(key)
                    self.unreadable.append((ordinal, line))
                continue
            cid = line.custom_id
            if cid not in self._kept and cid in self.succeeded and line.outcome != "succeeded":
                self.superseded += 1
                self._extra(ordinal, line, "superseded")
                continue
            if cid in self._kept:
                self.duplicates += 1
                if self._kept[cid] != _digest(line):
                    self._extra(ordinal, line, "duplicate")
                continue
            self._kept[cid] = _digest(line)
            yield line

    def _extra(self, ordinal: int, line: ItemResult, kind: ExtraKind) -> None:
        if line.usage.total_tokens:
            self.extras.append(ExtraLine(ordinal, line.custom_id, kind, line.usage, self.cost_of(line.usage)))


def estimate_usage(request_json: str) -> Usage:
    """An upper estimate of what one answer to a recorded request was billed.

    :param request_json: the item's recorded request
    """
    estimate = estimate_request_tokens(CanonicalRequest.from_dict(json.loads(request_json)))
    return Usage(input_tokens=estimate.input, output_tokens=estimate.max_output)


def price_unreadable(
    ledger: Ledger,
    job_id: str,
    damaged: list[tuple[int, MalformedLine]],
    cost_of: Callable[[Usage], Decimal],
) -> list[ExtraLine]:
    """Price each damaged line at an estimate from its item's request (``unreadable``, never free).

    A line whose custom id could not be read, or names no line of the job, is priced at the
    largest estimate among the job's requests.

    :param ledger: the ledger
    :param job_id: the job whose files held the lines
    :param damaged: ``(ordinal, line)`` from :attr:`LineSorter.unreadable`
    :param cost_of: prices one line's usage (batch rate)
    """
    if not damaged:
        return []
    ids = sorted({line.custom_id for _, line in damaged if line.custom_id})
    requests = request_json_of(ledger, job_id, ids)
    fallback: Usage | None = None
    out = []
    for ordinal, line in damaged:
        request = requests.get(line.custom_id or "")
        if request is not None:
            usage = estimate_usage(request)
        else:
            if fallback is None:
                every = request_json_of(ledger, job_id, None).values()
                fallback = max(
                    (estimate_usage(r) for r in every), key=lambda u: u.total_tokens, default=Usage()
                )
            usage = fallback
        out.append(ExtraLine(ordinal, line.custom_id, "unreadable", usage, cost_of(usage), estimated=True))
    return out
