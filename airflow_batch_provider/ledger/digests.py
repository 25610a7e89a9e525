"""What a delivery row is keyed and compared by: the idempotency key of an item for one sink, the digest of its values.

- :func:`delivery_key` (:func:`delivery_keys` for many items of one sink): the stable key of one
  item and prompt version for one sink or consumer, the one a consumer hands to other APIs;
- :func:`values_sha256`: the digest of the values a sink writes for one item (its JSON object,
  keys sorted), recorded with the row so that a later delivery leaves out what the sink holds;
  :func:`value_json` and :func:`text_sha256` let a mapping compiled once per sink
  (:mod:`airflow_batch_provider.sinks.row_map`) write the same JSON member by member.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final


def json_writer(
    item_separator: str, key_separator: str, sort_keys: bool, finite: bool = False
) -> Callable[[Any], str]:
    """A function that writes a value's JSON as ``json.JSONEncoder`` with these settings does.

    Text as is (``ensure_ascii=False``), anything JSON has no type for as ``str``. The C encoder
    is made once here (``JSONEncoder.encode`` makes one per call: half a digest's time), without
    the circular-reference check (the values written are trees); the Python encoder where the
    interpreter has no C one.

    :param item_separator: between items (``", "`` or ``","``)
    :param key_separator: between a key and its value (``": "`` or ``":"``)
    :param sort_keys: whether an object's members are written in key order
    :param finite: raise ``ValueError`` on a NaN or an infinity (RFC 8259 JSON has none), instead
        of writing ``NaN`` or ``Infinity`` as Python's ``json`` does
    """
    if c_make_encoder is None:
        return json.JSONEncoder(  # type: ignore[no-any-return]
            sort_keys=sort_keys,
            ensure_ascii=False,
            default=str,
            separators=(item_separator, key_separator),
            allow_nan=not finite,
        ).encode
    encode = c_make_encoder(
        None, str, encode_basestring, None, key_separator, item_separator, sort_keys, False, not finite
    )

    def write(value: Any) -> str:
        return "".join(encode(value, 0))

    return write


#: The digest's JSON: keys sorted, text as is, anything else as ``str`` (made once, not per row).
_digest_json: Final = json_writer(", ", ": ", sort_keys=True)


def delivery_key(workload: str, sink: str, app_id: str, prompt_version: str) -> str:
    """The stable idempotency key of one item and prompt version for one sink or consumer.

    :param workload: workload name
    :param sink: the sink's or consumer's name
    :param app_id: the item's application id
    :param prompt_version: the prompt version of the answer
    """
    return delivery_keys(workload, sink)(app_id, prompt_version)


def delivery_keys(workload: str, sink: str) -> Callable[[str, str], str]:
    """:func:`delivery_key` of one workload and sink, for many items: their part hashed once.

    :param workload: workload name
    :param sink: the sink's or consumer's name
    """
    start = hashlib.sha256("\x1f".join((workload, sink, "")).encode("utf-8"))

    def key(app_id: str, prompt_version: str) -> str:
        digest = start.copy()
        digest.update(f"{app_id}\x1f{prompt_version}".encode())
        return digest.hexdigest()[:32]

    return key


def values_sha256(values: Mapping[str, Any]) -> str:
    """The digest of the values a sink writes for one item (keys sorted, JSON).

    :param values: column -> value
    """
    return text_sha256(_digest_json(values if isinstance(values, dict) else dict(values)))


def value_json(value: Any) -> str:
    """One value's JSON text exactly as :func:`values_sha256` writes it inside its object.

    For a digest written out once per sink (:mod:`airflow_batch_provider.sinks.row_map`): a
    string, an ``int`` and a finite ``float`` directly (what the encoder calls for them), anything
    else through the digest's encoder itself.

    :param value: a key's or a column's value
    """
    kind = type(value)
    if kind is str:
        return encode_basestring(value)  # type: ignore[no-any-return]
    if kind is int:
        return int.__repr__(value)
    if kind is float and value - value == 0.0:  # finite: NaN and the infinities go to the encoder
        return float.__repr__(value)
    return _digest_json(value)


def text_sha256(text: str) -> str:
    """The digest of a JSON text (what :func:`values_sha256` returns for the object it wrote).

    :param text: the JSON text
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
