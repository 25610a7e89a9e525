from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from datetime import date
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.core.tokens import estimate_request_tokens
from tests.support.scripts import load_script

ROOT = Path(__file__).parents[3]
SCRIPT = ROOT / "include" / "generate_feedback_data.py"
PROMPT = ROOT / "include" / "prompts" / "feedback_classification.yaml"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load_script(SCRIPT, "generate_feedback_data")


@pytest.fixture(scope="module")
def records(gen: ModuleType) -> list[dict[str, Any]]:
    return list(gen.generate(3000, 7))


@pytest.fixture(scope="module")
def prompt() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(PROMPT.read_text())
    return data


def test_the_same_seed_gives_the_same_records_and_another_seed_does_not(gen: ModuleType) -> None:
    assert list(gen.generate(200, 7)) == list(gen.generate(200, 7))
    assert list(gen.generate(200, 7)) != list(gen.generate(200, 8))
    assert list(gen.generate(50, 7)) == list(gen.generate(200, 7))[:50]


def test_records_have_the_documented_fields_and_shapes(
    gen: ModuleType, records: list[dict[str, Any]]
) -> None:
    assert len(records) == 3000
    assert records[0]["id"] == "cmt-000001"
    assert records[-1]["id"] == "cmt-003000"
    assert len({r["id"] for r in records}) == 3000
    for r in records:
        assert set(r) == {"id", "customer_id", "channel", "created_at", "product", "comment", "_truth"}
        assert re.fullmatch(r"cust-\d{5}", r["customer_id"])
        assert r["channel"] in {"email", "app_review", "chat", "survey"}
        date.fromisoformat(r["created_at"])
        assert r["product"] in gen.PRODUCTS
        assert r["product"] in r["comment"] or "store hours" in r["comment"]
        assert r["_truth"]["sentiment"] in gen.SENTIMENTS
        assert r["_truth"]["topic"] in gen.TOPICS


def test_every_label_and_channel_occurs_in_a_realistic_mix(records: list[dict[str, Any]]) -> None:
    sentiments = Counter(r["_truth"]["sentiment"] for r in records)
    topics = Counter(r["_truth"]["topic"] for r in records)
    channels = Counter(r["channel"] for r in records)
    assert set(sentiments) == {"positive", "negative", "neutral"}
    assert min(sentiments.values()) > 300
    assert len(topics) == 6 and min(topics.values()) > 200
    assert len(channels) == 4
    assert len({r["comment"] for r in records}) > 500


def test_the_truth_is_recoverable_from_whole_word_keywords(
    gen: ModuleType, records: list[dict[str, Any]]
) -> None:
    wrong = [r for r in records if gen.keyword_labels(r["comment"]) != r["_truth"]]
    assert wrong == []


def test_each_comment_holds_keywords_of_one_topic_and_one_sentiment_only(
    gen: ModuleType, records: list[dict[str, Any]]
) -> None:
    def hits(lists: dict[str, tuple[str, ...]], text: str) -> set[str]:
        return {
            label
            for label, words in lists.items()
            if any(re.search(rf"\b{re.escape(w)}\b", text, re.IGNORECASE) for w in words)
        }

    for r in records:
        truth = r["_truth"]
        assert hits(gen.TOPIC_KEYWORDS, r["comment"]) == ({truth["topic"]} - {"other"}), r
        assert hits(gen.SENTIMENT_KEYWORDS, r["comment"]) == {truth["sentiment"]}, r


def test_ensure_dataset_writes_once_and_leaves_an_existing_file_alone(
    gen: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "data" / "comments.jsonl"
    assert gen.ensure_dataset(path, 20, 7) == path
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == list(gen.generate(20, 7))
    path.write_text("kept\n")
    gen.ensure_dataset(path, 20, 7)
    assert path.read_text() == "kept\n"
    assert [p.name for p in path.parent.iterdir()] == ["comments.jsonl"]


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(
    gen: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(n: int, seed: int) -> Any:
        yield {"id": "cmt-000001"}
        raise RuntimeError("disk full")

    monkeypatch.setattr(gen, "generate", broken)
    with pytest.raises(RuntimeError):
        gen.ensure_dataset(tmp_path / "c.jsonl", 5, 7)
    assert list(tmp_path.iterdir()) == []


def test_the_cli_writes_the_requested_file(gen: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--n", "30", "--seed", "7"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == str(out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == list(gen.generate(30, 7))


def test_a_negative_count_is_refused(gen: ModuleType) -> None:
    with pytest.raises(ValueError, match="-1"):
        list(gen.generate(-1, 7))


# The prompt that classifies these comments.


def test_the_prompt_file_loads_and_renders_a_generated_record_into_a_request(
    prompt: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    template = PromptTemplate.from_yaml(PROMPT)
    assert template.output_format == "json"
    assert template.output_schema == prompt["output_schema"]
    request = template.render(records[0])
    r = records[0]
    assert request.messages[0]["content"] == f"Comment ({r['channel']}, {r['product']}): {r['comment']}"
    assert request.app_id == r["id"]
    assert request.model == "gpt-4o-mini"
    assert prompt["version"] == "v3"
    assert 200 <= estimate_request_tokens(request).cacheable <= 1000


def test_the_system_prompt_is_a_rubric_with_every_label_and_three_examples(
    gen: ModuleType, prompt: dict[str, Any]
) -> None:
    system = prompt["system"]
    assert "sentiment" in system
    for label in (*gen.SENTIMENTS, *gen.TOPICS):
        assert label in system
    examples = [json.loads(line) for line in system.splitlines() if line.startswith('{"sentiment"')]
    assert len(examples) == 3
    assert "{{" not in system


def test_the_output_schema_matches_the_generator_labels_and_the_response_format(
    gen: ModuleType, prompt: dict[str, Any]
) -> None:
    schema = prompt["output_schema"]
    response_format = prompt["params"]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "feedback_label"
    assert response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["schema"] == schema
    assert schema["properties"]["sentiment"]["enum"] == list(gen.SENTIMENTS)
    assert schema["properties"]["topic"]["enum"] == list(gen.TOPICS)
    assert schema["properties"]["confidence"]["type"] == "number"
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == ["confidence", "sentiment", "topic"]
    assert prompt["params"]["temperature"] == 0
    assert prompt["params"]["max_tokens"] == 60


def test_the_few_shot_examples_agree_with_the_keyword_labels(gen: ModuleType, prompt: dict[str, Any]) -> None:
    lines = prompt["system"].splitlines()
    pairs = [
        (lines[i], json.loads(lines[i + 1]))
        for i in range(len(lines) - 1)
        if lines[i].startswith("Comment (") and lines[i + 1].startswith("{")
    ]
    assert len(pairs) == 3
    for comment, label in pairs:
        text = comment.split("): ", 1)[1]
        assert gen.keyword_labels(text) == {"sentiment": label["sentiment"], "topic": label["topic"]}
