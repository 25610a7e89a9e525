"""Deterministic synthetic invoices for the invoice entity extraction workload.

Each record is one JSON line::

    {"id": "inv-000001", "document": "Invoice No: INV-2025-004217\\nVendor: Northwind Traders\\n...",
     "_truth": {"invoice_number": "INV-2025-004217", "invoice_date": "2025-03-14",
                "vendor": "Northwind Traders", "currency": "EUR", "total": 1234.5},
     "_variant": "clean"}

``document`` is the plain text of an invoice as an OCR step would hand it over: a number, a
vendor line, an invoice date and a due date, a bill-to block, line items, subtotal, tax and total.
``_truth`` holds the fields as issued (the date always ISO 8601). ``_variant`` says how the
document is written:

- ``clean`` (most): ISO dates, a ``Vendor:`` line;
- ``long_date``: the invoice date written as ``March 14, 2025``;
- ``slash_date``: the invoice date written as ``14/03/2025``;
- ``no_vendor``: the vendor appears only in the letterhead, with no ``Vendor:`` label.

The last three are the documents an extractor gets wrong in the shape the schema demands
(a non-ISO date, no vendor), so that a run shows ``invalid_output`` items, retried and then sent
to review. The variant mix is fixed by the seed. Standard library only; the same ``n`` and
``seed`` give byte-identical output.

CLI::

    python include/generate_invoice_data.py --out include/data/invoices.jsonl --n 600 --seed 11
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Final

VARIANTS: Final[tuple[tuple[str, float], ...]] = (
    ("clean", 0.85),
    ("long_date", 0.06),
    ("slash_date", 0.05),
    ("no_vendor", 0.04),
)
VENDORS: Final[tuple[str, ...]] = (
    "Northwind Traders",
    "Contoso Supplies",
    "Fabrikam Components",
    "Adatum Office Goods",
    "Tailspin Logistics",
    "Litware Systems",
    "Proseware Labs",
    "Wingtip Hardware",
    "Alpine Ski House",
    "Coho Vineyard",
)
CUSTOMERS: Final[tuple[str, ...]] = (
    "Blue Yonder Airlines",
    "Margie's Travel",
    "Lucerne Publishing",
    "Trey Research",
    "Woodgrove Bank",
    "Humongous Insurance",
)
#: currency code -> (how an amount is written, tax rate)
CURRENCIES: Final[dict[str, tuple[str, float]]] = {
    "USD": ("${:,.2f}", 0.0),
    "EUR": ("€{:,.2f}", 0.2),
    "GBP": ("£{:,.2f}", 0.2),
    "CHF": ("CHF {:,.2f}", 0.081),
}
ITEMS: Final[tuple[str, ...]] = (
    "Printer paper, A4, 5 reams",
    "Ergonomic office chair",
    "USB-C docking station",
    "Toner cartridge, black",
    "Standing desk frame",
    "Wireless keyboard",
    "Consulting hours",
    "Annual software licence",
    "Shipping and handling",
    "Desk organiser set",
)
_MONTHS: Final = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def _variant(rng: random.Random) -> str:
    u = rng.random()
    edge = 0.0
    for name, share in VARIANTS:
        edge += share
        if u < edge:
            return name
    return VARIANTS[0][0]


def _money(currency: str, amount: float) -> str:
    return CURRENCIES[currency][0].format(amount)


def make_invoice(index: int, rng: random.Random) -> dict[str, Any]:
    """Return one invoice record.

    :param index: 1-based record number (the id)
    :param rng: the generator's random source
    """
    variant = _variant(rng)
    vendor = rng.choice(VENDORS)
    customer = rng.choice(CUSTOMERS)
    currency = rng.choice(list(CURRENCIES))
    issued = date(2025, 1, 1) + timedelta(days=rng.randrange(365))
    due = issued + timedelta(days=rng.choice((14, 30, 45, 60)))
    number = f"INV-{issued.year}-{rng.randrange(1, 999_999):06d}"
    lines = []
    subtotal = 0.0
    for item in rng.sample(ITEMS, rng.randint(1, 4)):
        quantity = rng.randint(1, 12)
        unit = round(rng.uniform(4, 450), 2)
        amount = round(quantity * unit, 2)
        subtotal += amount
        lines.append(f"  {item}: {quantity} x {_money(currency, unit)} = {_money(currency, amount)}")
    subtotal = round(subtotal, 2)
    tax = round(subtotal * CURRENCIES[currency][1], 2)
    total = round(subtotal + tax, 2)
    if variant == "long_date":
        issued_text = f"{_MONTHS[issued.month - 1]} {issued.day}, {issued.year}"
    elif variant == "slash_date":
        issued_text = f"{issued.day:02d}/{issued.month:02d}/{issued.year}"
    else:
        issued_text = issued.isoformat()
    head = [f"{vendor.upper()}", f"Invoice No: {number}"]
    if variant != "no_vendor":
        head.append(f"Vendor: {vendor}")
    document = "\n".join(
        [
            *head,
            f"Invoice date: {issued_text}",
            f"Due date: {due.isoformat()}",
            f"Bill to: {customer}",
            "Items:",
            *lines,
            f"Subtotal: {_money(currency, subtotal)}",
            f"Tax: {_money(currency, tax)}",
            f"Total due: {_money(currency, total)}",
        ]
    )
    return {
        "id": f"inv-{index:06d}",
        "document": document,
        "_truth": {
            "invoice_number": number,
            "invoice_date": issued.isoformat(),
            "vendor": vendor,
            "currency": currency,
            "total": total,
        },
        "_variant": variant,
    }


def generate(n: int = 600, seed: int = 11) -> Iterator[dict[str, Any]]:
    """Yield ``n`` invoices, deterministically for a seed.

    :param n: how many invoices
    :param seed: random seed
    """
    rng = random.Random(seed)
    for index in range(1, n + 1):
        yield make_invoice(index, rng)


def write_jsonl(path: Path, n: int = 600, seed: int = 11) -> Path:
    """Write the invoices to ``path`` atomically (a temporary file, then a rename).

    :param path: the JSONL file to write
    :param n: how many invoices
    :param seed: random seed
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            for record in generate(n, seed):
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def ensure_dataset(path: str | Path, n: int = 600, seed: int = 11) -> Path:
    """Return ``path``, writing the dataset first only if the file does not exist yet.

    :param path: the JSONL file
    :param n: how many invoices, when it is written
    :param seed: random seed, when it is written
    """
    target = Path(path)
    if target.exists():
        return target
    return write_jsonl(target, n, seed)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point.

    :param argv: arguments (default: ``sys.argv[1:]``)
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "invoices.jsonl")
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    write_jsonl(args.out, args.n, args.seed)
    print(f"wrote {args.n} invoices to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
