//! The plugin runtime, one per process: its wasmtime engines (configured here, in one place:
//! component model, async, epoch interruption, copy-on-write memory images, the pooling
//! allocator with an on-demand engine beside it), their linkers, where compiled code is
//! placed ([`Compiled`], [`Placement`]), and the threads guests run on. How a component file
//! becomes a [`Compiled`] and a [`crate::Plugin`] is `loader.rs`'s: the runtime's loading
//! methods live there.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use sharehost_trusted_cwasm::load_host_precompiled;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use crate::cache::Cache;
use crate::config::{PluginLimits, RuntimeConfig};
use crate::error::{LoadError, RuntimeError};
use crate::store::{self, StoreState};
use crate::threads::{GuestRunning, GuestTask, GuestThreads, Ticker};
use crate::turns::Turns;

/// Which instance allocator the engine ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorKind {
    /// Pre-reserved slots with wasmtime's default 4 GiB reservation per memory (+ guard):
    /// instantiation is a few µs and the compiled code needs no explicit bounds checks.
    /// Growth is capped at the plugin memory limit.
    Pooling,
    /// Pre-reserved slots whose reservation is the plugin memory limit itself: far less
    /// address space (e.g. 64 MiB instead of 4 GiB per slot) at the price of explicit bounds
    /// checks in compiled code. Used when the full-size pool cannot be reserved.
    PoolingCompact,
    /// Memory mapped per instance: used when the pool's address space could not be reserved
    /// (e.g. small virtual address spaces, `ulimit -v`), or when pooling is switched off.
    OnDemand,
}

/// The plugin runtime: one per process, shared by every pipeline (cheap to clone).
///
/// Owns the wasmtime `Engine` (component model, async, epoch interruption), the linker with
/// exactly the granted host interfaces, the precompiled cache and the epoch ticker thread,
/// which stops when the last clone is dropped.
#[derive(Clone)]
pub struct PluginRuntime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    /// Stopped (and joined) first when the last clone goes.
    ticker: Ticker,
    /// The engine every component tries first: the pool when it could be reserved.
    primary: Flavor,
    /// An on-demand engine with the primary's code settings, for a component that does not
    /// fit one pool slot (more core instances, memories or tables per instance than a slot's
    /// share: a Python component has about 40 core instances). `None` when the primary is
    /// on-demand already.
    overflow: Option<Flavor>,
    config: RuntimeConfig,
    cache: Option<Cache>,
    /// The threads guests run on (see [`GuestThreads`]).
    guests: GuestThreads,
    /// The fair share of those threads between pipelines.
    turns: Arc<Turns>,
}

/// One wasmtime engine with its linker. Compiled components and linkers belong to the engine
/// that made them, so each allocator has its own; both engines share code settings, so one
/// precompiled artifact loads into either.
struct Flavor {
    engine: Engine,
    linker: Linker<StoreState>,
    kind: AllocatorKind,
}

impl Flavor {
    fn new(engine: Engine, kind: AllocatorKind) -> Result<Self, RuntimeError> {
        let mut linker = Linker::new(&engine);
        store::add_to_linker(&mut linker).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        Ok(Self {
            engine,
            linker,
            kind,
        })
    }
}

/// Where a plugin's instances live, as `/pipelines` and `sharehost test-plugin` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The allocator its instances come from.
    pub allocator: AllocatorKind,
    /// Why a component runs on-demand although the runtime has a pool: wasmtime's count of
    /// what one instance needs against a pool slot's share, e.g. "The component transitively
    /// contains 38 core module instances, which exceeds the configured maximum of 8".
    pub reason: Option<String>,
}

impl AllocatorKind {
    /// The name `/pipelines` and the CLI show.
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Pooling => "pooling",
            AllocatorKind::PoolingCompact => "pooling-compact",
            AllocatorKind::OnDemand => "on-demand",
        }
    }
}

/// Where a component came from, for the benchmark and `test-plugin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled now (no cache, or a miss).
    Compiled,
    /// Mapped from the precompiled cache.
    Cached,
}

/// A component compiled (or mapped from the cache) and checked, not yet instantiated: what
/// [`PluginRuntime::compile`] hands `check`, the benchmark and tests, which want to know where
/// a component would run without running it, and what a pipeline keeps of its earlier
/// versions so that a rollback instantiates them again without compiling (cheap to clone: the
/// code is shared).
#[derive(Clone)]
pub struct Compiled {
    pub(crate) component: Component,
    /// SHA-256 of the component bytes.
    pub hash: String,
    /// Compiled now or mapped from the cache.
    pub origin: Origin,
    /// Which allocator its instances would come from.
    pub placement: Placement,
    /// The key id of the trusted key whose signature was verified, when the plugin's limits
    /// carry a trust policy (`None` without one).
    pub signer: Option<String>,
}

fn base_config() -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true)
        .epoch_interruption(true)
        .memory_init_cow(true)
        .cranelift_opt_level(OptLevel::Speed)
        // We never use component-model async; skipping it saves per-store setup.
        .concurrency_support(false);
    c
}

impl PluginRuntime {
    /// Builds the engine (pooling allocator first when configured, on-demand if the pool
    /// cannot be reserved), the linker and the cache, and starts the epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<Self, RuntimeError> {
        let (engine, allocator) = build_engine(&config)?;
        let memory = MemorySettings::of(&config, allocator);
        let overflow = match allocator {
            AllocatorKind::OnDemand => None,
            AllocatorKind::Pooling | AllocatorKind::PoolingCompact => {
                let engine = Engine::new(&on_demand_config(memory))
                    .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
                Some(Flavor::new(engine, AllocatorKind::OnDemand)?)
            }
        };
        let primary = Flavor::new(engine, allocator)?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(Cache::open(
                &primary.engine,
                dir,
                &code_settings(allocator, memory),
            )?),
            None => None,
        };
        let engines = std::iter::once(&primary)
            .chain(overflow.as_ref())
            .map(|f| f.engine.clone())
            .collect();
        let threads = config.guest_threads.max(1);
        let turns = Turns::new(threads);
        let ticker = Ticker::start(engines, config.epoch_tick, turns.clone())?;
        let guests = GuestThreads::start(threads)?;
        Ok(Self {
            inner: Arc::new(RuntimeInner {
                ticker,
                primary,
                overflow,
                config,
                cache,
                guests,
                turns,
            }),
        })
    }

    /// Runs `future` on the guest threads. Plugin calls of a pipeline go there, so that a
    /// guest's time slices never stand between the host's own tasks and a thread.
    pub(crate) fn spawn_guest<F>(&self, future: F) -> GuestTask<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.guests.spawn(future)
    }

    /// The fair share of the guest threads between pipelines.
    pub(crate) fn turns(&self) -> &Arc<Turns> {
        &self.inner.turns
    }

    /// Turns granted so far to the plugins of `tenant` (the fair share at work; for tests).
    pub fn turns_granted(&self, tenant: &str) -> u64 {
        self.inner.turns.granted(tenant)
    }

    /// Starts the epoch ticker (if it was parked) for a guest call; it keeps ticking until
    /// the guard is dropped, and a while after.
    pub(crate) fn guest_running(&self) -> GuestRunning {
        self.inner.ticker.guest_running()
    }

    /// Which allocator the engine uses (pooling, or the on-demand fallback).
    pub fn allocator(&self) -> AllocatorKind {
        self.inner.primary.kind
    }

    /// Linear memories the instance pool keeps warm while no instance uses them, and the bytes
    /// they keep resident (`None` without a pool): what a long-running host holds on to after
    /// swaps, for tests and the soak to check that it stays bounded.
    pub fn pool_unused_warm_memories(&self) -> Option<(u32, usize)> {
        let m = self.inner.primary.engine.pooling_allocator_metrics()?;
        Some((m.unused_warm_memories(), m.unused_memory_bytes_resident()))
    }

    /// Loads precompiled code into the pool's engine, or, when one instance of the component
    /// needs more than a pool slot's share (core instances, memories, tables, instance
    /// state), into the on-demand engine, with wasmtime's count as the reason. The artifact is
    /// this host's own compilation (just made, or read back from its own cache).
    pub(crate) fn place(&self, artifact: &[u8]) -> wasmtime::Result<(Component, Placement)> {
        let inner = &self.inner;
        let primary = load_host_precompiled(&inner.primary.engine, artifact);
        match (primary, &inner.overflow) {
            (Ok(component), _) => Ok((
                component,
                Placement {
                    allocator: inner.primary.kind,
                    reason: None,
                },
            )),
            (Err(e), Some(overflow)) => match exceeds_pool_share(&e) {
                Some(reason) => {
                    let component = load_host_precompiled(&overflow.engine, artifact)?;
                    Ok((
                        component,
                        Placement {
                            allocator: overflow.kind,
                            reason: Some(reason),
                        },
                    ))
                }
                None => Err(e),
            },
            (Err(e), None) => Err(e),
        }
    }

    /// Compiles a component's bytes once, without any allocator's check: [`PluginRuntime::place`]
    /// then loads the code into the engine whose allocator takes it.
    pub(crate) fn precompile(&self, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        self.inner.primary.engine.precompile_component(bytes)
    }

    /// The settings the runtime was built from.
    pub(crate) fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// The precompiled cache, if one is configured.
    pub(crate) fn cache(&self) -> Option<&Cache> {
        self.inner.cache.as_ref()
    }

    /// The linker of the engine `component` was loaded into.
    pub(crate) fn linker_for(&self, component: &Component) -> &Linker<StoreState> {
        let inner = &self.inner;
        match &inner.overflow {
            Some(o) if Engine::same(&o.engine, component.engine()) => &o.linker,
            _ => &inner.primary.linker,
        }
    }

    /// Turns wasmtime's refusal into a load error: a component that does not fit the pool
    /// gets a message naming the limit to raise, anything else wasmtime's explanation.
    pub(crate) fn compile_error(
        &self,
        path: &Path,
        limits: &PluginLimits,
        e: &wasmtime::Error,
    ) -> LoadError {
        match pool_limit_hint(e, &self.inner.config, limits) {
            Some(message) => LoadError::PoolLimit {
                path: path.to_owned(),
                message,
            },
            None => LoadError::Compile {
                path: path.to_owned(),
                message: format!("{e:#}"),
            },
        }
    }

    /// The path the precompiled cache stores a component with this content hash under, if a
    /// cache is configured (for tests of the cache key).
    #[cfg(test)]
    pub(crate) fn cache_path_for(&self, content_hash: &str) -> Option<std::path::PathBuf> {
        self.inner.cache.as_ref().map(|c| c.path_for(content_hash))
    }
}

/// What one pool slot offers a plugin instance (its share of the pool's totals): enough for a
/// Rust or JavaScript component (3 to 6 core instances, one memory). A component needing more
/// runs on-demand instead of taking several slots' share, so the pool can never run out of
/// core instances, memories or tables before it runs out of instances.
const CORE_INSTANCES_PER_SLOT: u32 = 8;
/// Linear memories one pool slot offers (see [`CORE_INSTANCES_PER_SLOT`]).
const MEMORIES_PER_SLOT: u32 = 2;
/// Tables one pool slot offers (see [`CORE_INSTANCES_PER_SLOT`]).
const TABLES_PER_SLOT: u32 = 8;

/// When wasmtime refuses a component for the pool because one instance needs more than a
/// slot holds (its per-component limits or a core module's shape), the reason, and the
/// component runs on-demand. `None` for refusals on-demand would not lift (a memory larger
/// than the plugin limit, a shared memory) and for everything else. The messages matched
/// are wasmtime 48's (`validate_component` / `validate_module` of its pooling allocator).
fn exceeds_pool_share(e: &wasmtime::Error) -> Option<String> {
    let root = e.root_cause().to_string();
    let lifted_on_demand = [
        "which exceeds the configured maximum of",
        "defined memories count of",
        "defined tables count of",
        "minimum element size of",
        "instance allocation for this module",
        "instance allocation for this component",
    ];
    let chain = format!("{e:#}");
    lifted_on_demand
        .iter()
        .any(|needle| chain.contains(needle))
        .then(|| {
            root.trim_end_matches('.')
                .replace(" in the pooling allocator", " per pool slot")
        })
}

/// Maps wasmtime's pooling-allocator refusals that running on-demand would not lift (see
/// [`exceeds_pool_share`] for those that it does) to the setting that lifts them, if any. The
/// messages matched are wasmtime 48's; an unmatched one keeps wasmtime's text.
fn pool_limit_hint(
    e: &wasmtime::Error,
    config: &RuntimeConfig,
    limits: &PluginLimits,
) -> Option<String> {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let has = |needle: &str| chain.iter().find(|m| m.contains(needle));
    let mib = |b: usize| b >> 20;
    if let Some(m) = has("memory has a minimum byte size of") {
        let needed = m
            .split("minimum byte size of ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .map(|b| format!("{} MiB", b.div_ceil(1 << 20)))
            .unwrap_or_else(|| "more".into());
        return Some(format!(
            "its memory starts at {needed}, more than a pool slot of {} MiB: raise the plugin memory limit \
             (memory_limit_mib in the manifest, --max-memory-mib for test-plugin; now {} MiB, at most 4096)",
            mib(config.max_plugin_memory),
            mib(limits.max_memory),
        ));
    }
    if has("memory is shared").is_some() {
        return Some("it uses a shared memory, which plugins may not".into());
    }
    None
}

/// How linear memories are reserved: part of the compiled code (bounds checks), so the pool's
/// engine and the on-demand one beside it use the same, and one artifact loads into both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MemorySettings {
    /// `None`: wasmtime's defaults on 64-bit hosts (4 GiB reservation plus guard).
    /// `Some(bytes)`: the compact pool's reservation, the plugin memory limit itself.
    compact_reservation: Option<u64>,
}

impl MemorySettings {
    fn of(config: &RuntimeConfig, allocator: AllocatorKind) -> Self {
        Self {
            compact_reservation: (allocator == AllocatorKind::PoolingCompact)
                .then_some(config.max_plugin_memory as u64),
        }
    }

    fn apply(self, c: &mut Config) {
        if let Some(reservation) = self.compact_reservation {
            c.memory_reservation(reservation)
                .memory_guard_size(64 << 10)
                .memory_reservation_for_growth(0);
        }
    }
}

/// The runtime settings that shape compiled code beyond what wasmtime's
/// `precompile_compatibility_hash` covers, as stable text for the cache key: the allocator
/// actually chosen, the reservation and guard each allocator configures (the compact pool
/// compiles the plugin memory limit in as the memory reservation, so an artifact built for
/// 4096 MiB must never serve a 64 MiB runtime, nor the reverse), and the pool slot's share
/// (which decides whether an entry loads into the pool or on-demand). Not the memory limit
/// itself where no reservation carries it: it shapes no code then, and keyed on it,
/// `test-plugin` (its own limit) and `run` (the manifest's) compiled the same component into
/// two entries.
fn code_settings(allocator: AllocatorKind, memory: MemorySettings) -> String {
    let (reservation, guard, growth) = match memory.compact_reservation {
        Some(r) => (r, 64u64 << 10, 0u64),
        // wasmtime's defaults on 64-bit hosts.
        None => (0, 0, 0),
    };
    format!(
        "v3 allocator={allocator:?} memory_reservation={reservation} \
         memory_guard={guard} reservation_for_growth={growth} opt=speed epochs=1 cow=1 \
         slot={CORE_INSTANCES_PER_SLOT}/{MEMORIES_PER_SLOT}/{TABLES_PER_SLOT}"
    )
}

/// The pooling allocator's limits for `config`. With `compact`, each memory reserves only the
/// plugin memory limit (plus a small guard) instead of 4 GiB plus a 32 MiB guard.
fn pooling_config(config: &RuntimeConfig, compact: bool) -> Config {
    let mut c = base_config();
    let n = config.max_instances.max(1);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(n)
        .max_core_instances_per_component(CORE_INSTANCES_PER_SLOT)
        .max_memories_per_component(MEMORIES_PER_SLOT)
        .max_tables_per_component(TABLES_PER_SLOT)
        .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_SLOT))
        .total_memories(n.saturating_mul(MEMORIES_PER_SLOT))
        .total_tables(n.saturating_mul(TABLES_PER_SLOT))
        .total_stacks(n)
        .max_memory_size(config.max_plugin_memory)
        // Keep a little of each slot resident so recycled instances fault in less.
        .linear_memory_keep_resident(1 << 20)
        // A new version (a hot swap, a canary, a rollback) takes over the slots its
        // predecessors left instead of touching cold ones: with wasmtime's default (100 unused
        // warm slots kept) every swap left 1 MiB per memory resident for good, and a 30-minute
        // soak with a swap every 5 minutes grew from 23 to 29 MiB. Slots affine to
        // the same component are still picked first, so recycled instances lose nothing.
        .max_unused_warm_slots(0);
    let allocator = if compact {
        AllocatorKind::PoolingCompact
    } else {
        AllocatorKind::Pooling
    };
    MemorySettings::of(config, allocator).apply(&mut c);
    c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    c
}

/// An on-demand engine whose code settings match `memory` (so the pool's artifacts load into
/// it unchanged).
fn on_demand_config(memory: MemorySettings) -> Config {
    let mut c = base_config();
    memory.apply(&mut c);
    c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    c
}

/// Builds the engine, trying in order: the full-size pool, the compact pool, on-demand
/// allocation. Each step down is logged; the chosen one is reported by
/// [`PluginRuntime::allocator`]. The precompiled cache keys on the engine configuration, so
/// artifacts of one step are never loaded by another.
fn build_engine(config: &RuntimeConfig) -> Result<(Engine, AllocatorKind), RuntimeError> {
    if config.pooling {
        for (compact, kind) in [
            (false, AllocatorKind::Pooling),
            (true, AllocatorKind::PoolingCompact),
        ] {
            match Engine::new(&pooling_config(config, compact)) {
                Ok(e) => return Ok((e, kind)),
                Err(e) => tracing::warn!(
                    allocator = ?kind,
                    error = %format!("{e:#}"),
                    "cannot reserve the instance pool (address space?); trying a smaller one"
                ),
            }
        }
    }
    Engine::new(&on_demand_config(MemorySettings {
        compact_reservation: None,
    }))
    .map(|e| (e, AllocatorKind::OnDemand))
    .map_err(|e| RuntimeError::Engine(format!("{e:#}")))
}

#[cfg(test)]
mod code_settings_tests {
    use super::*;

    #[test]
    fn the_compact_pool_keys_its_cache_on_the_memory_limit_it_compiles_in() {
        let with = |mib: usize, allocator| {
            let config = RuntimeConfig {
                max_plugin_memory: mib << 20,
                ..RuntimeConfig::default()
            };
            code_settings(allocator, MemorySettings::of(&config, allocator))
        };
        // An artifact built for 4096 MiB must never serve a 64 MiB compact runtime.
        assert_ne!(
            with(64, AllocatorKind::PoolingCompact),
            with(4096, AllocatorKind::PoolingCompact)
        );
        assert_eq!(
            with(64, AllocatorKind::Pooling),
            with(4096, AllocatorKind::Pooling)
        );
        assert_ne!(
            with(64, AllocatorKind::Pooling),
            with(64, AllocatorKind::PoolingCompact)
        );
    }
}
