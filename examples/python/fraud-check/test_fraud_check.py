"""The fraud check's unit tests, natively: testing.http.mock plays the scoring service (the Rust
example's tests, in Python)."""

import json

import pytest

from sharehost_guest import ConfigError, accept, http, reject, release, retry, testing

from fraud_check import FraudCheck

URL = "http://127.0.0.1:8088/score"
ORDER = b'{"id":"o-1","amount":120.5,"customer":"c-7"}'


def fraud_check(**config):
    return testing.instantiate(FraudCheck, {"score-url": URL, **config}, {"scoring-token": "t0ken"})


def service(status, body=b""):
    """A clean fake host whose scoring service answers every call with ``status`` and ``body``."""
    testing.reset()
    testing.http.mock(lambda req: http.Response(status, body=body))


def judge(value, **config):
    return fraud_check(**config).handle_record(testing.record(value))


def test_a_low_score_emits_the_scored_order_keyed_by_its_id_and_accepts():
    service(200, b'{"score":12}')
    assert judge(ORDER) == accept()
    (sent,) = testing.http.take_requests()
    assert (sent.method, sent.url, sent.body) == ("POST", URL, ORDER)
    assert sent.header_str("content-type") == "application/json"
    assert sent.header_str("authorization") == "Bearer t0ken"
    (emit,) = testing.take_emits()
    assert (emit.output, emit.key) == ("scored", b"o-1")
    assert json.loads(emit.value) == {"id": "o-1", "amount": 120.5, "customer": "c-7", "score": 12}


def test_a_score_over_the_max_is_rejected_naming_both_and_emits_nothing():
    service(200, b'{"score":95}')
    assert judge(ORDER) == reject("score 95 > 80")
    assert testing.take_emits() == []
    assert judge(ORDER, **{"max-score": "95"}) == accept()


def test_a_5xx_is_retried_after_a_second_and_emits_nothing():
    for status in (500, 503):
        service(status)
        assert judge(ORDER) == retry(1000)
        assert testing.take_emits() == []


def test_a_refused_connection_is_retried_after_a_second():
    testing.reset()

    def refused(req):
        raise http.Connect("connection refused")

    testing.http.mock(refused)
    assert judge(ORDER) == retry(1000)


def test_any_other_status_or_an_answer_without_a_score_is_rejected_naming_it():
    service(404)
    assert judge(ORDER) == reject("scoring service answered 404")
    for body in (b'{"score":"low"}', b'{"score":true}', b"[]", b"oops"):
        service(200, body)
        assert judge(ORDER) == reject("scoring service answered without an integer `score`")


def test_a_tombstone_non_json_or_an_order_without_an_id_is_rejected_and_never_sent():
    service(200, b'{"score":1}')
    assert judge(None) == reject("tombstone")
    assert judge(b"{oops") == reject("not JSON")
    assert judge(b"\xff") == reject("not JSON")
    assert judge(b'{"id":"o-1","amount":NaN}') == reject("not JSON")
    for no_id in (b'{"amount":5}', b'{"id":7}', b"[1]"):
        assert judge(no_id) == reject("`id` missing or not a string")
    assert testing.http.take_requests() == []


def test_a_refused_emit_releases_the_order():
    service(200, b'{"score":1}')

    def spent(emit):
        raise testing.TooManyEmits(1)

    testing.refuse_emits(spent)
    assert judge(ORDER) == release()


def test_init_refuses_a_configuration_without_score_url_a_token_or_a_whole_max_score():
    token = {"scoring-token": "t0ken"}
    with pytest.raises(ConfigError, match="^set `score-url`"):
        testing.instantiate(FraudCheck, {}, token)
    with pytest.raises(ConfigError, match="^score-url `/score`"):
        testing.instantiate(FraudCheck, {"score-url": "/score"}, token)
    for bad in ("lots", "-1", "8.5", "", "\u00b2"):
        with pytest.raises(ConfigError) as e:
            testing.instantiate(FraudCheck, {"score-url": URL, "max-score": bad}, token)
        assert str(e.value) == f"max-score `{bad}` is not a whole number"
    with pytest.raises(ConfigError, match="^set the secret `scoring-token`"):
        testing.instantiate(FraudCheck, {"score-url": URL})
