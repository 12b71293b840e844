"""``sharehost_guest.http`` inside a component: ``wasi:http/outgoing-handler`` and
``wasi:io/poll`` through componentize-py's bindings. Imported by the component glue only when the
plugin uses HTTP (the build then targets the world with those imports). Not a public API.

Resource order matters to the host: a child (a pollable, a body, a stream) is dropped before
its parent (the future, the response, the body), or the host traps ("resource has children").
Python's garbage collector drops in no fixed order, so every resource here is dropped
explicitly (``__exit__``), children first.
"""

from __future__ import annotations

from typing import List, Optional, Union

from componentize_py_types import Err
from wit_world.imports import http_types as ht
from wit_world.imports import outgoing_handler, poll, streams

from . import http

#: Bytes asked per read of a response body.
_READ_CHUNK = 64 * 1024
#: The most ``blocking-write-and-flush`` takes in one call (the WASI streams contract).
_WRITE_CHUNK = 4096

_METHODS = {
    "GET": ht.Method_Get(),
    "HEAD": ht.Method_Head(),
    "POST": ht.Method_Post(),
    "PUT": ht.Method_Put(),
    "DELETE": ht.Method_Delete(),
    "PATCH": ht.Method_Patch(),
    "OPTIONS": ht.Method_Options(),
}


def _drop(resource) -> None:
    if resource is not None:
        resource.__exit__(None, None, None)


def send_all(requests: List[http.Request]) -> List[Union[http.Response, http.HttpError]]:
    """Starts every request, then waits for all of them together (see ``http.send_all``)."""
    answers: List[Optional[Union[http.Response, http.HttpError]]] = []
    # (slot, pollable, future): each future's pollable is made once and kept beside it; the
    # pollable is a child of its future and is always dropped first.
    pending = []
    for i, request in enumerate(requests):
        try:
            future = _start(request)
        except http.HttpError as e:
            answers.append(e)
            continue
        answers.append(None)
        pending.append((i, future.subscribe(), future))
    while pending:
        ready = sorted(set(poll.poll([p for _, p, _ in pending])), reverse=True)
        for position in ready:
            if position >= len(pending):
                continue
            slot, pollable, future = pending[position]
            got = future.get()
            if got is None:
                continue  # not resolved after all: poll again
            if isinstance(got, Err):
                answer: Union[http.Response, http.HttpError] = http.Other("response already taken")
            elif isinstance(got.value, Err):
                answer = _error(got.value.value)
            else:
                answer = _read(got.value.value)
            del pending[position]
            _drop(pollable)
            _drop(future)
            answers[slot] = answer
    return [a if a is not None else http.Other("no response") for a in answers]


def _start(request: http.Request):
    """Builds and sends one request (its body written after ``handle``, so the host is already
    reading it): the future of its response."""
    https, authority, path = request.target()
    entries = list(request.headers)
    # A body goes with its length (no chunked request: some servers refuse it), unless the
    # plugin set one.
    if request.body and request.header_value("content-length") is None:
        entries.append(("content-length", str(len(request.body)).encode()))
    try:
        headers = ht.Fields.from_list(entries)
    except Err as e:
        raise http.InvalidRequest(f"headers: {type(e.value).__name__.split('_')[-1]}") from None
    outgoing = ht.OutgoingRequest(headers)
    method = _METHODS.get(request.method) or ht.Method_Other(request.method)

    def invalid(what: str) -> http.InvalidRequest:
        return http.InvalidRequest(f"{what} of `{request.url}`")

    try:
        try:
            outgoing.set_method(method)
        except Err:
            raise invalid("method") from None
        try:
            outgoing.set_scheme(ht.Scheme_Https() if https else ht.Scheme_Http())
        except Err:
            raise invalid("scheme") from None
        try:
            outgoing.set_authority(authority)
        except Err:
            raise invalid("authority") from None
        try:
            outgoing.set_path_with_query(path)
        except Err:
            raise invalid("path") from None
        body = outgoing.body()
    except BaseException:
        _drop(outgoing)
        raise
    try:
        future = outgoing_handler.handle(outgoing, None)
    except Err as e:
        _drop(body)
        raise _error(e.value) from None
    if request.body:
        stream = body.write()
        try:
            _write_all(stream, request.body)
        finally:
            _drop(stream)
    try:
        ht.OutgoingBody.finish(body, None)
    except Err as e:
        _drop(future)
        raise _error(e.value) from None
    return future


def _write_all(stream: streams.OutputStream, data: bytes) -> None:
    for start in range(0, len(data), _WRITE_CHUNK):
        try:
            stream.blocking_write_and_flush(data[start : start + _WRITE_CHUNK])
        except Err as e:
            raise _stream_error(e.value) from None


def _read(response) -> Union[http.Response, http.HttpError]:
    """Reads a response's status, headers and whole body."""
    try:
        status = response.status()
        fields = response.headers()
        headers = fields.entries()
        _drop(fields)
        body = response.consume()
    except Err:
        _drop(response)
        return http.Other("response body already taken")
    chunks = []
    error: Optional[http.HttpError] = None
    stream = body.stream()
    try:
        while True:
            try:
                chunks.append(stream.blocking_read(_READ_CHUNK))
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    break
                error = _stream_error(e.value)
                break
    finally:
        _drop(stream)
        _drop(body)
        _drop(response)
    if error is not None:
        return error
    return http.Response(status, headers, b"".join(chunks))


def _stream_error(e) -> http.HttpError:
    """A stream failure, with the HTTP error behind it when the host gives one."""
    if isinstance(e, streams.StreamError_Closed):
        return http.Connect("stream closed")
    io_error = e.value
    try:
        code = ht.http_error_code(io_error)
        if code is not None:
            return _error(code)
        return _body_error(io_error.to_debug_string())
    finally:
        _drop(io_error)


def _body_error(text: str) -> http.HttpError:
    """A response body's failure that came without an error code: wasmtime-wasi-http hands a
    body's error to the guest as a plain I/O error whose ``http-error-code`` is none, though
    the host named it; its text still says which (the same reading as the Rust SDK's)."""
    lower = text.lower()
    if "body size exceeds limit" in lower:
        return http.TooLarge(text)
    if "timeout" in lower or "timed out" in lower:
        return http.Timeout(text)
    return http.Connect(text)


_DENIED = (ht.ErrorCode_HttpRequestDenied, ht.ErrorCode_DestinationIpProhibited)
_TIMEOUT = (
    ht.ErrorCode_DnsTimeout,
    ht.ErrorCode_ConnectionTimeout,
    ht.ErrorCode_ConnectionReadTimeout,
    ht.ErrorCode_ConnectionWriteTimeout,
    ht.ErrorCode_HttpResponseTimeout,
)
_CONNECT = (
    ht.ErrorCode_DnsError,
    ht.ErrorCode_DestinationNotFound,
    ht.ErrorCode_DestinationUnavailable,
    ht.ErrorCode_DestinationIpUnroutable,
    ht.ErrorCode_ConnectionRefused,
    ht.ErrorCode_ConnectionTerminated,
    ht.ErrorCode_TlsProtocolError,
    ht.ErrorCode_TlsCertificateError,
    ht.ErrorCode_TlsAlertReceived,
    ht.ErrorCode_HttpResponseIncomplete,
)
_INVALID = (
    ht.ErrorCode_HttpRequestMethodInvalid,
    ht.ErrorCode_HttpRequestUriInvalid,
    ht.ErrorCode_HttpRequestUriTooLong,
    ht.ErrorCode_HttpRequestLengthRequired,
    ht.ErrorCode_HttpRequestBodySize,
    ht.ErrorCode_HttpRequestHeaderSectionSize,
    ht.ErrorCode_HttpRequestHeaderSize,
    ht.ErrorCode_HttpRequestTrailerSectionSize,
    ht.ErrorCode_HttpRequestTrailerSize,
)


def _describe(code) -> str:
    """The error code the way the Rust SDK shows it (``HttpRequestDenied``,
    ``DnsError(...)``)."""
    name = type(code).__name__.split("_", 1)[-1]
    value = getattr(code, "value", None)
    return name if value is None else f"{name}({value!r})"


def _error(code) -> http.HttpError:
    """The SDK's error for a ``wasi:http`` error code (the Rust SDK's classes)."""
    text = _describe(code)
    if isinstance(code, _DENIED):
        return http.Denied(text)
    if isinstance(code, _TIMEOUT):
        return http.Timeout(text)
    if isinstance(code, _CONNECT):
        return http.Connect(text)
    if isinstance(code, ht.ErrorCode_HttpResponseBodySize):
        return http.TooLarge(text)
    if isinstance(code, _INVALID):
        return http.InvalidRequest(text)
    return http.Other(text)

