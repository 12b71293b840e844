//! WASI: the interfaces component toolchains import even when a plugin never calls them
//! (`validate.rs` lists which), served from an empty context by wasmtime-wasi's own bindings:
//! no preopens, no environment, no arguments, stdin closed, networking denied (wasmtime-wasi
//! 48's default), stdout and stderr captured by the log ([`crate::log::Stdio`]), random bytes
//! at most [`MAX_RANDOM_BYTES_PER_CALL`] per call.

use wasmtime::component::Linker;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::capability::{Capability, Setup};
use crate::store::StoreState;

/// Largest `get-random-bytes` (and insecure) request served in one call: generated in well
/// under a millisecond even in a debug build, where wasmtime-wasi's own 64 MiB default took
/// about 15 s, a host call no deadline could interrupt. Larger requests trap.
pub(crate) const MAX_RANDOM_BYTES_PER_CALL: u64 = 64 << 10;

/// What one store keeps for WASI: wasmtime-wasi's context (its resources live in the store's
/// shared table).
pub(crate) struct Wasi {
    ctx: WasiCtx,
}

impl Capability for Wasi {
    type Report = ();

    fn new(setup: &Setup<'_>) -> Self {
        let ctx = WasiCtx::builder()
            .stdout(setup.stdio.stdout.clone())
            .stderr(setup.stdio.stderr.clone())
            .allow_blocking_current_thread(false)
            .max_random_size(MAX_RANDOM_BYTES_PER_CALL)
            .build();
        Self { ctx }
    }

    fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
        wasmtime_wasi::p2::add_to_linker_async(linker)
    }

    fn end_call(&mut self) {}
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.caps.wasi.ctx,
            table: &mut self.table,
        }
    }
}
