from __future__ import annotations

import json
import math

import pytest

from batch_emulator import model


@pytest.mark.parametrize(
    ("text", "sentiment", "topic"),
    [
        ("I was charged twice and still have no refund", "negative", "billing"),
        ("The courier delivered the package early, great service", "positive", "delivery"),
        ("The app crashes at login after every update", "negative", "app_experience"),
        ("The support agent was friendly and helpful", "positive", "support"),
        ("The material feels cheap and the handle is broken", "negative", "product_quality"),
        ("I bought it on Tuesday", "neutral", "other"),
    ],
)
def test_classification_reads_sentiment_and_topic_from_keywords(
    text: str, sentiment: str, topic: str
) -> None:
    result = model.classify(text)
    assert (result["sentiment"], result["topic"]) == (sentiment, topic)
    assert 0.5 <= result["confidence"] <= 0.99
    assert result["topic"] in model.TOPICS


def test_the_task_is_chosen_from_the_system_prompt_and_the_output_format() -> None:
    review = "Terrible delivery, the parcel came late"
    assert model.respond("Rate the sentiment.", review).task == "classification"
    assert model.respond(None, review, json_mode=True).task == "classification"
    assert model.respond("Extract the invoice fields.", review).task == "extraction"
    summary = model.respond("Be brief.", review)
    assert summary.task == "summary"
    assert summary.text == "Summary: Terrible delivery, the parcel came late"
    assert json.loads(model.respond("Rate the sentiment.", review).text)["sentiment"] == "negative"


def test_invoice_extraction_finds_number_dates_amounts_currency_and_vendor() -> None:
    text = (
        "Invoice No: INV-2024-0042\nVendor: Acme Supplies Ltd\nIssued 2024-03-15, due 14/04/2024.\n"
        "Subtotal: $1,200.00 Tax: $240.00 Total due: $1,440.00"
    )
    result = model.extract_invoice(text)
    assert result["invoice_number"] == "INV-2024-0042"
    assert result["vendor"] == "Acme Supplies Ltd"
    assert result["dates"] == ["2024-03-15", "14/04/2024"]
    assert result["invoice_date"] == "2024-03-15"
    assert result["amounts"] == [1200.0, 240.0, 1440.0]
    assert result["total"] == 1440.0
    assert result["currency"] == "USD"


def test_invoice_extraction_leaves_absent_fields_empty() -> None:
    assert model.extract_invoice("nothing here") == {
        "invoice_number": None,
        "invoice_date": None,
        "dates": [],
        "amounts": [],
        "total": None,
        "currency": None,
        "vendor": None,
        "line_items": [],
    }
    euro = model.extract_invoice("Invoice #A17 from Müller GmbH on 3 March 2024: 99,50 EUR or 1.234,00 €")
    assert euro["invoice_number"] == "A17"
    assert euro["dates"] == ["3 March 2024"]
    assert euro["currency"] == "EUR"


def test_invoice_extraction_reads_each_billed_line_with_its_quantity_price_and_amount() -> None:
    text = (
        "Invoice No: INV-2025-000042\nVendor: Contoso Supplies\nItems:\n"
        "  Toner cartridge, black: 2 x €45.00 = €90.00\n"
        "  Printer paper, A4, 5 reams: 1 x €1,024.50 = €1,024.50\n"
        "  Consulting hours: 3 x CHF 120.00 = CHF 360.00\n"
        "Subtotal: €1,114.50\nTotal due: €1,337.40"
    )
    assert model.extract_invoice(text)["line_items"] == [
        {"description": "Toner cartridge, black", "quantity": 2, "unit_price": 45.0, "amount": 90.0},
        {"description": "Printer paper, A4, 5 reams", "quantity": 1, "unit_price": 1024.5, "amount": 1024.5},
        {"description": "Consulting hours", "quantity": 3, "unit_price": 120.0, "amount": 360.0},
    ]


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("Line: Toner cartridge, black", "office_supplies"),
        ("Line: Desk organiser set", "office_supplies"),  # a tie goes to the earlier category
        ("Line: Ergonomic office chair", "furniture"),
        ("Line: USB-C docking station", "it_hardware"),
        ("Line: Annual software licence", "software"),
        ("Line: Consulting hours", "services"),
        ("Line: Shipping and handling", "logistics"),
        ("Line: Gift basket", "other"),
    ],
)
def test_a_spend_category_prompt_gets_the_category_its_keywords_decide(line: str, category: str) -> None:
    reply = model.respond("Give the spend category of one line of a supplier invoice.", line)
    assert reply.task == "categorisation"
    answer = json.loads(reply.text)
    assert answer["category"] == category
    assert 0.5 <= answer["confidence"] <= 0.99


def test_tokens_are_a_quarter_of_the_utf8_bytes_rounded_up() -> None:
    assert model.count_tokens("") == 0
    assert model.count_tokens("abcd") == 1
    assert model.count_tokens("abcde") == 2
    assert model.count_tokens("é") == 1  # two bytes
    assert model.message_tokens("abcd") == 1 + model.MESSAGE_OVERHEAD_TOKENS


def test_cached_tokens_follow_openai_minimum_and_increment() -> None:
    assert model.cached_tokens(5000, seen_before=False) == 0
    assert model.cached_tokens(1023, seen_before=True) == 0
    assert model.cached_tokens(1024, seen_before=True) == 1024
    assert model.cached_tokens(1300, seen_before=True) == 1280
    assert model.cached_tokens(300, seen_before=True, min_tokens=100, increment=64) == 256


def test_answers_are_cut_at_max_output_tokens() -> None:
    reply = model.respond(None, "word " * 100, max_output_tokens=4)
    assert reply.truncated and reply.output_tokens <= 4
    assert not model.respond(None, "short", max_output_tokens=100).truncated


def test_embeddings_are_deterministic_unit_vectors_that_reflect_shared_words() -> None:
    a = model.embed("the parcel arrived late", 128)
    assert a == model.embed("the parcel arrived late", 128)
    assert len(a) == 128
    assert math.isclose(sum(v * v for v in a), 1.0, rel_tol=1e-9)
    similar = model.embed("the parcel arrived very late", 128)
    other = model.embed("excellent billing support", 128)

    def cos(x: list[float], y: list[float]) -> float:
        return sum(p * q for p, q in zip(x, y, strict=True))

    assert cos(a, similar) > cos(a, other)
    assert model.embed("", 8) == [1.0] + [0.0] * 7
    with pytest.raises(ValueError):
        model.embed("x", 0)
