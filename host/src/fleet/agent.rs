//! A host's part in the fleet. Before its first batch it reads the deployments topic to its
//! end and brings each of its pipelines to what the fleet wants; then it follows the topic,
//! publishes its status every interval, reads everyone's, and decides the fleet's canaries on
//! the sum of every host's tallies. A decision is one record in the deployments topic's order
//! and every host applies the first one for a canary, so no host leads and a host that dies
//! mid-decision changes nothing.
//!
//! What arrives through Kafka never widens what a pipeline may reach: an action names only a
//! component (checked against its digest, its signature verified with the pipeline's own keys
//! before anything compiles it) and how it is rolled out; grants stay in each host's manifest.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use crate::kafka::now_ms;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::components;
use super::desired::{Desired, FleetState};
use super::hosts::Hosts;
use super::records::{
    Action, CanaryReport, ComponentRef, Decision, DeploymentRecord, HostStatus, PipelineReport,
    RecordError, decision_key, decode_deployment, decode_status,
};
use super::sign;
use super::topics::{self, TopicError, Topics};
use crate::kafka::{
    Compression, ConsumedRecord, KafkaClient, KafkaError, OffsetSpec, ProduceRecord,
};
use crate::manifest::FleetSpec;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::rollout::{CanaryDecision, CanaryRequest, ShadowRequest, decide};
use crate::tenants::Tenants;
pub use sharehost_api::fleet::{FleetView, HostView};

/// How long one read of the deployments topic waits for a new record (the broker answers at
/// once when there is one).
const FOLLOW_WAIT: Duration = Duration::from_millis(500);

/// Why a host cannot take part in its fleet at start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The fleet's topics cannot be made or used.
    #[error(transparent)]
    Topics(#[from] TopicError),
    /// The cluster failed while the host read the fleet's state.
    #[error("fleet {fleet}: reading {topic}: {error}")]
    Read {
        /// The fleet.
        fleet: String,
        /// The topic.
        topic: String,
        /// What the cluster said.
        error: KafkaError,
    },
}

/// What this host last did with the fleet's wishes for one pipeline.
#[derive(Debug, Clone, Default)]
struct Applied {
    /// The fleet action the pipeline is at (0: none).
    seq: u64,
    /// What the fleet wanted when it was last brought to it (or tried): a pipeline is brought
    /// to the fleet's state again only when that changes (an action, a canary's decision), so
    /// a swap an operator makes on this host alone lasts until the fleet's next change.
    desired: Option<Desired>,
    /// The pipeline object it was applied to (by address): a pipeline loaded again (restarted
    /// by a manifest re-read, or after a failure) starts from its manifest and is brought to
    /// the fleet's state again.
    instance: usize,
    /// Why the fleet's latest wish could not be applied here: the action's number and the
    /// reason (the pipeline keeps its current version meanwhile).
    refused: Option<(u64, String)>,
    /// When a refused wish is tried again (doubling from the status interval to a minute).
    retry_at: Option<Instant>,
    /// The delay before the next try after this one fails.
    retry_delay: Duration,
}

/// The longest wait between two tries of a fleet action a host could not apply.
const MAX_RETRY: Duration = Duration::from_secs(60);

struct Inner {
    state: FleetState,
    deployments_at: i64,
    status_at: i64,
    /// Every host's latest status, this one's included (bounded, aged, clashes flagged).
    hosts: Hosts,
    applied: HashMap<String, Applied>,
    /// Canaries this host has written a decision for.
    decided: HashSet<(String, u64)>,
    /// Pipelines whose shadow the fleet started (a shadow an operator started on this host
    /// alone is not the fleet's to stop).
    fleet_shadows: HashSet<String>,
    /// Kinds of bad records already logged (each is logged once, then only counted).
    logged: HashSet<String>,
    /// Records judged per pipeline at the last status, for the rate.
    judged: HashMap<String, (u64, Instant)>,
    /// Actions refused before they could be read (unsigned, tampered, foreign key): the last.
    last_refused: Option<String>,
}

impl Inner {
    fn new(spec: &FleetSpec, host: &str) -> Inner {
        Inner {
            state: FleetState::default(),
            deployments_at: 0,
            status_at: 0,
            hosts: Hosts::of_host(host, spec.max_hosts, spec.stale_after_ms),
            applied: HashMap::new(),
            decided: HashSet::new(),
            fleet_shadows: HashSet::new(),
            logged: HashSet::new(),
            judged: HashMap::new(),
            last_refused: None,
        }
    }
}

/// What one deployments record did to the fleet's state.
pub(super) enum Folded {
    /// A verified action, applied.
    Applied {
        /// The action.
        action: Box<Action>,
        /// The key id that signed it.
        signer: String,
    },
    /// A verified action the state refused (not newer, does not apply): why.
    Refused(String),
    /// The first decision of a canary.
    Decided(Decision),
    /// A decision for a canary decided already.
    Late,
    /// A record that is not one, or cannot be trusted: its kind and why.
    Skipped {
        /// A short name for the metric.
        kind: &'static str,
        /// The whole reason.
        why: String,
    },
}

/// Folds one record of the deployments topic into `state`: an action only when signed by a
/// key of `spec.trust` and for this fleet. The agent and `sharehost fleet` both read the topic
/// with it, so they agree on the state.
pub(super) fn fold_record(state: &mut FleetState, spec: &FleetSpec, r: &ConsumedRecord) -> Folded {
    let signed = match decode_deployment(r.key.as_deref(), r.value.as_deref()) {
        Err(e) => {
            return Folded::Skipped {
                kind: e.kind(),
                why: e.to_string(),
            };
        }
        Ok(DeploymentRecord::Decision(d)) => {
            return match state.apply_decision(&d) {
                Ok(()) => Folded::Decided(d),
                Err(_) => Folded::Late,
            };
        }
        Ok(DeploymentRecord::Action(signed)) => signed,
    };
    match sign::verify(&signed, &spec.trust) {
        Err(why) => Folded::Skipped {
            kind: "unverified",
            why: format!("action at offset {} refused: {why}", r.offset),
        },
        Ok((action, _)) if action.fleet != spec.name => Folded::Skipped {
            kind: "other_fleet",
            why: format!(
                "action at offset {} is for fleet {:?}, not {:?}",
                r.offset, action.fleet, spec.name
            ),
        },
        Ok((action, signer)) => match state.take_action(&action) {
            Ok(()) => Folded::Applied {
                action: Box::new(action),
                signer,
            },
            Err(refused) => Folded::Refused(format!(
                "action {} ({}) of pipeline {} refused: {refused}",
                action.seq,
                action.change.name(),
                action.pipeline
            )),
        },
    }
}

/// A host of a fleet.
pub struct Fleet {
    spec: FleetSpec,
    host: String,
    instance: String,
    started_ms: u64,
    topics: Topics,
    client: Arc<KafkaClient>,
    dir: PathBuf,
    metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    reconciling: tokio::sync::Mutex<()>,
}

/// This host's id in the fleet: `fleet.host_id`, else the machine's host name (a pod's name
/// in Kubernetes), else one made up from the process id.
pub fn host_id(spec: &FleetSpec) -> String {
    if let Some(h) = &spec.host_id {
        return h.clone();
    }
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("host-{}", std::process::id()))
}

/// Builds the fleet's view from its state and every host's latest status.
pub fn view(
    spec: &FleetSpec,
    host: &str,
    state: &FleetState,
    hosts: &Hosts,
    last_refused: Option<String>,
) -> FleetView {
    let now = now_ms();
    FleetView {
        fleet: spec.name.clone(),
        host: host.to_owned(),
        pipelines: state.pipelines.clone(),
        hosts: hosts
            .iter()
            .map(|(_, e)| {
                let age_ms = now.saturating_sub(e.status.at_ms);
                HostView {
                    status: e.status.clone(),
                    age_ms,
                    stale: age_ms > spec.stale_after_ms,
                    conflict: hosts.live_conflict(e, now),
                }
            })
            .collect(),
        last_refused,
    }
}

impl Fleet {
    /// Joins the fleet: makes or checks its topics and reads the deployments topic to its end,
    /// so [`Fleet::reconcile`] brings a pipeline to the fleet's state before its first batch.
    pub async fn start(
        spec: FleetSpec,
        client: Arc<KafkaClient>,
        metrics: Arc<Metrics>,
        state_dir: &std::path::Path,
    ) -> Result<Arc<Fleet>, FleetError> {
        let topics = topics::ensure(&client, &spec).await?;
        let host = host_id(&spec);
        let inner = Mutex::new(Inner::new(&spec, &host));
        let fleet = Arc::new(Fleet {
            dir: state_dir.join("fleet").join(&spec.name),
            host,
            instance: uuid::Uuid::new_v4().to_string(),
            started_ms: now_ms(),
            topics,
            client,
            metrics,
            inner,
            reconciling: tokio::sync::Mutex::new(()),
            spec,
        });
        let read = |topic: &str, error| FleetError::Read {
            fleet: fleet.spec.name.clone(),
            topic: topic.to_owned(),
            error,
        };
        let (deployments, status) = (&fleet.topics.deployments, &fleet.topics.status);
        let first = fleet
            .client
            .list_offset(deployments, 0, OffsetSpec::Earliest)
            .await
            .map_err(|e| read(deployments, e))?;
        let end = fleet
            .client
            .list_offset(deployments, 0, OffsetSpec::Latest)
            .await
            .map_err(|e| read(deployments, e))?;
        let status_first = fleet
            .client
            .list_offset(status, 0, OffsetSpec::Earliest)
            .await
            .map_err(|e| read(status, e))?;
        {
            let mut inner = fleet.inner.lock();
            inner.deployments_at = first;
            inner.status_at = status_first;
        }
        while fleet.inner.lock().deployments_at < end {
            if !fleet
                .read_deployments(Duration::ZERO)
                .await
                .map_err(|e| read(deployments, e))?
            {
                break;
            }
        }
        fleet.read_statuses().await.map_err(|e| read(status, e))?;
        let inner = fleet.inner.lock();
        tracing::info!(
            fleet = %fleet.spec.name,
            host = %fleet.host,
            records = end - first,
            pipelines = inner.state.pipelines.len(),
            hosts = inner.hosts.len(),
            "fleet state read to its end"
        );
        drop(inner);
        Ok(fleet)
    }

    /// This host's id in the fleet.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The fleet's topics.
    pub fn topics(&self) -> &Topics {
        &self.topics
    }

    /// The fleet as this host sees it (`GET /fleet`).
    pub fn view(&self) -> FleetView {
        let inner = self.inner.lock();
        view(
            &self.spec,
            &self.host,
            &inner.state,
            &inner.hosts,
            inner.last_refused.clone(),
        )
    }

    /// Reads what the deployments topic has past the last record read, waiting up to `wait`
    /// for one; `true` when there were records.
    async fn read_deployments(&self, wait: Duration) -> Result<bool, KafkaError> {
        let at = self.inner.lock().deployments_at;
        let got = self
            .client
            .fetch(&self.topics.deployments, 0, at, wait)
            .await?;
        let mut inner = self.inner.lock();
        let mut any = false;
        for r in got.records {
            if r.offset < inner.deployments_at {
                continue;
            }
            inner.deployments_at = r.offset + 1;
            self.fold(&mut inner, r);
            any = true;
        }
        Ok(any)
    }

    /// Folds one deployments record into the state; a record that cannot be trusted or read
    /// is logged (once per kind), counted and skipped.
    fn fold(&self, inner: &mut Inner, r: ConsumedRecord) {
        let topic = self.topics.deployments.clone();
        // A record that panics its reader is skipped like any bad record: the agent reads on.
        let folded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fold_record(&mut inner.state, &self.spec, &r)
        }))
        .unwrap_or_else(|p| Folded::Skipped {
            kind: "panicked",
            why: format!("reading it panicked: {}", panic_message(p.as_ref())),
        });
        match folded {
            Folded::Skipped { kind, why } => {
                if matches!(kind, "unverified" | "other_fleet") {
                    inner.last_refused = Some(why.clone());
                }
                self.skip(inner, &topic, r.offset, kind, &why);
            }
            Folded::Applied { action, signer } => {
                self.count_action("applied");
                tracing::info!(fleet = %self.spec.name, pipeline = %action.pipeline, seq = action.seq, change = action.change.name(), signer, "fleet action");
            }
            Folded::Refused(text) => {
                self.count_action("refused");
                tracing::warn!(fleet = %self.spec.name, "{text}");
                inner.last_refused = Some(text);
            }
            Folded::Decided(d) => {
                tracing::info!(fleet = %self.spec.name, pipeline = %d.pipeline, seq = d.seq, promote = d.promote, host = %d.host, reason = %d.reason, "fleet canary decided");
            }
            // A later decision for a decided canary is the normal race between hosts: the
            // first one in the topic's order stands.
            Folded::Late => {}
        }
    }

    fn skip(&self, inner: &mut Inner, topic: &str, offset: i64, kind: &str, why: &str) {
        self.metrics
            .fleet_records_skipped
            .get_or_create(&vec![
                ("topic", topic.to_owned()),
                ("reason", kind.to_owned()),
            ])
            .inc();
        if kind == "panicked" {
            // A bug, not bad input: every one is worth a line.
            tracing::error!(fleet = %self.spec.name, topic, offset, "fleet record skipped: {why}");
        } else if inner.logged.insert(format!("{topic}/{kind}")) {
            tracing::warn!(fleet = %self.spec.name, topic, offset, "fleet record skipped (records like it are only counted from now on, in sharehost_fleet_records_skipped_total): {why}");
        }
    }

    fn count_write_failure(&self, record: &str) {
        self.metrics
            .fleet_write_failures
            .get_or_create(&vec![("record", record.to_owned())])
            .inc();
    }

    fn count_action(&self, result: &str) {
        self.metrics
            .fleet_actions
            .get_or_create(&vec![("result", result.to_owned())])
            .inc();
    }

    /// Reads the status topic to its end.
    async fn read_statuses(&self) -> Result<(), KafkaError> {
        loop {
            let at = self.inner.lock().status_at;
            let got = self
                .client
                .fetch(&self.topics.status, 0, at, Duration::ZERO)
                .await?;
            if got.records.is_empty() {
                return Ok(());
            }
            let topic = self.topics.status.clone();
            let mut inner = self.inner.lock();
            for r in got.records {
                if r.offset < inner.status_at {
                    continue;
                }
                inner.status_at = r.offset + 1;
                if r.value.is_none() {
                    // A tombstone: the host left for good.
                    if let Some(k) = r.key.as_deref() {
                        inner.hosts.remove(String::from_utf8_lossy(k).as_ref());
                    }
                    continue;
                }
                let decoded = std::panic::catch_unwind(|| decode_status(r.value.as_deref()))
                    .unwrap_or_else(|p| Err(RecordError::Panicked(panic_message(p.as_ref()))));
                match decoded {
                    Err(e) => self.skip(&mut inner, &topic, r.offset, e.kind(), &e.to_string()),
                    Ok(s) if r.key.as_deref() != Some(s.host.as_bytes()) => {
                        let why = format!("a status of host {:?} under another key", s.host);
                        self.skip(&mut inner, &topic, r.offset, "wrong_key", &why);
                    }
                    Ok(s)
                        if s.host == self.host
                            && s.instance != self.instance
                            && s.at_ms > self.started_ms =>
                    {
                        let why = format!(
                            "another live process (instance {}) reports as this host's id {:?}: give each host its own fleet.host_id",
                            s.instance, self.host
                        );
                        inner.hosts.flag(&self.host, why.clone(), now_ms());
                        self.skip(&mut inner, &topic, r.offset, "clashing_host_id", &why);
                    }
                    Ok(s) if s.host == self.host && s.instance != self.instance => {
                        // This host's status from before a restart: this process's replaces it.
                    }
                    Ok(s) => {
                        for n in inner.hosts.take(s, now_ms()) {
                            self.skip(&mut inner, &topic, r.offset, n.kind, &n.why);
                        }
                    }
                }
            }
            if inner.status_at >= got.high_watermark {
                return Ok(());
            }
        }
    }

    /// [`Fleet::reconcile`] for a pipeline about to run (just loaded, or run again): whatever
    /// was applied under its name before is forgotten, so it is brought to the fleet's state.
    pub async fn reconcile_before_run(&self, p: &Pipeline) {
        self.inner.lock().applied.remove(p.name());
        self.reconcile(p).await;
    }

    /// Brings `p` to what the fleet wants of it (the active version, a canary, a shadow) when
    /// that changed since it was last brought to it. A version this host cannot fetch, verify
    /// or load is refused here (the pipeline keeps the one it runs, and the status says why)
    /// and tried again with backoff, from the status interval to a minute.
    pub async fn reconcile(&self, p: &Pipeline) {
        // One at a time: a tenant about to run its pipeline and the follow loop may both
        // reconcile it, and they would fetch and keep the same component twice.
        let _one_at_a_time = self.reconciling.lock().await;
        let (desired, applied) = {
            let inner = self.inner.lock();
            (
                inner.state.desired(p.name()),
                inner.applied.get(p.name()).cloned().unwrap_or_default(),
            )
        };
        if desired.seq == 0 {
            // The fleet has never acted on this pipeline: the host's own manifest and state
            // file say what it runs.
            return;
        }
        let instance = std::ptr::from_ref(p) as usize;
        let same = applied.instance == instance && applied.desired.as_ref() == Some(&desired);
        if same
            && applied
                .retry_at
                .is_none_or(|at| Instant::now() < at || applied.refused.is_none())
        {
            return;
        }
        let result = self.converge(p, &desired).await;
        let mut inner = self.inner.lock();
        let entry = inner.applied.entry(p.name().to_owned()).or_default();
        let first_try = !(entry.instance == instance && entry.desired.as_ref() == Some(&desired));
        entry.seq = desired.seq;
        entry.instance = instance;
        entry.desired = Some(desired.clone());
        match result {
            Ok(()) => {
                entry.refused = None;
                entry.retry_at = None;
                entry.retry_delay = Duration::ZERO;
            }
            Err(why) => {
                if first_try {
                    tracing::warn!(fleet = %self.spec.name, pipeline = %p.name(), seq = desired.seq, "fleet action not applied here; the pipeline keeps its current version (tried again with backoff): {why}");
                    self.count_action("not_applied");
                    entry.retry_delay = Duration::ZERO;
                }
                let interval = Duration::from_millis(self.spec.status_interval_ms.max(100));
                entry.retry_delay = (entry.retry_delay * 2).clamp(interval, MAX_RETRY);
                entry.retry_at = Some(Instant::now() + entry.retry_delay);
                entry.refused = Some((desired.seq, why));
            }
        }
    }

    async fn converge(&self, p: &Pipeline, d: &Desired) -> Result<(), String> {
        // A fleet canary the fleet no longer runs ends as the fleet decided it.
        if let Some((Some(seq), ..)) = p.canary_tallies()
            && d.canary.as_ref().map(|c| c.seq) != Some(seq)
        {
            let (promote, reason) = match &d.last_canary {
                Some(o) if o.seq == seq => (o.promoted, o.reason.clone()),
                _ => (false, format!("replaced by fleet action {}", d.seq)),
            };
            p.end_fleet_canary(seq, promote, reason).await;
        }
        match &d.active {
            Some(c) if p.active_hash() != c.digest => {
                let path = self.component(c).await?;
                p.swap(&path).await.map_err(|e| e.to_string())?;
            }
            // Rolled back past the fleet's first deploy: the manifest's own component.
            None if !d.history.is_empty() && p.active_hash() != p.manifest_hash() => {
                let path = p.spec().component.clone();
                p.swap(&path).await.map_err(|e| e.to_string())?;
            }
            _ => {}
        }
        if let Some(c) = &d.canary {
            match p.canary_tallies() {
                Some((Some(seq), ..)) if seq == c.seq => {}
                Some((Some(_), ..)) => return Err("another fleet canary is still ending".into()),
                Some((None, hash, ..)) => {
                    let _ = p
                        .end_canary_because(
                            false,
                            format!(
                                "replaced by fleet canary {} (this host's own canary of {})",
                                c.seq,
                                crate::pipeline::short(&hash)
                            ),
                        )
                        .await;
                    self.start_canary(p, c.seq, &c.component, &c.rules).await?;
                }
                None => self.start_canary(p, c.seq, &c.component, &c.rules).await?,
            }
        }
        let fleet_shadow = self.inner.lock().fleet_shadows.contains(p.name());
        match (&d.shadow, p.shadow_candidate()) {
            (Some((c, _)), Some(running)) if running == c.digest => {}
            (Some((c, sample)), running) => {
                if running.is_some() {
                    p.stop_shadow();
                }
                let path = self.component(c).await?;
                p.start_shadow(ShadowRequest {
                    path,
                    sample: *sample,
                })
                .await
                .map_err(|e| e.to_string())?;
                self.inner.lock().fleet_shadows.insert(p.name().to_owned());
            }
            (None, Some(_)) if fleet_shadow => {
                p.stop_shadow();
                self.inner.lock().fleet_shadows.remove(p.name());
            }
            _ => {}
        }
        Ok(())
    }

    async fn start_canary(
        &self,
        p: &Pipeline,
        seq: u64,
        c: &ComponentRef,
        rules: &super::records::CanaryRules,
    ) -> Result<(), String> {
        let path = self.component(c).await?;
        p.start_fleet_canary(
            CanaryRequest {
                path,
                percent: rules.percent,
                promote_after: rules.promote_after.clone(),
                rollback_if: rules.rollback_if.clone(),
            },
            seq,
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    /// The local file of `c`: kept from before, or fetched from the components topic (checked
    /// against its digest) and kept beside its signature.
    async fn component(&self, c: &ComponentRef) -> Result<PathBuf, String> {
        if let Some(path) = components::stored(&self.dir, c) {
            // Its signature as this deployment carries it (the same bytes may be re-signed).
            components::store_signature(&path, c).map_err(|e| e.to_string())?;
            return Ok(path);
        }
        let mut skipped = Vec::new();
        let bytes =
            components::download(&self.client, &self.topics.components, c, &mut skipped).await;
        if !skipped.is_empty() {
            let topic = self.topics.components.clone();
            let mut inner = self.inner.lock();
            for k in skipped {
                self.skip(&mut inner, &topic, k.offset, k.kind, &k.why);
            }
        }
        let bytes = bytes.map_err(|e| e.to_string())?;
        components::store(&self.dir, c, &bytes).map_err(|e| e.to_string())
    }

    /// Reconciles every loaded pipeline.
    pub async fn reconcile_all(&self, tenants: &Tenants) {
        for p in tenants.pipelines() {
            self.reconcile(&p).await;
        }
    }

    /// This host's status now.
    fn status(&self, tenants: &Tenants) -> HostStatus {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let pipelines = tenants
            .pipelines()
            .into_iter()
            .map(|p| {
                let s = p.status();
                let judged: u64 = s
                    .versions
                    .values()
                    .map(|v| v.accepted + v.rejected + v.released + v.renewed + v.retried)
                    .sum();
                let faults = s.versions.values().map(|v| v.faults).sum();
                let rate = match inner.judged.insert(p.name().to_owned(), (judged, now)) {
                    Some((before, at)) if now > at => {
                        judged.saturating_sub(before) as f64 / (now - at).as_secs_f64()
                    }
                    _ => 0.0,
                };
                let applied = inner.applied.get(p.name()).cloned().unwrap_or_default();
                PipelineReport {
                    name: p.name().to_owned(),
                    state: s.state.clone(),
                    active: p.active_hash(),
                    applied_seq: applied.seq,
                    refused: applied.refused.map(|(_, why)| why),
                    canary: p.canary_tallies().and_then(|(seq, candidate, c, a)| {
                        Some(CanaryReport {
                            seq: seq?,
                            candidate,
                            candidate_tally: c.into(),
                            active_tally: a.into(),
                        })
                    }),
                    shadow: p.shadow_candidate(),
                    records_per_second: (rate * 10.0).round() / 10.0,
                    faults,
                    judged,
                }
            })
            .collect();
        let status = HostStatus {
            host: self.host.clone(),
            instance: self.instance.clone(),
            at_ms: now_ms(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pipelines,
        };
        let _ = inner.hosts.take(status.clone(), now_ms());
        status
    }

    /// Starts writing this host's status, beside the loop that calls it: that loop applies the
    /// fleet's actions and must never wait on a status write, and a slow write (a busy cluster,
    /// a leader being replaced) is left to finish rather than cut short.
    fn publish(&self, tenants: &Tenants) -> tokio::task::JoinHandle<Result<(), String>> {
        let status = self.status(tenants);
        let value = serde_json::to_vec(&status).unwrap_or_default();
        let record = ProduceRecord {
            key: Some(Bytes::from(self.host.clone())),
            value: Some(Bytes::from(value)),
            headers: Vec::new(),
            timestamp: None,
        };
        let (client, topic) = (self.client.clone(), self.topics.status.clone());
        tokio::spawn(async move {
            client
                .produce(&topic, 0, &[record], Compression::None)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// Decides every fleet canary this host takes part in, on the sum of every host's tallies
    /// (this host's live ones, the others' last published), and records a decision when the
    /// canary's rules call one.
    async fn decide_canaries(&self, tenants: &Tenants) {
        // Read to the end first: a host writes at most one decision per canary, and one
        // already in the topic (this host's, written before a restart or a failed answer, or
        // another's) ends the canary here before anything else is written.
        loop {
            match self.read_deployments(Duration::ZERO).await {
                Ok(true) => continue,
                Ok(false) => break,
                Err(_) => return,
            }
        }
        let mut decisions = Vec::new();
        {
            let inner = self.inner.lock();
            for (name, d) in &inner.state.pipelines {
                let Some(c) = &d.canary else { continue };
                if inner.decided.contains(&(name.clone(), c.seq)) {
                    continue;
                }
                // Only a host that runs the canary decides it (it has records to count).
                let Some(p) = tenants.find(name) else {
                    continue;
                };
                let Some((Some(seq), _, mut candidate, mut active)) = p.canary_tallies() else {
                    continue;
                };
                if seq != c.seq {
                    continue;
                }
                for (host, s) in inner.hosts.statuses() {
                    if *host == self.host {
                        continue;
                    }
                    for r in s.pipelines.iter().filter(|r| r.name == *name) {
                        if let Some(cr) = r.canary.as_ref().filter(|cr| cr.seq == c.seq) {
                            candidate = candidate.plus(cr.candidate_tally.into());
                            active = active.plus(cr.active_tally.into());
                        }
                    }
                }
                let elapsed = Duration::from_millis(now_ms().saturating_sub(c.issued_at_ms));
                let (promote, reason) = match decide(
                    &c.rules.promote_after,
                    &c.rules.rollback_if,
                    candidate,
                    active,
                    elapsed,
                ) {
                    CanaryDecision::Continue => continue,
                    CanaryDecision::Promote(r) => (true, r),
                    CanaryDecision::RollBack(r) => (false, r),
                };
                decisions.push(Decision {
                    pipeline: name.clone(),
                    seq: c.seq,
                    promote,
                    reason: format!("{reason} (fleet sum, decided by host {})", self.host),
                    host: self.host.clone(),
                    candidate: candidate.into(),
                    active: active.into(),
                });
            }
        }
        for d in decisions {
            let record = ProduceRecord {
                key: Some(Bytes::from(decision_key(&d.pipeline, d.seq, &self.host))),
                value: Some(Bytes::from(serde_json::to_vec(&d).unwrap_or_default())),
                headers: Vec::new(),
                timestamp: None,
            };
            match self
                .client
                .produce(&self.topics.deployments, 0, &[record], Compression::None)
                .await
            {
                Ok(_) => {
                    self.inner
                        .lock()
                        .decided
                        .insert((d.pipeline.clone(), d.seq));
                }
                Err(e) => {
                    self.count_write_failure("decision");
                    tracing::warn!(fleet = %self.spec.name, pipeline = %d.pipeline, "cannot record the canary's decision (tried again at the next interval): {e}")
                }
            }
        }
    }

    /// Follows the fleet until `shutdown` (see [`Fleet::follow`]), in a task of its own that is
    /// started again, with backoff, when it panics: what a topic holds must never stop a host's
    /// agent for good. Each restart is logged at ERROR and counted in
    /// `sharehost_fleet_agent_restarts_total`.
    pub async fn run(self: Arc<Self>, tenants: Arc<Tenants>, shutdown: CancellationToken) {
        let metrics = self.metrics.clone();
        let fleet = self.spec.name.clone();
        let stop = shutdown.clone();
        supervise(
            &shutdown,
            |why| {
                metrics.fleet_agent_restarts.inc();
                tracing::error!(fleet = %fleet, "the fleet agent panicked and is started again (counted in sharehost_fleet_agent_restarts_total): {why}");
            },
            move || self.clone().follow(tenants.clone(), stop.clone()),
        )
        .await;
    }

    /// Follows the fleet until `shutdown`: applies new actions and decisions as they arrive,
    /// and every status interval reads everyone's status, decides canaries, retries what was
    /// not applied and publishes this host's status.
    async fn follow(self: Arc<Self>, tenants: Arc<Tenants>, shutdown: CancellationToken) {
        let mut tick =
            tokio::time::interval(Duration::from_millis(self.spec.status_interval_ms.max(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut publishing = true;
        // One status write at a time: while one is still out, an interval writes none.
        let mut write: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                read = self.read_deployments(FOLLOW_WAIT) => match read {
                    Ok(true) => self.reconcile_all(&tenants).await,
                    Ok(false) => {}
                    Err(e) => {
                        if !failing {
                            tracing::warn!(fleet = %self.spec.name, "cannot read the deployments topic (tried again): {e}");
                        }
                        failing = true;
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                },
                _ = tick.tick() => {
                    if let Err(e) = self.read_statuses().await {
                        tracing::debug!(fleet = %self.spec.name, "cannot read the status topic: {e}");
                    }
                    self.decide_canaries(&tenants).await;
                    self.reconcile_all(&tenants).await;
                    if write.as_ref().is_some_and(|w| !w.is_finished()) {
                        continue;
                    }
                    let Some(done) = write.replace(self.publish(&tenants)) else {
                        continue;
                    };
                    let published = done
                        .await
                        .unwrap_or_else(|e| Err(format!("the status write ended: {e}")));
                    match published {
                        Ok(()) => {
                            failing = false;
                            if !publishing {
                                tracing::info!(fleet = %self.spec.name, "this host's status is published again");
                            }
                            publishing = true;
                        }
                        Err(e) => {
                            self.count_write_failure("status");
                            if publishing {
                                tracing::warn!(fleet = %self.spec.name, "cannot publish this host's status (tried again every interval; other hosts will see it stale, and it judges on): {e}");
                            }
                            publishing = false;
                        }
                    }
                }
            }
        }
        if let Some(w) = write {
            w.abort();
        }
    }
}

/// The first wait before a panicked task is started again; it doubles on each panic in a row.
const FIRST_RESTART_DELAY: Duration = Duration::from_millis(100);

/// The longest wait before a panicked task is started again.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// Runs the task `start` makes until it returns or `shutdown`; when it panics, `on_panic` is
/// told why and a new one is started after a delay that doubles from
/// [`FIRST_RESTART_DELAY`] to [`MAX_RESTART_DELAY`] (back to the first after a task that ran
/// longer than the longest delay). The panic is caught as the spawned task's `JoinError`, so
/// nothing of it reaches the caller.
pub(crate) async fn supervise<F, Fut>(
    shutdown: &CancellationToken,
    mut on_panic: impl FnMut(&str),
    mut start: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut delay = FIRST_RESTART_DELAY;
    loop {
        let started = Instant::now();
        let mut task = tokio::spawn(start());
        let ended = tokio::select! {
            ended = &mut task => ended,
            _ = shutdown.cancelled() => {
                // The task sees the same token and ends on its own; wait for it.
                task.await
            }
        };
        match ended {
            Ok(()) => return,
            Err(e) if e.is_panic() => {
                if started.elapsed() > MAX_RESTART_DELAY {
                    delay = FIRST_RESTART_DELAY;
                }
                on_panic(&panic_message(e.into_panic().as_ref()));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(MAX_RESTART_DELAY);
            }
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        }
    }
}

/// The text a panic was raised with (a `&str` or a `String`), or a placeholder.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::desired::Desired;
    use crate::fleet::records::{CanaryRules, Change, action_key};
    use crate::rollout::{PromoteAfter, RollbackIf};
    use crate::runtime::{TrustPolicy, TrustedKey};

    fn spec(trust: TrustPolicy) -> FleetSpec {
        FleetSpec {
            name: "f".into(),
            host_id: Some("h".into()),
            topic_prefix: "p.".into(),
            replication_factor: None,
            status_interval_ms: 1000,
            stale_after_ms: 10_000,
            status_retention_ms: 60_000,
            max_hosts: 10,
            trust: Arc::new(trust),
        }
    }

    fn component(n: u8) -> ComponentRef {
        ComponentRef {
            digest: format!("{n:02x}").repeat(32),
            size: 1,
            name: format!("v{n}.wasm"),
            signature: String::new(),
            chunks: vec![i64::from(n)],
        }
    }

    fn record(offset: i64, key: &str, value: &[u8]) -> ConsumedRecord {
        ConsumedRecord {
            offset,
            timestamp: 0,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::copy_from_slice(value)),
            headers: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_task_that_panics_is_started_again_and_each_panic_is_told() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let runs = Arc::new(AtomicUsize::new(0));
        let mut told = Vec::new();
        let r = runs.clone();
        supervise(
            &CancellationToken::new(),
            |why| told.push(why.to_owned()),
            move || {
                let r = r.clone();
                async move {
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    assert!(n >= 2, "run {n} panics");
                }
            },
        )
        .await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a run that returns"
        );
        assert_eq!(told.len(), 2, "{told:?}");
        assert!(told[0].contains("run 0 panics"), "{told:?}");
    }

    #[tokio::test]
    async fn a_shutdown_ends_the_wait_before_a_restart() {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let mut told = 0;
        supervise(
            &shutdown,
            |_| {
                told += 1;
                stop.cancel();
            },
            || async { panic!("always") },
        )
        .await;
        assert_eq!(told, 1, "no restart after the shutdown");
    }

    #[test]
    fn a_compacted_deployments_topic_folds_to_the_state_the_whole_log_folds_to() {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("key pair");
        let trusted = TrustedKey::parse(&kp.pk.to_base64()).expect("trusted key");
        let spec = spec(TrustPolicy::new([trusted]).expect("policy"));
        // Actions made as `sharehost fleet` makes them: from the state the log folds to so far.
        let fold_log = |log: &[(String, Vec<u8>)]| {
            let mut state = FleetState::default();
            for (i, (key, value)) in log.iter().enumerate() {
                let _ = fold_record(&mut state, &spec, &record(i as i64, key, value));
            }
            state
        };
        let act = |log: &[(String, Vec<u8>)], change| {
            let state = fold_log(log);
            let mut a = Action {
                fleet: "f".into(),
                pipeline: "p".into(),
                seq: state.desired("p").seq + 1,
                issued_at_ms: 1,
                change,
                then: Desired::default(),
            };
            let mut next = state;
            next.apply_action(&a).expect("applies");
            a.then = next.desired("p");
            (
                action_key(&a.pipeline, a.seq),
                serde_json::to_vec(&sign::sign(&a, &kp.sk).expect("sign")).expect("json"),
            )
        };
        let decision = |host: &str, promote| {
            let d = Decision {
                pipeline: "p".into(),
                seq: 3,
                promote,
                reason: "r".into(),
                host: host.into(),
                candidate: Default::default(),
                active: Default::default(),
            };
            (
                crate::fleet::records::decision_key("p", 3, host),
                serde_json::to_vec(&d).expect("json"),
            )
        };
        // The log as written: two deploys, a canary decided by two hosts (the first wins), a
        // replay of the first action under its own key, a rollback, a malformed record.
        let mut log: Vec<(String, Vec<u8>)> = Vec::new();
        let first = act(
            &log,
            Change::Deploy {
                component: component(1),
            },
        );
        log.push(first.clone());
        log.push(act(
            &log,
            Change::Deploy {
                component: component(2),
            },
        ));
        log.push(act(
            &log,
            Change::Canary {
                component: component(3),
                rules: CanaryRules {
                    percent: 10.0,
                    promote_after: PromoteAfter {
                        batches: Some(5),
                        seconds: None,
                    },
                    rollback_if: RollbackIf::default(),
                },
            },
        ));
        log.push(decision("h2", true));
        log.push(decision("h1", false));
        log.push(first);
        log.push(("action/p/x".into(), b"{".to_vec()));
        log.push(act(&log, Change::Rollback { to: None }));
        let fold = |records: &[(i64, &(String, Vec<u8>))]| {
            let mut state = FleetState::default();
            for (offset, (key, value)) in records {
                let _ = fold_record(&mut state, &spec, &record(*offset, key, value));
            }
            state
        };
        let all: Vec<(i64, &(String, Vec<u8>))> =
            log.iter().enumerate().map(|(i, r)| (i as i64, r)).collect();
        // Compaction keeps the last record of each key, at its offset.
        let compacted: Vec<(i64, &(String, Vec<u8>))> = all
            .iter()
            .filter(|(i, (k, _))| !all.iter().any(|(j, (k2, _))| j > i && k2 == k))
            .copied()
            .collect();
        assert!(compacted.len() < all.len());
        let whole = fold(&all);
        assert_eq!(fold(&compacted), whole);
        let p = whole.desired("p");
        assert_eq!(p.seq, 4);
        assert_eq!(
            p.last_canary.as_ref().map(|c| c.promoted),
            Some(true),
            "the first decision in the log stands"
        );
        assert_eq!(
            p.active.as_ref().map(|c| c.digest.clone()),
            Some(component(2).digest),
            "promoted v3, then rolled back to v2"
        );
    }
}
