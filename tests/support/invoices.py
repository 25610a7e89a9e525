"""The synthetic invoices of ``include/generate_invoice_data.py``, loaded as the DAGs load them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def generated_invoices(n: int, seed: int = 11) -> list[dict[str, Any]]:
    """The first ``n`` invoices the generator writes for ``seed`` (the DAGs' sample set: seed 11).

    :param n: how many
    :param seed: the generator's seed
    """
    spec = importlib.util.spec_from_file_location(
        "generate_invoice_data", REPO / "include" / "generate_invoice_data.py"
    )
    assert spec and spec.loader
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    return list(generator.generate(n, seed))
