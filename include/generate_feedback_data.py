"""Deterministic synthetic customer comments for the feedback-classification workload.

Each record is one JSON line::

    {"id": "cmt-000001", "customer_id": "cust-01234", "channel": "email", "created_at": "2025-03-14",
     "product": "Nimbus Headphones", "comment": "...", "_truth": {"sentiment": "negative", "topic": "billing"}}

Comments are assembled from templates, so that the labels are recoverable from keywords: each
comment holds words of exactly one topic list in :data:`TOPIC_KEYWORDS` (none for ``other``) and
of exactly one sentiment list in :data:`SENTIMENT_KEYWORDS`, matched as whole words, case
insensitive (substring matching would misread ``happy`` and ``disappointed`` as containing
``app``). ``_truth`` records the labels so that tests can measure how often a model agrees.

The emulator's stand-in classifier (``batch_emulator/model.py``, owned by
another module) labels comments from keyword lists too; the lists here are the generator's own,
and agreement between the two is measured against ``_truth``, not assumed.

Standard library only; the same ``n`` and ``seed`` give byte-identical output.

CLI::

    python include/generate_feedback_data.py --out include/data/feedback_comments.jsonl --n 3000 --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Final

SENTIMENTS: Final[tuple[str, ...]] = ("positive", "negative", "neutral")
TOPICS: Final[tuple[str, ...]] = (
    "billing",
    "delivery",
    "product_quality",
    "support",
    "app_experience",
    "other",
)
CHANNELS: Final[tuple[str, ...]] = ("email", "app_review", "chat", "survey")
PRODUCTS: Final[tuple[str, ...]] = (
    "Nimbus Headphones",
    "Aurora Blender",
    "Summit Backpack",
    "Orbit Smartwatch",
    "Harbor Coffee Maker",
    "Cedar Desk Lamp",
    "Pulse Fitness Tracker",
    "Atlas Luggage Set",
)

#: Whole-word keywords that identify each topic (``other`` has none).
TOPIC_KEYWORDS: Final[dict[str, tuple[str, ...]]] = {
    "billing": ("invoice", "charged", "refund", "bill", "payment"),
    "delivery": ("shipping", "delivery", "arrived", "package", "courier"),
    "product_quality": ("broke", "quality", "defect", "works great", "sturdy"),
    "support": ("agent", "support", "helpdesk", "ticket"),
    "app_experience": ("app", "login", "crash", "screen", "update"),
}
#: Whole-word keywords that identify each sentiment.
SENTIMENT_KEYWORDS: Final[dict[str, tuple[str, ...]]] = {
    "positive": ("love", "great", "excellent", "fast", "happy"),
    "negative": ("terrible", "slow", "angry", "broken", "disappointed"),
    "neutral": ("okay", "fine", "average"),
}

# Topic sentences: {product} is filled in; each names at least one keyword of its topic and no
# keyword of another topic or of any sentiment.
_TOPIC_SENTENCES: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "billing": {
        "any": (
            "The invoice for my {product} order",
            "My last payment for the {product}",
            "The refund for the {product}",
            "How I was charged for the {product}",
            "The monthly bill that includes the {product}",
        ),
    },
    "delivery": {
        "any": (
            "The delivery of my {product}",
            "The package with the {product}",
            "Shipping for the {product}",
            "The courier who brought the {product}",
            "How the {product} arrived",
        ),
    },
    "product_quality": {
        "any": (
            "The build quality of the {product}",
            "How sturdy the {product} feels",
            "The quality of the {product} after a month",
        ),
        "positive": ("The {product} works great and the quality",),
        "negative": ("The {product} broke within a week, and that defect",),
    },
    "support": {
        "any": (
            "The support agent who handled my {product} question",
            "My helpdesk ticket about the {product}",
            "The support team for the {product}",
        ),
    },
    "app_experience": {
        "any": (
            "The companion app for the {product}",
            "The login screen of the {product} app",
            "The latest app update for the {product}",
        ),
        "negative": ("The {product} app keeps hitting a crash on start, which",),
    },
    "other": {
        "any": (
            "The colour options of the {product}",
            "Your store hours near me",
            "The gift wrapping for the {product}",
            "The name of the {product}",
            "Your newsletter about the {product}",
        ),
    },
}

# Sentiment clauses complete the topic sentence; each holds keywords of its sentiment only.
_SENTIMENT_CLAUSES: Final[dict[str, tuple[str, ...]]] = {
    "positive": (
        "was excellent, I love it.",
        "made me really happy, great job.",
        "was fast and excellent.",
        "is great, I love how it turned out.",
        "left me happy: fast and simple.",
    ),
    "negative": (
        "was terrible and I am angry.",
        "left me disappointed, it was so slow.",
        "is broken and the whole thing was terrible.",
        "was slow and left me disappointed.",
        "made me angry, a terrible experience.",
    ),
    "neutral": (
        "was okay, nothing special.",
        "seemed fine overall.",
        "was average, as expected.",
        "is fine, I suppose.",
        "was okay and about average.",
    ),
}
_CLOSERS: Final[tuple[str, ...]] = (
    "",
    "",
    " Ordered last month.",
    " Just letting you know.",
    " Regards, a customer.",
)
_SENTIMENT_WEIGHTS: Final[tuple[int, ...]] = (40, 40, 20)
_TOPIC_WEIGHTS: Final[tuple[int, ...]] = (18, 18, 18, 16, 18, 12)
_START: Final = date(2025, 1, 1)
_DAYS: Final = 365


def _pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")\b", re.IGNORECASE)


_TOPIC_PATTERNS: Final = {t: _pattern(w) for t, w in TOPIC_KEYWORDS.items()}
_SENTIMENT_PATTERNS: Final = {s: _pattern(w) for s, w in SENTIMENT_KEYWORDS.items()}


def keyword_labels(comment: str) -> dict[str, str]:
    """Label a comment from the keyword lists (whole words); the reference for ``_truth``.

    Topic: the topic whose keywords appear, else ``other``. Sentiment: the sentiment whose
    keywords appear most often, ``neutral`` when none do.

    :param comment: the comment text
    """
    topic_hits = {t: len(p.findall(comment)) for t, p in _TOPIC_PATTERNS.items()}
    sentiment_hits = {s: len(p.findall(comment)) for s, p in _SENTIMENT_PATTERNS.items()}
    topic = max(topic_hits, key=lambda t: topic_hits[t]) if any(topic_hits.values()) else "other"
    sentiment = (
        max(sentiment_hits, key=lambda s: sentiment_hits[s]) if any(sentiment_hits.values()) else "neutral"
    )
    return {"sentiment": sentiment, "topic": topic}


def _comment(rng: random.Random, topic: str, sentiment: str, product: str) -> str:
    options = _TOPIC_SENTENCES[topic]
    sentences = options["any"] + options.get(sentiment, ())
    opener = rng.choice(sentences).format(product=product)
    clause = rng.choice(_SENTIMENT_CLAUSES[sentiment])
    return f"{opener} {clause}{rng.choice(_CLOSERS)}"


def generate(n: int = 3000, seed: int = 7) -> Iterator[dict[str, Any]]:
    """Yield ``n`` synthetic comments, the same ones for the same ``seed``.

    :param n: how many comments
    :param seed: random seed
    :raises ValueError: ``n`` is negative
    """
    if n < 0:
        raise ValueError(f"n = {n} is negative; ask for 0 or more comments.")
    rng = random.Random(seed)
    for i in range(1, n + 1):
        sentiment = rng.choices(SENTIMENTS, weights=_SENTIMENT_WEIGHTS)[0]
        topic = rng.choices(TOPICS, weights=_TOPIC_WEIGHTS)[0]
        product = rng.choice(PRODUCTS)
        yield {
            "id": f"cmt-{i:06d}",
            "customer_id": f"cust-{rng.randrange(1, 20_000):05d}",
            "channel": rng.choice(CHANNELS),
            "created_at": (_START + timedelta(days=rng.randrange(_DAYS))).isoformat(),
            "product": product,
            "comment": _comment(rng, topic, sentiment, product),
            "_truth": {"sentiment": sentiment, "topic": topic},
        }


def write_jsonl(path: Path, n: int = 3000, seed: int = 7) -> Path:
    """Write the comments to ``path`` atomically (a temporary file, then a rename).

    :param path: the JSONL file to write
    :param n: how many comments
    :param seed: random seed
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            for record in generate(n, seed):
                fh.write(json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def ensure_dataset(path: str | Path, n: int = 3000, seed: int = 7) -> Path:
    """Return ``path``, writing the dataset first only if the file does not exist yet.

    :param path: the JSONL file
    :param n: how many comments, when it is written
    :param seed: random seed, when it is written
    """
    target = Path(path)
    if target.exists():
        return target
    return write_jsonl(target, n, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write synthetic customer comments as JSONL.")
    parser.add_argument("--out", type=Path, default=Path("include/data/feedback_comments.jsonl"))
    parser.add_argument("--n", type=int, default=3000, help="number of comments (default 3000)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = parser.parse_args(argv)
    if args.n < 0:
        parser.error(f"--n {args.n} is negative; give 0 or more.")
    path = (
        write_jsonl(args.out, args.n, args.seed)
        if args.force
        else ensure_dataset(args.out, args.n, args.seed)
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
