//! `[[pipeline]]`: one pipeline ([`PipelineSpec`]: topics, share group, plugin and policy),
//! and its validator. Each pipeline's table is checked on its own, then against the pipelines
//! before it (a name and a share group belong to one pipeline). Its grants are checked in
//! [`super::grants`], its own trusted keys in [`super::trust`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::context::{Ctx, valid_name};
use super::defaults;
use super::error::ManifestError;
use super::grants;
use super::raw::RawPipeline;
use super::secret::SecretSource;
use super::trust;
use crate::runtime::{
    HttpSettings, LoadError, OutputGrant, Secrets, TrustPolicy, check_component_path,
};

/// What happens to a batch whose plugin faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPolicy {
    /// Give the records back for redelivery (the delivery cap catches a record that always
    /// faults).
    Release,
    /// Reject them (and dead-letter them when a dead-letter topic is set).
    Reject,
}

/// What a pipeline promises about its records' effects (`guarantee`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    /// Every record is judged at least once; after a lost acknowledgement (a cut connection,
    /// a restarted broker or host) it may be judged again and its outputs written again.
    AtLeastOnce,
    /// Each record's outputs and dead letter are written once: in one Kafka transaction with
    /// the record of what the batch settles, committed before the acknowledgement, and a
    /// record delivered again is looked up there before it is judged.
    ExactlyOnce,
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
    /// At-least-once (the default) or exactly-once effects (`guarantee`).
    pub guarantee: Guarantee,
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
    /// Schema-encoded records (`[pipeline.schema]`): decoded for the plugin, emits encoded.
    pub schema: Option<super::schema::SchemaSpec>,
    /// A candidate to shadow from the start (`shadow`, resolved against the manifest's
    /// folder) and the fraction of batches it sees (`shadow_sample`, default 1).
    pub shadow: Option<ShadowSpec>,
    /// Where the share group starts on partitions it has not read yet (`start`); `None`
    /// leaves the group's own setting (the broker's default: latest).
    pub start: Option<StartPosition>,
}

/// Where a share group starts on a partition it has never read: set as the group's
/// `share.auto.offset.reset` before the pipeline joins. It applies when the broker first
/// initialises a partition's share state; a group that has read a partition keeps its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartPosition {
    /// From the oldest record the topic keeps.
    Earliest,
    /// From records produced after the group first reads the partition.
    Latest,
    /// From the first record at most this long ago (an ISO-8601 duration, `PT1H`).
    ByDuration(String),
}

impl StartPosition {
    /// The value of the group config `share.auto.offset.reset`.
    pub fn config_value(&self) -> String {
        match self {
            StartPosition::Earliest => "earliest".into(),
            StartPosition::Latest => "latest".into(),
            StartPosition::ByDuration(d) => format!("by_duration:{d}"),
        }
    }
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
    /// What this pipeline would let the broker archive with no copy kept, one sentence each
    /// naming the key that keeps it: `check` prints them and `run` logs them at start. Records
    /// the plugin rejects, and records released at their last delivery (by the plugin's
    /// `release` or `retry`, or a fault under `fault_policy = "release"`), are archived by the
    /// broker; a
    /// `dead_letter_topic` keeps the rejected ones, a `delivery_cap` under the group's limit
    /// dead-letters the others before their last delivery, and a broker-side dead-letter
    /// topic keeps everything the broker archives. Empty when nothing can be lost so.
    pub fn loss_warnings(&self) -> Vec<String> {
        if self.broker_dead_letter_topic.is_some() {
            return Vec::new();
        }
        let name = &self.name;
        if self.dead_letter_topic.is_none() {
            return vec![format!(
                "pipeline {name}: no `dead_letter_topic`: records the plugin rejects, and \
                 records released at the group's delivery limit (e.g. a record that faults at \
                 every delivery), are archived by the broker with no copy kept; set \
                 `dead_letter_topic` and a `delivery_cap` under the group's limit \
                 (`share.delivery.count.limit`, 5 by default) to keep them"
            )];
        }
        if self.delivery_cap.is_none() {
            return vec![format!(
                "pipeline {name}: `dead_letter_topic` without `delivery_cap`: a record released \
                 at every delivery (the plugin's `release` or `retry`, or a fault under \
                 `fault_policy = \"release\"`) is archived by the broker at the group's \
                 delivery limit without a dead letter; set `delivery_cap` under the group's \
                 limit (`share.delivery.count.limit`, 5 by default: e.g. 4)"
            )];
        }
        Vec::new()
    }

    /// What this pipeline grants its plugin that `before` (the same pipeline as the host
    /// ran it; `None` for a pipeline new to the host) did not: outputs added or pointed at
    /// another topic, outbound hosts added, secrets added or read from elsewhere, signatures
    /// no longer required. Each entry names the grant; empty when nothing widened. A live
    /// re-read logs these at WARN, since a manifest edit is how a plugin gets more reach.
    pub fn grants_widened_from(&self, before: Option<&PipelineSpec>) -> Vec<String> {
        super::grants::widened(before, self)
    }

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

/// What the pipelines checked so far have taken: their names, and their share groups with the
/// pipeline that consumes each.
#[derive(Default)]
struct Taken {
    names: HashSet<String>,
    groups: HashMap<String, String>,
}

/// Validates every `[[pipeline]]`, in file order; the first error ends the check. A pipeline
/// without a `[pipeline.trust]` of its own gets `host_trust`.
pub(super) fn validate_all(
    cx: &Ctx<'_>,
    raw: &[RawPipeline],
    max_component_bytes: u64,
    host_trust: Option<&Arc<TrustPolicy>>,
) -> Result<Vec<PipelineSpec>, ManifestError> {
    if raw.is_empty() {
        return Err(cx.err(None, "pipeline", "the manifest defines no [[pipeline]]"));
    }
    let mut taken = Taken::default();
    raw.iter()
        .enumerate()
        .map(|(i, p)| {
            let field = format!("pipeline[{i}]");
            validate(cx, &field, p, &mut taken, max_component_bytes, host_trust)
        })
        .collect()
}

/// Validates one pipeline (`field` is `pipeline[i]`). The checks run in a fixed order, which
/// is the one a manifest with several errors reports the first of; keep it when adding keys.
fn validate(
    cx: &Ctx<'_>,
    field: &str,
    p: &RawPipeline,
    taken: &mut Taken,
    max_component_bytes: u64,
    host_trust: Option<&Arc<TrustPolicy>>,
) -> Result<PipelineSpec, ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
    let name = identity(cx, p, field, taken)?;
    let component = component(cx, p, field, max_component_bytes)?;
    let (batch_size, max_in_flight) = batching(cx, p, field)?;
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
    let guarantee = cx.choice(
        &p.guarantee,
        &f("guarantee"),
        &[
            ("at-least-once", Guarantee::AtLeastOnce),
            ("exactly-once", Guarantee::ExactlyOnce),
        ],
        Guarantee::AtLeastOnce,
    )?;
    if guarantee == Guarantee::ExactlyOnce
        && crate::pipeline::settled_topic(p.group.get_ref()).is_none()
    {
        return Err(cx.err(
            Some(p.group.span()),
            f("group"),
            format!(
                "{:?} cannot name its settled log's topic (sharehost-settled.<group>), which guarantee = \"exactly-once\" needs: use letters, digits, '.', '_' and '-' only, at most 231 of them",
                p.group.get_ref()
            ),
        ));
    }
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
    let (dead_letter_topic, broker_dead_letter_topic) = dead_letter_topics(cx, p, field)?;
    let auto_renew_after = auto_renew_after(cx, p, field)?;
    let shadow = shadow(cx, p, field, max_component_bytes)?;
    let start = start_position(cx, p, field)?;
    let wall_ms = wall_deadline_ms(cx, p, field, cpu_ms)?;
    let outputs = grants::outputs(cx, p, field)?;
    let schema = super::schema::schema(cx, p, field, &outputs)?;
    let secrets = grants::secrets(cx, p, field)?;
    let http = grants::http(cx, p, field)?;
    let recycle_after = cx.int(
        &p.recycle_after,
        &f("recycle_after"),
        1..=1_000_000,
        defaults::RECYCLE_AFTER,
    )?;
    let concurrency = cx.int(
        &p.concurrency,
        &f("concurrency"),
        1..=64,
        defaults::CONCURRENCY,
    )?;
    let max_renewals = cx.int(
        &p.max_renewals,
        &f("max_renewals"),
        0..=100,
        defaults::MAX_RENEWALS,
    )?;
    let max_retry_delay_ms = cx.int(
        &p.max_retry_delay_ms,
        &f("max_retry_delay_ms"),
        0..=86_400_000,
        defaults::MAX_RETRY_DELAY_MS,
    )?;
    let (max_emits_per_batch, max_emit_bytes_per_batch) = grants::emit_limits(cx, p, field)?;
    let trust = match &p.trust {
        Some(t) => Some(trust::validate(cx, t, &f("trust"))?),
        None => host_trust.cloned(),
    };
    Ok(PipelineSpec {
        name,
        topics: p.topics.get_ref().clone(),
        group: p.group.get_ref().clone(),
        component,
        config: p.config.clone(),
        batch_size,
        max_in_flight,
        delivery_cap,
        fault_policy,
        guarantee,
        cpu_deadline: Duration::from_millis(cpu_ms),
        memory_limit: mem_mib << 20,
        instance_mode,
        recycle_after,
        concurrency,
        dead_letter_topic,
        broker_dead_letter_topic,
        start,
        max_renewals,
        auto_renew_after,
        wall_deadline: Duration::from_millis(wall_ms),
        max_retry_delay: Duration::from_millis(max_retry_delay_ms),
        outputs,
        max_emits_per_batch,
        max_emit_bytes_per_batch,
        secrets,
        http,
        trust,
        schema,
        shadow,
    })
}

/// The name, topics and share group: a valid name no other pipeline has, at least one topic,
/// and a group no other pipeline consumes. Returns the name.
fn identity(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
    taken: &mut Taken,
) -> Result<String, ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
    let name = p.name.get_ref().clone();
    if !valid_name(&name) {
        return Err(cx.err(
            Some(p.name.span()),
            f("name"),
            format!("{name:?} must be 1-64 letters, digits, '-' or '_'"),
        ));
    }
    if !taken.names.insert(name.clone()) {
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
    // One share group per pipeline: two pipelines in one group would split its records
    // between two plugins, each judging the other's share as if it were its own.
    if let Some(other) = taken.groups.insert(p.group.get_ref().clone(), name.clone()) {
        return Err(cx.err(
            Some(p.group.span()),
            f("group"),
            format!(
                "pipeline {other:?} already consumes share group {:?}: two pipelines in one group split its records between their plugins; give each its own group",
                p.group.get_ref()
            ),
        ));
    }
    Ok(name)
}

/// The component file, resolved against the manifest's folder.
fn component(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
    max_component_bytes: u64,
) -> Result<PathBuf, ManifestError> {
    let component = cx.path(&p.component);
    // The runtime's own reader decides (regular file, size), so `check` and a load refuse the
    // same paths with the same words; the file is not read here.
    if let Err(e) = check_component_path(&component, max_component_bytes) {
        let message = match e {
            LoadError::Read { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                format!("component file {} does not exist", component.display())
            }
            other => other.to_string(),
        };
        return Err(cx.err(
            Some(p.component.span()),
            format!("{field}.component"),
            message,
        ));
    }
    Ok(component)
}

/// `batch_size` and `max_in_flight`, which holds at least one batch.
fn batching(cx: &Ctx<'_>, p: &RawPipeline, field: &str) -> Result<(usize, usize), ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
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
    Ok((batch_size, max_in_flight))
}

/// `auto_renew_after`: the fraction of the lock duration after which a running batch is
/// renewed, in [0.05, 0.95].
fn auto_renew_after(cx: &Ctx<'_>, p: &RawPipeline, field: &str) -> Result<f64, ManifestError> {
    match &p.auto_renew_after {
        None => Ok(defaults::AUTO_RENEW_AFTER),
        Some(v) if (0.05..=0.95).contains(v.get_ref()) => Ok(*v.get_ref()),
        Some(v) => Err(cx.err(
            Some(v.span()),
            format!("{field}.auto_renew_after"),
            format!("must be between 0.05 and 0.95 (got {})", v.get_ref()),
        )),
    }
}

/// `wall_deadline_ms`: at least the CPU deadline (`cpu_ms`), by default a few of it.
fn wall_deadline_ms(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
    cpu_ms: u64,
) -> Result<u64, ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
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
    Ok(wall_ms)
}

/// `start`: `"earliest"`, `"latest"` or `{ by_duration = "PT1H" }`.
fn start_position(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
) -> Result<Option<StartPosition>, ManifestError> {
    let Some(v) = &p.start else {
        return Ok(None);
    };
    let bad = |why: String| {
        cx.err(
            Some(v.span()),
            format!("{field}.start"),
            format!("{why}; expected \"earliest\", \"latest\" or {{ by_duration = \"PT1H\" }}"),
        )
    };
    match v.get_ref() {
        toml::Value::String(s) if s == "earliest" => Ok(Some(StartPosition::Earliest)),
        toml::Value::String(s) if s == "latest" => Ok(Some(StartPosition::Latest)),
        toml::Value::String(s) => Err(bad(format!("{s:?} is not a start position"))),
        toml::Value::Table(t) => {
            let d = match (t.len(), t.get("by_duration")) {
                (1, Some(toml::Value::String(d))) => d,
                _ => {
                    let keys: Vec<&str> = t.keys().map(String::as_str).collect();
                    return Err(bad(format!("a table with {keys:?}")));
                }
            };
            if !iso_duration(d) {
                return Err(bad(format!(
                    "by_duration {d:?} is not an ISO-8601 duration of days, hours, minutes and seconds (PnDTnHnMnS, e.g. PT1H, P2D, PT90M)"
                )));
            }
            Ok(Some(StartPosition::ByDuration(d.clone())))
        }
        other => Err(bad(format!(
            "a value of type {} is not a start position",
            other.type_str()
        ))),
    }
}

/// Whether `s` is a duration the broker takes for `by_duration`: Java's `Duration.parse`
/// grammar without signs or fractions, `PnDTnHnMnS` with at least one part. Checked here so a
/// typo is the manifest's error, not a refused config at the first join; a dozen lines, where
/// a date-time crate would also take years and months, which the broker refuses.
fn iso_duration(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('P') else {
        return false;
    };
    let (days, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return false,
        None => (rest, None),
    };
    let parts = |text: &str, units: &[char]| -> Option<usize> {
        let (mut n, mut unit, mut digits) = (0, 0, 0);
        for c in text.chars() {
            if c.is_ascii_digit() {
                digits += 1;
                continue;
            }
            let at = units.iter().position(|u| *u == c)?;
            if digits == 0 || at < unit {
                return None;
            }
            (unit, digits, n) = (at + 1, 0, n + 1);
        }
        (digits == 0).then_some(n)
    };
    let Some(d) = parts(days, &['D']) else {
        return false;
    };
    let t = match time {
        Some(t) => match parts(t, &['H', 'M', 'S']) {
            Some(n) => n,
            None => return false,
        },
        None => 0,
    };
    d + t > 0
}

/// `dead_letter_topic` (the host's) and `broker_dead_letter_topic` (the group's, KIP-1191):
/// each, when set, differs from the pipeline's own topics, and from each other.
fn dead_letter_topics(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
) -> Result<(Option<String>, Option<String>), ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
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
    Ok((dead_letter_topic, broker_dead_letter_topic))
}

/// `shadow` (a candidate component, checked like `component`) and `shadow_sample`, which
/// means nothing without it.
fn shadow(
    cx: &Ctx<'_>,
    p: &RawPipeline,
    field: &str,
    max_component_bytes: u64,
) -> Result<Option<ShadowSpec>, ManifestError> {
    let f = |name: &str| format!("{field}.{name}");
    let path = match (&p.shadow, &p.shadow_sample) {
        (None, None) => return Ok(None),
        (None, Some(v)) => {
            return Err(cx.err(
                Some(v.span()),
                f("shadow_sample"),
                "has no effect without shadow (the candidate component)",
            ));
        }
        (Some(path), _) => path,
    };
    let resolved = cx.path(path);
    if let Err(e) = check_component_path(&resolved, max_component_bytes) {
        return Err(cx.err(Some(path.span()), f("shadow"), e.to_string()));
    }
    let sample = match &p.shadow_sample {
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
    Ok(Some(ShadowSpec {
        path: resolved,
        sample,
    }))
}

#[cfg(test)]
mod tests {
    use super::{FaultPolicy, InstanceModeSpec, StartPosition};
    use crate::manifest::defaults;
    use crate::manifest::testing::{MINIMAL, dir, parse};

    #[test]
    fn check_warns_of_what_the_broker_would_archive_with_no_copy_naming_the_key() {
        let with = |extra: &str| {
            let m = parse(&format!("{MINIMAL}{extra}\n")).expect("valid");
            m.pipelines[0].loss_warnings()
        };
        let none = with("");
        assert_eq!(none.len(), 1);
        assert!(
            none[0].contains("pipeline orders: no `dead_letter_topic`")
                && none[0].contains("`delivery_cap`"),
            "{none:?}"
        );
        let uncapped = with("dead_letter_topic = \"orders-dlq\"");
        assert_eq!(uncapped.len(), 1);
        assert!(
            uncapped[0].contains("without `delivery_cap`"),
            "{uncapped:?}"
        );
        // Rejecting faults leaves the plugin's own releases and retries to the limit.
        assert_eq!(
            with("dead_letter_topic = \"orders-dlq\"\nfault_policy = \"reject\"").len(),
            1
        );
        // Kept: capped under the limit, or the broker's own dead-letter topic keeps what it
        // archives.
        assert!(with("dead_letter_topic = \"orders-dlq\"\ndelivery_cap = 4").is_empty());
        assert!(with("broker_dead_letter_topic = \"dlq.orders\"").is_empty());
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
    fn a_start_position_is_earliest_latest_or_a_duration_and_anything_else_is_named() {
        let with = |start: &str| parse(&format!("{MINIMAL}start = {start}\n"));
        assert_eq!(parse(MINIMAL).expect("valid").pipelines[0].start, None);
        for (written, want) in [
            (r#""earliest""#, StartPosition::Earliest),
            (r#""latest""#, StartPosition::Latest),
            (
                r#"{ by_duration = "PT1H" }"#,
                StartPosition::ByDuration("PT1H".into()),
            ),
            (
                r#"{ by_duration = "P2DT3H30M15S" }"#,
                StartPosition::ByDuration("P2DT3H30M15S".into()),
            ),
        ] {
            let m = with(written).expect(written);
            assert_eq!(m.pipelines[0].start.as_ref(), Some(&want), "{written}");
        }
        assert_eq!(
            StartPosition::ByDuration("PT1H".into()).config_value(),
            "by_duration:PT1H"
        );
        for (written, says) in [
            (r#""oldest""#, r#""oldest" is not a start position"#),
            ("3", "a value of type integer is not a start position"),
            (r#"{ by_time = "PT1H" }"#, r#"a table with ["by_time"]"#),
            (r#"{ by_duration = "1h" }"#, "is not an ISO-8601 duration"),
            (r#"{ by_duration = "PT" }"#, "is not an ISO-8601 duration"),
            (r#"{ by_duration = "P" }"#, "is not an ISO-8601 duration"),
            (r#"{ by_duration = "P1Y" }"#, "is not an ISO-8601 duration"),
            (
                r#"{ by_duration = "PT1M1H" }"#,
                "is not an ISO-8601 duration",
            ),
            (
                r#"{ by_duration = "PT-1H" }"#,
                "is not an ISO-8601 duration",
            ),
        ] {
            let e = with(written).expect_err(written);
            assert_eq!(e.field.as_deref(), Some("pipeline[0].start"), "{written}");
            assert!(e.message.contains(says), "{written}: {e}");
            assert!(e.message.contains("by_duration = \"PT1H\""), "{e}");
        }
    }
}
