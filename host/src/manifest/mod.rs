//! The manifest: what `sharehost run` and `sharehost check` read. TOML with unknown fields
//! refused, every value checked, and every error pointing at the file, line and field.
//!
//! The reference with every field, its default and an example is `docs/manifest.md`.

mod admin;
mod cluster;
mod context;
pub mod defaults;
mod error;
mod raw;
mod runtime;
mod secret;
mod trust;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

pub use admin::AdminSpec;
pub use cluster::{ClusterSpec, SaslSpec};
pub use error::ManifestError;
pub use runtime::RuntimeSpec;
pub use secret::SecretSource;

use crate::runtime::{
    HttpGrant, HttpSettings, LoadError, OutputGrant, RuntimeConfig, Secrets, TrustPolicy,
    check_component_path,
};
use context::{Ctx, valid_name};
use raw::RawManifest;

/// What happens to a batch whose plugin faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPolicy {
    /// Give the records back for redelivery (the delivery cap catches a record that always
    /// faults).
    Release,
    /// Reject them (and dead-letter them when a dead-letter topic is set).
    Reject,
}

/// Instance reuse, as written in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceModeSpec {
    /// One warm instance, recycled after `recycle_after` batches or any fault.
    Reuse,
    /// A fresh instance for every batch.
    Fresh,
}

/// One pipeline: topics + share group + plugin + policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSpec {
    /// Unique name (metrics, logs, admin URLs).
    pub name: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Share group.
    pub group: String,
    /// Component file (resolved against the manifest's folder).
    pub component: PathBuf,
    /// Plugin configuration handed to `init`.
    pub config: BTreeMap<String, String>,
    /// Most records per plugin call.
    pub batch_size: usize,
    /// Most records acquired and not yet judged.
    pub max_in_flight: usize,
    /// Client-side delivery cap (see docs/share-engine.md).
    pub delivery_cap: Option<i16>,
    /// Verdict for the records of a faulted batch.
    pub fault_policy: FaultPolicy,
    /// CPU deadline of one plugin call.
    pub cpu_deadline: Duration,
    /// Memory cap of one plugin instance.
    pub memory_limit: usize,
    /// Instance reuse.
    pub instance_mode: InstanceModeSpec,
    /// Batches per instance in reuse mode.
    pub recycle_after: u32,
    /// Plugin instances working in parallel.
    pub concurrency: usize,
    /// Where rejected records go, if anywhere.
    pub dead_letter_topic: Option<String>,
    /// The group's broker-side dead-letter topic (KIP-1191), which the host configures: it
    /// receives what the broker archives at the delivery limit (a record whose every
    /// delivery crashed the host), so every archived record has a dead letter.
    pub broker_dead_letter_topic: Option<String>,
    /// How often one record may ask for renew before it is released.
    pub max_renewals: u32,
    /// Renew records held past this fraction of the lock duration.
    pub auto_renew_after: f64,
    /// Wall-clock deadline of one plugin call (at least `cpu_deadline`): a plugin waiting on
    /// HTTP burns no CPU but must still end.
    pub wall_deadline: Duration,
    /// Longest delay a `retry` verdict may ask for; longer ones are cut to it.
    pub max_retry_delay: Duration,
    /// Output name to topic (`[pipeline.outputs]`): the only topics a plugin can emit to.
    pub outputs: BTreeMap<String, String>,
    /// Most emits per batch.
    pub max_emits_per_batch: u32,
    /// Most emitted bytes per batch.
    pub max_emit_bytes_per_batch: u64,
    /// Secrets handed to `init` (`[pipeline.secrets]`), by name; read at load, never shown.
    pub secrets: Vec<(String, SecretSource)>,
    /// Outbound HTTP, when `allowed_outbound_hosts` grants any host.
    pub http: Option<HttpSettings>,
    /// The keys its components must be signed by: the pipeline's own `[pipeline.trust]` when
    /// it has one (it replaces the host's), else the host's `[trust]`; `None`: no signature
    /// needed. Goes into the plugin's limits, so every load of the pipeline checks it.
    pub trust: Option<Arc<TrustPolicy>>,
    /// A candidate to shadow from the start (`shadow`, resolved against the manifest's
    /// folder) and the fraction of batches it sees (`shadow_sample`, default 1).
    pub shadow: Option<ShadowSpec>,
}

/// A shadow candidate named by the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowSpec {
    /// The candidate component.
    pub path: PathBuf,
    /// Fraction of batches it judges, in (0, 1].
    pub sample: f64,
}

impl PipelineSpec {
    /// Reads the pipeline's secrets from their environment variables and files. Errors name
    /// the secret and its source, never a value.
    pub fn resolve_secrets(&self) -> Result<Secrets, String> {
        let mut pairs = Vec::with_capacity(self.secrets.len());
        for (name, source) in &self.secrets {
            let field = format!("pipeline {}: secrets.{name}", self.name);
            pairs.push((name.clone(), source.read(&field)?));
        }
        Ok(Secrets::new(pairs))
    }

    /// What the runtime grants this pipeline's plugin for outputs.
    pub fn output_grant(&self) -> OutputGrant {
        OutputGrant {
            names: self.outputs.keys().map(|n| n.as_str().into()).collect(),
            max_emits: self.max_emits_per_batch,
            max_bytes: self.max_emit_bytes_per_batch,
        }
    }
}

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
            ..RuntimeConfig::default()
        }
    }

    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ManifestError::unreadable(path, &e))?;
        Self::parse(path, &text)
    }

    /// Validates manifest text; `path` names it in errors and anchors relative paths.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| ManifestError::from_toml(path, text, &e))?;

        let cx = Ctx { file: path, text };
        let cluster = cluster::validate(&cx, &raw.cluster)?;
        let admin = admin::validate(&cx, raw.admin.as_ref())?;
        let runtime = runtime::validate(&cx, raw.runtime.as_ref())?;
        let trust = match &raw.trust {
            Some(t) => Some(trust::validate(&cx, t, "trust")?),
            None => None,
        };

        // Pipelines.
        if raw.pipelines.is_empty() {
            return Err(cx.err(None, "pipeline", "the manifest defines no [[pipeline]]"));
        }
        let mut names = HashSet::new();
        // One share group per pipeline: two pipelines in one group would split its records
        // between two plugins, each judging the other's share as if it were its own.
        let mut groups: HashMap<String, String> = HashMap::new();
        let mut pipelines = Vec::new();
        for (i, p) in raw.pipelines.iter().enumerate() {
            let f = |name: &str| format!("pipeline[{i}].{name}");
            let name = p.name.get_ref().clone();
            if !valid_name(&name) {
                return Err(cx.err(
                    Some(p.name.span()),
                    f("name"),
                    format!("{name:?} must be 1-64 letters, digits, '-' or '_'"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(cx.err(
                    Some(p.name.span()),
                    f("name"),
                    format!("another pipeline is already named {name:?}"),
                ));
            }
            if p.topics.get_ref().is_empty() || p.topics.get_ref().iter().any(String::is_empty) {
                return Err(cx.err(
                    Some(p.topics.span()),
                    f("topics"),
                    "list at least one topic, none empty",
                ));
            }
            if p.group.get_ref().is_empty() {
                return Err(cx.err(Some(p.group.span()), f("group"), "must not be empty"));
            }
            if let Some(other) = groups.insert(p.group.get_ref().clone(), name.clone()) {
                return Err(cx.err(
                    Some(p.group.span()),
                    f("group"),
                    format!(
                        "pipeline {other:?} already consumes share group {:?}: two pipelines in one group split its records between their plugins; give each its own group",
                        p.group.get_ref()
                    ),
                ));
            }
            let component = cx.path(&p.component);
            // The runtime's own reader decides (regular file, size), so `check` and a load
            // refuse the same paths with the same words; the file is not read here.
            if let Err(e) = check_component_path(&component, runtime.max_component_bytes) {
                let message = match e {
                    LoadError::Read { error, .. }
                        if error.kind() == std::io::ErrorKind::NotFound =>
                    {
                        format!("component file {} does not exist", component.display())
                    }
                    other => other.to_string(),
                };
                return Err(cx.err(Some(p.component.span()), f("component"), message));
            }
            let batch_size: usize = cx.int(
                &p.batch_size,
                &f("batch_size"),
                1..=10_000,
                defaults::BATCH_SIZE,
            )?;
            let max_in_flight: usize = cx.int(
                &p.max_in_flight,
                &f("max_in_flight"),
                1..=1_000_000,
                defaults::MAX_IN_FLIGHT,
            )?;
            if max_in_flight < batch_size {
                let span = p.max_in_flight.as_ref().map(|s| s.span());
                return Err(cx.err(
                    span,
                    f("max_in_flight"),
                    format!("must be at least batch_size ({batch_size}), got {max_in_flight}"),
                ));
            }
            let delivery_cap = match &p.delivery_cap {
                None => None,
                Some(_) => Some(cx.int::<i16>(&p.delivery_cap, &f("delivery_cap"), 2..=25, 0)?),
            };
            let fault_policy = cx.choice(
                &p.fault_policy,
                &f("fault_policy"),
                &[
                    ("release", FaultPolicy::Release),
                    ("reject", FaultPolicy::Reject),
                ],
                FaultPolicy::Release,
            )?;
            let instance_mode = cx.choice(
                &p.instance_mode,
                &f("instance_mode"),
                &[
                    ("reuse", InstanceModeSpec::Reuse),
                    ("fresh", InstanceModeSpec::Fresh),
                ],
                InstanceModeSpec::Reuse,
            )?;
            let cpu_ms: u64 = cx.int(
                &p.cpu_deadline_ms,
                &f("cpu_deadline_ms"),
                1..=600_000,
                defaults::CPU_DEADLINE_MS,
            )?;
            let mem_mib: usize = cx.int(
                &p.memory_limit_mib,
                &f("memory_limit_mib"),
                1..=4096,
                defaults::MEMORY_LIMIT_MIB,
            )?;
            let dead_letter_topic = match &p.dead_letter_topic {
                Some(t) if t.get_ref().is_empty() => {
                    return Err(cx.err(
                        Some(t.span()),
                        f("dead_letter_topic"),
                        "must not be empty (leave it out for none)",
                    ));
                }
                Some(t) if p.topics.get_ref().contains(t.get_ref()) => {
                    return Err(cx.err(
                        Some(t.span()),
                        f("dead_letter_topic"),
                        "must not be one of the pipeline's own topics",
                    ));
                }
                Some(t) => Some(t.get_ref().clone()),
                None => None,
            };
            let broker_dead_letter_topic = match &p.broker_dead_letter_topic {
                Some(t) if t.get_ref().trim().is_empty() => {
                    return Err(cx.err(
                        Some(t.span()),
                        f("broker_dead_letter_topic"),
                        "must not be empty (leave it out for none)",
                    ));
                }
                Some(t) if t.get_ref().starts_with("__") => {
                    return Err(cx.err(
                        Some(t.span()),
                        f("broker_dead_letter_topic"),
                        "must not start with `__` (the broker refuses internal names)",
                    ));
                }
                Some(t)
                    if p.topics.get_ref().contains(t.get_ref())
                        || dead_letter_topic.as_ref() == Some(t.get_ref()) =>
                {
                    return Err(cx.err(
                        Some(t.span()),
                        f("broker_dead_letter_topic"),
                        "must differ from the pipeline's topics and its dead_letter_topic",
                    ));
                }
                Some(t) => Some(t.get_ref().clone()),
                None => None,
            };
            let auto_renew_after = match &p.auto_renew_after {
                None => defaults::AUTO_RENEW_AFTER,
                Some(v) if (0.05..=0.95).contains(v.get_ref()) => *v.get_ref(),
                Some(v) => {
                    return Err(cx.err(
                        Some(v.span()),
                        f("auto_renew_after"),
                        format!("must be between 0.05 and 0.95 (got {})", v.get_ref()),
                    ));
                }
            };
            let shadow = match (&p.shadow, &p.shadow_sample) {
                (None, None) => None,
                (None, Some(v)) => {
                    return Err(cx.err(
                        Some(v.span()),
                        f("shadow_sample"),
                        "has no effect without shadow (the candidate component)",
                    ));
                }
                (Some(path), sample) => {
                    let resolved = cx.path(path);
                    if let Err(e) = check_component_path(&resolved, runtime.max_component_bytes) {
                        return Err(cx.err(Some(path.span()), f("shadow"), e.to_string()));
                    }
                    let sample = match sample {
                        None => defaults::SHADOW_SAMPLE,
                        Some(v) if *v.get_ref() > 0.0 && *v.get_ref() <= 1.0 => *v.get_ref(),
                        Some(v) => {
                            return Err(cx.err(
                                Some(v.span()),
                                f("shadow_sample"),
                                format!("must be in (0, 1] (got {})", v.get_ref()),
                            ));
                        }
                    };
                    Some(ShadowSpec {
                        path: resolved,
                        sample,
                    })
                }
            };
            let wall_ms: u64 = cx.int(
                &p.wall_deadline_ms,
                &f("wall_deadline_ms"),
                1..=3_600_000,
                defaults::wall_deadline_ms(cpu_ms).min(3_600_000),
            )?;
            if wall_ms < cpu_ms {
                let span = p.wall_deadline_ms.as_ref().map(|s| s.span());
                return Err(cx.err(
                    span,
                    f("wall_deadline_ms"),
                    format!("must be at least cpu_deadline_ms ({cpu_ms}), got {wall_ms}"),
                ));
            }
            let mut outputs = BTreeMap::new();
            for (out, topic) in &p.outputs {
                let field = f(&format!("outputs.{out}"));
                if !valid_name(out) {
                    return Err(cx.err(
                        Some(topic.span()),
                        field,
                        format!("output name {out:?} must be 1-64 letters, digits, '-' or '_'"),
                    ));
                }
                let t = topic.get_ref();
                if t.is_empty() || p.topics.get_ref().contains(t) {
                    return Err(cx.err(
                        Some(topic.span()),
                        field,
                        "must name a topic that is not one of the pipeline's own (an output into its own input would loop)",
                    ));
                }
                outputs.insert(out.clone(), t.clone());
            }
            let mut secrets = Vec::new();
            for (secret, source) in &p.secrets {
                let field = f(&format!("secrets.{secret}"));
                let table = source.get_ref().as_table();
                let key = |k: &str| table.and_then(|t| t.get(k)).and_then(toml::Value::as_str);
                let only = table.is_some_and(|t| t.len() == 1);
                let source = match (key("env"), key("file")) {
                    (Some(var), None) if only && !var.is_empty() => {
                        SecretSource::Env(var.to_owned())
                    }
                    (None, Some(file)) if only && !file.is_empty() => {
                        SecretSource::File(cx.path(&Spanned::new(source.span(), file.to_owned())))
                    }
                    _ => {
                        return Err(cx.err(
                            Some(source.span()),
                            field,
                            "set exactly one of { env = \"VAR\" } or { file = \"path\" } (secrets never go in the manifest)",
                        ));
                    }
                };
                secrets.push((secret.clone(), source));
            }
            let http = match &p.allowed_outbound_hosts {
                Some(hosts) if !hosts.get_ref().is_empty() => {
                    let settings = HttpSettings {
                        allowed_outbound_hosts: hosts.get_ref().clone(),
                        request_timeout: Duration::from_millis(cx.int(
                            &p.http_timeout_ms,
                            &f("http_timeout_ms"),
                            1..=600_000,
                            defaults::HTTP_TIMEOUT_MS,
                        )?),
                        max_response_bytes: cx.int(
                            &p.http_max_response_bytes,
                            &f("http_max_response_bytes"),
                            1..=(1 << 30),
                            defaults::HTTP_MAX_RESPONSE_BYTES,
                        )?,
                        max_concurrent: cx.int(
                            &p.http_max_concurrent,
                            &f("http_max_concurrent"),
                            1..=1024,
                            defaults::HTTP_MAX_CONCURRENT,
                        )?,
                        ca_file: p.http_ca_file.as_ref().map(|c| cx.path(c)),
                    };
                    // The grant's own checks (every entry, the CA file), at the list's span.
                    HttpGrant::new(settings.clone()).map_err(|e| {
                        cx.err(
                            Some(hosts.span()),
                            f("allowed_outbound_hosts"),
                            e.to_string(),
                        )
                    })?;
                    Some(settings)
                }
                _ => {
                    let stray = [
                        (
                            "http_timeout_ms",
                            p.http_timeout_ms.as_ref().map(|s| s.span()),
                        ),
                        (
                            "http_max_response_bytes",
                            p.http_max_response_bytes.as_ref().map(|s| s.span()),
                        ),
                        (
                            "http_max_concurrent",
                            p.http_max_concurrent.as_ref().map(|s| s.span()),
                        ),
                        ("http_ca_file", p.http_ca_file.as_ref().map(|s| s.span())),
                    ];
                    if let Some((key, span)) = stray.into_iter().find(|(_, s)| s.is_some()) {
                        return Err(cx.err(
                            span,
                            f(key),
                            "has no effect without allowed_outbound_hosts (which grants no host yet)",
                        ));
                    }
                    None
                }
            };
            pipelines.push(PipelineSpec {
                name,
                topics: p.topics.get_ref().clone(),
                group: p.group.get_ref().clone(),
                component,
                config: p.config.clone(),
                batch_size,
                max_in_flight,
                delivery_cap,
                fault_policy,
                cpu_deadline: Duration::from_millis(cpu_ms),
                memory_limit: mem_mib << 20,
                instance_mode,
                recycle_after: cx.int(
                    &p.recycle_after,
                    &f("recycle_after"),
                    1..=1_000_000,
                    defaults::RECYCLE_AFTER,
                )?,
                concurrency: cx.int(
                    &p.concurrency,
                    &f("concurrency"),
                    1..=64,
                    defaults::CONCURRENCY,
                )?,
                dead_letter_topic,
                broker_dead_letter_topic,
                max_renewals: cx.int(
                    &p.max_renewals,
                    &f("max_renewals"),
                    0..=100,
                    defaults::MAX_RENEWALS,
                )?,
                auto_renew_after,
                wall_deadline: Duration::from_millis(wall_ms),
                max_retry_delay: Duration::from_millis(cx.int(
                    &p.max_retry_delay_ms,
                    &f("max_retry_delay_ms"),
                    0..=86_400_000,
                    defaults::MAX_RETRY_DELAY_MS,
                )?),
                outputs,
                max_emits_per_batch: cx.int(
                    &p.max_emits_per_batch,
                    &f("max_emits_per_batch"),
                    0..=1_000_000,
                    defaults::MAX_EMITS_PER_BATCH,
                )?,
                max_emit_bytes_per_batch: cx.int(
                    &p.max_emit_bytes_per_batch,
                    &f("max_emit_bytes_per_batch"),
                    0..=(1 << 32),
                    defaults::MAX_EMIT_BYTES_PER_BATCH,
                )?,
                secrets,
                http,
                trust: match &p.trust {
                    Some(t) => Some(trust::validate(&cx, t, &f("trust"))?),
                    None => trust.clone(),
                },
                shadow,
            });
        }
        Ok(Manifest {
            path: path.to_path_buf(),
            cluster,
            admin,
            runtime,
            trust,
            pipelines,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sharehost-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("tmp");
        std::fs::write(d.join("plugin.wasm"), b"not really").expect("write");
        d
    }

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(&dir().join("m.toml"), text)
    }

    const MINIMAL: &str = r#"
[cluster]
bootstrap = "127.0.0.1:9092"

[[pipeline]]
name = "orders"
topics = ["orders"]
group = "orders-g"
component = "plugin.wasm"
"#;

    #[test]
    fn outputs_secrets_http_and_deadlines_of_a_plugin_that_acts_are_parsed() {
        let text = format!(
            "{MINIMAL}wall_deadline_ms = 9000\nmax_retry_delay_ms = 1000\nallowed_outbound_hosts = [\"http://127.0.0.1:8088\"]\nhttp_max_concurrent = 4\n[pipeline.outputs]\nvalid = \"orders-valid\"\n[pipeline.secrets]\napi-token = {{ env = \"SHAREHOST_TEST_TOKEN_UNSET\" }}\n"
        );
        let m = parse(&text).expect("valid");
        let p = &m.pipelines[0];
        assert_eq!(p.wall_deadline, Duration::from_secs(9));
        assert_eq!(p.max_retry_delay, Duration::from_secs(1));
        assert_eq!(
            p.outputs.get("valid").map(String::as_str),
            Some("orders-valid")
        );
        let http = p.http.as_ref().expect("http granted");
        assert_eq!(http.allowed_outbound_hosts, ["http://127.0.0.1:8088"]);
        assert_eq!(http.max_concurrent, 4);
        assert_eq!(
            http.request_timeout,
            Duration::from_millis(defaults::HTTP_TIMEOUT_MS)
        );
        // The secret is read at load, and its error names it and its source, no value.
        let e = p.resolve_secrets().expect_err("variable unset");
        assert!(
            e.contains("secrets.api-token") && e.contains("SHAREHOST_TEST_TOKEN_UNSET"),
            "{e}"
        );
        // A minimal pipeline grants nothing: no outputs, no hosts, no secrets.
        let m = parse(MINIMAL).expect("valid");
        let p = &m.pipelines[0];
        assert!(p.outputs.is_empty() && p.http.is_none() && p.secrets.is_empty());
        assert_eq!(
            p.wall_deadline,
            p.cpu_deadline * 3,
            "three CPU budgets by default"
        );
    }

    #[test]
    fn a_plugin_that_acts_is_refused_bad_grants_naming_the_key() {
        for (extra, key, why) in [
            (
                "wall_deadline_ms = 10\n",
                "wall_deadline_ms",
                "at least cpu_deadline_ms",
            ),
            (
                "[pipeline.outputs]\nloop = \"orders\"\n",
                "outputs.loop",
                "would loop",
            ),
            (
                "[pipeline.outputs]\n\"bad name\" = \"t\"\n",
                "outputs.bad name",
                "letters, digits",
            ),
            (
                "[pipeline.secrets]\nt = { env = \"A\", file = \"b\" }\n",
                "secrets.t",
                "exactly one of",
            ),
            (
                "[pipeline.secrets]\nt = { }\n",
                "secrets.t",
                "exactly one of",
            ),
            (
                "http_timeout_ms = 100\n",
                "http_timeout_ms",
                "without allowed_outbound_hosts",
            ),
        ] {
            let e = parse(&format!("{MINIMAL}{extra}")).expect_err(extra);
            let text = e.to_string();
            assert!(text.contains(key) && text.contains(why), "{extra}: {text}");
        }
    }

    #[test]
    fn a_minimal_manifest_gets_the_documented_defaults() {
        let m = parse(MINIMAL).expect("valid");
        let p = &m.pipelines[0];
        assert_eq!(p.batch_size, defaults::BATCH_SIZE);
        assert_eq!(p.max_in_flight, defaults::MAX_IN_FLIGHT);
        assert_eq!(p.fault_policy, FaultPolicy::Release);
        assert_eq!(p.instance_mode, InstanceModeSpec::Reuse);
        assert_eq!(p.delivery_cap, None);
        assert_eq!(
            p.component,
            dir().join("plugin.wasm"),
            "relative to the manifest"
        );
        assert_eq!(m.admin.listen, "127.0.0.1:9464");
        assert_eq!(m.cluster.client_id, "sharehost");
    }

    #[test]
    fn unknown_fields_name_line_and_field() {
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nbatchsize = 10",
        );
        let e = parse(&text).expect_err("unknown field");
        assert_eq!(e.line, Some(9), "{e}");
        assert!(e.message.contains("unknown field `batchsize`"), "{e}");
    }

    #[test]
    fn bad_values_name_line_and_field() {
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nbatch_size = 0",
        );
        let e = parse(&text).expect_err("bad value");
        assert_eq!(
            e.to_string(),
            format!(
                "{}:9:14: pipeline[0].batch_size: must be between 1 and 10000 (got 0)",
                dir().join("m.toml").display()
            )
        );
    }

    #[test]
    fn a_component_path_that_is_not_a_regular_file_says_what_it_is() {
        let d = dir().join("a-directory.wasm");
        std::fs::create_dir_all(&d).expect("dir");
        let e =
            parse(&MINIMAL.replace("plugin.wasm", "a-directory.wasm")).expect_err("a directory");
        assert_eq!(e.field.as_deref(), Some("pipeline[0].component"));
        assert_eq!(e.message, format!("{}: is a directory", d.display()));
        let e = parse(&MINIMAL.replace("plugin.wasm", "/dev/zero")).expect_err("a device");
        assert_eq!(
            e.message,
            "/dev/zero: is a character device, not a regular file"
        );
        let e = parse(&MINIMAL.replace("plugin.wasm", "absent.wasm")).expect_err("absent");
        assert!(e.message.ends_with("absent.wasm does not exist"), "{e}");
    }

    #[test]
    fn the_component_size_limit_is_a_runtime_key() {
        let m = parse(MINIMAL).expect("valid");
        assert_eq!(m.runtime.max_component_bytes, 64 << 20);
        assert_eq!(m.runtime_config().max_component_bytes, 64 << 20);
        let text = format!("[runtime]\nmax_component_mib = 2\n{MINIMAL}");
        let m = parse(&text).expect("valid");
        assert_eq!(m.runtime_config().max_component_bytes, 2 << 20);
        // A component file over the maximum is refused by the manifest check, naming the key.
        let big = dir().join("big.wasm");
        std::fs::File::create(&big)
            .expect("create")
            .set_len(3 << 20)
            .expect("grow");
        let e = parse(&text.replace("plugin.wasm", "big.wasm")).expect_err("too big");
        assert!(
            e.message
                .contains("is 3 MiB, more than the 2 MiB maximum (runtime.max_component_mib"),
            "{e}"
        );
        let e = parse(&format!("[runtime]\nmax_component_mib = 0\n{MINIMAL}")).expect_err("0");
        assert_eq!(e.field.as_deref(), Some("runtime.max_component_mib"));
    }

    /// Two minisign public keys (their secret halves were never kept) and their ids.
    const ALICE: &str = "RWRHs4BcChVSimkp37yexDX7kT2h9Qc3la9J7aDfSJlRObr3f7mo+D3W";
    const ALICE_ID: &str = "8A52150A5C80B347";
    const BOB: &str = "RWQBAgMEBQYHCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    const BOB_ID: &str = "0807060504030201";

    #[test]
    fn trusted_keys_come_from_the_host_or_replace_it_per_pipeline() {
        // No [trust]: no signature needed.
        let m = parse(MINIMAL).expect("valid");
        assert!(m.trust.is_none() && m.pipelines[0].trust.is_none());
        // The host's keys apply to every pipeline without its own.
        let text = format!("[trust]\nkeys = [\"{ALICE}\"]\n{MINIMAL}");
        let m = parse(&text).expect("valid");
        let ids = |p: &PipelineSpec| p.trust.as_ref().map(|t| t.key_ids().join(","));
        assert_eq!(ids(&m.pipelines[0]).as_deref(), Some(ALICE_ID));
        // A pipeline's own list replaces the host's; a keys file adds to the inline keys.
        let keys = dir().join("trusted.pub");
        std::fs::write(
            &keys,
            format!("untrusted comment: minisign public key {BOB_ID}\n{BOB}\n"),
        )
        .expect("write");
        let own = format!("{text}[pipeline.trust]\nkeys_file = \"trusted.pub\"\n");
        let m = parse(&own).expect("valid");
        assert_eq!(ids(&m.pipelines[0]).as_deref(), Some(BOB_ID));
        assert_eq!(
            m.trust.as_ref().map(|t| t.key_ids().join(",")).as_deref(),
            Some(ALICE_ID)
        );
        let both = own.replace(
            "keys_file = ",
            &format!("keys = [\"{ALICE}\"]\nkeys_file = "),
        );
        let m = parse(&both).expect("valid");
        assert_eq!(
            ids(&m.pipelines[0]).as_deref(),
            Some(format!("{ALICE_ID},{BOB_ID}").as_str())
        );
    }

    #[test]
    fn a_bad_trusted_key_or_an_empty_trust_table_is_refused_naming_the_field() {
        std::fs::write(dir().join("not-keys.pub"), "not a key\n").expect("write");
        for (text, field, why) in [
            (
                format!("[trust]\nkeys = [\"{ALICE}\", \"RWQnope\"]\n{MINIMAL}"),
                "trust.keys[1]",
                "is not base64",
            ),
            (
                format!("{MINIMAL}[pipeline.trust]\nkeys = [\"aGVsbG8=\"]\n"),
                "pipeline[0].trust.keys[0]",
                "not a minisign public key",
            ),
            (
                format!("[trust]\nkeys = [\"{ALICE}\"]\n{MINIMAL}[pipeline.trust]\nkeys = []\n"),
                "pipeline[0].trust",
                "cannot opt out",
            ),
            (
                format!("[trust]\nkeys_file = \"absent.pub\"\n{MINIMAL}"),
                "trust.keys_file",
                "cannot read",
            ),
            (
                format!("[trust]\nkeys_file = \"not-keys.pub\"\n{MINIMAL}"),
                "trust.keys_file",
                "line 1: ",
            ),
        ] {
            let e = parse(&text).expect_err(field);
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
            assert!(e.message.contains(why), "{e}");
            assert!(e.line.is_some(), "{e}");
        }
        let e = parse(&format!("[trust]\nkey = [\"{ALICE}\"]\n{MINIMAL}")).expect_err("typo");
        assert!(e.message.contains("unknown field `key`"), "{e}");
    }

    #[test]
    fn sasl_secrets_come_from_the_environment_or_a_file() {
        let text = MINIMAL.replace(
            "bootstrap = \"127.0.0.1:9092\"",
            "bootstrap = \"127.0.0.1:9092\"\nsasl = { mechanism = \"SCRAM-SHA-512\", username = \"u\", password_env = \"SHAREHOST_TEST_PW_UNSET\" }",
        );
        let m = parse(&text).expect("valid");
        let e = m.cluster.sasl_settings().expect_err("unset");
        assert!(e.contains("SHAREHOST_TEST_PW_UNSET"), "{e}");
        let both = text.replace("password_env", "password_file = \"x\", password_env");
        assert!(
            parse(&both)
                .expect_err("both")
                .message
                .contains("exactly one")
        );
    }
}
