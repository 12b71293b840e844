//! HTTP for the tests: servers of their own on loopback, and a plain HTTP/1.1 client for a
//! host's admin listener (its paths and bodies are `sharehost::api`'s).

use std::io::{Read, Write};
use std::net::TcpStream;

/// Serves `app` on an ephemeral loopback port for the rest of the test; returns its address.
pub async fn serve_on_loopback(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// The status code and body of a whole HTTP/1.1 answer as read off a socket (status 0 when it
/// is not HTTP).
pub fn parse_response(resp: &str) -> (u16, String) {
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// One HTTP/1.1 request to an admin listener at `addr`; returns status code and body (status
/// 0 when the listener is not there or the answer is not HTTP).
pub fn http_request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let sent = write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut resp = String::new();
    if sent.is_err() || s.read_to_string(&mut resp).is_err() {
        return (0, String::new());
    }
    parse_response(&resp)
}
