"""Provider adapters behind one contract (:mod:`airflow_batch_provider.adapters.base`)."""
