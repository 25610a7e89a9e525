from __future__ import annotations

import pytest

from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.adapters.registry import BUILTIN, adapter_class, known_conn_types
from airflow_batch_provider.exceptions import ConfigurationError


def test_the_openai_connection_types_resolve_to_the_openai_adapter() -> None:
    assert adapter_class("openai_batch") is OpenAIBatchAdapter
    assert adapter_class("openai") is OpenAIBatchAdapter


def test_every_builtin_entry_names_an_adapter_class() -> None:
    for conn_type in BUILTIN:
        cls = adapter_class(conn_type)
        assert cls.conn_type in BUILTIN, conn_type


def test_an_unknown_connection_type_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as err:
        adapter_class("smtp")
    message = str(err.value)
    assert "'smtp'" in message and "openai_batch" in message and "entry-point" in message
    assert "openai_batch" in known_conn_types()
