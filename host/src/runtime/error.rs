//! Typed errors of the runtime. Faults during a batch are not errors: they are
//! [`crate::runtime::BatchOutcome::Fault`] values.

use std::path::PathBuf;

/// Why the runtime itself could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// wasmtime refused the engine configuration (even the on-demand fallback).
    #[error("cannot configure the WebAssembly engine: {0}")]
    Engine(String),
    /// The precompiled cache directory could not be created or secured.
    #[error("cache directory {path}: {source}")]
    CacheDir {
        /// The configured directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The epoch ticker thread could not be started.
    #[error("cannot start the epoch ticker thread: {0}")]
    Ticker(std::io::Error),
}

/// Why a plugin could not be loaded. Every variant names the plugin file and the item at fault,
/// so `sharehost check` and `test-plugin` can print one clear line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{path}: cannot read the component: {source}")]
    Read {
        /// The component path.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The bytes are not a valid component (or are a core module), or compilation failed.
    #[error("{path}: not a valid WebAssembly component: {message}")]
    Compile {
        /// The component path.
        path: PathBuf,
        /// wasmtime's explanation.
        message: String,
    },
    /// The component imports something the runtime does not grant.
    #[error("{path}: imports {} not granted to plugins (allowed: sharehost:plugin/host and the minimal wasi set in docs/wit.md)", .imports.join(", "))]
    ForbiddenImport {
        /// The component path.
        path: PathBuf,
        /// Every refused import name, e.g. `wasi:filesystem/types@0.2.6`.
        imports: Vec<String>,
    },
    /// The component does not implement the plugin world: an export is missing or has the
    /// wrong type.
    #[error("{path}: not a sharehost:plugin@0.1.0 component: {message}")]
    WrongWorld {
        /// The component path.
        path: PathBuf,
        /// Which export is missing or mistyped.
        message: String,
    },
    /// The plugin's memory limit exceeds what the runtime's pool slots can hold.
    #[error("plugin memory limit {requested} bytes exceeds the runtime maximum {maximum} bytes")]
    MemoryLimit {
        /// The plugin's limit.
        requested: usize,
        /// The runtime's `max_plugin_memory`.
        maximum: usize,
    },
    /// Instantiation or `init` failed, or `init` returned an error for the configuration.
    #[error("{path}: init failed: {message}")]
    Init {
        /// The component path.
        path: PathBuf,
        /// The guest's message or the fault.
        message: String,
    },
    /// The precompiled cache could not be written (loading still works without it).
    #[error("{path}: precompiled cache: {message}")]
    Cache {
        /// The cache file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}
