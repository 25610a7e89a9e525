"""Consumer: what a DAG author writes is checked when the DAG is parsed, each mistake named with its fix."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger.handoffs import HandOff
from airflow_batch_provider.sinks.consumer import Consumer


def act(handoff: HandOff) -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "open tickets"}, r"name='open tickets'; use 1 to 64 letters, digits and '_'"),
        ({"name": ""}, r"name=''; use 1 to 64 letters"),
        ({"act": "https://helpdesk"}, r"act='https://helpdesk'; give a function of one HandOff"),
        ({"where": "negative"}, r"where='negative'; give a function of one HandOff returning True"),
        ({"page_size": 0}, r"page_size=0; use 1 or more"),
        ({"page_size": True}, r"page_size=True; use 1 or more"),
    ],
)
def test_a_wrong_argument_is_refused_naming_it_and_what_to_give(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Consumer(**{"name": "tickets", "act": act, **kwargs})


def test_the_filter_decides_which_answers_it_wants_and_none_means_all() -> None:
    negative = HandOff("k1", "a1", "v1", {"sentiment": "negative"}, "i1")
    positive = HandOff("k2", "a2", "v1", {"sentiment": "positive"}, "i2")
    picky = Consumer("tickets", act, where=lambda h: h.output["sentiment"] == "negative")
    assert [picky.wants(negative), picky.wants(positive)] == [True, False]
    assert Consumer("tickets", act).wants(positive) and picky.sink_name == "tickets"
