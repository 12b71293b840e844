//! The one unsafe call of sharehost, isolated so the rest of the workspace can keep
//! `unsafe_code = "forbid"`.
//!
//! wasmtime's [`Component::deserialize`] loads native code and runs it: it is only as safe as
//! the bytes are trustworthy. The plugin runtime (`sharehost::runtime`) writes precompiled
//! artifacts itself, into a host-owned 0700 directory, under a name derived from the SHA-256
//! of the component bytes, the engine's compatibility hash and the runtime's code settings,
//! and calls this function only on the bytes of such files or on the bytes its engine has just
//! compiled in memory. Never call it on bytes from anywhere else.

use wasmtime::Engine;
use wasmtime::component::Component;

/// Loads a component that `engine.precompile_component` produced in this host: either just
/// now, in memory (the runtime compiles once and then loads the code into the pool's engine
/// or the on-demand one), or earlier into its own cache, from the bytes the cache read out of
/// the file it opened and checked (owner, mode, not a symlink): taking bytes rather than a path
/// means the file checked is the file loaded, with no second path lookup in between.
///
/// The caller guarantees the bytes were written by this host (not by a plugin author, not by
/// another user): that is the whole safety argument, so the function is deliberately narrow.
/// Artifacts from another wasmtime version or configuration are rejected by wasmtime with an
/// error, not loaded.
pub fn load_host_precompiled(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: wasmtime requires that the bytes be the output of `precompile_component` (or
    // `Component::serialize`) from a compatible engine and not tampered with. The only caller,
    // sharehost's runtime, passes bytes its own engine just returned from
    // `precompile_component`, or the content of a file it wrote itself into a directory
    // only this user owns and can write (mode 0700), after checking on the opened file that
    // this user owns it, that no one else can write it and that it is not a symlink; entries
    // are named by content hash + engine compatibility hash + the runtime's code settings.
    // Incompatible engines are detected by wasmtime's own header check and return `Err`.
    #[allow(unsafe_code)]
    unsafe {
        Component::deserialize(engine, artifact)
    }
}
