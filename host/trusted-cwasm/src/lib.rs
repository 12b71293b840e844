//! The one unsafe call of sharehost, isolated so the rest of the workspace can keep
//! `unsafe_code = "forbid"`.
//!
//! wasmtime's [`Component::deserialize_file`] maps native code from a file and runs it: it is
//! only as safe as the file is trustworthy. The plugin runtime (`sharehost::runtime`) writes
//! precompiled artifacts itself, into a host-owned 0700 directory, under a name derived from
//! the SHA-256 of the component bytes and the engine's compatibility hash, and calls this
//! function only on such files. Never call it on bytes from anywhere else.

use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;

/// Loads a component that `engine.precompile_component` produced in this host's own cache.
///
/// The caller guarantees the file was written by this host (not by a plugin author, not by
/// another user): that is the whole safety argument, so the function is deliberately narrow.
/// Files from another wasmtime version or configuration are rejected by wasmtime with an
/// error, not loaded.
pub fn load_host_precompiled(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: wasmtime requires that the file be the output of `precompile_component` (or
    // `Component::serialize`) from a compatible engine and not tampered with. The only caller,
    // sharehost's runtime cache, passes files it wrote itself into a directory only this user
    // can write (mode 0700), named by content hash + engine compatibility hash. Incompatible
    // engines are detected by wasmtime's own header check and return `Err`.
    #[allow(unsafe_code)]
    unsafe {
        Component::deserialize_file(engine, path)
    }
}
