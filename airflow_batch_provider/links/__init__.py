"""Operator extra links: a batch job's page at its provider, and the run's page in the LLM batch UI."""
