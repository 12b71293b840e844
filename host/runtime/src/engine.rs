//! The one wasmtime engine per process, its epoch ticker, its linker and its cache.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use super::cache::{self, Cache};
use super::component_file::{self, Surface};
use super::config::{PluginLimits, RuntimeConfig};
use super::error::{LoadError, RuntimeError};
use super::plugin::{Plugin, PluginInit};
use super::turns::Turns;
use super::validate;
use crate::store::{self, StoreState};
use sharehost_trusted_cwasm::load_host_precompiled;

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
    /// The engine every component tries first: the pool when it could be reserved.
    pub(crate) primary: Flavor,
    /// An on-demand engine with the primary's code settings, for a component that does not
    /// fit one pool slot (more core instances, memories or tables per instance than a slot's
    /// share: a Python component has about 40 core instances). `None` when the primary is
    /// on-demand already.
    overflow: Option<Flavor>,
    pub(crate) config: RuntimeConfig,
    cache: Option<Cache>,
    ticker: Ticker,
    /// The threads guests run on (see [`GuestThreads`]).
    guests: GuestThreads,
    /// The fair share of those threads between pipelines.
    pub(crate) turns: Arc<Turns>,
}

/// The threads guests run on, apart from the host's own: a guest computing to its deadline
/// takes one of these, never a thread that the share engine's I/O, another pipeline's
/// acknowledgements or the admin API wait on. One per core; which guest runs on them when
/// there are more busy guests than threads is [`Turns`]' business.
struct GuestThreads {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        // The last handle may go inside an async context (a test, a drained pipeline):
        // a blocking shutdown would panic there. Guests still running are cut off.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A future run on the guest threads ([`PluginRuntime::spawn_guest`]): awaiting it gives its
/// output; dropping it cancels it there (as dropping the future itself would have).
pub(crate) struct GuestTask<T> {
    handle: tokio::task::JoinHandle<T>,
}

impl<T> Drop for GuestTask<T> {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl<T> std::future::Future for GuestTask<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.handle).poll(cx)
    }
}

/// One wasmtime engine with its linker. Compiled components and linkers belong to the engine
/// that made them, so each allocator has its own; both engines share code settings, so one
/// precompiled artifact loads into either.
pub(crate) struct Flavor {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<StoreState>,
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

/// The dedicated epoch thread. A tokio task would stop ticking exactly when it matters most:
/// when a spinning guest (or anything else) blocks the executor's threads. It ticks only while
/// guest code may run: idle, it parks instead of waking 500 times a second (half a percent of
/// a core whatever the number of pipelines, issue 14).
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Guest calls under way ([`GuestRunning`] guards).
    running: Arc<AtomicUsize>,
    /// The ticker is parked until a call starts (not just between two ticks).
    asleep: Arc<AtomicBool>,
    /// The ticker's thread, to unpark it when the first call starts.
    waker: Thread,
}

/// Ticks the ticker keeps making after the last guest call ended before it parks: calls
/// that follow each other closely (a pipeline's batches, thousands a second) then find it
/// ticking, instead of each waking it (a futex wake and a thread switch per call, then a
/// park again: a fifth of the host's CPU at 1 KiB records). At the 2 ms default tick, an
/// idle host parks the ticker 100 ms after its last call.
const IDLE_TICKS_BEFORE_PARKING: u32 = 50;

/// Held while guest code may run (instantiation, `init`, `handle`): the epoch ticker, which
/// enforces the CPU deadline and time-slices the guest, ticks while any guard exists.
pub(crate) struct GuestRunning {
    running: Arc<AtomicUsize>,
}

impl Drop for GuestRunning {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
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
                &code_settings(&config, allocator, memory),
            )?),
            None => None,
        };
        let engines = std::iter::once(&primary)
            .chain(overflow.as_ref())
            .map(|f| f.engine.clone())
            .collect();
        let threads = config.guest_threads.max(1);
        let turns = Turns::new(threads);
        let ticker = start_ticker(engines, config.epoch_tick, turns.clone())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sharehost-guest")
            .enable_all()
            .build()
            .map_err(|e| RuntimeError::Engine(format!("cannot start the guest threads: {e}")))?;
        Ok(Self {
            inner: Arc::new(RuntimeInner {
                primary,
                overflow,
                config,
                cache,
                ticker,
                guests: GuestThreads {
                    runtime: Some(runtime),
                },
                turns,
            }),
        })
    }

    /// Runs `future` on the guest threads. Plugin calls of a pipeline go there, so that a
    /// guest's time slices never stand between the host's own tasks and a thread.
    pub(crate) fn spawn_guest<F>(&self, future: F) -> GuestTask<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let rt = self
            .inner
            .guests
            .runtime
            .as_ref()
            .expect("the guest threads live as long as the runtime");
        GuestTask {
            handle: rt.spawn(future),
        }
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
        let ticker = &self.inner.ticker;
        if ticker.running.fetch_add(1, Ordering::SeqCst) == 0
            && ticker.asleep.load(Ordering::SeqCst)
        {
            ticker.waker.unpark();
        }
        GuestRunning {
            running: ticker.running.clone(),
        }
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
        let compiled = self.compile(path, &limits).await?;
        Plugin::new(self.clone(), path, compiled, limits, init).await
    }

    /// A plugin from a component compiled earlier (a version a pipeline kept): instantiated
    /// and initialised like [`PluginRuntime::load_with`], nothing read or compiled.
    pub async fn instantiate(
        &self,
        path: &Path,
        compiled: Compiled,
        limits: PluginLimits,
        init: PluginInit,
    ) -> Result<Plugin, LoadError> {
        Plugin::new(self.clone(), path, compiled, limits, init).await
    }

    /// Reads, validates and compiles a component without instantiating it, and says whether
    /// it came from the cache and which allocator takes it. Exposed for `sharehost check` and
    /// benchmarks.
    ///
    /// When `limits.trust` is set, the bytes read must carry a valid signature by a trusted key
    /// (`PATH.minisig`, see `trust.rs`) or the component is refused ([`LoadError::Untrusted`])
    /// before it is parsed, compiled or looked up in the cache.
    ///
    /// The file goes through the one component reader (regular file, bounded size, header),
    /// then its imports and exports are checked from its sections *before* compiling: a
    /// component refused for its contract costs a read and a parse, not a compilation (which
    /// for a component with a large data segment costs several times its size in memory).
    ///
    /// Compiling takes seconds of CPU, so this runs on a blocking thread of the caller's
    /// tokio runtime: no caller can stall the async workers that judging and the engine share.
    pub async fn compile(&self, path: &Path, limits: &PluginLimits) -> Result<Compiled, LoadError> {
        let (runtime, owned, limits) = (self.clone(), path.to_owned(), limits.clone());
        tokio::task::spawn_blocking(move || runtime.compile_blocking(&owned, &limits))
            .await
            .unwrap_or_else(|e| {
                Err(LoadError::Compile {
                    path: path.to_owned(),
                    message: format!("the compile task failed: {e}"),
                })
            })
    }

    /// [`PluginRuntime::compile`] on the calling thread, for callers outside an async runtime
    /// (`sharehost check`, tests, benchmarks). It blocks for as long as compiling takes.
    pub fn compile_blocking(
        &self,
        path: &Path,
        limits: &PluginLimits,
    ) -> Result<Compiled, LoadError> {
        let inner = &self.inner;
        if limits.max_memory > inner.config.max_plugin_memory {
            return Err(LoadError::MemoryLimit {
                requested: limits.max_memory,
                maximum: inner.config.max_plugin_memory,
            });
        }
        let bytes = component_file::read_component(path, inner.config.max_component_bytes)?;
        // The signature covers exactly these bytes, and is checked before anything parses them
        // and before the cache lookup: a cached artifact never stands in for a signature.
        let signer = match &limits.trust {
            Some(policy) => {
                Some(
                    policy
                        .verify(path, &bytes)
                        .map_err(|refusal| LoadError::Untrusted {
                            path: path.to_owned(),
                            refusal,
                        })?,
                )
            }
            None => None,
        };
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
        // A memory the plugin may not have is refused before the (costly) compile: one
        // 200 MiB data segment cost seconds and hundreds of MiB to compile, on every attempt.
        if surface.initial_memory > limits.max_memory as u64 {
            return Err(LoadError::InitialMemory {
                path: path.to_owned(),
                declared: surface.initial_memory,
                limit: limits.max_memory as u64,
            });
        }
        let hash = cache::content_hash(&bytes);
        let cached = inner.cache.as_ref().and_then(|c| {
            let artifact = c.get_artifact(&hash)?;
            match self.place(&artifact) {
                Ok(placed) => Some(placed),
                // Not a pool-fit refusal (those fall back to on-demand): an entry wasmtime
                // cannot load, e.g. truncated by a crash. Compile it again.
                Err(e) => {
                    c.discard(&hash, &format!("{e:#}"));
                    None
                }
            }
        });
        // `fresh`: the artifact compiled now, cached once the checks below pass.
        let (component, placement, fresh) = match cached {
            Some((component, placement)) => (component, placement, None),
            None => {
                // Compiled once, without the allocator's check; `place` then loads the code
                // into the engine whose allocator takes it.
                let artifact = inner
                    .primary
                    .engine
                    .precompile_component(&bytes)
                    .map_err(|e| self.compile_error(path, limits, &e))?;
                let (component, placement) = self
                    .place(&artifact)
                    .map_err(|e| self.compile_error(path, limits, &e))?;
                (component, placement, Some(artifact))
            }
        };
        drop(bytes);
        // The same checks on the compiled component's types: they also cover a cached entry
        // and export types the section walk does not look at.
        let engine = component.engine();
        if let Some(found) = validate::foreign_version(
            validate::names(engine, &component)
                .iter()
                .map(String::as_str),
        ) {
            return Err(LoadError::WrongVersion {
                path: path.to_owned(),
                found,
            });
        }
        let imports = validate::imports(engine, &component);
        check_imports(
            path,
            limits.http.is_some(),
            imports.iter().map(String::as_str),
        )?;
        if let Some(message) = validate::missing_exports(engine, &component) {
            return Err(LoadError::WrongWorld {
                path: path.to_owned(),
                message,
            });
        }
        // Only components that passed validation are cached.
        let origin = match fresh {
            Some(artifact) => {
                if let Some(cache) = &inner.cache {
                    cache.put_artifact(&artifact, &hash);
                }
                Origin::Compiled
            }
            None => Origin::Cached,
        };
        Ok(Compiled {
            component,
            hash,
            origin,
            placement,
            signer,
        })
    }

    /// Loads precompiled code into the pool's engine, or, when one instance of the component
    /// needs more than a pool slot's share (core instances, memories, tables, instance
    /// state), into the on-demand engine, with wasmtime's count as the reason. The artifact is
    /// this host's own compilation (just made, or read back from its own cache).
    fn place(&self, artifact: &[u8]) -> wasmtime::Result<(Component, Placement)> {
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
        // What a load without the cache compiles (placement aside: loading the code into the
        // engine that takes it is the cached-load part).
        self.inner
            .primary
            .engine
            .precompile_component(&bytes)
            .map_err(|e| LoadError::Compile {
                path: path.to_owned(),
                message: format!("{e:#}"),
            })?;
        let compile = t.elapsed();
        let limits = PluginLimits::default();
        // First call fills the cache (when configured), second one maps from it.
        self.compile_blocking(path, &limits)?;
        let t = Instant::now();
        let origin = self.compile_blocking(path, &limits)?.origin;
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
/// actually chosen and the plugin memory limit (the compact pool compiles the limit in as the
/// memory reservation, so an artifact built for 4096 MiB must never serve a 64 MiB runtime,
/// nor the reverse), plus the reservation and guard each allocator configures, and the pool
/// slot's share (which decides whether an entry loads into the pool or on-demand).
fn code_settings(
    config: &RuntimeConfig,
    allocator: AllocatorKind,
    memory: MemorySettings,
) -> String {
    let (reservation, guard, growth) = match memory.compact_reservation {
        Some(r) => (r, 64u64 << 10, 0u64),
        // wasmtime's defaults on 64-bit hosts.
        None => (0, 0, 0),
    };
    format!(
        "v2 allocator={allocator:?} max_plugin_memory={} memory_reservation={reservation} \
         memory_guard={guard} reservation_for_growth={growth} opt=speed epochs=1 cow=1 \
         slot={CORE_INSTANCES_PER_SLOT}/{MEMORIES_PER_SLOT}/{TABLES_PER_SLOT}",
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
        // soak with a swap every 5 minutes grew from 23 to 29 MiB (issue 14). Slots affine to
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

fn start_ticker(
    engines: Vec<Engine>,
    tick: Duration,
    turns: Arc<Turns>,
) -> Result<Ticker, RuntimeError> {
    let stop = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicUsize::new(0));
    let asleep = Arc::new(AtomicBool::new(false));
    let (flag, calls, parked) = (stop.clone(), running.clone(), asleep.clone());
    let tick = tick.max(Duration::from_micros(100));
    let thread = std::thread::Builder::new()
        .name("sharehost-epoch".into())
        .spawn(move || {
            let mut idle = 0u32;
            while !flag.load(Ordering::Relaxed) {
                if calls.load(Ordering::SeqCst) == 0 {
                    idle = idle.saturating_add(1);
                } else {
                    idle = 0;
                }
                if idle > IDLE_TICKS_BEFORE_PARKING {
                    // No guest ran for a while: sleep until the first call (or the
                    // runtime's drop) unparks us. `asleep` is set before `running` is read
                    // again, and a starting call raises `running` before it reads `asleep`
                    // (both SeqCst): either we see the call and do not park, or the call
                    // sees us asleep and unparks us (its token makes a late park return).
                    parked.store(true, Ordering::SeqCst);
                    if calls.load(Ordering::SeqCst) == 0 {
                        std::thread::park();
                    }
                    parked.store(false, Ordering::SeqCst);
                    idle = 0;
                    continue;
                }
                // park_timeout, not sleep: dropping the runtime unparks us at once.
                std::thread::park_timeout(tick);
                for engine in &engines {
                    engine.increment_epoch();
                }
                turns.tick();
            }
        })
        .map_err(RuntimeError::Ticker)?;
    Ok(Ticker {
        stop,
        waker: thread.thread().clone(),
        thread: Some(thread),
        running,
        asleep,
    })
}
