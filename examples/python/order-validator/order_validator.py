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
import math
import re

from sharehost_guest import ConfigError, Plugin, accept, export, log, reject

_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
# serde_json refuses input nested deeper than this (its recursion limit, 128).
_MAX_DEPTH = 127
_SURROGATE = re.compile("[\ud800-\udfff]")
_INF = float("inf")


class NotJson(ValueError):
    """The value is not JSON as serde_json reads it."""


def _parse_int(s: str):
    # serde_json: u64 if it fits, else i64 if it fits, else f64 (an error if infinite);
    # `-0` is the float -0.0, not the integer 0. Length first: int() refuses 4300+ digits.
    if len(s) <= 21:
        v = int(s)
        if 0 <= v <= _U64_MAX and not (v == 0 and s.startswith("-")):
            return v
        if _I64_MIN <= v < 0:
            return v
    return _parse_float(s)


def _parse_float(s: str) -> float:
    try:
        return serde_f64(s)
    except OverflowError:
        raise NotJson(f"number out of range: {s}") from None


# serde_json's table of powers of ten: the doubles nearest 1e0 ... 1e308 (Rust's literals are
# correctly rounded, and so is Python's float()).
_POW10 = [float(f"1e{i}") for i in range(309)]
_I32_MAX = 2**31 - 1
_I32_MIN = -(2**31)


def serde_f64(literal: str) -> float:
    """The double serde_json 1.x (without its ``float_roundtrip`` feature, as in the Rust
    example) reads from a valid JSON number literal; raises :class:`OverflowError` where
    serde_json fails with "number out of range".

    Why not ``float(literal)``: serde_json's default float reader is fast, not correctly
    rounded. It gathers digits into a u64 significand while they fit (later integer digits
    only raise the exponent, later fraction digits are dropped), converts that to a double and
    multiplies or divides it once by a power of ten. With more than 15 digits, or a power
    beyond 1e22 (not exact as a double), that can land one unit in the last place away from the
    nearest double (``-307924402685.9952890786`` reads as ``-307924402685.99524``, not
    ``...9953``), and ``1.7976931348623158e308`` overflows. A
    negative price's reason prints that double, so this reads the same one. It follows
    serde_json's ``parse_integer``, ``parse_long_integer``, ``parse_decimal``,
    ``parse_exponent`` and ``f64_from_parts`` step by step.
    """
    neg = literal.startswith("-")
    body = literal[1:] if neg else literal
    mantissa, e_mark, exponent = body.replace("E", "e").partition("e")
    whole, _, fraction = mantissa.partition(".")
    if not e_mark:
        # Up to 15 digits: an exact significand and one exact power of ten, so one rounding:
        # serde's double is the correctly rounded one. An integer of at most 64 bits: serde
        # keeps it as an integer and `as f64` rounds correctly.
        if len(whole) + len(fraction) <= 15:
            return float(literal)
        if not fraction and len(whole) <= 20 and int(whole) <= _U64_MAX:
            return float(literal)

    # parse_integer, then parse_long_integer once the u64 would overflow: the integer digits
    # that did not fit only raise the exponent. (No leading zeros but a lone `0`, so a prefix
    # fits exactly when each of its digits did.)
    taken = min(len(whole), 20)
    sig = int(whole[:taken])
    if sig > _U64_MAX:
        taken -= 1
        sig = int(whole[:taken])
    exp = len(whole) - taken

    # parse_decimal: fraction digits join the significand until one would overflow it (even
    # after long integer digits); from then on the rest is ignored.
    if fraction:
        i = 0
        if sig == 0:
            i = len(fraction) - len(fraction.lstrip("0"))
        n = len(fraction)
        while i < n:
            nxt = sig * 10 + (ord(fraction[i]) - 48)
            if nxt > _U64_MAX:
                break
            sig = nxt
            i += 1
        exp -= i

    # parse_exponent, and parse_exponent_overflow for an exponent beyond i32.
    if e_mark:
        positive_exp = not exponent.startswith("-")
        digits = exponent.lstrip("+-").lstrip("0")
        if len(digits) > 10 or (digits and int(digits) > _I32_MAX):
            if sig != 0 and positive_exp:
                raise OverflowError("number out of range")
            return -0.0 if neg else 0.0
        e = int(digits) if digits else 0
        exp = min(exp + e, _I32_MAX) if positive_exp else max(exp - e, _I32_MIN)

    # f64_from_parts
    f = float(sig)
    while True:
        a = abs(exp)
        if a <= 308:
            if exp >= 0:
                f *= _POW10[a]
                if f == _INF:
                    raise OverflowError("number out of range")
            else:
                f /= _POW10[a]
            break
        if f == 0.0:
            break
        if exp >= 0:
            raise OverflowError("number out of range")
        f /= 1e308
        exp += 308
    return -f if neg else f


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
    UTF-16), no NaN/Infinity, integers as u64/i64 or else floats, floats rounded as serde_json
    rounds them (:func:`serde_f64`; out of range: an error), ``-0`` a float, lone surrogate
    escapes refused, at most 127 levels of nesting. Raises
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
    """``f`` formatted like Rust's ``{}`` for f64, as the Rust example prints a price: the
    shortest digits that read back as ``f`` (like ``repr``), but never an exponent and no
    ``.0`` on whole numbers (``-1.0`` -> ``-1``, ``1e20`` -> ``100000000000000000000``,
    ``1e-7`` -> ``0.0000001``), ``-0`` for minus zero.

    Why not just ``repr``: besides the layout, when ``f`` lies exactly halfway between two
    shortest candidates, ``repr`` picks the even last digit and Rust the larger magnitude
    (``-1140963860933227.25`` is ``-1140963860933227.2`` in Python, ``...227.3`` in Rust).
    """
    if f != f:
        return "NaN"
    if f == _INF:
        return "inf"
    if f == -_INF:
        return "-inf"
    sign = "-" if math.copysign(1.0, f) < 0 else ""
    a = abs(f)
    if a == 0.0:
        return sign + "0"
    # repr's shortest digits as `digits` x 10**exp, no leading or trailing zeros.
    mantissa, _, e = repr(a).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    exp = int(e or "0") - len(frac)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    digits = stripped
    # A tie: the exact value is `digits` followed by a 5. repr's digit is then even (at most
    # 8), so the larger candidate is the last digit plus one, with no carry.
    exact, exact_exp = _exact_decimal(a)
    if exact_exp == exp - 1 and exact == digits + "5":
        digits = digits[:-1] + chr(ord(digits[-1]) + 1)
    if exp >= 0:
        out = digits + "0" * exp
    elif len(digits) + exp > 0:
        point = len(digits) + exp
        out = digits[:point] + "." + digits[point:]
    else:
        out = "0." + "0" * -(len(digits) + exp) + digits
    return sign + out


def _exact_decimal(a: float):
    """The exact decimal value of a finite positive double (every double is one) as
    ``(digits, exp)`` with value ``int(digits) * 10**exp`` and no trailing zeros in
    ``digits``: what a formatting tie is checked against."""
    n, d = a.as_integer_ratio()
    k = d.bit_length() - 1  # d is 2**k
    # n / 2**k == n * 5**k / 10**k
    digits = str(n * 5**k)
    stripped = digits.rstrip("0")
    return stripped, len(digits) - len(stripped) - k


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
