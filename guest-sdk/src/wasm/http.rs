//! [`crate::http`] in a component: `wasi:http/outgoing-handler@0.2.4` and `wasi:io/poll`.
//!
//! Only what a plugin calls is linked, so these imports appear in a component only when the
//! plugin uses `http::*` (a plugin that does not needs no `allowed_outbound_hosts`).
//!
//! Resource order matters to the host: a child (a pollable, a body, a stream) is dropped
//! before its parent (the future, the response, the body), or the host traps.

use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingResponse, Method as WireMethod,
    OutgoingBody, OutgoingRequest, Scheme,
};
use wasi::io::poll;
use wasi::io::streams::{OutputStream, StreamError};

use crate::http::{HttpError, Method, Request, Response};

/// Bytes asked per read of a response body.
const READ_CHUNK: u64 = 64 * 1024;
/// The most `blocking-write-and-flush` takes in one call (the WASI streams contract).
const WRITE_CHUNK: usize = 4096;

/// Starts every request, then waits for all of them together (see [`crate::http::send_all`]).
pub(crate) fn send_all(requests: Vec<Request>) -> Vec<Result<Response, HttpError>> {
    let mut answers: Vec<Option<Result<Response, HttpError>>> = Vec::with_capacity(requests.len());
    // Each future's pollable is made once and kept beside it (making them anew each round cost
    // the guest and the host N pollables a round, N² for N requests). The pollable is a child
    // of its future and is always dropped first.
    let mut pending: Vec<(usize, poll::Pollable, FutureIncomingResponse)> =
        Vec::with_capacity(requests.len());
    for (i, request) in requests.iter().enumerate() {
        match start(request) {
            Ok(future) => {
                answers.push(None);
                pending.push((i, future.subscribe(), future));
            }
            Err(e) => answers.push(Some(Err(e))),
        }
    }
    while !pending.is_empty() {
        let mut ready: Vec<usize> = {
            let refs: Vec<&poll::Pollable> = pending.iter().map(|(_, p, _)| p).collect();
            poll::poll(&refs).into_iter().map(|i| i as usize).collect()
        };
        // Highest position first, so that swap_remove leaves the lower ones in place.
        ready.sort_unstable_by(|a, b| b.cmp(a));
        ready.dedup();
        for position in ready {
            if position >= pending.len() {
                continue;
            }
            let answer = match pending[position].2.get() {
                None => continue, // not resolved after all: poll again
                Some(Err(())) => Err(HttpError::Other("response already taken".to_owned())),
                Some(Ok(Err(code))) => Err(error(code)),
                Some(Ok(Ok(response))) => read(response),
            };
            let (slot, pollable, future) = pending.swap_remove(position);
            // The child first (bindings would drop in reverse: the future first).
            drop(pollable);
            drop(future);
            if let Some(a) = answers.get_mut(slot) {
                *a = Some(answer);
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(HttpError::Other("no response".to_owned()))))
        .collect()
}

/// Builds and sends one request (its body written after `handle`, so the host is already
/// reading it): the future of its response.
fn start(request: &Request) -> Result<FutureIncomingResponse, HttpError> {
    let target = request.target()?;
    // A body goes with its length (no chunked request: some servers refuse it), unless the
    // plugin set one; the host then checks that exactly that many bytes are written.
    let has_length = request.header_value("content-length").is_some();
    let mut entries = request.headers.clone();
    if !request.body.is_empty() && !has_length {
        entries.push((
            "content-length".to_owned(),
            request.body.len().to_string().into_bytes(),
        ));
    }
    let headers = Fields::from_list(&entries)
        .map_err(|e| HttpError::InvalidRequest(format!("headers: {e:?}")))?;
    let outgoing = OutgoingRequest::new(headers);
    let method = match &request.method {
        Method::Get => WireMethod::Get,
        Method::Head => WireMethod::Head,
        Method::Post => WireMethod::Post,
        Method::Put => WireMethod::Put,
        Method::Delete => WireMethod::Delete,
        Method::Patch => WireMethod::Patch,
        Method::Options => WireMethod::Options,
        Method::Other(name) => WireMethod::Other(name.clone()),
    };
    let scheme = if target.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let invalid = |what: &str| HttpError::InvalidRequest(format!("{what} of `{}`", request.url));
    outgoing
        .set_method(&method)
        .map_err(|()| invalid("method"))?;
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    outgoing
        .set_authority(Some(&target.authority))
        .map_err(|()| invalid("authority"))?;
    outgoing
        .set_path_with_query(Some(&target.path_with_query))
        .map_err(|()| invalid("path"))?;
    let body = outgoing
        .body()
        .map_err(|()| HttpError::Other("request body already taken".to_owned()))?;
    let future = outgoing_handler::handle(outgoing, None).map_err(error)?;
    if !request.body.is_empty() {
        let stream = body
            .write()
            .map_err(|()| HttpError::Other("request body stream already taken".to_owned()))?;
        write_all(&stream, &request.body)?;
    }
    OutgoingBody::finish(body, None).map_err(error)?;
    Ok(future)
}

/// Writes `bytes` to a request body, blocking until the host has taken them.
fn write_all(stream: &OutputStream, bytes: &[u8]) -> Result<(), HttpError> {
    for chunk in bytes.chunks(WRITE_CHUNK) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(stream_error)?;
    }
    Ok(())
}

/// Reads a response's status, headers and whole body.
fn read(response: IncomingResponse) -> Result<Response, HttpError> {
    let status = response.status();
    let headers = {
        let fields = response.headers();
        fields
            .entries()
            .into_iter()
            .collect::<Vec<(String, Vec<u8>)>>()
    };
    let body = response
        .consume()
        .map_err(|()| HttpError::Other("response body already taken".to_owned()))?;
    let bytes = {
        let stream = body
            .stream()
            .map_err(|()| HttpError::Other("response body stream already taken".to_owned()))?;
        let mut bytes = Vec::new();
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(stream_error(e)),
            }
        }
        bytes
    };
    drop(body);
    drop(response);
    Ok(Response {
        status,
        headers,
        body: bytes,
    })
}

/// A stream failure, with the HTTP error behind it when the host gives one (a body over the
/// size cap, a timeout between bytes).
fn stream_error(e: StreamError) -> HttpError {
    match e {
        StreamError::Closed => HttpError::Connect("stream closed".to_owned()),
        StreamError::LastOperationFailed(io) => match wasi::http::types::http_error_code(&io) {
            Some(code) => error(code),
            None => body_error(io.to_debug_string()),
        },
    }
}

/// A response body's failure that came without an error code. wasmtime-wasi-http (48) hands a
/// body's error to the guest as a plain I/O error whose `http-error-code` is none, though the
/// host named it (a body over `http_max_response_bytes`, a read past `http_timeout_ms`); its
/// text still says which, so the class is read from there.
fn body_error(text: String) -> HttpError {
    let lower = text.to_ascii_lowercase();
    if lower.contains("body size exceeds limit") {
        HttpError::TooLarge(text)
    } else if lower.contains("timeout") || lower.contains("timed out") {
        HttpError::Timeout(text)
    } else {
        HttpError::Connect(text)
    }
}

/// The SDK's error for a `wasi:http` error code.
fn error(code: ErrorCode) -> HttpError {
    let text = format!("{code:?}");
    match code {
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => {
            HttpError::Denied(text)
        }
        ErrorCode::DnsTimeout
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => HttpError::Timeout(text),
        ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTerminated
        | ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::TlsAlertReceived(_)
        | ErrorCode::HttpResponseIncomplete => HttpError::Connect(text),
        ErrorCode::HttpResponseBodySize(_) => HttpError::TooLarge(text),
        ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestUriTooLong
        | ErrorCode::HttpRequestLengthRequired
        | ErrorCode::HttpRequestBodySize(_)
        | ErrorCode::HttpRequestHeaderSectionSize(_)
        | ErrorCode::HttpRequestHeaderSize(_)
        | ErrorCode::HttpRequestTrailerSectionSize(_)
        | ErrorCode::HttpRequestTrailerSize(_) => HttpError::InvalidRequest(text),
        _ => HttpError::Other(text),
    }
}
