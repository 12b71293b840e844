//! Outbound HTTP for plugins (`wasi:http/outgoing-handler`), granted per pipeline by an
//! allow-list. STUB: the HTTP room is being written; every request is refused for now.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::host::StoreState;

/// What a pipeline's manifest grants for outbound HTTP, before it is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpSettings {
    /// `allowed_outbound_hosts`: scheme + host + port entries (`https://api.example.com`,
    /// `http://127.0.0.1:8080`, `https://*.example.com`).
    pub allowed_outbound_hosts: Vec<String>,
    /// Per-request timeout (connect, send, response head and body).
    pub request_timeout: Duration,
    /// Largest response body handed to the guest.
    pub max_response_bytes: u64,
    /// Requests in flight at once, across all instances of the pipeline.
    pub max_concurrent: usize,
    /// Extra CA certificates (PEM) trusted beside the system roots.
    pub ca_file: Option<PathBuf>,
}

/// A checked HTTP grant, shared by every instance of one plugin version.
#[derive(Debug)]
pub struct HttpGrant {
    settings: HttpSettings,
}

impl HttpGrant {
    /// Checks `settings` (every allow-list entry, the CA file).
    pub fn new(settings: HttpSettings) -> Result<Arc<Self>, String> {
        Ok(Arc::new(Self { settings }))
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }
}

/// Per-store HTTP state.
pub(crate) struct HttpState {
    ctx: WasiHttpCtx,
    hooks: Hooks,
}

impl HttpState {
    pub(crate) fn new(grant: Option<Arc<HttpGrant>>) -> Self {
        Self {
            ctx: WasiHttpCtx::new(),
            hooks: Hooks { _grant: grant },
        }
    }
}

struct Hooks {
    _grant: Option<Arc<HttpGrant>>,
}

impl wasmtime_wasi_http::WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        _request: http::Request<wasmtime_wasi_http::WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Box<
        dyn Future<
                Output = wasmtime_wasi_http::Result<(
                    http::Response<wasmtime_wasi_http::WasiBody>,
                    Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                )>,
            > + Send,
    > {
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http.ctx,
            table: &mut self.table,
            hooks: &mut self.http.hooks,
        }
    }
}
