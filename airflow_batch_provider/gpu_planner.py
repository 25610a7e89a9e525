"""``python -m airflow_batch_provider.gpu_planner``: the GPU planner, compared with every provider's batch price.

The planner (:mod:`airflow_batch_provider.core.gpu_planner`) knows no provider; the models it
compares with are the ones the adapters declare (``compare_model``), gathered by the registry.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from airflow_batch_provider.adapters.registry import compare_models
from airflow_batch_provider.core.gpu_planner import main as planner_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the planner's command line against the declared providers.

    :param argv: arguments (default: ``sys.argv[1:]``)
    """
    return planner_main(argv, compare_models())


if __name__ == "__main__":
    sys.exit(main())
