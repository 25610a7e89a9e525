"""Per-model token prices and the cost of one request's usage.

The shipped table (``airflow_batch_provider/data/pricing.json``) lists each provider's
STANDARD (synchronous) list prices in USD per million tokens, with the date they were read
(``as_of``) and the page they came from. Batch prices are not listed: they are derived.

Cost rule:

- batch price = standard price x the provider's ``batch_discount`` (0.5 for OpenAI, Anthropic,
  Gemini and Bedrock; 1 for self-hosted vLLM, whose tokens cost 0 and whose GPU time is counted
  separately through ``gpu_hour_usd``);
- cache reads are priced at ``cached_input`` (typically 0.1 x input) and cache writes at
  ``cache_write`` (the 5-minute write, 1.25 x input at Anthropic; equal to input where the
  provider does not charge for writes); BOTH stack with the batch discount in batch mode, so a
  cache read in a batch costs 0.5 x 0.1 = 0.05 x the standard input price;
- ``Usage.input_tokens`` excludes cache reads and writes, so the four token counts are disjoint
  and each is billed once.

Amounts are :class:`~decimal.Decimal` throughout; round only for display.

Prices change. Correct a figure, or add a fine-tuned or new model, without a release: pass an
override (a JSON file, JSON text, or the Airflow config value, which the caller reads and passes
in as a string) to :meth:`PriceTable.load`. The override has the shape of the shipped file and
only the keys it changes::

    {"providers": {"openai": {"models": {"ft:gpt-4o-mini:acme": {"input": 0.30, "output": 1.20}}}}}

A new model needs ``input`` and ``output``; ``cached_input`` and ``cache_write`` default to
``input`` (no cache discount assumed, so a cost is never understated). A new provider's
``batch_discount`` defaults to 1 (no discount assumed).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from airflow_batch_provider.core.results import Usage
from airflow_batch_provider.exceptions import PricingError

PriceMode = Literal["batch", "sync"]
PRICE_MODES: Final[tuple[str, ...]] = get_args(PriceMode)

#: Tokens per pricing unit: prices are quoted per million tokens.
PER_TOKENS: Final = Decimal(1_000_000)
#: The key of a provider's catch-all entry (any model name, e.g. self-hosted vLLM).
WILDCARD: Final = "*"
#: What may follow a table key in a longer model name that still has the key's price: a
#: separator, then a date or build number (3+ digits), a version (``v1``) or ``latest``. Other
#: suffixes name other models (``gemini-2.5-flash-lite``, ``gpt-4o-audio-preview``) and must not
#: silently take the shorter name's price.
_SNAPSHOT_SUFFIX: Final = re.compile(r"[-@:](?:\d{3,}|v\d|latest(?:$|[-@:]))")
#: Bedrock cross-region inference profile prefixes, stripped before lookup.
_GEO_PREFIXES: Final = ("us.", "eu.", "apac.", "global.", "us-gov.", "jp.", "au.", "ca.")
_PRICE_FIELDS: Final = ("input", "cached_input", "cache_write", "output")
#: a row may name its own page and date (``source_url``, ``checked``) where it was read apart from
#: its provider's page; the table is then as old as the oldest of all those dates.
_MODEL_KEYS: Final = frozenset({*_PRICE_FIELDS, "notes", "source_url", "checked"})
_PROVIDER_KEYS: Final = frozenset(
    {"batch_discount", "gpu_hour_usd", "source", "source_url", "checked", "notes", "models"}
)
_TABLE_KEYS: Final = frozenset({"as_of", "currency", "unit", "notes", "providers"})
_FIX: Final = (
    "add or correct it in a pricing override file (same shape as airflow_batch_provider/data/"
    "pricing.json) or the Airflow config [batch_provider] pricing_override"
)


@dataclass(frozen=True)
class ModelPrice:
    """One model's standard prices in USD per million tokens, and its provider's batch discount.

    :param provider: provider name (``openai``, ``anthropic``, ``gemini``, ``bedrock``, ``vllm``)
    :param model: the model name that was looked up
    :param input: price of uncached input tokens
    :param cached_input: price of input tokens read from the prompt cache
    :param cache_write: price of input tokens written to the prompt cache (5-minute write)
    :param output: price of output tokens
    :param batch_discount: multiplier applied to every price in batch mode (0.5 = half price)
    :param matched: the table key that matched (differs from ``model`` for dated snapshots)
    """

    provider: str
    model: str
    input: Decimal
    cached_input: Decimal
    cache_write: Decimal
    output: Decimal
    batch_discount: Decimal = Decimal(1)
    matched: str = ""

    def multiplier(self, mode: PriceMode) -> Decimal:
        """Return the factor applied to standard prices in ``mode``.

        :param mode: ``batch`` or ``sync``
        :raises PricingError: ``mode`` is neither
        """
        if mode == "batch":
            return self.batch_discount
        if mode == "sync":
            return Decimal(1)
        raise PricingError(f"price mode {mode!r} is not one of {list(PRICE_MODES)}: pass 'batch' or 'sync'.")


@dataclass(frozen=True)
class ProviderPricing:
    """One provider's models and batch discount.

    :param name: provider name
    :param batch_discount: multiplier for batch prices (0.5 = half price)
    :param models: model key -> price
    :param gpu_hour_usd: hourly GPU cost for self-hosted providers, when configured
    :param source: where the figures come from
    :param notes: what the figures include and leave out
    :param source_url: the provider's public pricing page the figures were read from
    :param checked: the ISO date they were read there (``""``: not stated)
    """

    name: str
    batch_discount: Decimal
    models: Mapping[str, ModelPrice]
    gpu_hour_usd: Decimal | None = None
    source: str = ""
    notes: str = ""
    source_url: str = ""
    checked: str = ""


def cost(usage: Usage, price: ModelPrice, mode: PriceMode) -> Decimal:
    """Return the exact USD cost of ``usage`` at ``price`` in ``mode``.

    ``(input x input price + cache reads x cached_input + cache writes x cache_write + output x
    output price) / 1,000,000``, times the batch discount in batch mode. Not rounded.

    :param usage: tokens billed for the request(s)
    :param price: the model's prices
    :param mode: ``batch`` (discounted) or ``sync`` (standard price)
    :raises PricingError: ``mode`` is neither ``batch`` nor ``sync``
    """
    factor = price.multiplier(mode)
    standard = (
        usage.input_tokens * price.input
        + usage.cached_input_tokens * price.cached_input
        + usage.cache_write_tokens * price.cache_write
        + usage.output_tokens * price.output
    )
    return standard * factor / PER_TOKENS


def decimal_str(amount: Decimal) -> str:
    """Return an exact amount as plain decimal text without trailing zeros (``6000``, ``0.0000005``).

    :param amount: the amount
    """
    text = format(amount.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def format_usd(amount: Decimal, places: int = 2) -> str:
    """Round an amount half up for display only, e.g. ``$1,234.57``.

    An amount under a cent keeps its first two significant digits (``$0.0042``, not ``$0.00``),
    so a small run's report does not read as free.

    :param amount: the exact amount
    :param places: decimal places to show (at least; more for an amount under a cent)
    """
    if amount and abs(amount) < Decimal("0.01"):
        places = min(max(places, 1 - abs(amount).adjusted()), 12)
    quantum = Decimal(1).scaleb(-places)
    rounded = amount.quantize(quantum, rounding=ROUND_HALF_UP)
    sign = "-" if rounded < 0 else ""
    return f"{sign}${abs(rounded):,.{places}f}"


@dataclass(frozen=True)
class PriceTable:
    """The price of every known model, by provider.

    :param as_of: the date the figures were read from the providers' pages: the table's own
        ``as_of``, else the oldest ``checked`` date of its providers and rows
    :param providers: provider name -> its pricing
    :param currency: currency of every figure
    :param sources: what was merged to make the table (``shipped``, then each override)
    """

    as_of: str
    providers: Mapping[str, ProviderPricing]
    currency: str = "USD"
    sources: tuple[str, ...] = field(default=("shipped",))

    @classmethod
    def load(cls, override: str | Path | Mapping[str, Any] | None = None) -> PriceTable:
        """Load the shipped table and merge ``override`` over it.

        :param override: ``None``; a mapping; a path to a JSON file; or a string holding either
            JSON text (starting with ``{``) or a path (the Airflow config value, as read by the
            caller)
        :raises PricingError: the override cannot be read, or a key or value in it is malformed
            (the message names the key)
        """
        base = _shipped_raw()
        if override is None:
            return cls.from_dict(base, sources=("shipped",))
        raw_override, label = _read_override(override)
        _validate(raw_override, label, base=base)
        merged = _merge(base, raw_override)
        return cls.from_dict(merged, sources=("shipped", label))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], sources: tuple[str, ...] = ("custom",)) -> PriceTable:
        """Build a table from a complete mapping in the shape of ``pricing.json``.

        :param raw: the mapping
        :param sources: labels of what the mapping was made from
        :raises PricingError: a key or value is malformed (the message names the key)
        """
        label = " + ".join(sources)
        _validate(raw, label, base=None)
        providers: dict[str, ProviderPricing] = {}
        for pname, praw in raw["providers"].items():
            discount = _decimal(praw.get("batch_discount", 1), f"providers.{pname}.batch_discount", label)
            gpu = praw.get("gpu_hour_usd")
            models: dict[str, ModelPrice] = {}
            for mname, mraw in praw.get("models", {}).items():
                key = f"providers.{pname}.models.{mname}"
                inp = _decimal(mraw["input"], f"{key}.input", label)
                models[mname] = ModelPrice(
                    provider=pname,
                    model=mname,
                    input=inp,
                    cached_input=_decimal(mraw.get("cached_input", inp), f"{key}.cached_input", label),
                    cache_write=_decimal(mraw.get("cache_write", inp), f"{key}.cache_write", label),
                    output=_decimal(mraw["output"], f"{key}.output", label),
                    batch_discount=discount,
                    matched=mname,
                )
            providers[pname] = ProviderPricing(
                name=pname,
                batch_discount=discount,
                models=MappingProxyType(models),
                gpu_hour_usd=None if gpu is None else _decimal(gpu, f"providers.{pname}.gpu_hour_usd", label),
                source=str(praw.get("source", "")),
                notes=str(praw.get("notes", "")),
                source_url=str(praw.get("source_url", "")),
                checked=str(praw.get("checked", "")),
            )
        checked = sorted(_checked_dates(raw["providers"]))
        return cls(
            # a table is as old as its oldest dated row, unless it states one date for all (``as_of``)
            as_of=str(raw.get("as_of", checked[0] if checked else "unknown")),
            providers=MappingProxyType(providers),
            currency=str(raw.get("currency", "USD")),
            sources=sources,
        )

    def models(self, provider: str) -> tuple[str, ...]:
        """Return the model keys known for ``provider``, sorted.

        :param provider: provider name
        :raises PricingError: the provider is unknown
        """
        return tuple(sorted(self._provider(provider, model=None).models))

    def gpu_hour_usd(self, provider: str) -> Decimal | None:
        """Return the configured hourly GPU cost of a self-hosted provider, if any.

        :param provider: provider name
        :raises PricingError: the provider is unknown
        """
        return self._provider(provider, model=None).gpu_hour_usd

    def price(self, provider: str, model: str) -> ModelPrice:
        """Return the price of ``model`` at ``provider``.

        Lookup order: the exact name; the longest key that the name continues with a snapshot
        suffix, i.e. ``-``, ``@`` or ``:`` and then a date or build number of 3+ digits, ``v<n>``
        or ``latest`` (``gpt-4o-mini-2024-07-18`` -> ``gpt-4o-mini``,
        ``amazon.nova-lite-v1:0`` -> ``amazon.nova-lite``; but ``gemini-2.5-flash-lite`` does not
        take ``gemini-2.5-flash``'s price); the same two with a Bedrock cross-region prefix
        (``us.``, ``eu.`` ...) removed; the provider's ``*`` entry.

        :param provider: provider name
        :param model: model name as sent to the provider
        :raises PricingError: the provider or the model is unknown; the message names the
            closest known models and how to add a price
        """
        pricing = self._provider(provider, model)
        candidates = [model]
        for geo in _GEO_PREFIXES:
            if model.startswith(geo) and len(model) > len(geo):
                candidates.append(model[len(geo) :])
        for name in candidates:
            key = _match(name, pricing.models)
            if key is not None:
                found = pricing.models[key]
                return ModelPrice(
                    provider=provider,
                    model=model,
                    input=found.input,
                    cached_input=found.cached_input,
                    cache_write=found.cache_write,
                    output=found.output,
                    batch_discount=found.batch_discount,
                    matched=key,
                )
        if WILDCARD in pricing.models:
            found = pricing.models[WILDCARD]
            return ModelPrice(
                provider=provider,
                model=model,
                input=found.input,
                cached_input=found.cached_input,
                cache_write=found.cache_write,
                output=found.output,
                batch_discount=found.batch_discount,
                matched=WILDCARD,
            )
        known = sorted(pricing.models)
        closest = difflib.get_close_matches(model, known, n=3, cutoff=0.3) or known[:3]
        raise PricingError(
            f"no price for model {model!r} at provider {provider!r} (prices as of {self.as_of}); "
            f"closest known models: {', '.join(closest) or 'none'}. To price it, {_FIX}, e.g. "
            f'{{"providers": {{"{provider}": {{"models": {{"{model}": {{"input": ..., "output": ...}}}}}}}}}}.'
        )

    def _provider(self, provider: str, model: str | None) -> ProviderPricing:
        try:
            return self.providers[provider]
        except KeyError:
            what = f"model {model!r} at " if model is not None else ""
            raise PricingError(
                f"no prices for {what}provider {provider!r}; known providers: "
                f"{', '.join(sorted(self.providers))}. Check the provider name, or {_FIX}."
            ) from None


def _match(model: str, models: Mapping[str, ModelPrice]) -> str | None:
    if model in models:
        return model
    best: str | None = None
    for key in models:
        if key == WILDCARD or len(key) >= len(model):
            continue
        if (
            model.startswith(key)
            and _SNAPSHOT_SUFFIX.match(model, len(key))
            and (best is None or len(key) > len(best))
        ):
            best = key
    return best


@lru_cache(maxsize=1)
def _shipped_text() -> str:
    return (resources.files("airflow_batch_provider") / "data" / "pricing.json").read_text(encoding="utf-8")


def _shipped_raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_shipped_text(), parse_float=Decimal)
    return data


def _read_override(override: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(override, Mapping):
        return dict(override), "pricing override (mapping)"
    if isinstance(override, str) and override.lstrip().startswith("{"):
        text, label = override, "pricing override (JSON text)"
    else:
        path = Path(override).expanduser()
        label = f"pricing override file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PricingError(
                f"{label} cannot be read ({exc.strerror or exc}); give the path of a JSON file in the "
                "shape of airflow_batch_provider/data/pricing.json, or JSON text starting with '{'."
            ) from exc
    try:
        data = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise PricingError(
            f"{label} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; fix the JSON."
        ) from exc
    if not isinstance(data, dict):
        raise PricingError(
            f"{label} must be a JSON object with a 'providers' key, got {type(data).__name__}."
        )
    return data, label


def _decimal(value: Any, key: str, label: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise PricingError(
            f"{label}: {key} = {value!r} is not a number; give a price such as 0.15 or '0.15'."
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PricingError(f"{label}: {key} = {value!r} is not finite; give a price such as 0.15.")
        value = str(value)
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise PricingError(
            f"{label}: {key} = {value!r} is not a number; give a price such as 0.15 or '0.15'."
        ) from None
    if not amount.is_finite() or amount < 0:
        raise PricingError(f"{label}: {key} = {value!r} must be a finite number >= 0.")
    return amount


def _check_mapping(value: Any, key: str, label: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PricingError(f"{label}: {key} must be a JSON object, got {type(value).__name__} {value!r}.")
    return value


def _check_keys(raw: Mapping[str, Any], allowed: frozenset[str], key: str, label: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        where = f"{key}." if key else ""
        raise PricingError(
            f"{label}: unknown key {where}{unknown[0]}; allowed keys here: {', '.join(sorted(allowed))}."
        )


def _validate(raw: Mapping[str, Any], label: str, base: Mapping[str, Any] | None) -> None:
    """Check shape and values; with ``base``, ``raw`` is a partial override of ``base``."""
    _check_mapping(raw, "the top level", label)
    _check_keys(raw, _TABLE_KEYS, "", label)
    if base is None and "providers" not in raw:
        raise PricingError(f"{label}: missing key 'providers'; a price table needs one.")
    providers = _check_mapping(raw.get("providers", {}), "providers", label)
    base_providers: Mapping[str, Any] = base.get("providers", {}) if base is not None else {}
    for pname, praw in providers.items():
        pkey = f"providers.{pname}"
        praw = _check_mapping(praw, pkey, label)
        _check_keys(praw, _PROVIDER_KEYS, pkey, label)
        if "batch_discount" in praw:
            discount = _decimal(praw["batch_discount"], f"{pkey}.batch_discount", label)
            if discount > 1:
                raise PricingError(
                    f"{label}: {pkey}.batch_discount = {praw['batch_discount']!r} is above 1; it is the "
                    "multiplier of standard prices in batch mode (0.5 = half price)."
                )
        if praw.get("gpu_hour_usd") is not None:
            _decimal(praw["gpu_hour_usd"], f"{pkey}.gpu_hour_usd", label)
        if "checked" in praw:
            _check_date(praw["checked"], f"{pkey}.checked", label)
        models = _check_mapping(praw.get("models", {}), f"{pkey}.models", label)
        base_models: Mapping[str, Any] = base_providers.get(pname, {}).get("models", {})
        for mname, mraw in models.items():
            mkey = f"{pkey}.models.{mname}"
            mraw = _check_mapping(mraw, mkey, label)
            _check_keys(mraw, _MODEL_KEYS, mkey, label)
            for fname in _PRICE_FIELDS:
                if fname in mraw:
                    _decimal(mraw[fname], f"{mkey}.{fname}", label)
            if "checked" in mraw:
                _check_date(mraw["checked"], f"{mkey}.checked", label)
            if mname not in base_models:
                for required in ("input", "output"):
                    if required not in mraw:
                        raise PricingError(
                            f"{label}: {mkey}.{required} is missing; a model the table does not know yet "
                            "needs at least 'input' and 'output' (USD per million tokens)."
                        )


def _checked_dates(providers: Mapping[str, Any]) -> list[str]:
    """Return every stated ``checked`` date of the providers and of their rows."""
    dates = [str(praw["checked"]) for praw in providers.values() if praw.get("checked")]
    for praw in providers.values():
        dates += [str(m["checked"]) for m in praw.get("models", {}).values() if m.get("checked")]
    return dates


def _check_date(value: Any, key: str, label: str) -> None:
    try:
        date.fromisoformat(str(value))
    except ValueError:
        raise PricingError(
            f"{label}: {key} = {value!r} is not an ISO date (YYYY-MM-DD); give the date the figures "
            "were read from the provider's source_url."
        ) from None


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in base.items() if k != "providers"}
    merged.update({k: v for k, v in override.items() if k != "providers"})
    providers: dict[str, Any] = {
        p: {**v, "models": dict(v.get("models", {}))} for p, v in base.get("providers", {}).items()
    }
    for pname, praw in override.get("providers", {}).items():
        target = providers.setdefault(pname, {"models": {}})
        target.update({k: v for k, v in praw.items() if k != "models"})
        for mname, mraw in praw.get("models", {}).items():
            target["models"][mname] = {**target["models"].get(mname, {}), **mraw}
    merged["providers"] = providers
    return merged
