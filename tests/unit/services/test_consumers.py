"""A consumer's hand-offs against the real ledger (SQLite and PostgreSQL): each answer acted on once per key.

The answers are published the way the tasks publish them (:mod:`tests.unit.ledger.nights`); the
consumer is a :class:`~airflow_batch_provider.sinks.consumer.Consumer` whose function records what
it was handed, as the external system would.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import delivery_rows
from airflow_batch_provider.ledger.digests import delivery_key
from airflow_batch_provider.ledger.handoffs import HandOff, handoff_states
from airflow_batch_provider.ledger.refused_review import refused_review_rows
from airflow_batch_provider.services.consumers import consume
from airflow_batch_provider.sinks.consumer import Consumer
from tests.unit.ledger.nights import night
from tests.unit.services.consume_worker import CONSUMER

WL = "handoffs"
REPO = Path(__file__).resolve().parents[3]
MOODS = {"a0": "negative", "a1": "positive", "a2": "negative", "a3": "neutral", "a4": "negative"}
INPUTS = {app: f"comment {app}" for app in MOODS}
OUTPUTS = {app: {"sentiment": mood} for app, mood in MOODS.items()}


class Recorder:
    """The external system: every call's key, and a set of app ids whose call fails."""

    def __init__(self, failing: set[str] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failing = failing or set()
        self.judged: list[str] = []

    def act(self, handoff: HandOff) -> None:
        if handoff.app_id in self.failing:
            raise ConnectionError(f"helpdesk answered 503 for {handoff.app_id}")
        self.calls.append((handoff.app_id, handoff.key))

    def negative(self, handoff: HandOff) -> bool:
        self.judged.append(handoff.app_id)
        return bool(handoff.output["sentiment"] == "negative")


def keys(app_ids: Any, version: str = "v1") -> dict[str, str]:
    return {app: delivery_key(WL, CONSUMER, app, version) for app in app_ids}


def test_each_answer_is_acted_on_once_with_its_key_and_a_cleared_try_acts_on_nothing(ledger: Ledger) -> None:
    night(ledger, WL, "r1", INPUTS, outputs=OUTPUTS)
    seen = Recorder()
    first = consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, page_size=2))
    assert (first.acted, first.failed, first.left_out) == (5, 0, 0)
    assert dict(seen.calls) == keys(MOODS)  # one call per answer, with the item's own key
    again = consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, page_size=2))
    assert (again.acted, len(seen.calls)) == (0, 5)
    assert handoff_states(ledger, WL, CONSUMER, "r1") == {"acknowledged": 5}


def test_the_filter_leaves_answers_out_once_and_judges_one_again_only_when_its_answer_changed(
    ledger: Ledger,
) -> None:
    night(ledger, WL, "r1", INPUTS, outputs=OUTPUTS)
    seen = Recorder()
    counts = consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, where=seen.negative))
    assert (counts.acted, counts.left_out) == (3, 2)
    assert sorted(app for app, _ in seen.calls) == ["a0", "a2", "a4"]
    seen.judged.clear()
    assert consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, where=seen.negative)).left_out == 0
    assert seen.judged == []  # neither acted on nor left out again: not offered at all
    # a3's comment was edited and its answer, under the same prompt version, is negative now
    night(ledger, WL, "r2", {**INPUTS, "a3": "edited"}, outputs={"a3": {"sentiment": "negative"}})
    consume(ledger, WL, "r2", Consumer(CONSUMER, seen.act, where=seen.negative))
    assert seen.judged == ["a3"] and seen.calls[-1] == ("a3", keys(["a3"])["a3"])
    assert len(seen.calls) == 4 and handoff_states(ledger, WL, CONSUMER, "r2") == {
        "acknowledged": 4,
        "left_out": 1,
    }


def test_a_failed_call_is_recorded_with_its_message_for_review_and_offered_again_with_the_same_key(
    ledger: Ledger,
) -> None:
    night(ledger, WL, "r1", INPUTS, outputs=OUTPUTS)
    seen = Recorder(failing={"a1"})
    counts = consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, page_size=2))
    # the failure did not stop the page it was in, nor hold the pager at it
    assert (counts.acted, counts.failed) == (4, 1)
    assert counts.messages == ["a1: ConnectionError: helpdesk answered 503 for a1"]
    [listed] = refused_review_rows(ledger, WL)
    assert (listed.sink, listed.app_id, listed.error_code) == (CONSUMER, "a1", "sink_refused")
    assert listed.error_message == "ConnectionError: helpdesk answered 503 for a1"
    seen.failing.clear()
    retry = consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, page_size=2))
    assert (retry.acted, retry.failed) == (1, 0)
    assert seen.calls[-1] == ("a1", keys(["a1"])["a1"]) and len(seen.calls) == 5
    assert refused_review_rows(ledger, WL) == []


def test_a_filter_or_a_function_that_raises_fails_its_item_only(ledger: Ledger) -> None:
    night(ledger, WL, "r1", INPUTS, outputs={**OUTPUTS, "a2": ["not", "a", "mapping"]})
    seen = Recorder()
    counts = consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, where=seen.negative))
    assert (counts.acted, counts.left_out, counts.failed) == (2, 2, 1)
    assert counts.messages[0].startswith("a2: TypeError: ")


def test_a_new_prompt_version_is_a_new_key_for_its_answers_only(ledger: Ledger) -> None:
    night(ledger, WL, "r1", INPUTS, outputs=OUTPUTS)
    seen = Recorder()
    consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, where=seen.negative))
    night(ledger, WL, "r2", INPUTS, outputs=OUTPUTS, version="v2")
    consume(ledger, WL, "r2", Consumer(CONSUMER, seen.act, where=seen.negative))
    consume(ledger, WL, "r1", Consumer(CONSUMER, seen.act, where=seen.negative))  # run 1 cleared
    negative = ["a0", "a2", "a4"]
    assert seen.calls == [*keys(negative).items(), *keys(negative, "v2").items()]
    assert not set(keys(negative).values()) & set(keys(negative, "v2").values())


def test_a_kill_after_the_call_and_before_the_acknowledgement_repeats_that_key_once_and_no_new_one(
    ledger: Ledger, tmp_path: Path
) -> None:
    night(ledger, WL, "r1", INPUTS, outputs=OUTPUTS)
    log = tmp_path / "calls.log"
    url = ledger.engine.url.render_as_string(hide_password=False)
    command = [sys.executable, "-m", "tests.unit.services.consume_worker", url, WL, "r1", str(log)]
    env = {"ABP_FAILPOINTS": "consume.after_act=3"}
    killed = subprocess.run(command, cwd=REPO, env={**_env(), **env}, check=False, timeout=120)
    assert killed.returncode == -9
    assert len(log.read_text().splitlines()) == 3
    finished = subprocess.run(command, cwd=REPO, env=_env(), check=False, timeout=120)
    assert finished.returncode == 0
    calls = [tuple(line.split()) for line in log.read_text().splitlines()]
    counted = Counter(calls)
    # the third call's key, sent before the kill and not acknowledged, is sent again; no key is new
    assert set(counted) == set(keys(MOODS).items())
    assert [call for call, n in counted.items() if n > 1] == [calls[2]]
    assert {r["state"] for r in delivery_rows(ledger, WL, CONSUMER)} == {"acknowledged"}


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "ABP_FAILPOINTS"}
