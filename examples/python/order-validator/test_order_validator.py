"""Native unit tests of the Python order validator (plain pytest, no Wasm)."""

import json
import math
import os
import random
import struct

import pytest

from sharehost_guest import ConfigError, accept, reject, testing

from order_validator import OrderValidator, _exact_decimal, parse_u64, rust_float, serde_f64

HERE = os.path.dirname(os.path.abspath(__file__))


def judge(value, max_quantity="10"):
    p = testing.instantiate(OrderValidator, {"max-quantity": max_quantity})
    return p.handle([testing.record(value)])[0]


def reason(value, **kw):
    v = judge(value, **kw)
    assert v.kind == "reject", f"expected a rejection of {value!r}, got {v!r}"
    return v.reason


def test_accepts_a_valid_order():
    assert judge(b'{"id":"o1","sku":"A-1","quantity":2,"price":9.5}') == accept()
    assert judge(b'{"id":"o1","sku":"A-1","quantity":10,"price":0}') == accept()
    assert judge(b' {"id":"o","sku":"A","quantity":1,"price":-0.0,"x":[1,{}]}\n') == accept()


def test_rejects_malformed_orders_with_the_rust_reasons():
    assert reason(None) == "null value (tombstone)"
    assert reason(b"{oops") == "not JSON"
    assert reason(b"[1]") == "not a JSON object"
    assert reason(b'"text"') == "not a JSON object"
    assert reason(b'{"sku":"A","quantity":1,"price":1}') == "`id` missing or not a string"
    assert reason(b'{"id":1,"sku":"A","quantity":1,"price":1}') == "`id` missing or not a string"
    assert reason(b'{"id":"","sku":"A","quantity":1,"price":1}') == "`id` is empty"
    assert reason(b'{"id":"o","sku":"","quantity":1,"price":1}') == "`sku` is empty"
    assert reason(b'{"id":"o","quantity":1,"price":1}') == "`sku` missing or not a string"
    assert reason(b'{"id":"o","sku":"A","quantity":11,"price":1}') == "`quantity` 11 outside 1..=10"
    assert reason(b'{"id":"o","sku":"A","quantity":0,"price":1}') == "`quantity` 0 outside 1..=10"
    assert reason(b'{"id":"o","sku":"A","quantity":1,"price":-1}') == "`price` -1 is negative"
    assert reason(b'{"id":"o","sku":"A","quantity":1,"price":-2.5}') == "`price` -2.5 is negative"
    assert reason(b'{"id":"o","sku":"A","quantity":1,"price":"1"}') == (
        "`price` missing or not a number"
    )
    assert reason(b'{"id":"o","sku":"A","quantity":1}') == "`price` missing or not a number"


NOT_AN_INTEGER_QUANTITY = "`quantity` missing or not a non-negative integer"


@pytest.mark.parametrize(
    "quantity", ["true", "false", "5.0", "1e2", "-1", "-0", "null", '"5"', "18446744073709551616"]
)
def test_quantity_is_an_integer_the_way_serde_json_reads_one(quantity):
    order = b'{"id":"o","sku":"A","quantity":%s,"price":1}' % quantity.encode()
    assert reason(order) == NOT_AN_INTEGER_QUANTITY


def test_quantity_up_to_u64_max_is_an_integer():
    order = b'{"id":"o","sku":"A","quantity":18446744073709551615,"price":1}'
    assert reason(order) == "`quantity` 18446744073709551615 outside 1..=10"


@pytest.mark.parametrize("price", ["true", "null", "[]"])
def test_booleans_are_not_prices(price):
    order = b'{"id":"o","sku":"A","quantity":1,"price":%s}' % price.encode()
    assert reason(order) == "`price` missing or not a number"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id":"o","sku":"A","quantity":1,"price":NaN}',
        b'{"id":"o","sku":"A","quantity":1,"price":Infinity}',
        b'{"id":"o","sku":"A","quantity":1,"price":1e400}',
        b'{"id":"o","sku":"A","quantity":1,"price":-1' + b"0" * 400 + b"}",
        b'\xef\xbb\xbf{"id":"o","sku":"A","quantity":1,"price":1}',
        '{"id":"o","sku":"A","quantity":1,"price":1}'.encode("utf-16"),
        b'{"id":"o\xff","sku":"A","quantity":1,"price":1}',
        b'{"id":"\\ud800","sku":"A","quantity":1,"price":1}',
        b'{"id":"o","sku":"A","quantity":1,"price":1,}',
        b"[" * 128 + b"]" * 128,
        b"[" * 100000,
        b"",
    ],
)
def test_what_serde_json_refuses_is_not_json(raw):
    assert reason(raw) == "not JSON"


def test_nesting_up_to_serde_json_limit_is_json():
    assert reason(b"[" * 127 + b"]" * 127) == "not a JSON object"
    deep = b'{"id":"o","sku":"A","quantity":1,"price":1,"x":' + b"[" * 126 + b"]" * 126 + b"}"
    assert judge(deep) == accept()
    in_string = b'{"id":"' + b"[" * 300 + b'","sku":"A","quantity":1,"price":1}'
    assert judge(in_string) == accept()


def test_a_surrogate_pair_escape_is_fine():
    assert judge(b'{"id":"\\ud83d\\ude00","sku":"A","quantity":1,"price":1}') == accept()


def test_duplicate_keys_last_wins_like_serde_json():
    assert judge(b'{"id":"","id":"o","sku":"A","quantity":1,"price":1}') == accept()


@pytest.mark.parametrize(
    "f, shown",
    [
        (-1.0, "-1"),
        (-2.5, "-2.5"),
        (-1e20, "-100000000000000000000"),
        (-1e-7, "-0.0000001"),
        (-0.1 - 0.2, "-0.30000000000000004"),
        (-1.5e300, "-15" + "0" * 299),
    ],
)
def test_prices_are_formatted_like_rust_display(f, shown):
    assert rust_float(f) == shown


def test_config_default_and_refusals():
    p = testing.instantiate(OrderValidator)
    assert p.max_quantity == 1000
    assert testing.instantiate(OrderValidator, {"max-quantity": "+5"}).max_quantity == 5
    for bad, msg in [
        ("x", "max-quantity `x`: invalid digit found in string"),
        ("", "max-quantity ``: cannot parse integer from empty string"),
        ("-1", "max-quantity `-1`: invalid digit found in string"),
        (" 5", "max-quantity ` 5`: invalid digit found in string"),
        ("1_0", "max-quantity `1_0`: invalid digit found in string"),
        ("18446744073709551616", "number too large to fit in target type"),
    ]:
        with pytest.raises(ConfigError) as e:
            testing.instantiate(OrderValidator, {"max-quantity": bad})
        assert msg in str(e.value)
    assert parse_u64("18446744073709551615") == 2**64 - 1


def test_rejections_are_logged_at_debug_with_the_offset():
    testing.reset()
    p = testing.instantiate(OrderValidator)
    batch = testing.records(dict(value=b"{oops", offset=41), dict(value=b"[]", offset=42))
    assert p.handle(batch) == [reject("not JSON"), reject("not a JSON object")]
    logs = testing.take_logs()
    assert logs[0][0] == "debug" and logs[0][1].startswith("not JSON: ")
    assert logs[1:] == [("debug", "offset 41: not JSON"), ("debug", "offset 42: not a JSON object")]


def price_reason(literal):
    return reason(b'{"id":"o","sku":"A","quantity":1,"price":%s}' % literal.encode())


@pytest.mark.parametrize(
    "literal, shown",
    [
        # formatting ties: Rust takes the larger magnitude, Python's repr the even digit
        ("-99477062663224.625", "-99477062663224.63"),
        ("-1140963860933227.25", "-1140963860933227.3"),
        # serde_json without float_roundtrip: one ulp off the correctly rounded double
        ("-307924402685.9952890786", "-307924402685.99524"),
        ("-123456789012345678901234567890", "-123456789012345680000000000000"),
        ("-0.1e309", "-1" + "0" * 308),
        # a fraction digit still joins a u64 significand after a long integer part
        ("-18446744073709551616.1", "-18446744073709552000"),
    ],
)
def test_prices_read_and_shown_exactly_like_the_rust_example(literal, shown):
    assert price_reason(literal) == f"`price` {shown} is negative"


@pytest.mark.parametrize(
    "literal", ["-1.7976931348623158e308", "1.7976931348623158e308", "-1e2147483648", "1e309"]
)
def test_what_serde_json_reads_as_out_of_range_is_not_json(literal):
    # 1.7976931348623158e308 rounds to the largest double, but serde's 17976931348623158 *
    # 1e292 overflows.
    assert price_reason(literal) == "not JSON"
    with pytest.raises(OverflowError):
        serde_f64(literal)


@pytest.mark.parametrize(
    "literal, value",
    [
        ("-307924402685.9952890786", -307924402685.99524),
        ("1.7976931348623157e308", 1.7976931348623157e308),
        ("-1e-2147483649", -0.0),
        ("1e-400", 0.0),
        ("0." + "0" * 30 + "e5000", 0.0),
        ("-0." + "0" * 400 + "5e400", -0.5),
        ("18446744073709551615.5", 18446744073709551615.0),
        ("1" + "0" * 400 + "e-400", 1.0),
        ("5e-324", 5e-324),
        ("-0", -0.0),
        ("-9223372036854775809", -9223372036854775809.0),
    ],
)
def test_serde_f64_corners(literal, value):
    got = serde_f64(literal)
    assert got == value and math.copysign(1.0, got) == math.copysign(1.0, value)


def test_serde_f64_is_correctly_rounded_for_15_digits_or_fewer():
    rng = random.Random(1)
    for _ in range(2000):
        d = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 15))).lstrip("0") or "0"
        p = rng.randint(0, len(d))
        lit = d if p == len(d) else f"{d[:p] or '0'}.{d[p:]}"
        assert serde_f64(lit) == float(lit), lit


def test_rust_float_round_trips_with_repr_length():
    # Both tie candidates read back as the same double: Rust's digits are as short as repr's.
    rng = random.Random(2)
    for _ in range(5000):
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
        if math.isinf(x) or math.isnan(x):
            continue
        s = rust_float(x)
        assert float(s) == x, (repr(x), s)
        assert "e" not in s
    assert rust_float(float("-inf")) == "-inf"
    assert rust_float(-0.0) == "-0"
    assert rust_float(0.125) == "0.125"
    assert rust_float(5e-324) == "0." + "0" * 323 + "5"


def test_random_prices_match_the_rust_component():
    # testdata/prices.jsonl: random hard literals (long decimals, serde quirks, formatting
    # ties, extreme exponents) with the Rust component's reasons; testdata/rust_prices.py
    # made it and can compare any number of new ones.
    with open(os.path.join(HERE, "testdata", "prices.jsonl")) as f:
        cases = [json.loads(line) for line in f]
    assert len(cases) >= 750
    testing.echo_logs(False)
    try:
        p = testing.instantiate(OrderValidator)
        order = '{"id":"o","sku":"A","quantity":1,"price":%s}'
        wrong = [c for c in cases if p.check((order % c["price"]).encode()) != c["rust"]]
    finally:
        testing.echo_logs(True)
        testing.reset()
    assert wrong == []
    # and they hold the hard cases: doubles serde reads off the correctly rounded one, and
    # formatting ties
    misread = ties = 0
    for c in cases:
        try:
            x = abs(serde_f64(c["price"]))
        except OverflowError:
            continue
        misread += x != abs(float(c["price"]))
        shortest = repr(x).split("e")[0].replace(".", "").strip("0")
        ties += x != 0 and _exact_decimal(x)[0] == shortest + "5"
    assert misread >= 50 and ties >= 50, (misread, ties)
