"""The enricher's unit tests, natively: testing.http.mock answers the lookups (the Rust
example's tests, in Python)."""

import json

import pytest

from sharehost_guest import ConfigError, accept, http, reject, release, retry, testing

from enricher import Enricher, rust_f64, to_json

URL = "http://127.0.0.1:8088"


def enricher(**config):
    return testing.instantiate(Enricher, {"pricing-url": URL, **config})


def prices():
    """A pricing service: A-1 costs 2.5, B-2 costs 0.1, anything else is unknown."""

    def answer(req):
        price = {"A-1": "2.5", "B-2": "0.1"}.get(req.url.rsplit("/", 1)[-1])
        if price is None:
            return http.Response(404)
        return http.Response(200, body=f'{{"unit_price":{price}}}')

    testing.http.mock(answer)


def judge(e, *values):
    return e.handle(testing.records(*values, key=b"k"))


def test_a_priced_order_is_emitted_enriched_to_the_output_and_accepted():
    testing.reset()
    prices()
    e = enricher()
    verdicts = judge(
        e, b'{"id":"o1","sku":"A-1","quantity":3}', b'{"id":"o2","sku":"B-2","quantity":3,"note":"x"}'
    )
    assert verdicts == [accept(), accept()]
    emits = testing.take_emits()
    assert [(m.record_index, m.output, m.key) for m in emits] == [
        (0, "enriched", b"k"),
        (1, "enriched", b"k"),
    ]
    assert emits[0].value == b'{"id":"o1","quantity":3,"sku":"A-1","total":7.5,"unit_price":2.5}'
    second = json.loads(emits[1].value)
    assert second["total"] == 0.3, "totals are rounded to cents"
    assert second["note"] == "x", "the order's other fields are kept"


def test_an_unknown_sku_is_rejected_with_a_reason_and_emits_nothing():
    testing.reset()
    prices()
    assert judge(enricher(), b'{"id":"o1","sku":"Z-9","quantity":1}') == [
        reject("unknown sku `Z-9`")
    ]
    assert testing.take_emits() == []


def test_malformed_orders_are_rejected_with_what_is_wrong_and_never_looked_up():
    testing.reset()
    prices()
    verdicts = judge(
        enricher(),
        b"{oops",
        b"[1]",
        b'{"sku":"A-1"}',
        b'{"sku":"","quantity":1}',
        b'{"sku":"A-1","quantity":0}',
        b'{"sku":"A-1","quantity":NaN}',
        b'{"sku":"A-1","quantity":2.0}',
    )
    assert verdicts == [
        reject("not JSON"),
        reject("not a JSON object"),
        reject("`quantity` missing or not a positive integer"),
        reject("`sku` missing, empty or not a string"),
        reject("`quantity` missing or not a positive integer"),
        reject("not JSON"),
        reject("`quantity` missing or not a positive integer"),
    ]
    assert testing.http.take_requests() == []
    assert testing.take_emits() == []


def test_a_batch_asks_once_per_distinct_sku_with_the_bearer_token():
    testing.reset()
    prices()
    e = testing.instantiate(Enricher, {"pricing-url": URL + "/"}, {"api-token": "t0ken"})
    verdicts = judge(
        e,
        b'{"sku":"A-1","quantity":1}',
        b'{"sku":"B-2","quantity":1}',
        b'{"sku":"A-1","quantity":2}',
        b'{"sku":"a b/c","quantity":2}',
    )
    assert verdicts[:3] == [accept(), accept(), accept()]
    sent = testing.http.take_requests()
    assert [r.url for r in sent] == [
        f"{URL}/price/A-1",
        f"{URL}/price/B-2",
        f"{URL}/price/a%20b%2Fc",
    ]
    assert all(r.header_value("authorization") == b"Bearer t0ken" for r in sent)
    assert "t0ken" not in repr(sent[0])
    assert len(testing.take_emits()) == 3


def test_without_the_secret_no_authorization_header_is_sent():
    testing.reset()
    prices()
    judge(enricher(), b'{"sku":"A-1","quantity":1}')
    (sent,) = testing.http.take_requests()
    assert sent.header_value("authorization") is None


def test_a_429_a_5xx_or_no_answer_is_retried_after_the_configured_delay():
    testing.reset()

    def answer(req):
        sku = req.url.rsplit("/", 1)[-1]
        if sku == "busy":
            return http.Response(429)
        if sku == "down":
            return http.Response(503)
        if sku == "slow":
            return http.Response(429, headers=[("Retry-After", "7")])
        raise http.Connect("connection refused")

    testing.http.mock(answer)
    verdicts = judge(
        enricher(**{"retry-after-ms": "1500"}),
        b'{"sku":"busy","quantity":1}',
        b'{"sku":"down","quantity":1}',
        b'{"sku":"gone","quantity":1}',
        b'{"sku":"slow","quantity":1}',
    )
    assert verdicts == [retry(1500), retry(1500), retry(1500), retry(7000)]
    assert testing.take_emits() == [], "a retried order emits nothing"
    assert testing.take_logs()[-1][0] == "warn"


def test_a_refused_emit_releases_the_order_instead_of_accepting_it():
    testing.reset()
    prices()

    def policy(emit):
        if emit.record_index != 0:
            raise testing.TooManyEmits(1)

    testing.refuse_emits(policy)
    verdicts = judge(enricher(), b'{"sku":"A-1","quantity":1}', b'{"sku":"A-1","quantity":2}')
    assert verdicts == [accept(), release()]
    assert len(testing.take_emits()) == 1


def test_init_refuses_a_missing_or_unusable_pricing_url():
    with pytest.raises(ConfigError, match="set `pricing-url`"):
        testing.instantiate(Enricher, {})
    for url in ["127.0.0.1:8088", "ftp://host", "/relative"]:
        with pytest.raises(ConfigError, match=f"^pricing-url `{url}`"):
            testing.instantiate(Enricher, {"pricing-url": url})
    with pytest.raises(ConfigError, match="^retry-after-ms `soon`"):
        enricher(**{"retry-after-ms": "soon"})


def test_without_a_mock_every_request_is_denied_like_a_pipeline_without_a_grant():
    testing.reset()
    assert judge(enricher(), b'{"sku":"A-1","quantity":1}') == [retry(2000)]
    with pytest.raises(http.Denied):
        http.get(f"{URL}/price/A-1")


def test_numbers_are_written_the_way_serde_json_writes_them():
    assert [rust_f64(x) for x in (7.0, 0.3, 1e16, 1.5e-7, 0.00001, -0.0, 4.611686018427388e19)] == [
        "7.0", "0.3", "1e+16", "1.5e-7", "0.00001", "-0.0", "4.611686018427388e+19",
    ]
    assert to_json({"b": [1, 2.0], "a": "é\n"}) == '{"a":"é\\n","b":[1,2.0]}'
