"""Write a sharehost plugin in plain Python.

A plugin judges records fetched from a Kafka share group: for each record it returns a verdict
(:func:`accept`, :func:`release`, :func:`reject` with a reason, :func:`renew`, or :func:`retry`
after a delay). You subclass :class:`Plugin` over pure-Python types (:class:`Record`,
:class:`Verdict`, :class:`Config`), so your logic is unit-tested with plain ``pytest`` and the
fakes in :mod:`sharehost_guest.testing`, no WebAssembly involved. ``guest-sdk/python/build``
turns the module into a WebAssembly component (contract ``sharehost:plugin@0.2.0``).

A complete plugin::

    from sharehost_guest import Plugin, accept, reject, export

    @export
    class SizeLimit(Plugin):
        def init(self, config):
            self.max = int(config.get("max-bytes", "1024"))   # ValueError refuses the config

        def handle_record(self, record):
            if record.value is not None and len(record.value) > self.max:
                return reject("value too large")
            return accept()

State: the host creates one plugin object per component instance (``cls()`` then ``init``) and
calls ``handle`` on that same object for every batch the instance judges, so attributes you set
in ``init`` or ``handle`` survive across batches. The host recycles instances (after a number
of batches and after any fault), so keep only caches there, never state that must survive.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

__all__ = [
    "Plugin",
    "Record",
    "Verdict",
    "Config",
    "ConfigError",
    "EmitError",
    "NoSuchRecord",
    "UnknownOutput",
    "TooManyEmits",
    "TooManyBytes",
    "ReservedHeader",
    "accept",
    "release",
    "reject",
    "renew",
    "retry",
    "log",
    "export",
    "records_of",
    "RESERVED_HEADER_PREFIX",
    "NULL_SPAN",
]

#: The wire encoding of "null" in a span's start position (see ``wit/plugin.wit``).
NULL_SPAN = 0xFFFFFFFF

#: The header-key prefix the host keeps for its own (provenance) headers.
RESERVED_HEADER_PREFIX = "sharehost."

_U32_MAX = 0xFFFFFFFF

Bytes = Union[bytes, bytearray, memoryview, str]


# --------------------------------------------------------------------------------------------
# The host behind the SDK. Natively (unit tests) it is `testing`'s fake; in a component the
# build's glue (`sharehost_guest._component`) swaps in the real imports. Kept as a tiny object
# so both sides replace two functions and nothing else.


class _Backend:
    """Where log lines and emits go: the fake host natively, the real host in a component."""

    def __init__(self) -> None:
        self.log: Callable[[str, str], None] = _native_log
        self.emit: Callable[[int, str, Optional[bytes], Optional[bytes], list], None] = (
            _native_emit
        )


def _native_log(level: str, message: str) -> None:
    from . import testing

    testing._record_log(level, message)


def _native_emit(index, output, key, value, headers) -> None:
    from . import testing

    testing._record_emit(index, output, key, value, headers)


_backend = _Backend()


# --------------------------------------------------------------------------------------------
# Verdicts


class Verdict:
    """What should happen to one record; build one with :func:`accept`, :func:`release`,
    :func:`reject`, :func:`renew` or :func:`retry` (compare verdicts with ``==`` in tests).

    ``kind`` is one of ``"accept"``, ``"release"``, ``"reject"``, ``"renew"``, ``"retry"``;
    ``reason`` is set for a reject (or None), ``after_ms`` for a retry.
    """

    __slots__ = ("kind", "reason", "after_ms")

    def __init__(self, kind: str, reason: Optional[str] = None, after_ms: int = 0) -> None:
        self.kind = kind
        self.reason = reason
        self.after_ms = after_ms

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Verdict)
            and self.kind == other.kind
            and self.reason == other.reason
            and self.after_ms == other.after_ms
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.reason, self.after_ms))

    def __repr__(self) -> str:
        if self.kind == "reject":
            return f"reject({self.reason!r})" if self.reason is not None else "reject()"
        if self.kind == "retry":
            return f"retry({self.after_ms})"
        return f"{self.kind}()"


_ACCEPT = Verdict("accept")
_RELEASE = Verdict("release")
_RENEW = Verdict("renew")


def accept() -> Verdict:
    """Processed: acknowledge the record; it is never delivered again."""
    return _ACCEPT


def release() -> Verdict:
    """Not processed now: hand the record back for redelivery (to any consumer of the group)."""
    return _RELEASE


def reject(reason: Optional[str] = None) -> Verdict:
    """Never deliver the record again (dead-lettered when the pipeline has a dead-letter topic).

    The reason is logged and travels with the dead letter; the host bounds its length.
    """
    if reason is not None and not isinstance(reason, str):
        reason = str(reason)
    return Verdict("reject", reason=reason)


def renew() -> Verdict:
    """Still working on it: keep the lock (KIP-932 renew) and deliver the record here again."""
    return _RENEW


def retry(after_ms: int) -> Verdict:
    """Try again after ``after_ms`` milliseconds: the host keeps the record acquired and
    releases it when the delay has passed, so a plugin facing a 429 backs off instead of
    spinning. The host caps the delay (``max_retry_delay_ms``); the record's emits are
    discarded. Delays beyond 2**32-1 ms saturate; a negative delay is a ValueError."""
    after_ms = int(after_ms)
    if after_ms < 0:
        raise ValueError(f"retry delay must be >= 0 ms, got {after_ms}")
    return Verdict("retry", after_ms=min(after_ms, _U32_MAX))


# --------------------------------------------------------------------------------------------
# Emit errors (the contract's `emit-error`)


class EmitError(Exception):
    """The host refused an emit: it is not produced and never will be. What that means for the
    record is the plugin's call (usually release it or reject it with ``str(error)``).
    Subclasses name the reason: :class:`NoSuchRecord`, :class:`UnknownOutput`,
    :class:`TooManyEmits`, :class:`TooManyBytes`, :class:`ReservedHeader`."""


class NoSuchRecord(EmitError):
    """The record is not one of the batch being judged (or emit was called outside handle)."""

    def __init__(self) -> None:
        super().__init__("no such record in the batch being judged")


class UnknownOutput(EmitError):
    """The manifest's ``[pipeline.outputs]`` has no output of this name (``.output``)."""

    def __init__(self, output: str) -> None:
        self.output = output
        super().__init__(
            f"unknown output `{output}` (not in the manifest's [pipeline.outputs],"
            " or test-plugin's --output)"
        )


class TooManyEmits(EmitError):
    """The batch already emitted the most records the manifest allows (``.limit``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"too many emits: the batch already emitted {limit}, the manifest's max_emits_per_batch"
        )


class TooManyBytes(EmitError):
    """This emit would take the batch past the bytes the manifest allows (``.limit``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"too many bytes: this emit would take the batch past {limit} bytes "
            "(max_emit_bytes_per_batch)"
        )


class ReservedHeader(EmitError):
    """A header key starts with the reserved ``sharehost.`` prefix (``.key``)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"header `{key}` uses the reserved `sharehost.` prefix")


def _as_bytes(what: str, b: Optional[Bytes]) -> Optional[bytes]:
    """Accepts bytes-like or str (UTF-8 encoded) so emits read naturally; None stays null."""
    if b is None or isinstance(b, bytes):
        return b
    if isinstance(b, str):
        return b.encode("utf-8")
    if isinstance(b, (bytearray, memoryview)):
        return bytes(b)
    raise TypeError(f"{what} must be bytes, str or None, not {type(b).__name__}")


# --------------------------------------------------------------------------------------------
# Records


class _Unread:
    """Marks a lazily decoded field that has not been read yet (None is a valid value)."""


_UNREAD = _Unread()


def _span(data: bytes, spans: Sequence[int], i: int) -> Optional[bytes]:
    """The bytes of span ``i`` (entries 2i, 2i+1) of ``spans``; None for a null span."""
    start = spans[2 * i]
    if start == NULL_SPAN:
        return None
    return data[start : start + spans[2 * i + 1]]


class Record:
    """One record of a batch. Its fields are read from the batch's columns only when you use
    them: ``key``, ``value`` and ``headers`` are sliced out of the batch's one byte buffer on
    first access (and then kept), so a plugin that looks at values only never pays for keys.

    - ``index``: the record's position in its batch (what binds :meth:`emit` to it);
    - ``topic``, ``partition``, ``offset``, ``timestamp`` (ms since the epoch),
      ``delivery_count`` (1 on the first delivery);
    - ``key``, ``value``: ``bytes`` or ``None`` (null, distinct from empty; a null value is a
      tombstone);
    - ``headers``: list of ``(str, bytes | None)`` in order (keys may repeat).

    Build records for tests with :func:`sharehost_guest.testing.record`.
    """

    __slots__ = ("index", "_b", "_key", "_value", "_headers")

    def __init__(self, batch, index: int) -> None:
        # `batch` has the contract's columns (the wire `Batch` in a component, a
        # `testing.Columns` natively): the same decoding code runs in both.
        self.index = index
        self._b = batch
        self._key = _UNREAD
        self._value = _UNREAD
        self._headers = _UNREAD

    @property
    def topic(self) -> str:
        """The topic the record was fetched from."""
        return self._b.topics[self._b.topic_index[self.index]]

    @property
    def partition(self) -> int:
        """The partition the record was fetched from."""
        return self._b.partitions[self.index]

    @property
    def offset(self) -> int:
        """The record's offset in its partition."""
        return self._b.offsets[self.index]

    @property
    def timestamp(self) -> int:
        """Record timestamp, milliseconds since the Unix epoch."""
        return self._b.timestamps[self.index]

    @property
    def delivery_count(self) -> int:
        """How many times the broker has delivered this record, including now (1 = first)."""
        return self._b.delivery_counts[self.index]

    @property
    def idempotency_key(self) -> str:
        """A name for this record that is the same at every delivery, ``TOPIC/PARTITION/OFFSET``:
        hand it to a service the plugin calls (an ``Idempotency-Key`` header) so that a call
        made again after a redelivery does its work once. The host cannot undo a call outside
        Kafka, even in an exactly-once pipeline; the service can, with this key."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def key(self) -> Optional[bytes]:
        """The key; None is a null key, distinct from an empty one."""
        if self._key is _UNREAD:
            self._key = _span(self._b.data, self._b.key_spans, self.index)
        return self._key

    @property
    def value(self) -> Optional[bytes]:
        """The value; None is a null value (a tombstone)."""
        if self._value is _UNREAD:
            self._value = _span(self._b.data, self._b.value_spans, self.index)
        return self._value

    @property
    def headers(self) -> List[Tuple[str, Optional[bytes]]]:
        """Headers in order, as ``(key, value)``; a None value is a null header value."""
        if self._headers is _UNREAD:
            b = self._b
            first = b.header_ranges[2 * self.index]
            count = b.header_ranges[2 * self.index + 1]
            out = []
            data, hs = b.data, b.header_spans
            for h in range(first, first + count):
                k = _span(data, hs, 2 * h)
                out.append(
                    (k.decode("utf-8", "replace") if k is not None else "", _span(data, hs, 2 * h + 1))
                )
            self._headers = out
        return self._headers

    def value_str(self) -> Optional[str]:
        """The value as UTF-8 text; None when null or not valid UTF-8."""
        return _utf8(self.value)

    def key_str(self) -> Optional[str]:
        """The key as UTF-8 text; None when null or not valid UTF-8."""
        return _utf8(self.key)

    def header(self, key: str, default=None) -> Optional[bytes]:
        """The value of the first header named ``key`` as bytes (None for a null value);
        ``default`` when there is no such header. Use :attr:`headers` to tell absent from null,
        :meth:`header_str` for text."""
        for k, v in self.headers:
            if k == key:
                return v
        return default

    def header_str(self, key: str, default=None) -> Optional[str]:
        """The value of the first header named ``key`` as UTF-8 text (None when null or not
        valid UTF-8, like :meth:`value_str`); ``default`` when there is no such header."""
        for k, v in self.headers:
            if k == key:
                return _utf8(v)
        return default

    def emit(
        self,
        output: str,
        key: Optional[Bytes] = None,
        value: Optional[Bytes] = None,
        headers: Iterable[Tuple[str, Optional[Bytes]]] = (),
    ) -> None:
        """Emits a record to the topic the manifest maps ``output`` to, bound to this record:
        the host produces it before this record's accept goes out, and discards it if this
        record ends released, rejected, renewed or retried. So emit first, then return
        :func:`accept`.

        ``key``/``value`` are bytes, str (UTF-8) or None; ``headers`` are ``(str, value)``
        pairs and may not use the ``sharehost.`` prefix. Raises :class:`EmitError` (a
        subclass naming why) when the host refuses: the emit is then never produced.
        Natively the emit goes to :mod:`sharehost_guest.testing`'s collector.
        """
        wire_headers = [(str(k), _as_bytes("header value", v)) for k, v in headers]
        _backend.emit(
            self.index, output, _as_bytes("key", key), _as_bytes("value", value), wire_headers
        )

    def __repr__(self) -> str:
        return (
            f"Record(index={self.index}, topic={self.topic!r}, partition={self.partition}, "
            f"offset={self.offset}, key={self.key!r}, value={self.value!r})"
        )


def _utf8(b: Optional[bytes]) -> Optional[str]:
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None


def records_of(batch) -> List[Record]:
    """The records of a columnar batch (anything with the contract's ``batch`` fields), lazily
    decoded. The component glue uses it; tests rarely need it directly."""
    return [Record(batch, i) for i in range(len(batch.offsets))]


# --------------------------------------------------------------------------------------------
# Configuration


class ConfigError(Exception):
    """Raise it from :meth:`Plugin.init` to refuse a configuration: its message is what the
    host shows (any other exception refuses too, prefixed with its type name)."""


class Config:
    """The pipeline's configuration: the manifest's key/value pairs, in order (later entries
    override earlier ones), and apart from them its secrets (``[pipeline.secrets]``).

    Secrets are kept out of :meth:`get` and :meth:`items` so code dumping the configuration
    never dumps them, and ``repr`` shows their names only.
    """

    __slots__ = ("_pairs", "_secrets")

    def __init__(self, pairs=(), secrets=()) -> None:
        # dicts and lists of pairs both work, so tests can write Config({"k": "v"}).
        self._pairs = [(str(k), str(v)) for k, v in _pairs_of(pairs)]
        self._secrets = [(str(k), str(v)) for k, v in _pairs_of(secrets)]

    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:
        """The value of the last pair named ``key``, or ``default`` when there is none."""
        for k, v in reversed(self._pairs):
            if k == key:
                return v
        return default

    def secret(self, name: str) -> Optional[str]:
        """The secret named ``name`` (from ``[pipeline.secrets]``), e.g. an API token; None
        when absent. Keep it out of logs, reasons and emits yourself."""
        for k, v in reversed(self._secrets):
            if k == name:
                return v
        return None

    def items(self) -> List[Tuple[str, str]]:
        """All pairs, in manifest order (secrets not included)."""
        return list(self._pairs)

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self._pairs)

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        return iter(self._pairs)

    def __repr__(self) -> str:
        secrets = ", ".join(f"{k!r}: <redacted>" for k, _ in self._secrets)
        return f"Config(pairs={self._pairs!r}, secrets={{{secrets}}})"


def _pairs_of(pairs):
    if isinstance(pairs, dict):
        return list(pairs.items())
    return list(pairs)


# --------------------------------------------------------------------------------------------
# Plugins


class Plugin:
    """Subclass it and override :meth:`init` and :meth:`handle_record` (or :meth:`handle` to
    work on a whole batch). The host builds one object per instance with ``cls()`` (so the
    constructor takes no arguments), calls :meth:`init` once, then :meth:`handle` for every
    batch: state kept on ``self`` lives across batches until the host recycles the instance.
    """

    def init(self, config: Config) -> None:
        """Reads the pipeline configuration. Raise (ideally :class:`ConfigError`) to refuse
        it: at load the pipeline does not start and shows the message (never include a secret
        in it). The default accepts any configuration."""

    def handle(self, records: List[Record]) -> List[Verdict]:
        """Judges a batch: must return exactly one verdict per record, in order. The default
        calls :meth:`handle_record` for each record; override it to work on the batch as a
        whole. An exception escaping it is a plugin fault (the whole batch gets the
        pipeline's fault policy and the next batch runs on a fresh instance)."""
        hr = self.handle_record
        return [hr(r) for r in records]

    def handle_record(self, record: Record) -> Verdict:
        """Judges one record (called by the default :meth:`handle`)."""
        raise NotImplementedError(
            f"{type(self).__name__} must override handle_record(record) or handle(records)"
        )


_exported: List[type] = []


def export(cls: type) -> type:
    """Marks ``cls`` as the plugin the component exports (use as a class decorator, once per
    plugin module). Without it the build picks the one :class:`Plugin` subclass defined in the
    module, and fails when there are several."""
    if not (isinstance(cls, type) and issubclass(cls, Plugin)):
        raise TypeError(f"{cls!r} is not a sharehost plugin: subclass sharehost_guest.Plugin")
    _exported.append(cls)
    return cls


def instantiate(cls: type, config: Config) -> Plugin:
    """Creates and initialises a plugin exactly as the host does (``cls()`` then ``init``)."""
    plugin = cls()
    plugin.init(config)
    return plugin


from . import log  # noqa: E402  (log uses _backend, defined above)
