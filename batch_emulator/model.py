"""A deterministic STAND-IN for a language model. It is not an LLM and understands nothing.

It exists so that demos and tests get plausible, repeatable, checkable answers without a network:

- **classification**: when the system prompt mentions ``sentiment`` or the caller asks for JSON
  output, it answers ``{"sentiment", "topic", "confidence"}`` found by keyword lists in the user
  text (see :data:`SENTIMENT_WORDS` and :data:`TOPIC_WORDS`);
- **invoice extraction**: when the system prompt mentions ``invoice``, it answers a JSON object of
  regular-expression finds (invoice number, dates, amounts, currency, vendor, and the billed lines
  written ``<description>: <quantity> x <unit price> = <amount>``);
- **spend categorisation**: when the system prompt mentions ``spend category``, it answers
  ``{"category", "confidence"}`` found by keyword lists in the user text (see
  :data:`CATEGORY_WORDS`);
- **summary**: otherwise a short echo of the user text's first sentence;
- **embeddings**: hashed bag of words, L2-normalised.

Token counts are an approximation, the same everywhere in the emulator: a text is
``ceil(utf8 bytes / 4)`` tokens (:func:`count_tokens`), a chat message adds
:data:`MESSAGE_OVERHEAD_TOKENS` (4) for its role and framing, and an embedding input adds nothing.

Prompt caching follows OpenAI's published rule (:func:`cached_tokens`): the shared prefix of a
prompt (its leading system messages) is cached once it has been seen earlier in the same batch
(or, for the synchronous endpoints, earlier in the emulator's life); only prefixes of at least
1024 tokens are cached, and the cached count is rounded down to a multiple of 128 tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

MESSAGE_OVERHEAD_TOKENS: Final = 4
DEFAULT_EMBEDDING_DIMENSIONS: Final = 256

SENTIMENT_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "positive": (
        "great", "love", "loved", "excellent", "happy", "fast", "thanks", "thank", "good", "perfect",
        "amazing", "helpful", "easy", "recommend", "satisfied", "awesome", "wonderful", "quick",
        "smooth", "friendly", "fantastic", "best", "pleased", "resolved",
    ),
    "negative": (
        "bad", "terrible", "broken", "late", "refund", "angry", "worst", "slow", "crash", "crashes",
        "disappointed", "poor", "damaged", "wrong", "awful", "hate", "missing", "never", "overcharged",
        "useless", "rude", "unacceptable", "frustrated", "problem", "issue", "fails", "failed", "cancel",
    ),
}  # fmt: skip

TOPIC_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "billing": (
        "bill", "billing", "billed", "invoice", "charge", "charged", "overcharged", "refund", "payment",
        "price", "subscription", "fee", "credit", "card",
    ),
    "delivery": (
        "delivery", "delivered", "shipping", "shipped", "package", "parcel", "courier", "arrived",
        "tracking", "late", "dispatch",
    ),
    "product_quality": (
        "quality", "broken", "defect", "defective", "damaged", "material", "cheap", "stopped", "flimsy",
        "battery", "works", "product",
    ),
    "support": (
        "support", "agent", "service", "helpdesk", "representative", "ticket", "answer", "replied",
        "response", "staff", "rude", "helpful",
    ),
    "app_experience": (
        "app", "login", "crash", "crashes", "update", "screen", "website", "bug", "password", "ui",
        "button", "loading",
    ),
}  # fmt: skip
TOPICS: Final[tuple[str, ...]] = (*TOPIC_WORDS, "other")

#: Spend categories of a billed line, by keyword; ties go to the earlier category, none to ``other``.
CATEGORY_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "office_supplies": ("paper", "toner", "cartridge", "organiser", "organizer", "pen", "pens", "stationery", "ink"),
    "furniture": ("chair", "desk", "table", "shelf", "cabinet", "frame", "standing"),
    "it_hardware": ("usb", "docking", "keyboard", "mouse", "monitor", "laptop", "cable", "station"),
    "software": ("software", "licence", "license", "subscription", "saas"),
    "services": ("consulting", "hours", "training", "support", "maintenance"),
    "logistics": ("shipping", "handling", "freight", "delivery", "courier", "postage"),
}  # fmt: skip
CATEGORIES: Final[tuple[str, ...]] = (*CATEGORY_WORDS, "other")

_WORD: Final = re.compile(r"[\w']+", re.UNICODE)
_MONTHS: Final = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_DATE: Final = re.compile(
    r"\b(\d{4}-\d{2}-\d{2}|\d{1,2}[/.]\d{1,2}[/.]\d{2,4}|\d{1,2}\s+"
    + _MONTHS
    + r"\s+\d{4}|"
    + _MONTHS
    + r"\s+\d{1,2},?\s+\d{4})\b",
    re.IGNORECASE,
)
_INVOICE_NO: Final = re.compile(
    r"\binv(?:oice)?\.?\s*(?:no\.?|number|num\.?|nr\.?|#|id)?\s*[:#]?\s*([A-Z0-9][A-Z0-9/-]*\d[A-Z0-9/-]*)",
    re.IGNORECASE,
)
_CURRENCY_SYMBOLS: Final = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY"}
_AMOUNT: Final = re.compile(
    r"(?:(?P<pre>USD|EUR|GBP|CHF|JPY|CAD|AUD|[$€£¥])\s?(?P<a>\d{1,3}(?:[,\s]\d{3})*(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?))"
    r"|(?:(?P<b>\d{1,3}(?:,\d{3})*(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?)\s?(?P<post>USD|EUR|GBP|CHF|JPY|CAD|AUD|[€£]))",
)
_LINE_ITEM: Final = re.compile(
    r"^[ \t]*(?P<d>[^:\n]*[^:\s]):[ \t]*(?P<q>\d+(?:\.\d+)?)[ \t]*x[ \t]*(?P<u>[^=\n]+?)[ \t]*=[ \t]*(?P<a>[^\n]+?)[ \t]*$",
    re.MULTILINE,
)
_VENDOR: Final = re.compile(
    r"\b(?i:vendor|seller|supplier|from|billed\s+by|issued\s+by|company)\s*[:\-]?\s*"
    r"([A-Z][\w&.'-]*(?:[ \t]+[A-Z&][\w&.'-]*){0,5})",
)


def count_tokens(text: str) -> int:
    """Return the approximate token count of a text: ``ceil(utf8 bytes / 4)``.

    :param text: the text
    """
    return math.ceil(len(text.encode("utf-8")) / 4)


def message_tokens(text: str) -> int:
    """Return the tokens one chat message costs: its text plus the per-message overhead.

    :param text: the message's text
    """
    return count_tokens(text) + MESSAGE_OVERHEAD_TOKENS


def cached_tokens(prefix_tokens: int, seen_before: bool, min_tokens: int = 1024, increment: int = 128) -> int:
    """Return how many prompt tokens a provider would bill as cached.

    Rule (OpenAI's): nothing is cached the first time a prefix is seen or when the prefix is
    shorter than ``min_tokens``; otherwise the prefix is cached rounded down to a multiple of
    ``increment``.

    :param prefix_tokens: tokens of the shared prefix (leading system messages)
    :param seen_before: the same prefix was processed earlier
    :param min_tokens: shortest cacheable prefix
    :param increment: cache granularity
    """
    if not seen_before or prefix_tokens < min_tokens:
        return 0
    return (prefix_tokens // increment) * increment


def prefix_key(texts: Iterable[str]) -> str:
    """Return a stable key of a prompt prefix, for cache bookkeeping.

    :param texts: the prefix messages' texts
    """
    return hashlib.sha256("\x1e".join(texts).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Reply:
    """The stand-in model's answer.

    :param text: the generated text
    :param output_tokens: its token count (after any truncation)
    :param truncated: cut at ``max_output_tokens`` (finish reason ``length``)
    :param task: which behaviour answered (``classification``, ``extraction``, ``summary``)
    """

    text: str
    output_tokens: int
    truncated: bool
    task: str


def respond(
    system: str | None, user: str, *, json_mode: bool = False, max_output_tokens: int | None = None
) -> Reply:
    """Answer a prompt deterministically.

    :param system: the system prompt (``None`` when absent)
    :param user: the user text (all user messages joined)
    :param json_mode: the caller asked for JSON output
    :param max_output_tokens: cut the answer at this many tokens
    """
    sys_text = (system or "").lower()
    # A classification rubric may mention invoices as a topic, so "sentiment" decides first; a
    # spend category rubric reads lines of invoices, so it decides before "invoice".
    if "spend category" in sys_text and "sentiment" not in sys_text:
        task, text = "categorisation", json.dumps(categorise(user))
    elif "invoice" in sys_text and "sentiment" not in sys_text:
        task, text = "extraction", json.dumps(extract_invoice(user), ensure_ascii=False)
    elif json_mode or "sentiment" in sys_text:
        task, text = "classification", json.dumps(classify(user))
    else:
        task, text = "summary", summarize(user)
    truncated = False
    if max_output_tokens is not None and count_tokens(text) > max_output_tokens:
        raw = text.encode("utf-8")[: max(0, max_output_tokens) * 4]
        text = raw.decode("utf-8", errors="ignore")
        truncated = True
    return Reply(text=text, output_tokens=count_tokens(text), truncated=truncated, task=task)


def _words(text: str) -> list[str]:
    return [w.lower().strip("'") for w in _WORD.findall(text)]


def classify(text: str) -> dict[str, Any]:
    """Return ``{"sentiment", "topic", "confidence"}`` from keyword counts.

    Sentiment is the sign of positive minus negative hits (ties: ``neutral``); the topic is the one
    with most hits (ties go to the earlier topic in :data:`TOPIC_WORDS`; none: ``other``).
    Confidence grows with the margin of both decisions and stays within ``[0.5, 0.99]``.

    :param text: the user text
    """
    words = _words(text)
    pos = sum(w in SENTIMENT_WORDS["positive"] for w in words)
    neg = sum(w in SENTIMENT_WORDS["negative"] for w in words)
    sentiment = "positive" if pos > neg else "negative" if neg > pos else "neutral"
    scores = [(sum(w in kws for w in words), topic) for topic, kws in TOPIC_WORDS.items()]
    best = max(s for s, _ in scores)
    topic = next(t for s, t in scores if s == best) if best > 0 else "other"
    runner_up = sorted((s for s, _ in scores), reverse=True)[1] if best > 0 else 0
    margin = abs(pos - neg) / (pos + neg + 1) + (best - runner_up) / (best + 1)
    confidence = round(min(0.99, 0.5 + 0.25 * margin), 3)
    return {"sentiment": sentiment, "topic": topic, "confidence": confidence}


def categorise(text: str) -> dict[str, Any]:
    """Return ``{"category", "confidence"}`` of a billed line from keyword counts.

    The category is the one with most hits (ties go to the earlier one in
    :data:`CATEGORY_WORDS`; none: ``other``); confidence grows with the margin over the runner-up
    and stays within ``[0.5, 0.99]``.

    :param text: the user text
    """
    words = _words(text)
    scores = [(sum(w in kws for w in words), name) for name, kws in CATEGORY_WORDS.items()]
    best = max(s for s, _ in scores)
    category = next(n for s, n in scores if s == best) if best > 0 else "other"
    runner_up = sorted((s for s, _ in scores), reverse=True)[1]
    confidence = round(min(0.99, 0.5 + 0.4 * (best - runner_up) / (best + 1)), 3)
    return {"category": category, "confidence": confidence}


def _money(text: str) -> float | None:
    """The amount of a written sum (``€1,024.50``, ``CHF 120.00``), or ``None``."""
    m = _AMOUNT.search(text)
    raw = (m.group("a") or m.group("b") or "") if m else ""
    return float(re.sub(r"[,\s]", "", raw)) if raw else None


def _line_items(text: str) -> list[dict[str, Any]]:
    items = []
    for m in _LINE_ITEM.finditer(text):
        unit, amount = _money(m.group("u")), _money(m.group("a"))
        if unit is None or amount is None:
            continue
        quantity = float(m.group("q"))
        items.append(
            {
                "description": m.group("d").strip(),
                "quantity": int(quantity) if quantity.is_integer() else quantity,
                "unit_price": unit,
                "amount": amount,
            }
        )
    return items


def extract_invoice(text: str) -> dict[str, Any]:
    """Return invoice fields found by regular expressions (``None`` or empty where absent).

    :param text: the document text
    """
    number = _INVOICE_NO.search(text)
    dates = [m.group(1) for m in _DATE.finditer(text)]
    amounts: list[float] = []
    currency: str | None = None
    for m in _AMOUNT.finditer(text):
        raw = m.group("a") or m.group("b") or ""
        cur = m.group("pre") or m.group("post") or ""
        try:
            amounts.append(float(re.sub(r"[,\s]", "", raw)))
        except ValueError:  # pragma: no cover - the pattern only matches digits
            continue
        if currency is None:
            currency = _CURRENCY_SYMBOLS.get(cur, cur.upper())
    vendor = _VENDOR.search(text)
    return {
        "invoice_number": number.group(1) if number else None,
        "invoice_date": dates[0] if dates else None,
        "dates": dates,
        "amounts": amounts,
        "total": max(amounts) if amounts else None,
        "currency": currency,
        "vendor": vendor.group(1).strip(" .,") if vendor else None,
        "line_items": _line_items(text),
    }


def summarize(text: str, max_words: int = 25) -> str:
    """Return a short echo of the text: its first sentence, at most ``max_words`` words.

    :param text: the text
    :param max_words: most words kept
    """
    flat = " ".join(text.split())
    first = re.split(r"(?<=[.!?])\s", flat, maxsplit=1)[0] if flat else ""
    words = first.split()
    short = " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")
    return f"Summary: {short}" if short else "Summary: (empty input)"


def embed(text: str, dimensions: int = DEFAULT_EMBEDDING_DIMENSIONS) -> list[float]:
    """Return a hashed bag-of-words vector, L2-normalised (empty text: the first unit vector).

    Each lower-cased word adds +1 or -1 (by a hash bit) at a hashed position, so texts that share
    words have a positive cosine similarity.

    :param text: the input text
    :param dimensions: vector length
    """
    if dimensions < 1:
        raise ValueError("dimensions must be at least 1")
    vec = [0.0] * dimensions
    for word in _words(text):
        h = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "big")
        vec[h % dimensions] += 1.0 if (h >> 63) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    if norm == 0.0:
        vec[0] = 1.0
        return vec
    return [v / norm for v in vec]


def join_texts(parts: Sequence[str]) -> str:
    """Join message texts the way :func:`respond` expects its ``user`` argument.

    :param parts: the texts
    """
    return "\n".join(p for p in parts if p)
