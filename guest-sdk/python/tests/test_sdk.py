"""Unit tests of the Python SDK: decoding, verdicts, config, emits, logs (no Wasm)."""

import pathlib

import pytest

import sharehost_guest as sg
from sharehost_guest import (
    Config,
    ConfigError,
    Plugin,
    accept,
    log,
    reject,
    release,
    renew,
    retry,
    testing,
)


class Echo(Plugin):
    """Answers from the `verdict` header; counts calls across batches."""

    def init(self, config):
        if config.get("fail"):
            raise ConfigError(config.get("fail"))
        self.seen = 0

    def handle_record(self, record):
        self.seen += 1
        v = record.header("verdict")
        if v is None:
            return accept()
        if v == b"release":
            return release()
        if v == b"renew":
            return renew()
        return reject(v.decode())


@pytest.fixture(autouse=True)
def clean():
    testing.reset()
    yield
    testing.reset()


def test_default_handle_gives_one_verdict_per_record_in_order_and_state_persists():
    p = testing.instantiate(Echo)
    batch = testing.records(
        "x",
        dict(value="y", headers=[("verdict", "renew")]),
        dict(value="z", headers=[("verdict", b"bad")]),
    )
    assert p.handle(batch) == [accept(), renew(), reject("bad")]
    assert p.handle(testing.records("a", "b")) == [accept(), accept()]
    assert p.seen == 5


def test_init_refuses_with_the_message():
    with pytest.raises(ConfigError, match="^no$"):
        testing.instantiate(Echo, {"fail": "no"})


def test_records_decode_spans_nulls_and_headers_from_one_buffer():
    rs = testing.records(
        dict(value=None, key=b"k1", headers=[("a", None), ("b", b"")], offset=7),
        dict(value=b"", key=None, topic="other", partition=3, delivery_count=2, timestamp=9),
        dict(value="h\u00e9", key=b"", headers=[("a", "1"), ("a", "2")]),
    )
    a, b, c = rs
    assert (a.value, a.key, a.offset, a.index, a.topic) == (None, b"k1", 7, 0, "test")
    assert a.headers == [("a", None), ("b", b"")]
    assert a.header("a", "absent") is None and a.header("zz", "absent") == "absent"
    assert (b.value, b.key, b.topic, b.partition, b.delivery_count, b.timestamp) == (
        b"", None, "other", 3, 2, 9
    )
    assert b.headers == []
    assert c.value_str() == "h\u00e9" and c.key == b"" and c.key_str() == ""
    assert c.header("a") == b"1" and c.offset == 2
    # Text like the JavaScript SDK's headerText: None for null or not UTF-8, default if absent.
    assert c.header_str("a") == "1" and a.header_str("a", "absent") is None
    assert a.header_str("zz", "absent") == "absent"
    assert testing.record(headers=[("h", b"\xff")]).header_str("h") is None
    # The same at every delivery: topic, partition and offset.
    assert (a.idempotency_key, b.idempotency_key) == ("test/0/7", "other/3/1")
    # The columns really are spans into one buffer with 0xffffffff for null.
    cols = a._b
    assert cols.value_spans[0] == sg.NULL_SPAN and cols.key_spans[2] == sg.NULL_SPAN
    assert cols.data.count(b"k1") == 1


def test_batch_is_the_hosts_columnar_batch_and_records_take_values_or_specs():
    cols = testing.batch([dict(value="a", key="k"), dict(value=None, offset=9)])
    assert isinstance(cols, testing.Columns)
    assert cols.offsets == [0, 9] and cols.value_spans[2] == sg.NULL_SPAN
    a, b = sg.records_of(cols)
    assert (a.value, a.key, b.value, b.offset) == (b"a", b"k", None, 9)
    # Keyword arguments apply to every record; a spec's own fields win.
    rs = testing.records(b"x", dict(value="y", key="own"), key="shared", delivery_count=3)
    assert [(r.value, r.key, r.delivery_count, r.offset) for r in rs] == [
        (b"x", b"shared", 3, 0),
        (b"y", b"own", 3, 1),
    ]


def test_fields_are_read_only_when_used():
    class Exploding(testing.Columns):
        def __getattribute__(self, name):
            if name in ("key_spans", "header_ranges"):
                raise AssertionError(f"{name} read")
            return object.__getattribute__(self, name)

    cols = testing.record("v", key="k")._b
    r = sg.Record(Exploding(**vars(cols)), 0)
    assert r.value == b"v"
    with pytest.raises(AssertionError, match="key_spans read"):
        r.key


def test_invalid_utf8_reads_as_none_text():
    r = testing.record(b"\xff")
    assert r.value == b"\xff" and r.value_str() is None


def test_verdicts_compare_and_retry_saturates():
    assert reject("x") == reject("x") != reject("y")
    assert reject() == reject(None) != accept()
    assert retry(250) == retry(250) and retry(250).after_ms == 250
    assert retry(2**40).after_ms == 2**32 - 1
    with pytest.raises(ValueError):
        retry(-1)
    assert repr(reject("r")) == "reject('r')" and repr(retry(5)) == "retry(5)"


def test_config_last_value_wins_and_secrets_stay_apart_and_unprinted():
    c = Config([("a", "1"), ("a", "2"), ("url", "http://h")], secrets={"api-token": "s3cret"})
    assert c.get("a") == "2" and c.get("missing", "d") == "d" and c.get("missing") is None
    assert c.secret("api-token") == "s3cret" and c.secret("missing") is None
    assert c.get("api-token") is None and "api-token" not in c
    assert all(v != "s3cret" for _, v in c.items())
    shown = repr(c)
    assert "s3cret" not in shown and "api-token" in shown and "http://h" in shown


def test_emits_are_collected_with_their_record_index_in_order():
    a, b = testing.records("a", "b")
    b.emit("urgent", key=b"k", value="B", headers=[("kind", "order")])
    a.emit("normal")
    emits = testing.take_emits()
    assert [(e.record_index, e.output, e.key, e.value) for e in emits] == [
        (1, "urgent", b"k", b"B"),
        (0, "normal", None, None),
    ]
    assert emits[0].header("kind") == b"order" and emits[0].headers == [("kind", b"order")]
    assert testing.take_emits() == []


def test_refused_emits_raise_the_named_error_and_are_not_collected():
    r = testing.record("v")
    with pytest.raises(sg.ReservedHeader, match="sharehost.source.offset"):
        r.emit("out", headers=[("sharehost.source.offset", b"1")])

    def policy(e):
        if e.output != "out":
            raise testing.UnknownOutput(e.output)

    testing.refuse_emits(policy)
    r.emit("out", value=b"1")
    with pytest.raises(sg.EmitError) as err:
        r.emit("elsewhere", value=b"2")
    assert isinstance(err.value, sg.UnknownOutput) and err.value.output == "elsewhere"
    assert [e.output for e in testing.take_emits()] == ["out"]
    assert str(sg.TooManyEmits(1000)) == (
        "too many emits: the batch already emitted 1000, the manifest's max_emits_per_batch"
    )
    with pytest.raises(TypeError):
        r.emit("out", value=12)


def test_http_headers_read_as_bytes_or_as_text_whatever_their_case():
    from sharehost_guest import http

    req = http.Request.post("http://127.0.0.1:8088/score").bearer_auth("t0ken")
    assert req.header_value("Authorization") == b"Bearer t0ken"
    assert req.header_str("authorization") == "Bearer t0ken"
    assert req.header_str("missing") is None and req.header_value("missing") is None
    res = http.Response(503, headers=[("Retry-After", "7"), ("x-raw", b"\xff")])
    assert res.header("retry-after") == b"7" and res.header_str("RETRY-AFTER") == "7"
    assert res.header_str("x-raw") is None and res.header("x-raw") == b"\xff"


def test_logs_are_collected_with_their_level():
    testing.echo_logs(False)
    try:
        log.info("hello")
        log.warn("careful")
        log.debug("detail")
        log.error("bad")
        log.trace("t")
        with pytest.raises(ValueError):
            log.log("loud", "x")
    finally:
        testing.echo_logs(True)
    assert testing.take_logs() == [
        ("info", "hello"),
        ("warn", "careful"),
        ("debug", "detail"),
        ("error", "bad"),
        ("trace", "t"),
    ]
    assert testing.take_logs() == []


def test_a_plugin_without_handle_record_says_what_to_write():
    with pytest.raises(NotImplementedError, match="handle_record"):
        Plugin().handle(testing.records("x"))


def test_export_refuses_a_non_plugin():
    with pytest.raises(TypeError, match="not a sharehost plugin"):
        sg.export(int)
    sg._exported.clear()


def test_the_vendored_wit_is_the_repo_contract():
    sdk = pathlib.Path(__file__).resolve().parents[1]
    repo_wit = sdk.parent.parent / "wit" / "plugin.wit"
    if not repo_wit.exists():
        pytest.skip("not inside a sharehost checkout")
    vendored = sdk / "sharehost_guest" / "wit" / "plugin.wit"
    assert vendored.read_text() == repo_wit.read_text(), (
        "guest-sdk/python/sharehost_guest/wit/plugin.wit is stale: copy wit/plugin.wit over it"
    )
