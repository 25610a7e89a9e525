from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.settings import default_ledger_url, default_staging_root, get_setting


def test_a_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__POLL_FACTOR", "2.5")
    assert get_setting("poll_factor", "1.5") == "2.5"


def test_an_unset_setting_falls_back_to_its_default() -> None:
    assert get_setting("no_such_option_anywhere", "fallback") == "fallback"


def test_the_embedded_defaults_live_in_airflow_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", raising=False)
    monkeypatch.delenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert default_ledger_url() == f"sqlite:///{tmp_path / 'batch_ledger.sqlite'}"
    assert default_staging_root() == f"file://{tmp_path / 'batch_staging'}"


def test_the_price_table_takes_the_override_file_named_in_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from decimal import Decimal

    from airflow_batch_provider.settings import load_prices

    override = tmp_path / "prices.json"
    override.write_text('{"providers": {"openai": {"models": {"in-house-ft": {"input": 0.5, "output": 2}}}}}')
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__PRICING_OVERRIDE", str(override))
    price = load_prices().price("openai", "in-house-ft")
    assert (price.input, price.output) == (Decimal("0.5"), Decimal("2"))
    monkeypatch.delenv("AIRFLOW__BATCH_PROVIDER__PRICING_OVERRIDE")
    with pytest.raises(Exception, match="in-house-ft"):
        load_prices().price("openai", "in-house-ft")
