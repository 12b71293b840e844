"""A fake host for native unit tests: build records, run a plugin, collect emits and log lines.

The records you build here are encoded into the same columnar batch the host sends (spans into
one byte buffer, 0xffffffff for null), so a test runs the SDK's real decoding code::

    from sharehost_guest import testing, accept, reject
    from my_plugin import MyPlugin

    def test_rejects_empty_values():
        testing.reset()
        plugin = testing.instantiate(MyPlugin, {"max-bytes": "3"})
        assert plugin.handle(testing.records(b"abc", b"")) == [accept(), reject("empty")]
        assert testing.take_logs() == [("warn", "offset 1 is empty")]
        assert testing.take_emits() == []

Emits are checked like the host would (reserved ``sharehost.`` header keys are refused) plus
whatever :func:`refuse_emits` adds; a refused emit raises the same :class:`EmitError` subclass
a component sees.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from . import (
    NULL_SPAN,
    RESERVED_HEADER_PREFIX,
    Config,
    EmitError,
    Plugin,
    Record,
    ReservedHeader,
    _as_bytes,
)
from . import instantiate as _instantiate

__all__ = [
    "Columns",
    "Emit",
    "record",
    "records",
    "batch",
    "instantiate",
    "reset",
    "take_emits",
    "take_logs",
    "refuse_emits",
    "echo_logs",
    "http",
]


@dataclass
class Columns:
    """A columnar batch with the contract's fields (``wit/plugin.wit``'s ``batch``)."""

    topics: List[str] = field(default_factory=list)
    topic_index: List[int] = field(default_factory=list)
    partitions: List[int] = field(default_factory=list)
    offsets: List[int] = field(default_factory=list)
    timestamps: List[int] = field(default_factory=list)
    delivery_counts: List[int] = field(default_factory=list)
    key_spans: List[int] = field(default_factory=list)
    value_spans: List[int] = field(default_factory=list)
    header_ranges: List[int] = field(default_factory=list)
    header_spans: List[int] = field(default_factory=list)
    data: bytes = b""


@dataclass
class _Spec:
    value: Optional[bytes]
    key: Optional[bytes]
    headers: List[Tuple[str, Optional[bytes]]]
    topic: str
    partition: int
    offset: Optional[int]
    timestamp: int
    delivery_count: int


def _spec(
    value, key=None, headers=(), topic="test", partition=0, offset=None, timestamp=0,
    delivery_count=1,
) -> _Spec:
    return _Spec(
        _as_bytes("value", value),
        _as_bytes("key", key),
        [(k, _as_bytes("header value", v)) for k, v in headers],
        topic,
        partition,
        offset,
        timestamp,
        delivery_count,
    )


def _encode(specs: Sequence[_Spec]) -> Columns:
    """Encodes record specs as the host does: one data buffer, spans, header ranges."""
    c = Columns()
    data = bytearray()

    def put(b: Optional[bytes], spans: List[int]) -> None:
        if b is None:
            spans += [NULL_SPAN, 0]
        else:
            spans += [len(data), len(b)]
            data.extend(b)

    for i, s in enumerate(specs):
        if s.topic not in c.topics:
            c.topics.append(s.topic)
        c.topic_index.append(c.topics.index(s.topic))
        c.partitions.append(s.partition)
        c.offsets.append(i if s.offset is None else s.offset)
        c.timestamps.append(s.timestamp)
        c.delivery_counts.append(s.delivery_count)
        put(s.key, c.key_spans)
        put(s.value, c.value_spans)
        c.header_ranges += [len(c.header_spans) // 4, len(s.headers)]
        for k, v in s.headers:
            put(k.encode("utf-8"), c.header_spans)
            put(v, c.header_spans)
    c.data = bytes(data)
    return c


def record(
    value: Union[bytes, str, None] = b"",
    *,
    key: Union[bytes, str, None] = None,
    headers: Iterable[Tuple[str, Union[bytes, str, None]]] = (),
    topic: str = "test",
    partition: int = 0,
    offset: int = 0,
    timestamp: int = 0,
    delivery_count: int = 1,
) -> Record:
    """One record (index 0 of a batch of one) with this value (bytes, str or None for a
    tombstone) and neutral metadata unless given: topic ``test``, partition 0, offset 0,
    first delivery, no key, no headers."""
    spec = _spec(value, key, headers, topic, partition, offset, timestamp, delivery_count)
    return Record(_encode([spec]), 0)


def records(*values: Union[bytes, str, None, dict], **metadata) -> List[Record]:
    """A batch of records (indices and offsets 0, 1, 2, ...), decoded from one columnar buffer
    like the host's. Each argument is a value (bytes, str or None for a tombstone) or a dict
    with the keyword arguments of :func:`record` for that record alone (a missing ``offset``
    is its index); keyword arguments (``key``, ``headers``, ``topic``, ``delivery_count``, ...)
    apply to every record that does not set its own."""
    encoded = batch(
        [{**metadata, **v} if isinstance(v, dict) else dict(metadata, value=v) for v in values]
    )
    return [Record(encoded, i) for i in range(len(encoded.offsets))]


def batch(specs: Iterable[dict]) -> Columns:
    """The contract's columnar batch (what a component's ``handle`` receives) for per-record
    dicts with the keyword arguments of :func:`record` (a missing ``offset`` is the record's
    index). :func:`records` gives its records; :func:`sharehost_guest.records_of` decodes any
    batch the way the component glue does."""
    return _encode([_spec(**s) for s in specs])


def instantiate(cls: type, config=(), secrets=()) -> Plugin:
    """Creates and initialises ``cls`` as the host does (``cls()`` then ``init``), with a
    :class:`Config` built from ``config`` and ``secrets`` (dicts or lists of pairs)."""
    if not isinstance(config, Config):
        config = Config(config, secrets)
    return _instantiate(cls, config)


@dataclass
class Emit:
    """One collected emit, as the plugin made it."""

    record_index: int
    output: str
    key: Optional[bytes]
    value: Optional[bytes]
    headers: List[Tuple[str, Optional[bytes]]]

    def header(self, key: str, default=None):
        """The value of the first header named ``key``, or ``default``."""
        for k, v in self.headers:
            if k == key:
                return v
        return default


_emits: List[Emit] = []
_logs: List[Tuple[str, str]] = []
_policy: Optional[Callable[[Emit], None]] = None
_echo = True


def reset() -> None:
    """Forgets collected emits, log lines and HTTP requests, and drops any
    :func:`refuse_emits` policy and HTTP mock."""
    global _policy
    _emits.clear()
    _logs.clear()
    _policy = None
    http._reset()


def take_emits() -> List[Emit]:
    """The emits collected since the last take or reset, in order (and clears them)."""
    out = list(_emits)
    _emits.clear()
    return out


def take_logs() -> List[Tuple[str, str]]:
    """The ``(level, message)`` lines logged since the last take or reset (and clears them)."""
    out = list(_logs)
    _logs.clear()
    return out


def refuse_emits(policy: Optional[Callable[[Emit], None]]) -> None:
    """Makes the fake host refuse emits the way a manifest would: ``policy`` gets each
    :class:`Emit` and raises an :class:`EmitError` subclass (e.g. ``UnknownOutput(name)``)
    to refuse it. None removes the policy."""
    global _policy
    _policy = policy


def echo_logs(on: bool) -> None:
    """Whether native log lines are also written to stderr (default on)."""
    global _echo
    _echo = on


def _record_log(level: str, message: str) -> None:
    _logs.append((level, message))
    if _echo:
        print(f"[{level.upper()}] {message}", file=sys.stderr)


def _record_emit(index, output, key, value, headers) -> None:
    e = Emit(index, output, key, value, list(headers))
    for k, _ in e.headers:
        if k.startswith(RESERVED_HEADER_PREFIX):
            raise ReservedHeader(k)
    if _policy is not None:
        _policy(e)
    _emits.append(e)


class _FakeHttp:
    """The fake host's side of :mod:`sharehost_guest.http` (``testing.http``): a mock answers
    the plugin's requests, and the requests are kept for the test to inspect."""

    def __init__(self) -> None:
        self._mock = None
        self._requests = []

    def mock(self, answer) -> None:
        """Answers every further request with ``answer(request)``, which returns an
        :class:`sharehost_guest.http.Response` or raises (or returns) an
        :class:`sharehost_guest.http.HttpError` subclass (``http.Denied("...")``,
        ``http.Timeout("...")``, ...). Requests of a ``send_all`` are asked in order. Without a
        mock every request is :class:`~sharehost_guest.http.Denied`, as in a pipeline that
        grants no host."""
        self._mock = answer

    def take_requests(self):
        """The requests sent since the last take or reset, in order (those refused as invalid
        before sending included), and clears them."""
        out, self._requests = self._requests, []
        return out

    def _reset(self) -> None:
        self._mock = None
        self._requests = []

    def _send_all(self, requests):
        from . import http as h

        answers = []
        for req in requests:
            self._requests.append(req)
            try:
                req.target()
                if self._mock is None:
                    raise h.Denied(
                        f"{req.url}: no mock installed (sharehost_guest.testing.http.mock)"
                    )
                answer = self._mock(req)
            except h.HttpError as e:
                answer = e
            if not isinstance(answer, (h.Response, h.HttpError)):
                raise TypeError(
                    f"the HTTP mock answered {answer!r}: return an http.Response or raise an "
                    "http.HttpError subclass"
                )
            answers.append(answer)
        return answers


#: The fake HTTP side: ``testing.http.mock(fn)``, ``testing.http.take_requests()``.
http = _FakeHttp()


# Re-exported so a test needs only `testing` for the refusal types.
from . import NoSuchRecord, TooManyBytes, TooManyEmits, UnknownOutput  # noqa: E402,F401
