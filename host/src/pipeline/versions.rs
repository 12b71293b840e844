//! The versions room, [`Versions`]: the active version of a pipeline's plugin, the ones kept
//! compiled for rollback, and the state file that brings a restart back on the active one.
//! Also what a loaded version is, the grants every version gets, and how a component becomes a
//! version (read, checked and compiled off the async workers, then instantiated and
//! initialised).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use sharehost_api::{VersionInfo, VersionsStatus};

use super::counters::Counters;
use super::handler::{Handler, NativeHandler};
use crate::kafka::now_ms;
use crate::manifest::{InstanceModeSpec, PipelineSpec};
use crate::metrics::Metrics;
use crate::rollout::{ActiveState, CanaryNote};
use crate::runtime::{
    Compiled, HttpGrant, InstanceMode, OutputGrant, Placement, PluginInit, PluginLimits,
    PluginRuntime, Secrets,
};

/// The versions room: the active version, the replaced ones kept compiled for rollback (newest
/// first, at most [`KEPT_VERSIONS`]), and where the active one is remembered across restarts.
pub(super) struct Versions {
    /// The pipeline's name and group, for logs, metric labels and the state file.
    pipeline: String,
    group: String,
    metrics: Arc<Metrics>,
    active: Mutex<Arc<Version>>,
    kept: Mutex<VecDeque<Kept>>,
    /// Where the active version is remembered across restarts (`None`: not remembered).
    state_file: Option<PathBuf>,
    /// Content hash of the manifest's component, as loaded at start.
    manifest_hash: String,
}

impl Versions {
    /// `version` active, nothing kept, nothing remembered (until [`Versions::remembering`]).
    pub(super) fn new(spec: &PipelineSpec, metrics: Arc<Metrics>, version: Version) -> Versions {
        let versions = Versions {
            pipeline: spec.name.clone(),
            group: spec.group.clone(),
            metrics,
            manifest_hash: version.hash.clone(),
            active: Mutex::new(Arc::new(version)),
            kept: Mutex::new(VecDeque::new()),
            state_file: None,
        };
        versions.publish_info(&versions.active(), 1);
        versions
    }

    /// Remembers the active version in `file` from now on; `manifest_hash` is the manifest's
    /// component (which `kept`, when the host came back on another version, is).
    pub(super) fn remembering(
        mut self,
        file: PathBuf,
        manifest_hash: String,
        kept: Option<Kept>,
    ) -> Versions {
        self.state_file = Some(file);
        self.manifest_hash = manifest_hash;
        if let Some(k) = kept {
            self.kept.lock().push_front(k);
        }
        self
    }

    /// The active version (batches hold it while they run, so a swap never cuts one short).
    pub(super) fn active(&self) -> Arc<Version> {
        self.active.lock().clone()
    }

    /// The manifest's own component's content hash, as loaded at start.
    pub(super) fn manifest_hash(&self) -> &str {
        &self.manifest_hash
    }

    /// The state file, when the pipeline keeps one (the member id is kept beside it).
    pub(super) fn state_file(&self) -> Option<&Path> {
        self.state_file.as_deref()
    }

    /// Makes `v` the active version: the replaced one is kept compiled for rollback. Batches
    /// already running finish on the version they started with. The caller remembers it.
    pub(super) fn activate(&self, v: Arc<Version>, how: &str) {
        let hash = v.hash.clone();
        self.publish_info(&v, 1);
        let old = std::mem::replace(&mut *self.active.lock(), v);
        self.publish_info(&old, 0);
        tracing::info!(pipeline = %self.pipeline, from = %short(&old.hash), to = %short(&hash), "plugin {how}");
        let mut kept = self.kept.lock();
        kept.retain(|k| k.hash != hash && k.hash != old.hash);
        if let Some(compiled) = &old.compiled {
            kept.push_front(Kept {
                hash: old.hash.clone(),
                path: old.path.clone(),
                compiled: compiled.clone(),
                loaded_at_ms: old.loaded_at_ms,
            });
        }
        kept.truncate(KEPT_VERSIONS);
    }

    /// Writes the state file (when this pipeline keeps one), with the running `canary` noted;
    /// a failure is logged, not fatal.
    pub(super) fn remember(&self, canary: Option<CanaryNote>) {
        let Some(file) = &self.state_file else {
            return;
        };
        let active = self.active();
        let state = ActiveState {
            pipeline: self.pipeline.clone(),
            group: self.group.clone(),
            active_hash: active.hash.clone(),
            active_path: active.path.clone(),
            manifest_hash: self.manifest_hash.clone(),
            canary,
        };
        if let Err(e) = state.write(file) {
            tracing::warn!(pipeline = %self.pipeline, "cannot remember the active version for a restart: {e}");
        }
    }

    /// The kept version to roll back to: the newest one, or the one whose hash starts with
    /// `hash`; the reason when there is none.
    pub(super) fn kept(&self, hash: Option<&str>) -> Result<Kept, String> {
        let kept = self.kept.lock();
        let found = match hash {
            None => kept.front().cloned(),
            Some(h) => kept.iter().find(|k| k.hash.starts_with(h)).cloned(),
        };
        found.ok_or_else(|| match hash {
            None => "no earlier version is kept to roll back to".into(),
            Some(h) => {
                let known: Vec<&str> = kept.iter().map(|k| short(&k.hash)).collect();
                format!("no kept version matches {h:?} (kept: {known:?})")
            }
        })
    }

    /// The component path and signer of the active or a kept version with `hash`.
    pub(super) fn identity(&self, hash: &str) -> Option<(String, Option<String>)> {
        let active = self.active();
        if active.hash == hash {
            return Some((active.path.display().to_string(), active.signer()));
        }
        self.kept
            .lock()
            .iter()
            .find(|k| k.hash == hash)
            .map(|k| (k.path.display().to_string(), k.compiled.signer.clone()))
    }

    /// The active version and the kept ones with their `counters`, for
    /// `GET /pipelines/NAME/versions`.
    pub(super) fn status(&self, counters: &Counters) -> VersionsStatus {
        let active = self.active();
        let mut versions = vec![VersionInfo {
            hash: active.hash.clone(),
            path: active.path.display().to_string(),
            loaded_at_ms: active.loaded_at_ms,
            signer: active.signer(),
            active: true,
            counters: counters.of(&active.hash),
        }];
        for k in self.kept.lock().iter() {
            versions.push(VersionInfo {
                hash: k.hash.clone(),
                path: k.path.display().to_string(),
                loaded_at_ms: k.loaded_at_ms,
                signer: k.compiled.signer.clone(),
                active: false,
                counters: counters.of(&k.hash),
            });
        }
        VersionsStatus {
            active: active.hash.clone(),
            versions,
        }
    }

    /// `sharehost_plugin_version{pipeline, version, signer}`: 1 for the active version, 0 for
    /// one it replaced, so dashboards join any per-version metric with who signed it.
    fn publish_info(&self, v: &Version, active: i64) {
        self.metrics
            .plugin_version
            .get_or_create(&vec![
                ("pipeline", self.pipeline.clone()),
                ("version", short(&v.hash).to_owned()),
                ("signer", v.signer().unwrap_or_default()),
            ])
            .set(active);
    }
}

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
    /// The schema registry's client and the formats, when `[pipeline.schema]` names them: the
    /// host decodes records for the plugin and encodes its emits (never the plugin itself).
    pub(super) schemas: Option<Arc<crate::schema::Schemas>>,
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
            let schemas = match &spec.schema {
                Some(s) => {
                    let auth = s.resolve_auth(&spec.name)?;
                    Some(Arc::new(
                        crate::schema::Schemas::new(&s.settings, auth, &spec.outputs)
                            .map_err(|e| format!("schema: {e}"))?,
                    ))
                }
                None => None,
            };
            Ok(Grants {
                http,
                outputs: Arc::new(spec.output_grant()),
                secrets: Arc::new(spec.resolve_secrets()?),
                schemas,
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
        assert_eq!(v.instances.lock().len(), 2);
    }
}
