"""The README's "Chaining workloads" block is the shipped DAG file that its DAG test runs.

``tests/dags/test_invoice_line_item_categories.py`` runs ``dags/invoice_line_item_categories.py``
after the invoice extraction, against the emulator; this test holds the README's block to that
file, character for character.
"""

from __future__ import annotations

import re

from tests.docs.test_readme_table_and_back import REPO, section_blocks


def test_the_readme_chaining_block_is_the_shipped_invoice_line_item_dag() -> None:
    [(caption, code)] = section_blocks("### Chaining workloads")
    named = re.fullmatch(r"`(dags/[^`]+)`", caption)
    assert named, f"the block's caption {caption!r} names no dags/ file"
    assert named[1] == "dags/invoice_line_item_categories.py"
    assert code == (REPO / named[1]).read_text(encoding="utf-8")
