"""Sample datasets of the example DAGs, generated on first use by the scripts in ``include/``.

Airflow puts the DAG folder on ``sys.path``, so the DAG files import this module by name.

The datasets are written to ``$ABP_SAMPLE_DATA_DIR`` when it is set, else to ``include/data``:
the container stack mounts ``include/`` read-only and points the variable at a writable volume,
so that a fresh clone (no ``include/data`` yet) runs there too.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INCLUDE = Path(__file__).resolve().parents[1] / "include"


def data_dir() -> Path:
    """Where the sample datasets are written and read: ``$ABP_SAMPLE_DATA_DIR``, else ``include/data``."""
    configured = os.environ.get("ABP_SAMPLE_DATA_DIR", "").strip()
    return Path(configured) if configured else INCLUDE / "data"


def generated_records(
    generator: str, dataset: str, n: int, seed: int, limit: int = 0
) -> Iterator[dict[str, Any]]:
    """Yield the records of ``<data_dir()>/<dataset>``, generating the file first if it is missing.

    :param generator: the generator script's name in ``include/`` (without ``.py``)
    :param dataset: the file name under :func:`data_dir`
    :param n: how many records to generate
    :param seed: the generator's seed
    :param limit: yield at most this many (0: all)
    """
    spec = importlib.util.spec_from_file_location(generator, INCLUDE / f"{generator}.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no generator {generator}.py in {INCLUDE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = module.ensure_dataset(data_dir() / dataset, n=n, seed=seed)
    with open(path, encoding="utf-8") as fh:
        rows = (json.loads(line) for line in fh if line.strip())
        yield from (itertools.islice(rows, limit) if limit > 0 else rows)
