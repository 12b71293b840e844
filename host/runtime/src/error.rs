//! Typed errors of the runtime. Faults during a batch are not errors: they are
//! [`crate::BatchOutcome::Fault`] values.

use std::path::PathBuf;

/// The `sharehost:plugin` versions this host accepts, for messages.
pub(crate) const HOST_PACKAGE_VERSIONS: &str = "0.1.x and 0.2.x";

/// A byte count in MiB for messages: `64 MiB`, `95.4 MiB`.
fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// Why the runtime itself could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// wasmtime refused the engine configuration (even the on-demand fallback).
    #[error("cannot configure the WebAssembly engine: {0}")]
    Engine(String),
    /// The precompiled cache directory could not be created or secured.
    #[error("cache directory {path}: {error}")]
    CacheDir {
        /// The configured directory.
        path: PathBuf,
        /// What the file system said. Part of the message, not a `source`: a chain printed
        /// with its causes would say it twice.
        error: std::io::Error,
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
    #[error("{path}: cannot read the component: {error}")]
    Read {
        /// The component path.
        path: PathBuf,
        /// What the file system said. Part of the message, not a `source`: a chain printed
        /// with its causes would say it twice.
        error: std::io::Error,
    },
    /// The path names something other than a regular file (a directory, a FIFO, a device):
    /// refused before reading, so a FIFO cannot hang a load and `/dev/zero` cannot fill memory.
    #[error("{path}: {what}")]
    NotAFile {
        /// The component path.
        path: PathBuf,
        /// What it is instead, e.g. "is a directory".
        what: &'static str,
    },
    /// The file is larger than the runtime reads; refused before reading it.
    #[error("{path}: is {}, more than the {} maximum ({setting})", mib(*.size), mib(*.maximum))]
    TooLarge {
        /// The component path.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The runtime's `max_component_bytes`.
        maximum: u64,
        /// The setting that raises the maximum.
        setting: &'static str,
    },
    /// The file is not a component: not WebAssembly at all, or a core module. Says what it is
    /// and never quotes its bytes.
    #[error("{path}: {what}")]
    NotAComponent {
        /// The component path.
        path: PathBuf,
        /// What the file is, e.g. "a core module, not a component".
        what: &'static str,
    },
    /// The component was built against another version of the `sharehost:plugin` package
    /// (its imports or exports name it): a contract mismatch, not a forbidden import.
    #[error(
        "{path}: built for sharehost:plugin@{found}, this host speaks {HOST_PACKAGE_VERSIONS} (rebuild it against this host's wit/plugin.wit)"
    )]
    WrongVersion {
        /// The component path.
        path: PathBuf,
        /// The package version the component names, e.g. `0.2.0`.
        found: String,
    },
    /// The component does not fit the instance pool (too many memories or tables in one core
    /// module, a memory or table whose minimum exceeds a slot, ...): names the limit to raise.
    #[error("{path}: does not fit the plugin instance pool: {message}")]
    PoolLimit {
        /// The component path.
        path: PathBuf,
        /// Which limit and how to raise it (or why it cannot be raised).
        message: String,
    },
    /// The bytes are not a valid component (or are a core module), or compilation failed.
    #[error("{path}: not a valid WebAssembly component: {message}")]
    Compile {
        /// The component path.
        path: PathBuf,
        /// wasmtime's explanation.
        message: String,
    },
    /// The component calls out over HTTP (imports `wasi:http/outgoing-handler`), and its
    /// pipeline grants no host: names the manifest key that would.
    #[error("{path}: imports {} (outbound HTTP), but its pipeline grants no host: add `allowed_outbound_hosts = [\"https://api.example.com\"]` to the pipeline (scheme://host[:port] of each host it may call; see docs/manifest.md)", .imports.join(", "))]
    HttpNotGranted {
        /// The component path.
        path: PathBuf,
        /// The HTTP imports, e.g. `wasi:http/outgoing-handler@0.2.6`.
        imports: Vec<String>,
    },
    /// The component imports something the runtime does not grant.
    #[error("{path}: imports {} not granted to plugins (allowed: sharehost:plugin/host, sharehost:plugin/outputs, the minimal wasi set in docs/wit.md, and wasi:http when the pipeline grants hosts)", .imports.join(", "))]
    ForbiddenImport {
        /// The component path.
        path: PathBuf,
        /// Every refused import name, e.g. `wasi:filesystem/types@0.2.6`.
        imports: Vec<String>,
    },
    /// The component does not implement the plugin world: an export is missing or has the
    /// wrong type.
    #[error("{path}: not a sharehost:plugin component (0.1 or 0.2): {message}")]
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
    /// The component's modules declare more initial memory than the plugin may have: refused
    /// from its sections, before anything is compiled.
    #[error(
        "{path}: its modules declare {} of initial memory, more than the plugin's memory limit of {} (memory_limit_mib)",
        mib(*.declared), mib(*.limit)
    )]
    InitialMemory {
        /// The component path.
        path: PathBuf,
        /// Bytes its modules' memories start with.
        declared: u64,
        /// The plugin's memory limit.
        limit: u64,
    },
    /// One function of the component asks more of the compiler than the runtime's bounds
    /// allow (operators or nested blocks; see `functions.rs`): refused from its code
    /// section, before anything is compiled, since compile time grows faster than a function.
    #[error(
        "{path}: {at} has {has} {what}, more than the maximum of {bound} (raise {key} in the manifest)"
    )]
    FunctionTooLarge {
        /// The component path.
        path: PathBuf,
        /// Which function, in which core module.
        at: crate::functions::FunctionAt,
        /// What was counted, e.g. "operators".
        what: &'static str,
        /// How many it has.
        has: u64,
        /// The bound it is over.
        bound: u64,
        /// The manifest key that raises the bound, e.g. `runtime.max_function_operators`.
        key: &'static str,
    },
    /// Instantiation or `init` failed, or `init` returned an error for the configuration.
    #[error("{path}: init failed: {message}")]
    Init {
        /// The component path.
        path: PathBuf,
        /// The guest's message or the fault.
        message: String,
    },
    /// The pipeline trusts signing keys and the component has no valid signature by one of
    /// them (no `.minisig` beside it, a malformed one, an unknown key, a bad signature):
    /// refused before its bytes were parsed or compiled.
    #[error("{path}: refused by the pipeline's [trust]: {refusal}")]
    Untrusted {
        /// The component path.
        path: PathBuf,
        /// Which check failed.
        refusal: crate::trust::TrustRefusal,
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

impl LoadError {
    /// Whether the error describes the file itself (whether it exists, what it is, how large
    /// it is) rather than the component in it: what a remote caller of the admin API must not
    /// learn about paths the host can see.
    pub fn describes_the_file(&self) -> bool {
        matches!(
            self,
            LoadError::Read { .. }
                | LoadError::NotAFile { .. }
                | LoadError::TooLarge { .. }
                | LoadError::NotAComponent { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_component_says_its_cause_once() {
        let e = LoadError::Read {
            path: PathBuf::from("plugin.wasm"),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let chain = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(chain.matches("not found").count(), 1, "{chain}");
    }
}
