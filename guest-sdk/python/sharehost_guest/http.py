"""Outbound HTTP from a plugin: :func:`send` for one request, :func:`send_all` for the requests of
a batch at once. The same model and error classes as the Rust SDK's ``sharehost_guest::http``.

A pipeline grants hosts in its manifest (``allowed_outbound_hosts = ["http://127.0.0.1:8088"]``,
scheme + host + port); a request to any other host is refused inside the host and comes back as
:class:`Denied`. A plugin module that imports this module is built into a component that
imports ``wasi:http`` (so a pipeline must grant it at least one host, or it is refused at load);
a plugin that does not import it needs no grant. The host bounds each request (timeout,
response size) and the requests in flight, follows no redirect, and counts the time spent
waiting against the batch's wall-clock deadline (not its CPU one).

In a component the requests go through ``wasi:http``. Natively (your unit tests) they go to the
mock installed with :func:`sharehost_guest.testing.http.mock`::

    from sharehost_guest import http, testing

    testing.reset()
    testing.http.mock(lambda req: http.Response(200, body=b'{"unit_price": 2.5}')
                      if req.url.endswith("/A-1") else http.Response(404))
    a, b = http.send_all([http.Request.get("http://127.0.0.1:8088/price/A-1"),
                          http.Request.get("http://127.0.0.1:8088/price/Z-9")])
    assert a.status == 200 and b.status == 404

HTTP statuses (404, 429, 503 ...) are not errors: they are :class:`Response` objects. An
:class:`HttpError` means the request got no response.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

__all__ = [
    "Request",
    "Response",
    "HttpError",
    "InvalidRequest",
    "Denied",
    "Timeout",
    "Connect",
    "TooLarge",
    "Other",
    "send",
    "send_all",
    "get",
]

#: Header names whose values ``repr`` never shows (they carry credentials).
REDACTED_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key")

HeaderValue = Union[bytes, str]

#: What a component build without HTTP says when the plugin imports this module: the build
#: (``sharehost_guest._build``) reads it and builds again with ``wasi:http``.
NEEDS_HTTP = "sharehost-build: this plugin uses sharehost_guest.http"


def _check_component_build() -> None:
    """Inside a component build (the build writes a ``sharehost_build`` module), refuses to be
    imported into a component built without ``wasi:http``."""
    try:
        import sharehost_build  # type: ignore[import-not-found]
    except ImportError:
        return  # natively: the testing mock answers
    if not getattr(sharehost_build, "HTTP", False):
        raise ImportError(f"{NEEDS_HTTP}; build it with HTTP (`--http`)")


_check_component_build()


def _bytes(what: str, v) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes or str, not {type(v).__name__}")


def _find(headers: Sequence[Tuple[str, bytes]], name: str) -> Optional[bytes]:
    lower = name.lower()
    for k, v in headers:
        if k.lower() == lower:
            return v
    return None


def _text(v: Optional[bytes]) -> Optional[str]:
    if v is None:
        return None
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --------------------------------------------------------------------------------------------
# Errors (the Rust SDK's `HttpError` variants, as exception classes)


class HttpError(Exception):
    """Why a request got no response. Subclasses name the class: :class:`InvalidRequest`,
    :class:`Denied`, :class:`Timeout`, :class:`Connect`, :class:`TooLarge`, :class:`Other`."""

    #: The class's prefix in ``str(error)``, the Rust SDK's ``Display`` words.
    prefix = "HTTP failure"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{self.prefix}: {detail}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.detail == self.detail  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.detail))


class InvalidRequest(HttpError):
    """The request cannot be sent as built (a URL that is not absolute ``http``/``https``, a
    bad header name or value, a bad method)."""

    prefix = "invalid request"


class Denied(HttpError):
    """The host refused to send it: the URL's scheme, host and port are not in the pipeline's
    ``allowed_outbound_hosts`` (or the name resolves to an address the list does not grant).
    Nothing left the host."""

    prefix = "refused by the host (not in allowed_outbound_hosts)"


class Timeout(HttpError):
    """No answer in time: the host's per-request timeout (``http_timeout_ms``), or a connect,
    DNS or read timeout."""

    prefix = "timed out"


class Connect(HttpError):
    """The server could not be reached or the connection broke (DNS, refused, reset, TLS)."""

    prefix = "connection failed"


class TooLarge(HttpError):
    """The response body is larger than the host allows (``http_max_response_bytes``)."""

    prefix = "response too large"


class Other(HttpError):
    """Any other failure (a protocol error, too many requests in flight ...)."""

    prefix = "HTTP failure"


# --------------------------------------------------------------------------------------------
# Requests and responses


class Request:
    """One outgoing request: build it with :meth:`get`/:meth:`post`/:meth:`put`/:meth:`delete`
    (or ``Request(method, url)``) and the builder methods, send it with :func:`send` or
    :func:`send_all`. The fields are plain attributes so tests can inspect what a plugin sent
    (:func:`sharehost_guest.testing.http.take_requests`)."""

    __slots__ = ("method", "url", "headers", "body")

    def __init__(self, method: str, url: str, headers=(), body: HeaderValue = b"") -> None:
        #: The method, upper case (``GET``, ``POST``, ...).
        self.method = str(method).upper()
        #: The absolute URL (``http://host:port/path?query`` or ``https://...``).
        self.url = str(url)
        #: Headers in order, ``(name, bytes)`` (names may repeat).
        self.headers: List[Tuple[str, bytes]] = [
            (str(k), _bytes("header value", v)) for k, v in headers
        ]
        #: The body (empty: none).
        self.body = _bytes("body", body)

    @classmethod
    def get(cls, url: str) -> "Request":
        """A ``GET`` request."""
        return cls("GET", url)

    @classmethod
    def post(cls, url: str) -> "Request":
        """A ``POST`` request (add a body with :meth:`with_body`)."""
        return cls("POST", url)

    @classmethod
    def put(cls, url: str) -> "Request":
        """A ``PUT`` request."""
        return cls("PUT", url)

    @classmethod
    def delete(cls, url: str) -> "Request":
        """A ``DELETE`` request."""
        return cls("DELETE", url)

    def header(self, name: str, value: HeaderValue) -> "Request":
        """Adds a header; returns the request (so calls chain)."""
        self.headers.append((str(name), _bytes("header value", value)))
        return self

    def bearer_auth(self, token: str) -> "Request":
        """Adds ``Authorization: Bearer TOKEN`` (``repr`` never shows its value)."""
        return self.header("authorization", f"Bearer {token}")

    def with_body(self, body: HeaderValue) -> "Request":
        """Sets the body (sent with its ``content-length`` unless a header sets one)."""
        self.body = _bytes("body", body)
        return self

    def header_value(self, name: str) -> Optional[bytes]:
        """The value of the first header named ``name`` (case-insensitive) as bytes, or None.
        (``header(name, value)`` adds a header, as in the Rust SDK.)"""
        return _find(self.headers, name)

    def header_str(self, name: str) -> Optional[str]:
        """The value of the first header named ``name`` (case-insensitive) as UTF-8 text; None
        when absent or not valid UTF-8."""
        return _text(_find(self.headers, name))

    def validate(self) -> None:
        """Raises :class:`InvalidRequest` unless the request can be sent as built (an absolute
        ``http``/``https`` URL with a host), without sending it: lets ``init`` refuse a bad
        configured URL at load instead of failing every record later."""
        self.target()

    def target(self) -> Tuple[bool, str, str]:
        """``(https, authority, path_with_query)``: the URL split the way ``wasi:http`` takes
        it; the same checks natively and in a component."""
        url = self.url
        if any(c in url for c in " \t\r\n") or not url:
            raise InvalidRequest(f"url `{url}` is not a valid URL")
        try:
            parts = urlsplit(url)
        except ValueError as e:
            raise InvalidRequest(f"url `{url}`: {e}") from None
        if not parts.scheme or "://" not in url:
            raise InvalidRequest(f"url `{url}` is not absolute (http://host/...)")
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise InvalidRequest(f"url `{url}`: scheme `{parts.scheme}` is not http or https")
        if not parts.netloc:
            raise InvalidRequest(f"url `{url}` has no host")
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        return scheme == "https", parts.netloc, path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and (
            self.method, self.url, self.headers, self.body
        ) == (other.method, other.url, other.headers, other.body)

    def __repr__(self) -> str:
        shown = [
            (k, "<redacted>" if k.lower() in REDACTED_HEADERS else v.decode("utf-8", "replace"))
            for k, v in self.headers
        ]
        return (
            f"Request(method={self.method!r}, url={self.url!r}, headers={shown!r}, "
            f"body_len={len(self.body)})"
        )


class Response:
    """A response: status, headers and the whole body (read before :func:`send` returns)."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers=(), body: HeaderValue = b"") -> None:
        #: The status code.
        self.status = int(status)
        #: Headers in order, ``(name, bytes)``.
        self.headers: List[Tuple[str, bytes]] = [
            (str(k), _bytes("header value", v)) for k, v in headers
        ]
        #: The body.
        self.body = _bytes("body", body)

    def header(self, name: str) -> Optional[bytes]:
        """The value of the first header named ``name`` (case-insensitive) as bytes, or None."""
        return _find(self.headers, name)

    def header_str(self, name: str) -> Optional[str]:
        """The value of the first header named ``name`` (case-insensitive) as UTF-8 text; None
        when absent or not valid UTF-8."""
        return _text(_find(self.headers, name))

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def text(self) -> Optional[str]:
        """The body as UTF-8 text; None when it is not valid UTF-8."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def json(self):
        """The body parsed as JSON (``json.loads``; raises ``ValueError`` when it is not)."""
        import json

        return json.loads(self.body)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Response) and (self.status, self.headers, self.body) == (
            other.status,
            other.headers,
            other.body,
        )

    def __repr__(self) -> str:
        return f"Response(status={self.status}, headers={self.headers!r}, body_len={len(self.body)})"


# --------------------------------------------------------------------------------------------
# Sending

#: What sends a list of requests: the component's ``wasi:http`` client (installed by the build's
#: glue) or, natively, ``testing``'s mock.
_sender: Optional[Callable[[List[Request]], List[Union[Response, HttpError]]]] = None


def send_all(requests: Sequence[Request]) -> List[Union[Response, HttpError]]:
    """Sends all ``requests`` at once and waits until every one has its answer: a list in the
    same order whose items are a :class:`Response` or the :class:`HttpError` that request got
    (check with ``isinstance(answer, http.HttpError)``). A batch of N records that each need a
    lookup waits about one round trip, not N.

    In a component every request is started first, then their responses are awaited together
    (``wasi:io/poll``) and each body is read as it arrives. The host may still bound how many
    run at once (``http_max_concurrent``). A request that cannot be built fails alone; the
    others go on."""
    requests = list(requests)
    for r in requests:
        if not isinstance(r, Request):
            raise TypeError(f"send_all takes Request objects, got {type(r).__name__}")
    if _sender is None:
        # An import circle on purpose (imported here, when first needed): natively the
        # testing module's fake answers, and it takes this module's Request and Response.
        from . import testing

        return testing.http._send_all(requests)
    return _sender(requests)


def send(request: Request) -> Response:
    """Sends one request and waits for the whole response; raises the :class:`HttpError` it
    got instead of a response."""
    answers = send_all([request])
    answer = answers[0] if answers else Other("no response")
    if isinstance(answer, HttpError):
        raise answer
    return answer


def get(url: str) -> Response:
    """``GET url``, waiting for the whole response (raises :class:`HttpError`)."""
    return send(Request.get(url))
