//! The one wasmtime engine per process, its epoch ticker, its linker and its cache.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use super::cache::{self, Cache};
use super::component_file::{self, Surface};
use super::config::{PluginLimits, RuntimeConfig};
use super::error::{LoadError, RuntimeError};
use super::host::StoreState;
use super::plugin::{Plugin, PluginInit};
use super::validate;

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
    pub(crate) inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<StoreState>,
    pub(crate) config: RuntimeConfig,
    allocator: AllocatorKind,
    cache: Option<Cache>,
    ticker: Ticker,
}

/// The dedicated epoch thread. A tokio task would stop ticking exactly when it matters most:
/// when a spinning guest (or anything else) blocks the executor's threads.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        self.ticker.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Where a component came from, for the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Compiled now (no cache, or a miss).
    Compiled,
    /// Mapped from the cache.
    Cached,
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
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        super::host::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        // wasi:http's own interfaces; whether a plugin may import them (and where its
        // requests may go) is decided per plugin by its grant, never by the linker.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(Cache::open(
                &engine,
                dir,
                &code_settings(&config, allocator),
            )?),
            None => None,
        };
        let ticker = start_ticker(engine.clone(), config.epoch_tick)?;
        Ok(Self {
            inner: Arc::new(RuntimeInner {
                engine,
                linker,
                config,
                allocator,
                cache,
                ticker,
            }),
        })
    }

    /// Which allocator the engine uses (pooling, or the on-demand fallback).
    pub fn allocator(&self) -> AllocatorKind {
        self.inner.allocator
    }

    /// Loads, validates, compiles (or maps from the cache) and initialises a plugin.
    ///
    /// Refused before anything runs: unreadable file, not a component, an import not
    /// granted (named in the error), a missing or mistyped `init`/`handle` export. Then one
    /// instance is created and `init(config)` must succeed within the plugin's deadline.
    ///
    /// Compiling a component that is not in the cache takes tens of milliseconds of CPU on
    /// the calling thread: load plugins at startup or on a dedicated task, not on a hot path.
    pub async fn load(
        &self,
        path: &Path,
        limits: PluginLimits,
        config: Vec<(String, String)>,
    ) -> Result<Plugin, LoadError> {
        self.load_with(
            path,
            limits,
            PluginInit {
                config,
                ..PluginInit::default()
            },
        )
        .await
    }

    /// Loads a plugin like [`PluginRuntime::load`], with secrets beside the configuration
    /// (handed to a contract 0.2 component's `init`, redacted from everything it prints).
    pub async fn load_with(
        &self,
        path: &Path,
        limits: PluginLimits,
        init: PluginInit,
    ) -> Result<Plugin, LoadError> {
        let (component, hash, _) = self.compile(path, &limits)?;
        Plugin::new(self.clone(), path, component, hash, limits, init).await
    }

    /// Reads, validates and compiles a component without instantiating it; the third value
    /// says whether it came from the cache. Exposed for `sharehost check` and benchmarks.
    ///
    /// The file goes through the one component reader (regular file, bounded size, header),
    /// then its imports and exports are checked from its sections *before* compiling: a
    /// component refused for its contract costs a read and a parse, not a compilation (which
    /// for a component with a large data segment costs several times its size in memory).
    pub(crate) fn compile(
        &self,
        path: &Path,
        limits: &PluginLimits,
    ) -> Result<(Component, String, Origin), LoadError> {
        let inner = &self.inner;
        if limits.max_memory > inner.config.max_plugin_memory {
            return Err(LoadError::MemoryLimit {
                requested: limits.max_memory,
                maximum: inner.config.max_plugin_memory,
            });
        }
        let bytes = component_file::read_component(path, inner.config.max_component_bytes)?;
        let surface = Surface::read(&bytes).map_err(|message| LoadError::Compile {
            path: path.to_owned(),
            message,
        })?;
        check_contract(
            path,
            limits.http.is_some(),
            surface.imports.iter().map(String::as_str),
            surface
                .exports
                .iter()
                .map(|(n, is_func)| (n.as_str(), *is_func)),
        )?;
        let hash = cache::content_hash(&bytes);
        let cached = inner
            .cache
            .as_ref()
            .and_then(|c| c.get(&inner.engine, &hash));
        let origin = if cached.is_some() {
            Origin::Cached
        } else {
            Origin::Compiled
        };
        let component = match cached {
            Some(c) => c,
            None => Component::new(&inner.engine, &bytes)
                .map_err(|e| self.compile_error(path, limits, &e))?,
        };
        drop(bytes);
        // The same checks on the compiled component's types: they also cover a cached entry
        // and export types the section walk does not look at.
        if let Some(found) = validate::foreign_version(
            validate::names(&inner.engine, &component)
                .iter()
                .map(String::as_str),
        ) {
            return Err(LoadError::WrongVersion {
                path: path.to_owned(),
                found,
            });
        }
        let imports = validate::imports(&inner.engine, &component);
        check_imports(
            path,
            limits.http.is_some(),
            imports.iter().map(String::as_str),
        )?;
        if let Some(message) = validate::missing_exports(&inner.engine, &component) {
            return Err(LoadError::WrongWorld {
                path: path.to_owned(),
                message,
            });
        }
        // Only components that passed validation are cached.
        if let (Some(cache), Origin::Compiled) = (&inner.cache, origin) {
            cache.put(&component, &hash);
        }
        Ok((component, hash, origin))
    }

    /// Turns wasmtime's refusal into a load error: a component that does not fit the pool
    /// gets a message naming the limit to raise, anything else wasmtime's explanation.
    fn compile_error(&self, path: &Path, limits: &PluginLimits, e: &wasmtime::Error) -> LoadError {
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

    /// Measures compile-from-bytes against load-from-cache for one component (for the
    /// benchmark): returns (compile, cached load) durations.
    #[doc(hidden)]
    pub fn measure_compile_and_cached_load(
        &self,
        path: &Path,
    ) -> Result<(Duration, Duration), LoadError> {
        let bytes = component_file::read_component(path, self.inner.config.max_component_bytes)?;
        let t = Instant::now();
        Component::new(&self.inner.engine, &bytes).map_err(|e| LoadError::Compile {
            path: path.to_owned(),
            message: format!("{e:#}"),
        })?;
        let compile = t.elapsed();
        let limits = PluginLimits::default();
        // First call fills the cache (when configured), second one maps from it.
        self.compile(path, &limits)?;
        let t = Instant::now();
        let (_, _, origin) = self.compile(path, &limits)?;
        let load = t.elapsed();
        if origin != Origin::Cached {
            return Err(LoadError::Cache {
                path: path.to_owned(),
                message: "no cache directory configured".into(),
            });
        }
        Ok((compile, load))
    }
}

/// Refuses a component whose top-level names break the contract, in the order that tells its
/// author the most: another package version first (every other complaint follows from it),
/// then imports not granted, then a missing or non-function `init`/`handle`.
fn check_contract<'a>(
    path: &Path,
    http: bool,
    imports: impl Iterator<Item = &'a str> + Clone,
    exports: impl Iterator<Item = (&'a str, bool)> + Clone,
) -> Result<(), LoadError> {
    if let Some(found) =
        validate::foreign_version(imports.clone().chain(exports.clone().map(|(n, _)| n)))
    {
        return Err(LoadError::WrongVersion {
            path: path.to_owned(),
            found,
        });
    }
    check_imports(path, http, imports)?;
    if let Some(message) = validate::missing_exports_in(exports) {
        return Err(LoadError::WrongWorld {
            path: path.to_owned(),
            message,
        });
    }
    Ok(())
}

/// Refuses imports that are not granted: outbound HTTP without a grant with its own error
/// (naming the manifest key that grants it), anything else as forbidden.
fn check_imports<'a>(
    path: &Path,
    http: bool,
    imports: impl Iterator<Item = &'a str>,
) -> Result<(), LoadError> {
    let forbidden: Vec<&str> = imports
        .filter(|n| !validate::import_allowed(n, http))
        .collect();
    if forbidden.is_empty() {
        return Ok(());
    }
    if forbidden.iter().all(|n| validate::is_http_import(n)) {
        return Err(LoadError::HttpNotGranted {
            path: path.to_owned(),
            imports: forbidden.iter().map(|n| (*n).to_owned()).collect(),
        });
    }
    Err(LoadError::ForbiddenImport {
        path: path.to_owned(),
        imports: forbidden.iter().map(|n| (*n).to_owned()).collect(),
    })
}

/// Maps wasmtime's pooling-allocator refusals (raised when a component is compiled or
/// deserialized, see `validate_component` in wasmtime's pooling allocator) to the setting that
/// lifts them. The messages matched are wasmtime 48's; an unmatched one keeps wasmtime's text.
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
    if has("defined memories count of").is_some() {
        return Some(
            "a core module defines more than one linear memory; the pool allows one per core module \
             (a fixed limit of sharehost: build the plugin with a single memory)"
                .into(),
        );
    }
    if has("defined tables count of").is_some() {
        return Some(
            "a core module defines more tables than the pool allows per module (one) or in all \
             (8 per instance): a fixed limit of sharehost, build the plugin with one table per core module"
                .into(),
        );
    }
    if has("minimum element size of").is_some() {
        return Some(
            "a table starts with more elements than a pool table holds (20000, wasmtime's \
             table_elements; a fixed limit of sharehost)"
                .into(),
        );
    }
    if has("instance allocation for this module").is_some()
        || has("instance allocation for this component").is_some()
    {
        return Some(
            "its instance state (globals, functions, tables of one core module or of the whole component) \
             exceeds the pool's 1 MiB per instance; a fixed limit of sharehost"
                .into(),
        );
    }
    if let Some(m) = has("which exceeds the configured maximum of") {
        return Some(format!(
            "{} (the pool's per-component limits are fixed by sharehost)",
            m.trim_end_matches('.')
        ));
    }
    if has("memory is shared").is_some() {
        return Some("it uses a shared memory, which plugins may not".into());
    }
    None
}

/// The runtime settings that shape compiled code beyond what wasmtime's
/// `precompile_compatibility_hash` covers, as stable text for the cache key: the allocator
/// actually chosen and the plugin memory limit (the compact pool compiles the limit in as the
/// memory reservation, so an artifact built for 4096 MiB must never serve a 64 MiB runtime,
/// nor the reverse), plus the reservation and guard each allocator configures.
fn code_settings(config: &RuntimeConfig, allocator: AllocatorKind) -> String {
    let (reservation, guard, growth) = match allocator {
        AllocatorKind::PoolingCompact => (config.max_plugin_memory as u64, 64u64 << 10, 0u64),
        // wasmtime's defaults on 64-bit hosts.
        AllocatorKind::Pooling | AllocatorKind::OnDemand => (0, 0, 0),
    };
    format!(
        "v1 allocator={allocator:?} max_plugin_memory={} memory_reservation={reservation} \
         memory_guard={guard} reservation_for_growth={growth} opt=speed epochs=1 cow=1",
        config.max_plugin_memory
    )
}

/// The pooling allocator's limits for `config`. With `compact`, each memory reserves only the
/// plugin memory limit (plus a small guard) instead of 4 GiB plus a 32 MiB guard.
fn pooling_config(config: &RuntimeConfig, compact: bool) -> Config {
    let mut c = base_config();
    let n = config.max_instances.max(1);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(n)
        // A Rust component has one main module plus a few small shim modules.
        .total_core_instances(n.saturating_mul(8))
        .total_memories(n.saturating_mul(2))
        .total_tables(n.saturating_mul(8))
        .total_stacks(n)
        .max_memory_size(config.max_plugin_memory)
        // Keep a little of each slot resident so recycled instances fault in less.
        .linear_memory_keep_resident(1 << 20);
    if compact {
        c.memory_reservation(config.max_plugin_memory as u64)
            .memory_guard_size(64 << 10)
            .memory_reservation_for_growth(0);
    }
    c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
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
    let mut c = base_config();
    c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    Engine::new(&c)
        .map(|e| (e, AllocatorKind::OnDemand))
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))
}

fn start_ticker(engine: Engine, tick: Duration) -> Result<Ticker, RuntimeError> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let tick = tick.max(Duration::from_micros(100));
    let thread = std::thread::Builder::new()
        .name("sharehost-epoch".into())
        .spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                // park_timeout, not sleep: dropping the runtime unparks us at once.
                std::thread::park_timeout(tick);
                engine.increment_epoch();
            }
        })
        .map_err(RuntimeError::Ticker)?;
    Ok(Ticker {
        stop,
        thread: Some(thread),
    })
}
