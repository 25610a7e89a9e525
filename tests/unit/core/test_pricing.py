from __future__ import annotations

import json
import re
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.price_age import price_age_warning
from airflow_batch_provider.core.pricing import ModelPrice, PriceTable, cost, decimal_str, format_usd
from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.exceptions import PricingError

SHIPPED = Path(__file__).parents[3] / "airflow_batch_provider" / "data" / "pricing.json"


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load()


def test_shipped_table_states_its_date_and_a_source_for_every_provider(table: PriceTable) -> None:
    raw = json.loads(SHIPPED.read_text())
    assert "as_of" not in raw  # the date is each provider's own: the table is as old as the oldest
    rows = [m["checked"] for p in raw["providers"].values() for m in p["models"].values() if "checked" in m]
    assert table.as_of == min([p["checked"] for p in raw["providers"].values()] + rows)
    assert table.as_of[:4].isdigit()
    for name, provider in table.providers.items():
        assert provider.source, name
    for name in ("openai", "anthropic", "gemini", "bedrock"):
        assert table.providers[name].batch_discount == Decimal("0.5")


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("openai", "gpt-4o-mini"),
        ("openai", "gpt-4o"),
        ("openai", "gpt-4.1"),
        ("openai", "gpt-4.1-mini"),
        ("openai", "gpt-4.1-nano"),
        ("openai", "text-embedding-3-small"),
        ("openai", "text-embedding-3-large"),
        ("anthropic", "claude-sonnet-4"),
        ("anthropic", "claude-3-5-haiku"),
        ("anthropic", "claude-haiku-4-5"),
        ("anthropic", "claude-opus-4"),
        ("gemini", "gemini-2.5-flash"),
        ("gemini", "gemini-2.5-pro"),
        ("gemini", "gemini-embedding-001"),
        ("bedrock", "anthropic.claude-3-5-sonnet"),
        ("bedrock", "amazon.nova-lite"),
    ],
)
def test_every_required_model_has_a_price_with_cache_reads_no_dearer_than_input(
    table: PriceTable, provider: str, model: str
) -> None:
    price = table.price(provider, model)
    assert price.matched == model
    assert price.input > 0
    assert price.cached_input <= price.input <= price.cache_write


def test_claude_sonnet_4_is_priced_at_3_and_15_with_cache_read_030_and_write_375(table: PriceTable) -> None:
    price = table.price("anthropic", "claude-sonnet-4")
    assert (price.input, price.output, price.cached_input, price.cache_write) == (
        Decimal("3.00"),
        Decimal("15.00"),
        Decimal("0.30"),
        Decimal("3.75"),
    )


def test_a_dated_snapshot_matches_the_longest_prefix_at_a_boundary(table: PriceTable) -> None:
    assert table.price("openai", "gpt-4o-mini-2024-07-18").matched == "gpt-4o-mini"
    assert table.price("openai", "gpt-4o-2024-08-06").matched == "gpt-4o"
    assert table.price("openai", "gpt-4.1-nano-2025-04-14").matched == "gpt-4.1-nano"
    assert table.price("anthropic", "claude-sonnet-4-20250514").matched == "claude-sonnet-4"
    assert table.price("anthropic", "claude-opus-4-5-20251101").matched == "claude-opus-4-5"
    assert table.price("openai", "gpt-4o-mini-2024-07-18").model == "gpt-4o-mini-2024-07-18"


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("openai", "gpt-4oz"),
        ("openai", "gpt-4o-audio-preview"),
        ("gemini", "gemini-2.5-flash-lite"),
        ("anthropic", "claude-sonnet-4-7"),
    ],
)
def test_a_longer_name_that_is_another_model_does_not_take_the_prefix_price(
    table: PriceTable, provider: str, model: str
) -> None:
    with pytest.raises(PricingError, match=re.escape(model)):
        table.price(provider, model)


def test_version_suffixes_of_several_shapes_match(table: PriceTable) -> None:
    assert table.price("anthropic", "claude-3-5-haiku@20241022").matched == "claude-3-5-haiku"
    assert table.price("gemini", "gemini-2.5-flash-001").matched == "gemini-2.5-flash"
    assert table.price("anthropic", "claude-sonnet-4-latest").matched == "claude-sonnet-4"


def test_bedrock_ids_match_with_version_suffix_and_cross_region_prefix(table: PriceTable) -> None:
    assert table.price("bedrock", "anthropic.claude-3-5-sonnet-20241022-v2:0").matched == (
        "anthropic.claude-3-5-sonnet"
    )
    assert table.price("bedrock", "us.anthropic.claude-3-5-sonnet-20241022-v2:0").matched == (
        "anthropic.claude-3-5-sonnet"
    )
    assert table.price("bedrock", "amazon.nova-lite-v1:0").input == Decimal("0.06")


def test_self_hosted_vllm_prices_any_model_at_zero_per_token(table: PriceTable) -> None:
    price = table.price("vllm", "meta-llama/Llama-3.1-8B-Instruct")
    assert price.matched == "*"
    assert cost(Usage(10**9, 10**9), price, "batch") == 0
    assert table.gpu_hour_usd("vllm") is None


def test_the_emulator_prices_any_model_name_it_is_given(table: PriceTable) -> None:
    assert table.price("emulator", "whatever-model").matched == "*"
    assert table.price("emulator", "emulator-large").input == Decimal("3.00")


def test_an_unknown_model_error_names_the_model_provider_closest_models_and_fix(table: PriceTable) -> None:
    with pytest.raises(PricingError) as info:
        table.price("openai", "gpt-4o-mine")
    message = str(info.value)
    assert "'gpt-4o-mine'" in message
    assert "'openai'" in message
    assert "gpt-4o-mini" in message.split("closest known models:")[1]
    assert "override" in message
    assert "Airflow config" in message


def test_an_unknown_provider_error_lists_the_known_providers(table: PriceTable) -> None:
    with pytest.raises(PricingError, match="known providers: anthropic, bedrock"):
        table.price("opena1", "gpt-4o")


def test_an_override_mapping_adds_a_model_and_corrects_one_field_of_another() -> None:
    table = PriceTable.load(
        {
            "as_of": "2030-01-01",
            "providers": {
                "openai": {
                    "models": {
                        "ft:gpt-4o-mini:acme": {"input": "0.30", "output": 1.2},
                        "gpt-4o": {"output": 9},
                    }
                }
            },
        }
    )
    tuned = table.price("openai", "ft:gpt-4o-mini:acme")
    assert (tuned.input, tuned.output) == (Decimal("0.30"), Decimal("1.2"))
    assert tuned.cached_input == tuned.cache_write == Decimal("0.30")
    assert tuned.batch_discount == Decimal("0.5")
    gpt4o = table.price("openai", "gpt-4o")
    assert gpt4o.output == Decimal(9)
    assert gpt4o.input == Decimal("2.50")
    assert table.price("anthropic", "claude-sonnet-4").input == Decimal("3.00")
    assert table.as_of == "2030-01-01"
    assert table.sources == ("shipped", "pricing override (mapping)")


def test_an_override_file_and_json_text_from_the_airflow_config_both_merge(tmp_path: Path) -> None:
    body = {
        "providers": {"vllm": {"gpu_hour_usd": 2.49}, "acme": {"models": {"m1": {"input": 1, "output": 2}}}}
    }
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(body))
    from_file = PriceTable.load(path)
    from_text = PriceTable.load(json.dumps(body))
    from_path_string = PriceTable.load(str(path))
    for table in (from_file, from_text, from_path_string):
        assert table.gpu_hour_usd("vllm") == Decimal("2.49")
        assert table.price("acme", "m1").batch_discount == Decimal(1)
    assert "prices.json" in from_file.sources[1]


def test_loading_with_an_override_leaves_the_shipped_table_unchanged() -> None:
    PriceTable.load({"providers": {"openai": {"models": {"gpt-4o": {"input": 99}}}}})
    assert PriceTable.load().price("openai", "gpt-4o").input == Decimal("2.50")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (
            {"providers": {"openai": {"models": {"gpt-4o": {"input": "cheap"}}}}},
            "providers.openai.models.gpt-4o.input",
        ),
        (
            {"providers": {"openai": {"models": {"gpt-4o": {"input": -1}}}}},
            "providers.openai.models.gpt-4o.input",
        ),
        (
            {"providers": {"openai": {"models": {"gpt-4o": {"ouput": 1}}}}},
            "providers.openai.models.gpt-4o.ouput",
        ),
        (
            {"providers": {"openai": {"models": {"new-model": {"input": 1}}}}},
            "providers.openai.models.new-model.output",
        ),
        ({"providers": {"openai": {"batch_discount": 2}}}, "providers.openai.batch_discount"),
        ({"providers": {"openai": {"batch_discount": True}}}, "providers.openai.batch_discount"),
        ({"providers": {"openai": {"models": ["gpt-4o"]}}}, "providers.openai.models"),
        (
            {"providers": {"openai": {"models": {"gpt-4o": {"input": float("nan")}}}}},
            "providers.openai.models.gpt-4o",
        ),
        ({"provider": {}}, "provider"),
    ],
)
def test_a_malformed_override_raises_naming_the_key(override: dict[str, object], key: str) -> None:
    with pytest.raises(PricingError) as info:
        PriceTable.load(override)
    assert key in str(info.value)
    assert "pricing override" in str(info.value)


def test_an_override_that_is_not_json_or_not_a_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(PricingError, match="not valid JSON"):
        PriceTable.load('{"providers": ')
    with pytest.raises(PricingError, match="cannot be read"):
        PriceTable.load(tmp_path / "missing.json")
    not_an_object = tmp_path / "list.json"
    not_an_object.write_text("[1]")
    with pytest.raises(PricingError, match="must be a JSON object"):
        PriceTable.load(not_an_object)


def test_sync_cost_is_exact_per_token_arithmetic() -> None:
    price = ModelPrice(
        "p", "m", Decimal("0.1"), Decimal("0.2"), Decimal("0.3"), Decimal("0.4"), Decimal("0.5")
    )
    usage = Usage(input_tokens=1, cached_input_tokens=1, cache_write_tokens=1, output_tokens=1)
    assert cost(usage, price, "sync") == Decimal("0.000001")
    assert cost(usage, price, "batch") == Decimal("0.0000005")
    assert cost(Usage(input_tokens=1), price, "sync") + cost(
        Usage(output_tokens=1), price, "sync"
    ) == Decimal("0.0000005")


def test_tiny_amounts_are_not_rounded_away(table: PriceTable) -> None:
    price = table.price("openai", "gpt-4.1-nano")
    one_cached_token_in_batch = cost(Usage(cached_input_tokens=1), price, "batch")
    assert one_cached_token_in_batch == Decimal("0.025") * Decimal("0.5") / Decimal(1_000_000)
    assert one_cached_token_in_batch * 80_000_000 == Decimal(1)


def test_cache_reads_and_writes_stack_with_the_batch_discount(table: PriceTable) -> None:
    price = table.price("anthropic", "claude-sonnet-4")
    million = 1_000_000
    assert cost(Usage(cached_input_tokens=million), price, "batch") == Decimal("0.15")
    assert cost(Usage(cache_write_tokens=million), price, "batch") == Decimal("1.875")
    assert cost(Usage(cache_write_tokens=million), price, "sync") == Decimal("3.75")


def test_an_unknown_price_mode_is_refused(table: PriceTable) -> None:
    with pytest.raises(PricingError, match="'flex'"):
        cost(Usage(1), table.price("openai", "gpt-4o"), "flex")  # type: ignore[arg-type]


def test_format_usd_rounds_only_for_display() -> None:
    assert format_usd(Decimal("1234.565")) == "$1,234.57"
    assert format_usd(Decimal("0.0000125"), 6) == "$0.000013"
    assert format_usd(Decimal("-3")) == "-$3.00"


def test_decimal_text_is_exact_plain_and_without_trailing_zeros() -> None:
    assert decimal_str(Decimal("6000.000")) == "6000"
    assert decimal_str(Decimal("0.00000050")) == "0.0000005"
    assert decimal_str(Decimal("-0.0")) == "0"
    assert decimal_str(Decimal("3.75")) == "3.75"


def test_reasoning_tokens_are_billed_at_the_output_price(table: PriceTable) -> None:
    from decimal import Decimal

    from airflow_batch_provider.core.pricing import cost
    from airflow_batch_provider.core.results import Usage

    price = table.price("openai", "o4-mini-2025-04-16")
    assert price.matched == "o4-mini"
    # 100 visible output tokens and 900 reasoning tokens: 1,000 output tokens billed
    with_reasoning = Usage(input_tokens=1_000, output_tokens=1_000, reasoning_tokens=900)
    assert cost(with_reasoning, price, "sync") == (1_000 * price.input + 1_000 * price.output) / Decimal(
        1_000_000
    )
    assert cost(with_reasoning, price, "batch") == cost(with_reasoning, price, "sync") / 2


def test_moderations_are_priced_and_free(table: PriceTable) -> None:
    from decimal import Decimal

    from airflow_batch_provider.core.pricing import cost
    from airflow_batch_provider.core.results import Usage

    price = table.price("openai", "omni-moderation-latest")
    assert price.matched == "omni-moderation"
    assert cost(Usage(input_tokens=10_000), price, "sync") == Decimal(0)


def test_an_amount_under_a_cent_shows_its_first_two_significant_digits() -> None:
    assert format_usd(Decimal("0.0042")) == "$0.0042"
    assert format_usd(Decimal("0.00004631")) == "$0.000046"
    assert format_usd(Decimal("-0.005")) == "-$0.0050"
    assert format_usd(Decimal("0")) == "$0.00"
    assert format_usd(Decimal("0.01")) == "$0.01"


def test_every_priced_provider_names_its_public_pricing_page_and_the_date_it_was_read(
    table: PriceTable,
) -> None:
    for name, provider in table.providers.items():
        assert date.fromisoformat(provider.checked), name
        charges = any(p.input or p.output for p in provider.models.values())
        if charges:  # vllm is self-hosted: no per-token price, no page to read it from
            assert re.match(r"^https://[a-z0-9.-]+\.[a-z]{2,}/", provider.source_url), name


def _shipped_without_row_dates() -> dict[str, Any]:
    """The shipped table with only the providers' dates, for tests about those dates."""
    raw: dict[str, Any] = json.loads(SHIPPED.read_text())
    for provider in raw["providers"].values():
        for row in provider["models"].values():
            row.pop("checked", None)
            row.pop("source_url", None)
    return raw


def test_the_stale_price_warning_reads_the_oldest_checked_date_of_the_table() -> None:
    raw = _shipped_without_row_dates()
    raw["providers"]["openai"]["checked"] = "2026-11-30"
    raw["providers"]["anthropic"]["checked"] = "2026-06-01"
    for name in set(raw["providers"]) - {"openai", "anthropic"}:
        del raw["providers"][name]
    table = PriceTable.from_dict(raw)
    assert table.as_of == "2026-06-01"
    warning = price_age_warning(table.as_of, date(2026, 12, 1))
    assert warning and "prices as of 2026-06-01 are 183 days old" in warning


def test_a_checked_date_that_is_not_an_iso_date_is_refused_with_the_key_and_the_remedy() -> None:
    with pytest.raises(PricingError, match=r"providers\.openai\.checked = 'last week' is not an ISO date"):
        PriceTable.load({"providers": {"openai": {"checked": "last week"}}})


def test_a_row_checked_before_its_provider_makes_the_table_as_old_as_that_row() -> None:
    raw = _shipped_without_row_dates()
    raw["providers"] = {"anthropic": raw["providers"]["anthropic"]}
    raw["providers"]["anthropic"]["checked"] = "2026-12-02"
    row = raw["providers"]["anthropic"]["models"]["claude-haiku-4-5"]
    row["checked"] = "2026-03-01"
    row["source_url"] = "https://platform.claude.com/docs/en/about-claude/pricing"
    table = PriceTable.from_dict(raw)
    assert table.as_of == "2026-03-01"
    warning = price_age_warning(table.as_of, date(2026, 12, 2))
    assert warning and "prices as of 2026-03-01 are 276 days old" in warning


def test_a_row_checked_after_its_provider_leaves_the_table_as_old_as_the_provider() -> None:
    raw = _shipped_without_row_dates()
    raw["providers"] = {"openai": raw["providers"]["openai"]}
    raw["providers"]["openai"]["checked"] = "2026-01-15"
    raw["providers"]["openai"]["models"]["gpt-4o-mini"]["checked"] = "2026-12-02"
    assert PriceTable.from_dict(raw).as_of == "2026-01-15"


def test_a_row_checked_date_that_is_not_an_iso_date_is_refused_with_the_key_and_the_remedy() -> None:
    with pytest.raises(
        PricingError,
        match=r"providers\.openai\.models\.gpt-4o-mini\.checked = 'yesterday' is not an ISO date",
    ):
        PriceTable.load({"providers": {"openai": {"models": {"gpt-4o-mini": {"checked": "yesterday"}}}}})


def test_every_row_that_names_its_own_source_names_an_https_page_and_an_iso_date() -> None:
    raw = json.loads(SHIPPED.read_text())
    dated = 0
    for pname, provider in raw["providers"].items():
        for mname, row in provider["models"].items():
            if "checked" in row or "source_url" in row:
                dated += 1
                assert date.fromisoformat(row["checked"]), (pname, mname)
                assert re.match(r"^https://[a-z0-9.-]+\.[a-z]{2,}/", row["source_url"]), (pname, mname)
    assert dated  # the re-checked rows say where and when
