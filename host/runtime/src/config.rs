//! Settings of the runtime (per process) and of each plugin (per load).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::component_file::DEFAULT_MAX_COMPONENT_BYTES;
use crate::functions::FunctionBounds;
use crate::http::HttpGrant;
use crate::outputs::OutputGrant;
use crate::trust::TrustPolicy;

/// Process-wide runtime settings. One [`crate::PluginRuntime`] is built from them.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The largest linear memory any plugin may use. Pool slots are sized to it, so a smaller
    /// value means less reserved address space; a plugin asking for more is refused at load.
    pub max_plugin_memory: usize,
    /// How many instances may be alive at once across all plugins (pool size). Each live
    /// [`crate::Plugin`] holds at most one.
    pub max_instances: u32,
    /// How often the epoch ticker thread advances the engine's epoch. The CPU deadline of a
    /// batch is checked on every tick, so this is the deadline's resolution.
    pub epoch_tick: Duration,
    /// Host-owned directory for precompiled components. `None` compiles on every load.
    /// The runtime creates it with mode 0700 and only ever loads files it wrote itself.
    pub cache_dir: Option<PathBuf>,
    /// Try the pooling allocator first (falls back to on-demand when address space is short).
    pub pooling: bool,
    /// The largest component file the runtime reads (manifest `runtime.max_component_mib`).
    /// A bigger file is refused by its size before a byte is read, so a hostile path cannot
    /// make the host read gigabytes (or `/dev/zero` forever) into memory.
    pub max_component_bytes: u64,
    /// Threads that run guest code, apart from the host's own (default: one per core).
    /// Pipelines share them fairly when more guests compute than there are threads.
    pub guest_threads: usize,
    /// What one function of a component may ask of the compiler (manifest
    /// `runtime.max_function_*`): a function over a bound is refused before it is compiled,
    /// since compile time grows faster than the function.
    pub function_bounds: FunctionBounds,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_plugin_memory: 64 << 20,
            max_instances: 64,
            epoch_tick: Duration::from_millis(2),
            cache_dir: None,
            pooling: true,
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
            guest_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            function_bounds: FunctionBounds::default(),
        }
    }
}

/// Whether a plugin keeps its instance between batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceMode {
    /// Reuse one warm instance for up to `max_batches` batches, then recycle it. Any fault
    /// recycles it at once. Fast (no instantiation per batch); state in the guest survives
    /// between batches of the same instance, which plugins must not rely on.
    Reuse {
        /// Batches served by one instance before it is replaced by a fresh one.
        max_batches: u32,
    },
    /// A fresh instance (and `init`) for every batch: no state can leak between batches, at
    /// the price of instantiation plus `init` per batch (see docs/benchmarks.md).
    FreshPerBatch,
}

impl Default for InstanceMode {
    fn default() -> Self {
        Self::Reuse { max_batches: 1000 }
    }
}

/// Per-plugin budgets, enforced on every call into the guest.
#[derive(Debug, Clone)]
pub struct PluginLimits {
    /// Linear-memory cap of one instance; growth past it traps (out of memory fault).
    pub max_memory: usize,
    /// Guest-time (CPU) budget of one `handle` call (and of `init`): time the guest spends
    /// waiting in host calls (on HTTP, in a WASI sleep) does not count. A guest still running
    /// when it is spent is interrupted at the next epoch tick (timeout fault).
    pub batch_deadline: Duration,
    /// Wall-clock budget of one call, beside the CPU budget (never shorter than it): a plugin
    /// waiting on HTTP burns no CPU but must still end. `None`: [`DEFAULT_WALL_PER_CPU`] times
    /// `batch_deadline`.
    pub wall_deadline: Option<Duration>,
    /// Instance reuse policy.
    pub instance_mode: InstanceMode,
    /// Longest reject reason kept; longer ones are truncated (they travel into acks and
    /// dead-letter headers, so they must stay small).
    pub max_reason_bytes: usize,
    /// Outbound HTTP granted to the plugin (`None`: every request is refused in the host).
    pub http: Option<Arc<HttpGrant>>,
    /// Output names granted to the plugin and the per-batch emit bounds.
    pub outputs: Arc<OutputGrant>,
    /// The keys a component must be signed by (manifest `[trust]`); `None`: no signature
    /// needed. Checked on every load, before the component is parsed, compiled or looked up
    /// in the precompiled cache.
    pub trust: Option<Arc<TrustPolicy>>,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            max_memory: 64 << 20,
            batch_deadline: Duration::from_secs(5),
            instance_mode: InstanceMode::default(),
            max_reason_bytes: 1024,
            http: None,
            outputs: Arc::default(),
            wall_deadline: None,
            trust: None,
        }
    }
}

/// The default wall-clock budget of a call, in CPU budgets: the CPU deadline counts only the
/// guest's own CPU time, and on a machine (or executor) shared three ways a plugin gets its
/// CPU within about three times its wall time.
pub const DEFAULT_WALL_PER_CPU: u32 = 3;

impl PluginLimits {
    /// The wall-clock budget of one call: `wall_deadline`, never shorter than the CPU budget;
    /// by default [`DEFAULT_WALL_PER_CPU`] times it, so a plugin whose turns a busy machine
    /// spreads out still gets its whole CPU budget.
    pub fn wall_budget(&self) -> Duration {
        self.wall_deadline
            .unwrap_or(self.batch_deadline * DEFAULT_WALL_PER_CPU)
            .max(self.batch_deadline)
    }
}
