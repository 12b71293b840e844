"""Native unit tests of the Python order validator (plain pytest, no Wasm)."""

import pytest

from sharehost_guest import ConfigError, accept, reject, testing

from order_validator import OrderValidator, parse_u64, rust_float


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
    batch = testing.batch([dict(value=b"{oops", offset=41), dict(value=b"[]", offset=42)])
    assert p.handle(batch) == [reject("not JSON"), reject("not a JSON object")]
    logs = testing.take_logs()
    assert logs[0][0] == "debug" and logs[0][1].startswith("not JSON: ")
    assert logs[1:] == [("debug", "offset 41: not JSON"), ("debug", "offset 42: not a JSON object")]
