"""The service layer: the steps of each task, below the thin operators and above ``core`` and ``ledger``.

No module here imports Airflow at import time; operators pass the context's values in.
"""
