//! The manifest: what `sharehost run` and `sharehost check` read. TOML with unknown fields
//! refused, every value checked, and every error pointing at the file, line and field.
//!
//! Read in two steps, each in rooms of its own:
//! - `raw`: the TOML shape as written (serde, unknown fields refused, values kept with their
//!   position in the text); nothing is checked there but the shape.
//! - one validator per table turns it into the specs the host runs on, resolving paths against
//!   the manifest's folder and filling in [`defaults`]: `cluster` (`[cluster]`, into
//!   [`ClusterSpec`]), `admin` (`[admin]`, [`AdminSpec`]), `runtime` (`[runtime]`,
//!   [`RuntimeSpec`]), `trust` (`[trust]` and `[pipeline.trust]`), `fleet` (`[fleet]`,
//!   [`FleetSpec`]), `pipeline` (`[[pipeline]]`,
//!   [`PipelineSpec`]), and `grants` (a pipeline's outputs, secrets and outbound HTTP).
//!
//! Before them, `limits` refuses a manifest that asks more of a host than it is for (pipelines,
//! grants, config entries), and the file itself is read bounded ([`limits::MAX_MANIFEST_BYTES`],
//! regular files only) like every file the host reads.
//!
//! Beside them: `error` ([`ManifestError`], located by line, column and field), `context`
//! (what every validator shares: the text to locate errors in, range and choice checks,
//! relative paths), `secret` ([`SecretSource`]: where a secret lives) and [`defaults`].
//!
//! The reference with every field, its default and an example is `docs/manifest.md`.

mod admin;
mod cluster;
mod context;
pub mod defaults;
mod error;
mod fleet;
mod grants;
pub mod limits;
mod pipeline;
mod raw;
mod runtime;
mod schema;
mod secret;
#[cfg(test)]
mod testing;
mod trust;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use admin::AdminSpec;
pub use cluster::{ClusterSpec, SaslSpec};
pub use error::ManifestError;
pub use fleet::FleetSpec;
pub use pipeline::{
    FaultPolicy, Guarantee, InstanceModeSpec, PipelineSpec, ShadowSpec, StartPosition,
};
pub use runtime::RuntimeSpec;
pub use schema::{SchemaAuthSpec, SchemaSpec};
pub use secret::SecretSource;

use crate::runtime::{RuntimeConfig, TrustPolicy};
use context::Ctx;
use raw::RawManifest;

/// A validated manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The file it came from.
    pub path: PathBuf,
    /// The cluster.
    pub cluster: ClusterSpec,
    /// The admin listener.
    pub admin: AdminSpec,
    /// Host-wide runtime settings.
    pub runtime: RuntimeSpec,
    /// The host's trusted keys (`[trust]`): every pipeline without its own `[pipeline.trust]`
    /// requires components signed by one of them.
    pub trust: Option<Arc<TrustPolicy>>,
    /// The fleet this host is one of (`[fleet]`); `None`: a host on its own.
    pub fleet: Option<FleetSpec>,
    /// OpenTelemetry traces (`[telemetry]`), when it names a collector.
    pub telemetry: Option<crate::telemetry::TelemetrySpec>,
    /// The pipelines, in file order.
    pub pipelines: Vec<PipelineSpec>,
}

impl Manifest {
    /// Plugin runtime settings sized for every pipeline here: the largest memory limit, and
    /// instances for each pipeline's workers, a canary's set beside them, a hot-swap's or
    /// rollback's new set while the old one finishes, and a shadow's one plus two spare
    /// (3 × concurrency + 3), so `sharehost run` and the benchmark host reserve the same. The
    /// precompiled cache is the caller's choice.
    pub fn runtime_config(&self) -> RuntimeConfig {
        let max_plugin_memory = self
            .pipelines
            .iter()
            .map(|p| p.memory_limit)
            .max()
            .unwrap_or(defaults::MEMORY_LIMIT_MIB << 20);
        let instances: usize = self.pipelines.iter().map(|p| p.concurrency * 3 + 3).sum();
        RuntimeConfig {
            max_plugin_memory,
            max_instances: u32::try_from(instances.max(4)).unwrap_or(64),
            max_component_bytes: self.runtime.max_component_bytes,
            function_bounds: self.runtime.function_bounds,
            ..RuntimeConfig::default()
        }
    }

    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text = Self::read(path)?;
        Self::parse(path, &text)
    }

    /// Reads a manifest file's text: a regular file (a FIFO, a device or a directory is refused
    /// by type, without blocking) of at most [`limits::MAX_MANIFEST_BYTES`], UTF-8.
    pub fn read(path: &Path) -> Result<String, ManifestError> {
        crate::runtime::fs::read_regular_text(path, limits::MAX_MANIFEST_BYTES)
            .map_err(|e| ManifestError::unreadable(path, &e))
    }

    /// Reads a manifest file and validates its `[admin]` table only: what `sharehost ctl`
    /// needs, where the component and TLS files the rest names may not be (the other tables
    /// are parsed, their files never opened).
    pub fn load_admin(path: &Path) -> Result<AdminSpec, ManifestError> {
        let text = Self::read(path)?;
        let raw: RawManifest =
            toml::from_str(&text).map_err(|e| ManifestError::from_toml(path, &text, &e))?;
        admin::validate(
            &Ctx {
                file: path,
                text: &text,
            },
            raw.admin.as_ref(),
        )
    }

    /// Validates manifest text; `path` names it in errors and anchors relative paths. The
    /// tables are checked one after another (cluster, admin, runtime, trust, then each pipeline
    /// in file order), and the first error is the one returned.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| ManifestError::from_toml(path, text, &e))?;
        let cx = Ctx { file: path, text };
        limits::check(&cx, &raw)?;
        let cluster = cluster::validate(&cx, &raw.cluster)?;
        let admin = admin::validate(&cx, raw.admin.as_ref())?;
        let runtime = runtime::validate(&cx, raw.runtime.as_ref())?;
        let trust = match &raw.trust {
            Some(t) => Some(trust::validate(&cx, t, "trust")?),
            None => None,
        };
        let fleet = match &raw.fleet {
            Some(f) => Some(fleet::validate(&cx, f, trust.as_ref())?),
            None => None,
        };
        let telemetry = match &raw.telemetry {
            Some(t) => Some(telemetry(&cx, t)?),
            None => None,
        };
        let pipelines = pipeline::validate_all(
            &cx,
            &raw.pipelines,
            runtime.max_component_bytes,
            trust.as_ref(),
        )?;
        Ok(Manifest {
            path: path.to_path_buf(),
            cluster,
            admin,
            runtime,
            trust,
            fleet,
            telemetry,
            pipelines,
        })
    }
}

/// `[telemetry]`: an `http://` collector (OTLP over HTTP), a sample in 0..=1 (default 1: every
/// trace), a service name (default `sharehost`).
fn telemetry(
    cx: &context::Ctx<'_>,
    t: &toml::Spanned<raw::RawTelemetry>,
) -> Result<crate::telemetry::TelemetrySpec, ManifestError> {
    let t = t.get_ref();
    let endpoint = t.otlp_endpoint.get_ref().trim_end_matches('/').to_owned();
    let uri: Option<http::Uri> = endpoint.parse().ok();
    if !uri.is_some_and(|u| u.scheme_str() == Some("http") && u.host().is_some()) {
        return Err(cx.err(
            Some(t.otlp_endpoint.span()),
            "telemetry.otlp_endpoint",
            "must be an http:// URL of a collector's OTLP/HTTP port, e.g. http://127.0.0.1:4318 (https is not supported yet: run the collector beside the host)",
        ));
    }
    let sample = match &t.sample {
        None => 1.0,
        Some(s) if (0.0..=1.0).contains(s.get_ref()) => *s.get_ref(),
        Some(s) => {
            return Err(cx.err(
                Some(s.span()),
                "telemetry.sample",
                "must be within 0..=1 (the fraction of new traces kept)",
            ));
        }
    };
    Ok(crate::telemetry::TelemetrySpec {
        otlp_endpoint: endpoint,
        sample,
        service_name: t
            .service_name
            .as_ref()
            .map_or_else(|| "sharehost".to_owned(), |s| s.get_ref().clone()),
    })
}

#[cfg(test)]
mod telemetry_tests {
    use super::testing::{MINIMAL, parse};

    #[test]
    fn telemetry_is_an_http_collector_and_a_sample_within_0_and_1() {
        let with = |t: &str| parse(&format!("[telemetry]\n{t}\n{MINIMAL}"));
        let m = with("otlp_endpoint = \"http://127.0.0.1:4318/\"").expect("valid");
        let t = m.telemetry.expect("telemetry");
        assert_eq!(
            (t.otlp_endpoint.as_str(), t.sample, t.service_name.as_str()),
            ("http://127.0.0.1:4318", 1.0, "sharehost")
        );
        let e = with("otlp_endpoint = \"https://c:4318\"")
            .expect_err("https")
            .to_string();
        assert!(e.contains("telemetry.otlp_endpoint"), "{e}");
        let e = with("otlp_endpoint = \"http://c:4318\"\nsample = 1.5")
            .expect_err("sample")
            .to_string();
        assert!(e.contains("telemetry.sample"), "{e}");
    }
}
