"""The Airflow glue reads the ledger through typed, frozen rows, never raw ``RowMapping`` dicts.

A source scan: ``operators/``, ``services/`` and ``sensors/`` (the self-hosted lane's pod task and
services among them) may not import ``RowMapping`` nor call the ledger's untyped readers (``job``,
``jobs_for``, ``iter_items``); they use ``get_job``/``get_jobs`` (``JobRow``) and
``iter_item_rows`` (``ItemRow``, ``OpenItem``, ``ItemRef``, ``ItemOutcome``) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_batch_provider

PACKAGE = Path(airflow_batch_provider.__file__).parent
GLUE = ("operators", "services", "sensors")
#: The ledger's readers that hand out dicts or ``RowMapping`` objects.
UNTYPED_READERS = frozenset({"job", "jobs_for", "iter_items"})


def untyped_reads(source: str, name: str = "<source>") -> list[str]:
    """Every ``RowMapping`` import and call of an untyped ledger reader in ``source``, as ``name:line: what``.

    :param source: Python source text
    :param name: the file's name, for the message
    """
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                if alias.name.rsplit(".", 1)[-1] == "RowMapping":
                    found.append(f"{name}:{node.lineno}: imports RowMapping")
        elif isinstance(node, ast.Attribute) and node.attr == "RowMapping":
            found.append(f"{name}:{node.lineno}: uses RowMapping")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in UNTYPED_READERS
        ):
            found.append(f"{name}:{node.lineno}: calls .{node.func.attr}() (use the typed reader)")
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def test_the_airflow_glue_reads_no_raw_rows_from_the_ledger() -> None:
    files = sorted(p for folder in GLUE for p in (PACKAGE / folder).rglob("*.py"))
    assert len(files) > 10  # the scan looks at the real package, not an empty folder
    found = [hit for p in files for hit in untyped_reads(p.read_text("utf-8"), str(p.relative_to(PACKAGE)))]
    assert found == []


def test_the_scan_sees_a_rowmapping_import_and_each_untyped_reader() -> None:
    hostile = (
        "from sqlalchemy.engine import RowMapping\n"
        "import sqlalchemy.engine.RowMapping\n"
        "def f(ledger, x: sqlalchemy.engine.RowMapping):\n"
        "    ledger.job('j')\n"
        "    self.ledger.jobs_for('w', 'r')\n"
        "    list(ledger.iter_items('w', 'r'))\n"
        "    ledger.get_job('j'); ledger.get_jobs('w', 'r'); ledger.iter_item_rows('w', 'r')\n"
    )
    assert [hit.split(": ", 1)[1] for hit in untyped_reads(hostile)] == [
        "imports RowMapping",
        "imports RowMapping",
        "uses RowMapping",
        "calls .job() (use the typed reader)",
        "calls .jobs_for() (use the typed reader)",
        "calls .iter_items() (use the typed reader)",
    ]
