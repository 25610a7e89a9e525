"""Pure Python building blocks: no Airflow, no provider SDK."""
