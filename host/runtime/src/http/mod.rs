//! Outbound HTTP for plugins (`wasi:http/outgoing-handler`), granted per pipeline by an
//! allow-list.
//!
//! wasmtime-wasi-http implements the `wasi:http` types and hands every outgoing request to
//! its `WasiHttpHooks::send_request`; the crate's own sender (which connects anywhere) is not
//! compiled in. This module is that hook (`view.rs`), and its rooms keep every promise of the
//! grant:
//!
//! - **Allow-list.** A request whose scheme, host and port match no `allowed_outbound_hosts`
//!   entry fails with `HTTP-request-denied` (a value the guest handles), is logged and
//!   counted, and never leaves the host: no DNS lookup, no connection.
//! - **Address check.** The host resolves the name itself and connects only to addresses it
//!   checked (never resolving again, so DNS rebinding cannot swap the address in between).
//!   Loopback, private, link-local, shared (CGNAT), documentation and other non-public
//!   addresses are dropped unless the same scheme, address and port are listed as an IP
//!   literal (`http://127.0.0.1:8080`); a name left with no address is refused
//!   (`destination-IP-prohibited`).
//! - **No redirects.** hyper's connection-level client follows none, and nothing here does:
//!   a 3xx is the guest's to read.
//! - **One timeout per request** (`request_timeout`) covers the whole exchange from the
//!   moment it has a permit: DNS, connect, TLS, sending, the response head and the whole body.
//!   One deadline bounds how long a request can hold a permit, whatever the server does (a
//!   server that drips one byte at a time cannot stretch it, a plugin that never reads the
//!   answer cannot either). Waiting for a permit has a timeout of the same length of its own.
//!   The guest's own `request-options` timeouts are ignored: the grant's deadline is the one
//!   the pipeline's operator chose, and a plugin can always give up earlier by dropping the
//!   response future.
//! - **Response-size cap.** A `Content-Length` over `max_response_bytes` is refused at the
//!   head; a body without one is cut when it passes the cap, and the guest's stream fails with
//!   `HTTP-response-body-size`. The body is read only as fast as the guest reads it, so the
//!   host holds at most hyper's read buffer per request, never the body.
//! - **Concurrency cap.** One semaphore per grant (every instance of the plugin version
//!   shares it); a request waits for a permit within its timeout and holds it until its
//!   connection is closed.
//! - **TLS** through rustls (ring) with the system roots plus the optional CA file, one
//!   client configuration per grant; HTTP/1.1 only.
//! - **Bounded request bodies.** A guest writes at most 64 KiB per call into an outgoing
//!   body, and one chunk is buffered per body.
//!
//! Refusals are logged at warn with the origin (`scheme://host:port`, never the path or
//! query, which may carry tokens) and the plugin's name when the grant was built with
//! [`HttpGrant::named`]; every outcome is counted in [`HttpGrant::stats`].
//!
//! The rooms: `grant.rs` (the settings, checked into a grant, and where a request starts),
//! `allow_list.rs` (entries, matching, the address check), `client.rs` (one exchange),
//! `body.rs` (what a request holds while under way: its permit and its response body),
//! `report.rs` (the grant's counters and a store's refusal log) and `view.rs` (the store's
//! context, its builder, the view and the capability's linking).

mod allow_list;
mod body;
mod client;
mod grant;
mod report;
mod view;

pub use allow_list::{AllowedOrigin, OriginError, parse_allowed_origin};
pub use grant::{HttpGrant, HttpGrantError, HttpSettings, tls_connector};
pub use report::{HttpCounts, HttpStats};
pub(crate) use view::{HttpCtx, MAX_FIELDS_BYTES};
