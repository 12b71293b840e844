//! The loader: how a component file becomes compiled code ([`Compiled`]) and a running
//! [`Plugin`]. These are [`PluginRuntime`]'s loading methods; the engines they compile for
//! and place code in are `engine.rs`'s.
//!
//! A load reads the file through the one component reader (`component_file.rs`: a regular
//! file, bounded, a component header), checks its signature when the pipeline trusts keys
//! (`trust.rs`, on the very bytes read, before anything parses them or the cache is asked),
//! checks its imports and exports from its sections (`validate.rs`), its declared memory and
//! what each function asks of the compiler (`functions.rs`), all before compiling; then maps
//! it from the precompiled cache (`cache.rs`) or compiles it, checks the compiled types again,
//! and caches only what passed. Compiling takes seconds of CPU, so the async entry points
//! compile on a blocking thread: no load can stall the async workers that judging and the
//! share engine share.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cache;
use crate::component_file::{self, Surface};
use crate::config::PluginLimits;
use crate::engine::{Compiled, Origin, PluginRuntime};
use crate::error::LoadError;
use crate::functions::CodeShape;
use crate::plugin::{Plugin, PluginInit};
use crate::validate;

/// How long a load waits for another host's compile of the same component before compiling
/// itself: longer than an 18 MB Python component takes to compile on a busy 2-core machine
/// (a minute and more for the debug host), short enough that a host stopped mid-compile
/// (SIGSTOP) delays the others' start by minutes, not forever.
const COMPILE_LOCK_PATIENCE: Duration = Duration::from_secs(300);

impl PluginRuntime {
    /// Loads, validates, compiles (or maps from the cache) and initialises a plugin.
    ///
    /// Refused before anything runs: unreadable file, not a component, an import not
    /// granted (named in the error), a missing or mistyped `init`/`handle` export. Then one
    /// instance is created and `init(config)` must succeed within the plugin's deadline.
    ///
    /// Compiling runs off the async workers ([`PluginRuntime::compile`]); instantiating and
    /// `init` run on the calling task, under the plugin's deadline.
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
        let config = self.config();
        if limits.max_memory > config.max_plugin_memory {
            return Err(LoadError::MemoryLimit {
                requested: limits.max_memory,
                maximum: config.max_plugin_memory,
            });
        }
        let bytes = component_file::read_component(path, config.max_component_bytes)?;
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
        validate::check_contract(
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
        // A function whose compile time would run away is refused before Cranelift sees it,
        // and before the cache is asked: whether a component loads never depends on what an
        // earlier run (perhaps under raised bounds) left in the cache.
        CodeShape::check_bytes(path, &bytes, &config.function_bounds)?;
        let hash = cache::content_hash(&bytes);
        let from_cache = || {
            self.cache().and_then(|c| {
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
            })
        };
        // On a miss, one compile per component at a time: whoever waited for another's
        // compile looks again and loads its artifact. Held until the artifact is stored.
        let (cached, compiling) = match from_cache() {
            Some(placed) => (Some(placed), None),
            None => {
                let lock = self
                    .cache()
                    .and_then(|c| c.lock_compile(&hash, COMPILE_LOCK_PATIENCE));
                let again = if lock.is_some() { from_cache() } else { None };
                (again, lock)
            }
        };
        // `fresh`: the artifact compiled now, cached once the checks below pass.
        let (component, placement, fresh) = match cached {
            Some((component, placement)) => (component, placement, None),
            None => {
                // Compiled once, without the allocator's check; `place` then loads the code
                // into the engine whose allocator takes it.
                let artifact = self
                    .precompile(&bytes)
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
        validate::check_compiled(path, limits.http.is_some(), &component)?;
        // Only components that passed validation are cached.
        let origin = match fresh {
            Some(artifact) => {
                if let Some(cache) = self.cache() {
                    cache.put_artifact(&artifact, &hash);
                }
                drop(compiling);
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

    /// Measures compile-from-bytes against load-from-cache for one component (for the
    /// benchmark): returns (compile, cached load) durations.
    #[doc(hidden)]
    pub fn measure_compile_and_cached_load(
        &self,
        path: &Path,
    ) -> Result<(Duration, Duration), LoadError> {
        let bytes = component_file::read_component(path, self.config().max_component_bytes)?;
        let t = Instant::now();
        // What a load without the cache compiles (placement aside: loading the code into the
        // engine that takes it is the cached-load part).
        self.precompile(&bytes).map_err(|e| LoadError::Compile {
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
