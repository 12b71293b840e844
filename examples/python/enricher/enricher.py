"""Prices JSON orders over HTTP and emits the enriched order to the ``enriched`` output: the
Python twin of ``examples/enricher`` (Rust). The same input and the same pricing service give
the same verdicts, reasons and emitted bytes.

For a batch, every distinct SKU is asked once, all at the same time (``http.send_all``):
``GET {pricing-url}/price/{sku}``, with ``Authorization: Bearer TOKEN`` when the pipeline has
the secret ``api-token``. The service answers ``{"unit_price": X}``.

- an order (a JSON object with a non-empty string ``sku`` and a positive integer ``quantity``)
  whose lookup answers 2xx with a numeric ``unit_price``: emit ``{..order, "unit_price": X,
  "total": X * quantity}`` (keys sorted, as serde_json writes them) to ``enriched``, accept;
- 404: reject ``unknown sku `Z-9```;
- 429, 5xx, any other status, an unreadable price, or no answer: retry after
  ``retry-after-ms`` (or the 429/503's ``Retry-After``, if longer);
- anything else: reject with what is wrong (no lookup).

An emit the host refuses for the batch's budget releases the order instead of accepting it.

Configuration: ``pricing-url`` (required), ``retry-after-ms`` (default 2000), ``output``
(default ``enriched``). Secret: ``api-token`` (optional).
"""

import json
import math
import re
from urllib.parse import quote

from sharehost_guest import (
    ConfigError,
    Plugin,
    TooManyBytes,
    TooManyEmits,
    EmitError,
    accept,
    export,
    http,
    log,
    reject,
    release,
    retry,
)

# Where this reads numbers unlike serde_json: a double literal of 16 digits or more, or an
# integer past 64 bits, is read correctly rounded here (``float``), while serde_json's default
# reader may land one unit in the last place away (the order validator's ``serde_f64``
# follows it exactly; an enricher passes such fields through, and rarely sees them).

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
# serde_json refuses input nested deeper than this (its recursion limit, 128).
_MAX_DEPTH = 127
_SURROGATE = re.compile("[\ud800-\udfff]")
_U32 = re.compile(r"\+?[0-9]+")


# --- JSON as serde_json reads and writes it (the Rust enricher's parser) -----------------------


def _float(s: str) -> float:
    f = float(s)
    if math.isinf(f):
        raise ValueError(f"number out of range: {s}")  # serde_json refuses, Python gives inf
    return f


def _int(s: str):
    # serde_json: u64 if it fits, else i64 if it fits, else f64; `-0` is the float -0.0.
    # Length first: int() refuses 4300+ digits.
    if len(s) <= 21:
        v = int(s)
        if (0 <= v <= _U64_MAX and not (v == 0 and s.startswith("-"))) or _I64_MIN <= v < 0:
            return v
    return _float(s)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # Python's json accepts NaN and Infinity


def _depth_and_text_ok(v, depth: int = 0) -> bool:
    """Nested no deeper than serde_json allows, no lone surrogate (serde_json refuses both)."""
    if isinstance(v, str):
        return not _SURROGATE.search(v)
    if isinstance(v, (dict, list)):
        if depth >= _MAX_DEPTH:
            return False
        items = v.items() if isinstance(v, dict) else ((None, x) for x in v)
        return all(
            (k is None or _depth_and_text_ok(k)) and _depth_and_text_ok(x, depth + 1)
            for k, x in items
        )
    return True


def parse_json(data: bytes):
    """Parses like ``serde_json::from_slice::<Value>``; raises ``ValueError`` where it fails."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise ValueError("a UTF-8 byte order mark is not JSON")
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    v = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_no_constant)
    if not _depth_and_text_ok(v):
        raise ValueError("nested too deep, or a lone surrogate")
    return v


def rust_f64(x: float) -> str:
    """A double as serde_json 1.0.154 writes it: the shortest digits that read back (like
    ``repr``), always with a fraction or an exponent, in exponent form below 1e-5 and from
    1e16 on (``7.0``, ``0.3``, ``0.00001``, ``1e+16``, ``1.5e-7``)."""
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    k = int(exp or 0) - len(frac)
    stripped = digits.rstrip("0")
    k += len(digits) - len(stripped)
    digits = stripped
    n = len(digits)
    kk = n + k
    if 0 <= k and kk <= 16:
        text = digits + "0" * k + ".0"
    elif 0 < kk <= 16:
        text = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        text = "0." + "0" * -kk + digits
    elif n == 1:
        text = f"{digits}e{kk - 1:+d}"
    else:
        text = f"{digits[0]}.{digits[1:]}e{kk - 1:+d}"
    return sign + text


def to_json(v) -> str:
    """Compact JSON with keys sorted and numbers written like serde_json."""
    if isinstance(v, dict):
        return "{" + ",".join(f"{to_json(k)}:{to_json(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    if isinstance(v, float):
        return rust_f64(v)
    return json.dumps(v, ensure_ascii=False)


def _round_half_away(x: float) -> float:
    """Rust's ``f64::round``: halves away from zero (Python's ``round`` goes to even)."""
    a = abs(x)
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return math.copysign(r, x)


# --- The plugin -------------------------------------------------------------------------------


class _Later:
    """Ask again after ``ms`` milliseconds; ``why`` is logged."""

    def __init__(self, ms: int, why: str) -> None:
        self.ms = ms
        self.why = why


_UNKNOWN = object()


def parse_order(value):
    """``(order, sku, quantity)``, or the rejection reason as a string."""
    if value is None:
        return "null value (tombstone)"
    try:
        order = parse_json(value)
    except (ValueError, RecursionError) as e:
        # The reason is the same in every language; the parser's own message goes to the log.
        log.debug(f"not JSON: {e}")
        return "not JSON"
    if not isinstance(order, dict):
        return "not a JSON object"
    sku = order.get("sku")
    if not isinstance(sku, str) or not sku:
        return "`sku` missing, empty or not a string"
    quantity = order.get("quantity")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or not 0 < quantity <= _U64_MAX:
        return "`quantity` missing or not a positive integer"
    return order, sku, quantity


@export
class Enricher(Plugin):
    def init(self, config):
        url = config.get("pricing-url")
        if url is None:
            raise ConfigError("set `pricing-url` (e.g. http://127.0.0.1:8088)")
        self.pricing_url = url.rstrip("/")
        try:
            http.Request.get(f"{self.pricing_url}/price/x").validate()
        except http.HttpError as e:
            raise ConfigError(f"pricing-url `{self.pricing_url}`: {e}") from None
        raw = config.get("retry-after-ms")
        if raw is None:
            self.retry_after_ms = 2000
        elif _U32.fullmatch(raw) and int(raw) <= _U32_MAX:
            self.retry_after_ms = int(raw)
        else:
            raise ConfigError(f"retry-after-ms `{raw}`: not a whole number of milliseconds")
        self.token = config.secret("api-token")
        self.output = config.get("output", "enriched")

    def request(self, sku: str) -> http.Request:
        req = http.Request.get(f"{self.pricing_url}/price/{quote(sku, safe='-_.~')}")
        return req.bearer_auth(self.token) if self.token is not None else req

    def price(self, answer):
        """A float, ``_UNKNOWN``, or ``_Later``."""
        if isinstance(answer, http.HttpError):
            return _Later(self.retry_after_ms, str(answer))
        if 200 <= answer.status < 300:
            try:
                p = parse_json(answer.body).get("unit_price")
            except (ValueError, AttributeError, RecursionError):
                p = None
            if isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p):
                return float(p)
            return _Later(
                self.retry_after_ms, "pricing service answered without a numeric `unit_price`"
            )
        if answer.status == 404:
            return _UNKNOWN
        # A `Retry-After` in seconds (429, 503) is honoured when it asks for longer.
        asked = 0
        header = answer.header("retry-after")
        if header is not None:
            text = header.decode("utf-8", "replace").strip()
            if _U32.fullmatch(text) and int(text) <= _U32_MAX:
                asked = min(int(text) * 1000, _U32_MAX)
        return _Later(max(self.retry_after_ms, asked), f"pricing service answered {answer.status}")

    def emit(self, record, order, sku, quantity, unit_price):
        # Cents: a total is money, and 0.1 x 3 should read 0.3.
        total = _round_half_away(unit_price * float(quantity) * 100.0) / 100.0
        order["unit_price"] = unit_price
        order["total"] = total
        try:
            record.emit(self.output, key=record.key, value=to_json(order))
        except (TooManyEmits, TooManyBytes) as e:
            # The batch's budget is spent: the order comes back in a later batch.
            log.debug(f"offset {record.offset}: {e}; released")
            return release()
        except EmitError as e:
            # A manifest without our output: wait for the operator rather than lose orders.
            log.error(f"offset {record.offset}: emit refused: {e}")
            return retry(self.retry_after_ms)
        return accept()

    def handle(self, records):
        orders = [parse_order(r.value) for r in records]
        # One lookup per distinct SKU of the batch, all in flight at once.
        position = {}
        requests = []
        for o in orders:
            if not isinstance(o, str) and o[1] not in position:
                position[o[1]] = len(requests)
                requests.append(self.request(o[1]))
        prices = [self.price(a) for a in http.send_all(requests)]
        later = next((p for p in prices if isinstance(p, _Later)), None)
        if later is not None:
            log.warn(f"pricing lookups will be retried in {later.ms} ms: {later.why}")
        verdicts = []
        for record, o in zip(records, orders):
            if isinstance(o, str):
                verdicts.append(reject(o))
                continue
            order, sku, quantity = o
            p = prices[position[sku]]
            if p is _UNKNOWN:
                verdicts.append(reject(f"unknown sku `{sku}`"))
            elif isinstance(p, _Later):
                verdicts.append(retry(p.ms))
            else:
                verdicts.append(self.emit(record, order, sku, quantity, p))
        return verdicts
