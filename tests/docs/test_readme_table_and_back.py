"""The README's "from a table and back" block is the shipped DAG file that its DAG test runs.

``tests/dags/test_ticket_sentiment.py`` runs ``dags/ticket_sentiment.py`` against the emulator, a
real PostgreSQL and a helpdesk on loopback; this test holds the README's block to that file,
character for character, and the sinks section's consumer example to its lines.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def section_blocks(heading: str) -> list[tuple[str, str]]:
    """``(caption, code)`` of each fenced block of the README section under ``heading``.

    :param heading: the section's heading line, without the newline
    """
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    parts = section.split("```")
    return [
        (caption.strip().split("\n\n")[-1], block.partition("\n")[2])
        for caption, block in zip(parts[0::2], parts[1::2], strict=False)
    ]


def test_the_readme_from_a_table_and_back_block_is_the_shipped_ticket_sentiment_dag() -> None:
    [(caption, code)] = section_blocks("### From a table and back")
    named = re.fullmatch(r"`(dags/[^`]+)`", caption)
    assert named, f"the block's caption {caption!r} names no dags/ file"
    assert named[1] == "dags/ticket_sentiment.py"
    assert code == (REPO / named[1]).read_text(encoding="utf-8")


def test_the_readme_consumer_example_is_the_consumer_of_the_shipped_ticket_sentiment_dag() -> None:
    blocks = section_blocks("## From the run back into your table: sinks")
    [(caption, code)] = [(c, b) for c, b in blocks if "Consumer(" in b]
    assert caption.endswith("From `dags/ticket_sentiment.py`:")
    shipped = {line.strip() for line in (REPO / "dags" / "ticket_sentiment.py").read_text().splitlines()}
    shown = [
        line.strip() for line in code.splitlines() if line.strip() not in ("", "...,", "SqlUpsertSink(...),")
    ]
    assert [line for line in shown if line not in shipped] == []
    assert (
        "Consumer(" in shown
        and 'headers={"Idempotency-Key": handoff.key},  # one per ticket and prompt version' in shown
    )
