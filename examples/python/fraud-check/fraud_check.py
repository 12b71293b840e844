"""Checks each order with a fraud-scoring service: the plugin guide's worked example of a plugin
that acts (docs/plugin-guide.md, section 7), the Python twin of ``examples/fraud-check`` (Rust).

Each record's value is a JSON order, ``{"id": "o-1", "amount": 120.5, "customer": "c-7"}``. The
plugin POSTs it as it is to ``score-url`` with ``Authorization: Bearer TOKEN`` and reads
``{"score": N}`` back: a score up to ``max-score`` emits the order with ``"score": N`` to the
output ``scored`` (keyed by its id) and accepts; a higher one rejects (``score 95 > 80``); a 5xx
or no answer retries after 1000 ms; any other status rejects naming it. A tombstone, a value
that is not JSON and an order without a string ``id`` are rejected, never sent.

Configuration: ``score-url`` (required), ``max-score`` (a whole number, default 80). Secret:
``scoring-token`` (required).
"""

import json

from sharehost_guest import (
    ConfigError,
    EmitError,
    Plugin,
    accept,
    http,
    log,
    reject,
    release,
    retry,
)

# How long a record waits before it comes back when the service did not answer (or failed):
# long enough for a restarting service, short enough to catch up soon after.
RETRY_MS = 1000


def _not_json(constant):
    # Python's json reads NaN and Infinity, which are not JSON (nor to the Rust and JS twins).
    raise ValueError(f"{constant} is not JSON")


class FraudCheck(Plugin):
    """The fraud check, with what ``init`` read from the pipeline."""

    def init(self, config):
        self.score_url = config.get("score-url")
        if self.score_url is None:
            raise ConfigError("set `score-url` (e.g. http://127.0.0.1:8088/score)")
        try:
            # A URL that cannot be sent would fail every record: refuse it at load instead.
            http.Request.post(self.score_url).validate()
        except http.InvalidRequest as e:
            raise ConfigError(f"score-url `{self.score_url}`: {e}") from None
        raw = config.get("max-score", "80")
        if not (raw.isascii() and raw.isdigit()):
            raise ConfigError(f"max-score `{raw}` is not a whole number")
        self.max_score = int(raw)
        # Without it every call would be refused, and every order rejected.
        self.token = config.secret("scoring-token")
        if self.token is None:
            raise ConfigError("set the secret `scoring-token` ([pipeline.secrets])")

    def handle_record(self, record):
        if record.value is None:
            return reject("tombstone")
        try:
            order = json.loads(record.value, parse_constant=_not_json)
        except (ValueError, RecursionError):
            return reject("not JSON")
        order_id = order.get("id") if isinstance(order, dict) else None
        if not isinstance(order_id, str):
            return reject("`id` missing or not a string")
        request = (
            http.Request.post(self.score_url)
            .header("content-type", "application/json")
            .bearer_auth(self.token)
            .with_body(record.value)
        )
        try:
            response = http.send(request)
        except http.HttpError as e:
            # No answer: the service may be restarting, so the order comes back later.
            log.warn(f"order {order_id}: {e}; again in {RETRY_MS} ms")
            return retry(RETRY_MS)
        if 500 <= response.status <= 599:
            log.warn(
                f"order {order_id}: scoring service answered {response.status}; "
                f"again in {RETRY_MS} ms"
            )
            return retry(RETRY_MS)
        if response.status != 200:
            return reject(f"scoring service answered {response.status}")
        try:
            score = response.json().get("score")
        except (ValueError, AttributeError):
            score = None
        if type(score) is not int:  # bool is an int to isinstance
            return reject("scoring service answered without an integer `score`")
        if score > self.max_score:
            return reject(f"score {score} > {self.max_score}")
        # Produced only if this record ends accepted, and before its accept reaches the broker.
        try:
            record.emit("scored", key=order_id, value=json.dumps({**order, "score": score}))
        except EmitError as e:
            # The batch's emit budget is spent: the order comes back in a later batch.
            log.warn(f"order {order_id}: {e}")
            return release()
        return accept()
