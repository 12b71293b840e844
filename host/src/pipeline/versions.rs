//! The versions of a pipeline's plugin: what a loaded version is, the ones kept compiled for
//! rollback, the grants every version gets, and how a component becomes a version (read,
//! checked and compiled off the async workers, then instantiated and initialised).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::handler::{Handler, NativeHandler};
use crate::kafka::now_ms;
use crate::manifest::{InstanceModeSpec, PipelineSpec};
use crate::runtime::{
    Compiled, HttpGrant, InstanceMode, OutputGrant, Placement, PluginInit, PluginLimits,
    PluginRuntime, Secrets,
};

/// The first 12 hex digits of a content hash, for logs and metric labels.
pub fn short(hash: &str) -> &str {
    // A digest may come from a fleet record: any text, cut on a character boundary.
    sharehost_text::cut(hash, 12)
}

/// Why a plugin version could not be made active.
#[derive(Debug, thiserror::Error)]
#[error("pipeline {pipeline}: {}{message}", if path.as_os_str().is_empty() { String::new() } else { format!("cannot load {}: ", path.display()) })]
pub struct SwapError {
    /// The pipeline.
    pub pipeline: String,
    /// The component that failed.
    pub path: PathBuf,
    /// Why.
    pub message: String,
}

/// One loaded plugin version: `concurrency` instances of the same component (or handles on
/// the same native handler).
pub(super) struct Version {
    pub(super) hash: String,
    pub(super) path: PathBuf,
    /// Where its instances live (`None` for a native handler).
    pub(super) placement: Option<Placement>,
    /// Its compiled code (`None` for a native handler): kept when the version is replaced,
    /// so a rollback instantiates it again without reading or compiling anything.
    pub(super) compiled: Option<Compiled>,
    /// When it was loaded, in ms since the Unix epoch.
    pub(super) loaded_at_ms: u64,
    pub(super) instances: Mutex<Vec<Handler>>,
}

impl Version {
    /// The key id that signed it, when its pipeline requires signatures.
    pub(super) fn signer(&self) -> Option<String> {
        self.compiled.as_ref().and_then(|c| c.signer.clone())
    }
}

/// A replaced version kept for rollback: its code, not its instances (which would hold pool
/// slots for nothing).
#[derive(Clone)]
pub(super) struct Kept {
    pub(super) hash: String,
    pub(super) path: PathBuf,
    pub(super) compiled: Compiled,
    pub(super) loaded_at_ms: u64,
}

/// Versions kept compiled besides the active one, newest first, for rollback.
pub(super) const KEPT_VERSIONS: usize = 3;

impl Version {
    /// A native handler as a version: its "hash" and "path" name it (`native:NAME`), so logs,
    /// metrics and `GET /pipelines` show what runs.
    pub(super) fn native(handler: Arc<dyn NativeHandler>, concurrency: usize) -> Version {
        let id = format!("native:{}", handler.name());
        Version {
            hash: id.clone(),
            path: PathBuf::from(id),
            placement: None,
            compiled: None,
            loaded_at_ms: now_ms(),
            instances: Mutex::new(
                (0..concurrency)
                    .map(|_| Handler::Native(handler.clone()))
                    .collect(),
            ),
        }
    }
}

/// What a pipeline grants its plugin beyond computing: built once per pipeline (the HTTP
/// grant's concurrency cap and TLS settings are shared by every instance and version).
#[derive(Debug, Default, Clone)]
pub(super) struct Grants {
    pub(super) http: Option<Arc<HttpGrant>>,
    pub(super) outputs: Arc<OutputGrant>,
    pub(super) secrets: Arc<Secrets>,
}

impl Grants {
    /// The grants `spec` names; a bad one (a secret that is not set, an unusable host list)
    /// refuses the pipeline's component as a load failure would.
    pub(super) fn build(spec: &PipelineSpec) -> Result<Grants, SwapError> {
        let built = || -> Result<Grants, String> {
            let http = match &spec.http {
                Some(settings) => Some(
                    HttpGrant::named(&spec.name, settings.clone())
                        .map_err(|e| format!("allowed_outbound_hosts: {e}"))?,
                ),
                None => None,
            };
            Ok(Grants {
                http,
                outputs: Arc::new(spec.output_grant()),
                secrets: Arc::new(spec.resolve_secrets()?),
            })
        };
        built().map_err(|message| SwapError {
            pipeline: spec.name.clone(),
            path: spec.component.clone(),
            message,
        })
    }
}

/// The limits and grants a version of `spec` runs under.
pub(super) fn limits(spec: &PipelineSpec, grants: &Grants) -> PluginLimits {
    PluginLimits {
        max_memory: spec.memory_limit,
        batch_deadline: spec.cpu_deadline,
        wall_deadline: Some(spec.wall_deadline),
        http: grants.http.clone(),
        outputs: grants.outputs.clone(),
        trust: spec.trust.clone(),
        instance_mode: match spec.instance_mode {
            InstanceModeSpec::Reuse => InstanceMode::Reuse {
                max_batches: spec.recycle_after,
            },
            InstanceModeSpec::Fresh => InstanceMode::FreshPerBatch,
        },
        ..PluginLimits::default()
    }
}

/// The limits, grants and `init` a version of `spec` runs with, as the pipeline would load
/// it: what `sharehost test-plugin --manifest` runs a component under (and so compiles into
/// the same cache entry `run` maps). Errors name the grant that cannot be built.
pub fn plugin_setup(spec: &PipelineSpec) -> Result<(PluginLimits, PluginInit), SwapError> {
    let grants = Grants::build(spec)?;
    Ok((limits(spec, &grants), init(spec, &grants)))
}

/// What a version of `spec` gets at `init`: its config, its secrets, the pipeline's name.
fn init(spec: &PipelineSpec, grants: &Grants) -> PluginInit {
    PluginInit {
        config: spec
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        secrets: grants.secrets.clone(),
        tenant: Some(Arc::from(spec.name.as_str())),
    }
}

/// Reads, checks and compiles `path` for the pipeline (or maps it from the cache) on a
/// blocking thread: on a runtime worker the read, hash, signature check and compile held up
/// the batches queued behind it (a cached swap under load stalled judging up to 17 ms, an
/// uncached one for its whole compile).
pub(super) async fn compile_version(
    runtime: &PluginRuntime,
    spec: &PipelineSpec,
    grants: &Grants,
    path: &Path,
) -> Result<Compiled, SwapError> {
    let failed = |message: String| SwapError {
        pipeline: spec.name.clone(),
        path: path.to_owned(),
        message,
    };
    runtime
        .compile(path, &limits(spec, grants))
        .await
        .map_err(|e| {
            if !e.describes_the_file() {
                return failed(e.to_string());
            }
            // The answer of a swap goes to whoever called the admin API: it says only that
            // the path cannot be loaded. What is wrong with the file is the operator's to read.
            tracing::warn!(pipeline = %spec.name, "cannot load a component: {e}");
            failed(
                "cannot be loaded: not a readable WebAssembly component file within \
                 runtime.max_component_mib (the host's log says why)"
                    .into(),
            )
        })
}

/// `instances` initialised instances of compiled code under `limits`: a version ready to
/// take batches.
pub(super) async fn instantiate_version(
    runtime: &PluginRuntime,
    spec: &PipelineSpec,
    grants: &Grants,
    path: &Path,
    compiled: Compiled,
    limits: PluginLimits,
    instances: usize,
) -> Result<Version, SwapError> {
    let init = init(spec, grants);
    let mut plugins = Vec::with_capacity(instances);
    for _ in 0..instances {
        let plugin = runtime
            .instantiate(path, compiled.clone(), limits.clone(), init.clone())
            .await
            .map_err(|e| SwapError {
                pipeline: spec.name.clone(),
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        plugins.push(plugin);
    }
    let placement = compiled.placement.clone();
    if let Some(reason) = &placement.reason {
        tracing::info!(pipeline = %spec.name, component = %path.display(), %reason, "this component's instances are allocated on demand: one does not fit a pool slot");
    }
    Ok(Version {
        hash: compiled.hash.clone(),
        path: path.to_owned(),
        placement: Some(placement),
        compiled: Some(compiled),
        loaded_at_ms: now_ms(),
        instances: Mutex::new(
            plugins
                .into_iter()
                .map(|p| Handler::Wasm(Box::new(p)))
                .collect(),
        ),
    })
}

/// Compiles `path` and instantiates it as the pipeline's version (all its workers).
pub(super) async fn load_version(
    runtime: &PluginRuntime,
    spec: &PipelineSpec,
    grants: &Grants,
    path: &Path,
) -> Result<Version, SwapError> {
    let compiled = compile_version(runtime, spec, grants, path).await?;
    instantiate_version(
        runtime,
        spec,
        grants,
        path,
        compiled,
        limits(spec, grants),
        spec.concurrency,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Record, Verdict};

    struct Native;

    impl NativeHandler for Native {
        fn name(&self) -> &str {
            "test"
        }

        fn handle(&self, records: &[Record]) -> Vec<Verdict> {
            vec![Verdict::Accept; records.len()]
        }
    }

    #[test]
    fn a_native_version_is_named_after_its_handler() {
        let v = Version::native(Arc::new(Native), 2);
        assert_eq!(v.hash, "native:test");
        assert_eq!(v.instances.lock().map(|i| i.len()).unwrap_or(0), 2);
    }
}
