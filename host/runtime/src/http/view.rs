//! The HTTP capability of one store, in the shape of wasmtime's capability crates: a context
//! ([`HttpCtx`]: wasmtime-wasi-http's own, plus the hook that holds the grant), made by
//! [`HttpCtxBuilder`] (whose defaults are documented there); the per-call view is
//! wasmtime-wasi-http's [`WasiHttpCtxView`], made by [`HttpCtx::view`] from the store's state
//! through its [`WasiHttpView`] implementation (here); its [`Capability`] implementation makes
//! it from the pipeline's grant and defines `wasi:http`'s interfaces with wasmtime-wasi-http's
//! generated bindings. Whether a plugin may import them, and where its requests may go, is
//! decided per plugin by its grant, never by the linker.

use std::future::Future;
use std::sync::Arc;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi_http::p2::add_only_http_to_linker_async;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
    WasiHttpView,
};

use http_body_util::BodyExt;

use super::allow_list::Target;
use super::body::DrainedRequestBody;
use super::client::SendFuture;
use super::grant::HttpGrant;
use super::report::Refusals;
use crate::capability::{Call, Capability, Setup};
use crate::meter::{Charged, CpuMeter};
use crate::secrets::Secrets;
use crate::store::StoreState;

/// Largest write a guest may make to an outgoing request body in one call (wasmtime-wasi-http
/// defaults to 1 MiB). With one buffered chunk per body (the crate's default), an open request
/// body holds at most this much host memory; a guest that sends more writes more often, paced
/// by `check-write`.
const OUTGOING_BODY_CHUNK_SIZE: usize = 64 << 10;

/// Largest host-side header map (`wasi:http` `fields`) a plugin may build, names and values
/// together (wasmtime-wasi-http allows 128 KiB): far above what requests to APIs carry.
pub(crate) const MAX_FIELDS_BYTES: usize = 16 << 10;

/// Builds an [`HttpCtx`]. The defaults: no grant, so every request is refused in the host
/// (`HTTP-request-denied`, logged); refusals logged as plugin `plugin`'s, outside a pipeline,
/// nothing redacted. Header maps are held to [`MAX_FIELDS_BYTES`] and request-body writes to
/// [`OUTGOING_BODY_CHUNK_SIZE`], whatever the grant.
pub(crate) struct HttpCtxBuilder {
    grant: Option<Arc<HttpGrant>>,
    plugin: Arc<str>,
    pipeline: Option<Arc<str>>,
    secrets: Arc<Secrets>,
}

impl HttpCtxBuilder {
    /// A builder with the defaults.
    pub(crate) fn new() -> Self {
        Self {
            grant: None,
            plugin: Arc::from("plugin"),
            pipeline: None,
            secrets: Arc::default(),
        }
    }

    /// What the pipeline grants (`None`: every request is refused in the host).
    pub(crate) fn grant(mut self, grant: Option<Arc<HttpGrant>>) -> Self {
        self.grant = grant;
        self
    }

    /// The plugin's name, on refusal lines.
    pub(crate) fn plugin(mut self, plugin: Arc<str>) -> Self {
        self.plugin = plugin;
        self
    }

    /// The pipeline running the plugin, on refusal lines too.
    pub(crate) fn pipeline(mut self, pipeline: Option<Arc<str>>) -> Self {
        self.pipeline = pipeline;
        self
    }

    /// The secrets redacted from refusal lines.
    pub(crate) fn secrets(mut self, secrets: Arc<Secrets>) -> Self {
        self.secrets = secrets;
        self
    }

    /// The context; no call's meter yet.
    pub(crate) fn build(self) -> HttpCtx {
        let mut ctx = WasiHttpCtx::new();
        ctx.set_field_size_limit(MAX_FIELDS_BYTES);
        HttpCtx {
            ctx,
            hooks: Hooks {
                grant: self.grant,
                meter: None,
                traceparent: None,
                refusals: Arc::new(Refusals::new(self.plugin, self.pipeline, self.secrets)),
            },
        }
    }
}

/// What one store keeps for the HTTP capability: wasmtime-wasi-http's context and the hook
/// that holds the grant.
pub(crate) struct HttpCtx {
    ctx: WasiHttpCtx,
    hooks: Hooks,
}

impl HttpCtx {
    /// A builder with the defaults.
    pub(crate) fn builder() -> HttpCtxBuilder {
        HttpCtxBuilder::new()
    }

    /// The view wasmtime-wasi-http's host functions work on, with the store's `table`.
    pub(crate) fn view<'a>(&'a mut self, table: &'a mut ResourceTable) -> WasiHttpCtxView<'a> {
        WasiHttpCtxView {
            ctx: &mut self.ctx,
            table,
            hooks: &mut self.hooks,
        }
    }

    /// A call begins: its refusal budget is full again, and the host work of requests it
    /// starts (the exchange, its connection, its body) is charged to `meter`, the call's: it
    /// counts against the call's CPU deadline.
    pub(crate) fn begin_call(
        &mut self,
        meter: Arc<CpuMeter>,
        traceparent: Option<&http::HeaderValue>,
    ) {
        self.hooks.refusals.reset();
        self.hooks.meter = Some(meter);
        self.hooks.traceparent = traceparent.cloned();
    }

    /// The call ended: says how many of its refusals were not logged, if any.
    pub(crate) fn end_call(&self) {
        self.hooks.refusals.end_call();
    }
}

/// The hook wasmtime-wasi-http hands every outgoing request to: the grant's, or a refusal.
struct Hooks {
    grant: Option<Arc<HttpGrant>>,
    refusals: Arc<Refusals>,
    meter: Option<Arc<CpuMeter>>,
    /// The host's trace context for the call, set on each request that carries none.
    traceparent: Option<http::HeaderValue>,
}

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<SendFuture> {
        // Whatever drops the request before its body's end, the guest's writes still land.
        let mut request = request.map(|body| DrainedRequestBody::new(body).boxed_unsync());
        // The service called continues the host's trace, unless the plugin chose a context.
        if let Some(tp) = &self.traceparent
            && !request.headers().contains_key("traceparent")
        {
            request.headers_mut().insert("traceparent", tp.clone());
        }
        match &self.grant {
            Some(grant) => {
                let send = grant
                    .clone()
                    .send(request, self.refusals.clone(), self.meter.clone());
                match self.meter.clone() {
                    Some(meter) => Box::new(Charged::new(Box::into_pin(send), meter)),
                    None => send,
                }
            }
            None => {
                let origin = Target::of(request.uri()).map(|t| t.to_string());
                self.refusals.note(
                    origin.as_deref().unwrap_or("(invalid)"),
                    "outbound HTTP request refused: the pipeline grants no host \
                     (allowed_outbound_hosts)",
                );
                Box::new(async { Err(HttpError::HttpRequestDenied) })
            }
        }
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        OUTGOING_BODY_CHUNK_SIZE
    }

    // hyper errors reach here only from a response body read by the guest (the exchange maps
    // its own); the default hook logs each one at warn.
    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        tracing::debug!(error = %err, "outbound HTTP protocol error");
        if err.is_timeout() {
            ErrorCode::HttpResponseTimeout
        } else if err.is_incomplete_message() {
            ErrorCode::HttpResponseIncomplete
        } else if err.is_closed() || err.is_canceled() {
            ErrorCode::ConnectionTerminated
        } else {
            ErrorCode::HttpProtocolError
        }
    }
}

impl Capability for HttpCtx {
    type Report = ();

    fn new(setup: &Setup<'_>) -> Self {
        HttpCtx::builder()
            .grant(setup.limits.http.clone())
            .plugin(setup.plugin.clone())
            .pipeline(setup.pipeline.clone())
            .secrets(setup.secrets.clone())
            .build()
    }

    /// Defines `wasi:http`'s own interfaces (`types`, `outgoing-handler`); every request goes
    /// to the store's hook, through its [`WasiHttpView`]. WASI's, which they use, come first.
    fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
        add_only_http_to_linker_async(linker)
    }

    fn begin_call(&mut self, call: &Call<'_>) {
        HttpCtx::begin_call(self, call.meter.clone(), call.traceparent);
    }

    /// Says how many of the call's refusals were not logged, if any. Its counters are the
    /// grant's ([`HttpGrant::stats`]), shared by every instance.
    fn end_call(&mut self) {
        HttpCtx::end_call(self);
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        self.caps.http.view(&mut self.table)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn the_default_context_refuses_every_request_in_the_host() {
        let mut ctx = HttpCtx::builder().build();
        let request = http::Request::builder()
            .uri("http://127.0.0.1:9/")
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("request");
        let sent = ctx
            .hooks
            .send_request(request, None, Box::new(async { Ok(()) }));
        let result = std::pin::Pin::from(sent).await;
        assert!(matches!(result, Err(HttpError::HttpRequestDenied)));
        assert_eq!(ctx.hooks.refusals.dropped(), 0, "the refusal was logged");
    }
}
