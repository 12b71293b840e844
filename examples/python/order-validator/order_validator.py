"""Validates JSON orders and rejects malformed ones with a reason.

The Python twin of ``examples/order-validator`` (Rust): the same input gives the same verdicts
and the same reason strings. An order is a JSON object ``{"id": "...", "sku": "...",
"quantity": N, "price": X}`` with a non-empty ``id`` and ``sku``, ``quantity`` an integer in
``1..=max-quantity``, and ``price`` a non-negative number. Anything else is rejected (so it
never comes back, and lands in the dead-letter topic when one is configured).

Configuration: ``max-quantity`` (default 1000).

JSON is parsed like serde_json (the Rust example's parser) rather than like Python's defaults:
see :func:`parse_json` and the README's list of the differences that remain.
"""

import json
import re
from decimal import Decimal

from sharehost_guest import ConfigError, Plugin, accept, export, log, reject

_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
# serde_json refuses input nested deeper than this (its recursion limit, 128).
_MAX_DEPTH = 127
_SURROGATE = re.compile("[\ud800-\udfff]")


class NotJson(ValueError):
    """The value is not JSON as serde_json reads it."""


def _parse_int(s: str):
    # serde_json: u64 if it fits, else i64 if it fits, else f64 (an error if infinite);
    # `-0` is the float -0.0, not the integer 0.
    v = int(s)
    if 0 <= v <= _U64_MAX and not (v == 0 and s.startswith("-")):
        return v
    if _I64_MIN <= v < 0:
        return v
    return _parse_float(s)


def _parse_float(s: str) -> float:
    f = float(s)
    if f in (float("inf"), float("-inf")):
        raise NotJson(f"number out of range: {s}")
    return f


def _refuse_constant(name: str):
    raise NotJson(f"{name} is not JSON")


def _too_deep(raw: bytes) -> bool:
    """Whether brackets outside strings nest deeper than serde_json allows. Scanned before
    parsing, so hostile nesting never reaches the parser's recursion."""
    depth, in_string, escaped = 0, False, False
    for c in raw:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > _MAX_DEPTH:
                return True
        elif c in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def _strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)


def parse_json(raw: bytes):
    """Parses ``raw`` like ``serde_json::from_slice::<Value>``: strict UTF-8 (no BOM, no
    UTF-16), no NaN/Infinity, integers as u64/i64 or else floats (out of range: an error),
    ``-0`` a float, lone surrogate escapes refused, at most 127 levels of nesting. Raises
    :class:`NotJson` (or ``ValueError``) when serde_json would fail."""
    text = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if (raw.count(b"[") + raw.count(b"{")) > _MAX_DEPTH and _too_deep(raw):
        raise NotJson("recursion limit exceeded")
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_refuse_constant,
        )
    except RecursionError:
        raise NotJson("recursion limit exceeded") from None
    if b"\\u" in raw and any(_SURROGATE.search(s) for s in _strings(value)):
        raise NotJson("lone surrogate in a \\u escape")
    return value


def rust_float(f: float) -> str:
    """``f`` formatted like Rust's ``{}`` for f64: shortest round-trip digits, never an
    exponent, no ``.0`` on whole numbers (``-1.0`` -> ``-1``, ``1e20`` -> ``100000000000000000000``)."""
    s = format(Decimal(repr(f)), "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def parse_u64(s: str) -> int:
    """Parses like Rust's ``str::parse::<u64>`` (ASCII digits, optional ``+``); raises
    :class:`ValueError` with Rust's message otherwise."""
    if s == "":
        raise ValueError("cannot parse integer from empty string")
    digits = s[1:] if s.startswith("+") else s
    if digits == "" or not all("0" <= c <= "9" for c in digits):
        raise ValueError("invalid digit found in string")
    v = int(digits)
    if v > _U64_MAX:
        raise ValueError("number too large to fit in target type")
    return v


def _is_number(v) -> bool:
    return type(v) is int or type(v) is float


@export
class OrderValidator(Plugin):
    """The order validator."""

    def init(self, config):
        """Reads ``max-quantity`` (default 1000); a value that is not a u64 refuses the config."""
        s = config.get("max-quantity")
        if s is None:
            self.max_quantity = 1000
        else:
            try:
                self.max_quantity = parse_u64(s)
            except ValueError as e:
                raise ConfigError(f"max-quantity `{s}`: {e}") from None

    def check(self, value):
        """Checks one value: None when it is a valid order, else the rejection reason."""
        if value is None:
            return "null value (tombstone)"
        try:
            order = parse_json(value)
        except ValueError as e:
            # The reason is the same in every language; the parser's message goes to debug.
            log.debug(f"not JSON: {e}")
            return "not JSON"
        if not isinstance(order, dict):
            return "not a JSON object"
        for field in ("id", "sku"):
            s = order.get(field)
            if not isinstance(s, str):
                return f"`{field}` missing or not a string"
            if not s:
                return f"`{field}` is empty"
        quantity = order.get("quantity")
        if type(quantity) is not int or quantity < 0:
            return "`quantity` missing or not a non-negative integer"
        if quantity == 0 or quantity > self.max_quantity:
            return f"`quantity` {quantity} outside 1..={self.max_quantity}"
        price = order.get("price")
        if not _is_number(price):
            return "`price` missing or not a number"
        price = float(price)
        if not price >= 0.0:
            return f"`price` {rust_float(price)} is negative"
        return None

    def handle_record(self, record):
        """Accepts a valid order, rejects anything else with the reason."""
        reason = self.check(record.value)
        if reason is None:
            return accept()
        log.debug(f"offset {record.offset}: {reason}")
        return reject(reason)
