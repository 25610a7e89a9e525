"""The synthetic invoices of ``include/generate_invoice_data.py``, loaded as the DAGs load them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


def generated_invoices(n: int, seed: int = 11) -> list[dict[str, Any]]:
    """The first ``n`` invoices the generator writes for ``seed`` (the DAGs' sample set: seed 11).

    :param n: how many
    :param seed: the generator's seed
    """
    generator = load_script(REPO / "include" / "generate_invoice_data.py", "generate_invoice_data")
    return list(generator.generate(n, seed))
