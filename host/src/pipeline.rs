//! The one place where Kafka and Wasm meet: the share engine's records go to plugin instances in
//! batches, verdicts come back, and this module decides what to acknowledge, what to dead-letter
//! and what to present again. Hot-swap lives here too: a new plugin version is loaded, validated
//! and initialised off the hot path and takes the next batch; batches in flight finish on the
//! version they started with.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::kafka::{Header, KafkaClient, KafkaError, ProduceRecord};
use crate::manifest::{FaultPolicy, InstanceModeSpec, PipelineSpec};
use crate::metrics::{Labels, Metrics};
use crate::provenance as pv;
use crate::recent_faults::{FaultRole, RecentFault, RecentFaults};
use crate::rollout::{
    ActiveState, CanaryDecision, CanaryNote, CanaryPlan, CanaryRequest, CanaryState, CanaryStatus,
    SHADOW_QUEUE, ShadowRequest, ShadowStatus,
};
use crate::runtime::{
    BatchOutcome, Compiled, Emit, Fault, FaultKind, Header as RuntimeHeader, HttpGrant,
    InstanceMode, Judged, OutputGrant, Placement, Plugin, PluginInit, PluginLimits, PluginRuntime,
    Record, Secrets, Verdict,
};
use crate::share::consumer::{
    AcquireMode, RoundTrip, RoundTrips, ShareConsumer, ShareConsumerConfig, ShareRecord,
};
use crate::share::ledger::{AckKind, TopicIdPartition};
use crate::share::membership::fresh_member_id;
use crate::state::{Claim, MemberIdentity};
use crate::writes::{Landing, PartitionBy, Write, WriteObserver, record_bytes, write_all};
use prometheus_client::metrics::counter::Counter;

/// How long running batches may take to finish once shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a drain goes on judging the records it holds before it releases the rest: within
/// a 30 s grace period (Kubernetes' default), with time left to flush and close.
const DRAIN_JUDGING: Duration = Duration::from_secs(20);
/// A pipeline acquires no more records than its plugin judges in this long (at its measured
/// rate), so a drain judges what it holds within [`DRAIN_JUDGING`] and a crash hands little
/// back. Half the lock duration when that is shorter.
const PACE_WITHIN: Duration = Duration::from_secs(10);
/// How often a pipeline asks the group coordinator for its share group's lag.
const LAG_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps the engine's request latencies (`sharehost_request_seconds`) for one pipeline.
struct RequestTimes {
    metrics: Arc<Metrics>,
    pipeline: String,
}

impl RoundTrips for RequestTimes {
    fn took(&self, kind: RoundTrip, took: Duration) {
        let request = match kind {
            RoundTrip::Fetch => "fetch",
            RoundTrip::Acknowledge => "acknowledge",
        };
        self.metrics
            .request_seconds
            .get_or_create(&vec![
                ("pipeline", self.pipeline.clone()),
                ("request", request.to_owned()),
            ])
            .observe(took.as_secs_f64());
    }
}

/// Aborts a spawned task when dropped: a helper task lives exactly as long as its run.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Most extra plugin calls spent isolating poison records in a faulting batch.
const MAX_ISOLATION_CALLS: usize = 16;
/// A held record (`retry`, or one whose writes wait for a retry) is released this long before
/// its lock would run out on a broker without renew, so the release lands while the record is
/// still ours.
const RETRY_LOCK_MARGIN: Duration = Duration::from_secs(1);

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

/// The reason a dead letter carries when the plugin rejected without one.
const NO_REASON: &str = "rejected by the plugin (no reason given)";

/// What a reject's dead letter says: the plugin's reason, or [`NO_REASON`] when it gave none
/// (or an empty one), so a dead letter always says why.
fn reject_reason(reason: Option<String>) -> String {
    reason
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| NO_REASON.to_owned())
}

/// A trusted batch handler compiled into the process, in place of a Wasm component. It runs
/// through exactly the same pipeline (batching, verdicts, acknowledgements, dead letters,
/// metrics), so embedding code can use the pipeline without a sandbox, and the benchmark
/// (`host/examples/pipeline_bench.rs`) can measure what the sandbox alone costs.
pub trait NativeHandler: Send + Sync {
    /// A short name for logs, metrics labels and `GET /pipelines` (e.g. `accept-all`).
    fn name(&self) -> &str;
    /// Judges one batch: exactly one verdict per record, in record order (any other count
    /// counts as a `wrong_verdict_count` fault and the batch gets the fault policy).
    fn handle(&self, records: &[Record]) -> Vec<Verdict>;
}

/// What judges a batch: a sandboxed plugin instance, or a trusted native handler.
enum Handler {
    Wasm(Box<Plugin>),
    Native(Arc<dyn NativeHandler>),
}

impl Handler {
    /// Verdicts and emits for `records` plus the faults met, and the handler back (`None`
    /// when its instance was lost: the runtime shut down mid-call). A plugin runs on the
    /// runtime's guest threads. `isolate`: a faulted batch is split to find its poison records
    /// ([`Plugin::handle_isolating`]); otherwise the whole batch gets the policy and the fault
    /// is returned (for a canary, whose faulting batch the active version judges again:
    /// isolating would have the candidate judge parts of it once more on fresh instances).
    async fn judge(
        self,
        records: Arc<[Record]>,
        policy: &Verdict,
        isolate: bool,
    ) -> (Option<Handler>, Judged) {
        let n = records.len();
        match self {
            Handler::Wasm(plugin) => {
                let owned = policy.clone();
                let done = plugin
                    .on_guest_threads(move |p| {
                        Box::pin(async move {
                            if isolate {
                                return p
                                    .handle_isolating(&records, &owned, MAX_ISOLATION_CALLS)
                                    .await;
                            }
                            match p.handle(&records).await {
                                BatchOutcome::Verdicts(verdicts) => Judged {
                                    verdicts,
                                    emits: p.take_emits(),
                                    ..Judged::default()
                                },
                                BatchOutcome::Fault(fault) => judged_by_policy(n, &owned, fault),
                            }
                        })
                    })
                    .await;
                match done {
                    Some((plugin, judged)) => (Some(Handler::Wasm(plugin)), judged),
                    None => {
                        let fault = Fault {
                            kind: FaultKind::Trap,
                            message: "the plugin runtime shut down during the call".into(),
                            records: n,
                        };
                        (None, judged_by_policy(n, policy, fault))
                    }
                }
            }
            Handler::Native(h) => {
                let verdicts = h.handle(&records);
                let judged = if verdicts.len() == n {
                    Judged {
                        verdicts,
                        ..Judged::default()
                    }
                } else {
                    let fault = Fault {
                        kind: FaultKind::WrongVerdictCount,
                        message: format!(
                            "native handler {} returned {} verdicts for {n} records",
                            h.name(),
                            verdicts.len(),
                        ),
                        records: n,
                    };
                    judged_by_policy(n, policy, fault)
                };
                (Some(Handler::Native(h)), judged)
            }
        }
    }
}

/// Every record of a batch of `n` gets the fault policy, for `fault`.
fn judged_by_policy(n: usize, policy: &Verdict, fault: Fault) -> Judged {
    Judged {
        verdicts: vec![fault.verdict_under(policy); n],
        emits: Vec::new(),
        faults: vec![fault],
        faulted: (0..n).map(|i| (i, 0)).collect(),
    }
}

/// One loaded plugin version: `concurrency` instances of the same component (or handles on
/// the same native handler).
struct Version {
    hash: String,
    path: PathBuf,
    /// Where its instances live (`None` for a native handler).
    placement: Option<Placement>,
    /// Its compiled code (`None` for a native handler): kept when the version is replaced,
    /// so a rollback instantiates it again without reading or compiling anything.
    compiled: Option<Compiled>,
    /// When it was loaded, in ms since the Unix epoch.
    loaded_at_ms: u64,
    instances: Mutex<Vec<Handler>>,
}

impl Version {
    /// The key id that signed it, when its pipeline requires signatures.
    fn signer(&self) -> Option<String> {
        self.compiled.as_ref().and_then(|c| c.signer.clone())
    }
}

/// A replaced version kept for rollback: its code, not its instances (which would hold pool
/// slots for nothing).
#[derive(Clone)]
struct Kept {
    hash: String,
    path: PathBuf,
    compiled: Compiled,
    loaded_at_ms: u64,
}

/// A running shadow: the candidate's one instance, what it has seen, and a bound on the
/// batches waiting for it.
struct ShadowRun {
    version: Version,
    sample: f64,
    /// Batches offered so far, to spread the sample evenly.
    offered: AtomicU64,
    /// Free places in its queue ([`SHADOW_QUEUE`]); none free: the batch is dropped.
    queue: Arc<Semaphore>,
    /// Its one instance judges one batch at a time.
    turn: tokio::sync::Mutex<()>,
    status: Mutex<ShadowStatus>,
}

/// A running canary: the candidate's instances (as many as the active version's) and its plan.
struct CanaryRun {
    version: Arc<Version>,
    plan: Mutex<CanaryPlan>,
}

/// Versions kept compiled besides the active one, newest first, for rollback.
const KEPT_VERSIONS: usize = 3;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Version {
    /// A native handler as a version: its "hash" and "path" name it (`native:NAME`), so logs,
    /// metrics and `GET /pipelines` show what runs.
    fn native(handler: Arc<dyn NativeHandler>, concurrency: usize) -> Version {
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

/// Per-version counters shown by `GET /pipelines`.
#[derive(Debug, Default, Serialize, Clone)]
pub struct VersionCounters {
    /// Records accepted.
    pub accepted: u64,
    /// Records released (by the plugin, the fault policy or renew exhaustion).
    pub released: u64,
    /// Records rejected.
    pub rejected: u64,
    /// Renewals granted.
    pub renewed: u64,
    /// Plugin faults.
    pub faults: u64,
    /// Plugin calls.
    pub batches: u64,
    /// Records held back at the plugin's `retry`, then released.
    pub retried: u64,
    /// Emitted records produced before their source's Accept.
    pub emits_produced: u64,
    /// Emitted records discarded (their source was released, rejected, renewed or retried).
    pub emits_discarded: u64,
    /// Emitted records never produced: the pipeline stopped while their produce was being
    /// retried (their source was released), or the record is larger than its topic accepts
    /// (its source was rejected).
    pub emits_failed: u64,
}

/// One version as `GET /pipelines/NAME/versions` lists it.
#[derive(Debug, Serialize, Clone)]
pub struct VersionInfo {
    /// Content hash (sha256).
    pub hash: String,
    /// Component path it was loaded from.
    pub path: String,
    /// When it was loaded, ms since the Unix epoch.
    pub loaded_at_ms: u64,
    /// The key id that signed it (`[trust]`), `None` when unsigned.
    pub signer: Option<String>,
    /// Whether it is the active version.
    pub active: bool,
    /// Its counters since this host started.
    pub counters: VersionCounters,
}

/// `GET /pipelines/NAME/versions`: the active version first, then the kept ones, newest first.
#[derive(Debug, Serialize, Clone)]
pub struct VersionsStatus {
    /// The active version's hash.
    pub active: String,
    /// Active first, then kept for rollback.
    pub versions: Vec<VersionInfo>,
}

/// What `GET /pipelines` shows for one pipeline.
#[derive(Debug, Serialize, Clone)]
pub struct PipelineStatus {
    /// Pipeline name.
    pub name: String,
    /// starting, joining (not in its group: before the join, or while the coordinator cannot
    /// be reached), running, degraded (writes wait for a retry), draining, stopped or failed.
    pub state: String,
    /// Content hash (sha256) of the active plugin version.
    pub active_version: String,
    /// Component path of the active version.
    pub component: String,
    /// Counters per plugin version hash.
    pub versions: HashMap<String, VersionCounters>,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// Records acquired and not yet judged.
    pub in_flight: u64,
    /// The most records held at once since the pipeline started (never above `max_in_flight`).
    pub in_flight_peak: u64,
    /// How many records the engine may hold now: what the plugin judges within 10 s at its
    /// measured rate, between a batch per concurrent call and `max_in_flight`.
    pub in_flight_limit: u64,
    /// ShareFetch requests sent, and the records they acquired (records per fetch: the
    /// broker's cost per record falls as it grows).
    pub fetches: u64,
    /// Records acquired by those fetches.
    pub acquired: u64,
    /// Acquired ranges that cover only part of a producer batch (the broker then tracks the
    /// batch record by record): near zero while producer batches fit `max_in_flight`.
    pub acquired_split: u64,
    /// Batches whose outputs or dead letters wait for a retry of their produce (their records
    /// stay acquired); the state is `degraded` meanwhile.
    pub writes_waiting: u64,
    /// Failed produce requests of outputs and dead letters, retried (not plugin verdicts).
    pub write_failures: u64,
    /// Records released because the pipeline stopped before their writes landed.
    pub released_unwritten: u64,
    /// Dead letters written without the record's key, value and headers, because the whole
    /// record was larger than the dead-letter topic accepts.
    pub dead_letters_shrunk: u64,
    /// Output names the plugin emitted to that `[pipeline.outputs]` does not map: a
    /// misconfiguration (the records accepted with such an emit are rejected, and the
    /// pipeline is not ready) until the manifest maps them.
    pub unmapped_outputs: Vec<String>,
    /// Why the last run failed (a topic it writes to missing, the group refusing it, ...),
    /// while the host runs it again; `None` once it runs.
    pub last_error: Option<String>,
    /// Last hot-swap failure, if the last swap failed.
    pub last_swap_error: Option<String>,
    /// How long judging paused around the last hot swap: the longest gap between two judged
    /// batches from the last one before the swap was asked for to the first one the new
    /// version judged (ms, fractional). Meaningful while records flow: an idle pipeline
    /// reports its idle time. `None` before the first swap completes a batch.
    pub last_swap_stall_ms: Option<f64>,
    /// What the pipeline grants its plugin beyond computing.
    pub grants: GrantsStatus,
    /// The key id that signed the active version (`[trust]`), `None` when unsigned.
    pub signer: Option<String>,
    /// Which instance allocator the active version's instances come from: `pooling` (or
    /// `pooling-compact`), or `on-demand` for a component too big for a pool slot (most
    /// Python components), with the reason; `native` for a native handler.
    pub allocator: String,
    /// Why the active version runs on-demand although the host has a pool.
    pub allocator_reason: Option<String>,
    /// The running shadow, if any: agreement per verdict kind, faults, time per record, the
    /// first disagreements.
    pub shadow: Option<ShadowStatus>,
    /// The running canary, or how the last one ended.
    pub canary: Option<CanaryStatus>,
}

/// The grants of a pipeline as `GET /pipelines` shows them: names and hosts, never a secret's
/// value.
#[derive(Debug, Serialize, Clone)]
pub struct GrantsStatus {
    /// Output name to topic.
    pub outputs: BTreeMap<String, String>,
    /// Hosts the plugin may call over HTTP.
    pub allowed_outbound_hosts: Vec<String>,
    /// The names of the secrets handed to `init` (values are never shown).
    pub secrets: Vec<String>,
}

/// What a pipeline grants its plugin beyond computing: built once per pipeline (the HTTP
/// grant's concurrency cap and TLS settings are shared by every instance and version).
#[derive(Debug, Default, Clone)]
struct Grants {
    http: Option<Arc<HttpGrant>>,
    outputs: Arc<OutputGrant>,
    secrets: Arc<Secrets>,
}

impl Grants {
    /// The grants `spec` names; a bad one (a secret that is not set, an unusable host list)
    /// refuses the pipeline's component as a load failure would.
    fn build(spec: &PipelineSpec) -> Result<Grants, SwapError> {
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

/// A record a plugin asked to `retry`, held until `due`, then released.
struct Held {
    due: Instant,
    record: ShareRecord,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.due == other.due
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.due.cmp(&other.due)
    }
}

/// What a batch's task needs of the run loop: the engine, the client, the loop's queues and
/// the stop that ends write retries.
#[derive(Clone)]
struct BatchContext {
    consumer: Arc<ShareConsumer>,
    client: Arc<KafkaClient>,
    /// Renewed records go back to the backlog to be judged again.
    requeue: mpsc::UnboundedSender<ShareRecord>,
    /// How often the plugin renewed each record it holds (for `max_renewals`).
    renewals: Arc<Mutex<HashMap<(TopicIdPartition, i64), u32>>>,
    /// Records held at the plugin's `retry`.
    retries: mpsc::UnboundedSender<Held>,
    /// The pipeline is stopping: writes stop retrying and release their records.
    stop: CancellationToken,
}

/// The engine's numbers as last published, for `GET /pipelines`.
#[derive(Debug, Default)]
struct EngineCounts {
    /// The engine's totals last published as counters (session resets, rebalances, released
    /// by the broker, acks ok, acks failed).
    published: Mutex<[u64; 6]>,
    peak: AtomicU64,
    limit: AtomicU64,
    fetches: AtomicU64,
    acquired: AtomicU64,
    acquired_split: AtomicU64,
}

/// The pipeline's own count of its writes (outputs and dead letters), apart from verdicts.
#[derive(Debug, Default)]
struct WriteCounts {
    /// Batches whose writes wait for a retry now.
    waiting: AtomicUsize,
    /// Failed produce requests.
    failures: AtomicU64,
    /// Records released because the pipeline stopped before their writes landed.
    released: AtomicU64,
    /// Dead letters written without the record's key, value and headers.
    shrunk: AtomicU64,
}

/// Watches one batch's writes: counts failures by topic, shows the pipeline degraded while
/// they wait, and gives the batch's permit back at the first wait, so other batches are judged
/// meanwhile (their records stay bounded by `max_in_flight`).
struct WriteWatch<'a> {
    pipeline: &'a Pipeline,
    kind: &'static str,
    permit: &'a Mutex<Option<OwnedSemaphorePermit>>,
}

impl WriteObserver for WriteWatch<'_> {
    fn failed(&self, topic: &str, _records: usize, error: &KafkaError) {
        let p = self.pipeline;
        p.writes.failures.fetch_add(1, Ordering::Relaxed);
        p.metrics
            .write_failures
            .get_or_create(&vec![
                ("pipeline", p.spec.name.clone()),
                ("kind", self.kind.to_owned()),
                ("topic", topic.to_owned()),
                ("error", error.kind()),
            ])
            .inc();
    }

    fn produced(&self, took: Duration) {
        let p = self.pipeline;
        p.metrics
            .write_seconds
            .get_or_create(&vec![
                ("pipeline", p.spec.name.clone()),
                ("kind", self.kind.to_owned()),
            ])
            .observe(took.as_secs_f64());
    }

    fn shrunk(&self, topic: &str) {
        let p = self.pipeline;
        p.writes.shrunk.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(pipeline = %p.spec.name, topic, "a record larger than the dead-letter topic accepts was dead-lettered without its key, value and headers");
        p.metrics
            .dead_letters_shrunk
            .get_or_create(&vec![("pipeline", p.spec.name.clone())])
            .inc();
    }

    fn waiting(&self, waiting: bool) {
        let p = self.pipeline;
        let labels = vec![("pipeline", p.spec.name.clone())];
        if waiting {
            lock(self.permit).take();
            p.writes.waiting.fetch_add(1, Ordering::Relaxed);
            p.metrics.writes_waiting.get_or_create(&labels).inc();
        } else {
            p.writes.waiting.fetch_sub(1, Ordering::Relaxed);
            p.metrics.writes_waiting.get_or_create(&labels).dec();
        }
    }
}

/// A running pipeline as the admin endpoints see it.
pub struct Pipeline {
    spec: PipelineSpec,
    grants: Grants,
    runtime: PluginRuntime,
    metrics: Arc<Metrics>,
    active: Mutex<Arc<Version>>,
    /// Replaced versions, newest first, at most [`KEPT_VERSIONS`].
    history: Mutex<VecDeque<Kept>>,
    /// A candidate judging copies of batches, compared and never acted on.
    shadow: Mutex<Option<Arc<ShadowRun>>>,
    /// A candidate judging a share of batches for real.
    canary: Mutex<Option<Arc<CanaryRun>>>,
    /// How the last canary ended (kept after it is gone, for `GET /pipelines`).
    last_canary: Mutex<Option<CanaryStatus>>,
    /// Where the active version is remembered across restarts (`None`: not remembered).
    state_file: Option<PathBuf>,
    /// Content hash of the manifest's component, as loaded at start.
    manifest_hash: String,
    /// One change of versions at a time (swap, rollback, shadow, canary, promotion).
    swapping: tokio::sync::Mutex<()>,
    state: Mutex<String>,
    counters: Mutex<HashMap<String, VersionCounters>>,
    dead_lettered: AtomicU64,
    /// Whether the group's broker dead-letters Rejects and archived records itself (KIP-1191):
    /// the host's own dead letters are then acknowledged as done.
    broker_dlq: AtomicBool,
    in_flight: AtomicU64,
    /// Whether the pipeline's member is in its group (the coordinator answered it last).
    joined: std::sync::atomic::AtomicBool,
    engine: EngineCounts,
    writes: WriteCounts,
    last_swap_error: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    /// Output names the plugin emitted to that the manifest does not map.
    unmapped: Mutex<BTreeSet<String>>,
    stall: Mutex<SwapStall>,
    /// The last fault of records released for one, for their dead letter at the cap.
    last_faults: Mutex<LastFaults>,
    /// The last faults met, in words, for `GET /faults` and the console.
    recent_faults: Arc<RecentFaults>,
}

/// Most records whose last fault is kept: a bound on what a faulting plugin makes the host
/// hold (an entry is about 300 bytes); the oldest goes first.
const MAX_LAST_FAULTS: usize = 4096;

/// Longest fault text kept per record.
const MAX_LAST_FAULT_TEXT: usize = 256;

/// A record by topic, partition and offset.
type RecordId = (Arc<str>, i32, i64);

/// The fault each record met last, when the fault policy released it: a record that faults
/// on every delivery reaches the delivery cap released, and its dead letter then says why
/// ("delivery cap reached" alone hid it). Bounded at [`MAX_LAST_FAULTS`], oldest first.
#[derive(Default)]
struct LastFaults {
    by_record: HashMap<RecordId, String>,
    order: VecDeque<RecordId>,
}

impl LastFaults {
    fn note(&mut self, record: RecordId, fault: &Fault) {
        let mut text = format!("{}: {}", fault.kind, fault.message);
        if text.len() > MAX_LAST_FAULT_TEXT {
            let mut cut = MAX_LAST_FAULT_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        if self.by_record.insert(record.clone(), text).is_none() {
            self.order.push_back(record);
        }
        while self.by_record.len() > MAX_LAST_FAULTS {
            match self.order.pop_front() {
                Some(old) => {
                    self.by_record.remove(&old);
                }
                None => break,
            }
        }
    }

    /// The record's last fault, forgotten once read.
    fn take(&mut self, record: &RecordId) -> Option<String> {
        let text = self.by_record.remove(record)?;
        self.order.retain(|r| r != record);
        Some(text)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn limits(spec: &PipelineSpec, grants: &Grants) -> PluginLimits {
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

/// Reads, checks and compiles `path` for the pipeline (or maps it from the cache) on a
/// blocking thread: on a runtime worker the read, hash, signature check and compile held up
/// the batches queued behind it (a cached swap under load stalled judging up to 17 ms, an
/// uncached one for its whole compile).
async fn compile_version(
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
async fn instantiate_version(
    runtime: &PluginRuntime,
    spec: &PipelineSpec,
    grants: &Grants,
    path: &Path,
    compiled: Compiled,
    limits: PluginLimits,
    instances: usize,
) -> Result<Version, SwapError> {
    let init = PluginInit {
        config: spec
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        secrets: grants.secrets.clone(),
        tenant: Some(Arc::from(spec.name.as_str())),
    };
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
async fn load_version(
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

impl Pipeline {
    /// Loads the pipeline's component (validated and initialised) without touching Kafka.
    pub async fn load(
        spec: PipelineSpec,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Pipeline>, SwapError> {
        let grants = Grants::build(&spec)?;
        let version = load_version(&runtime, &spec, &grants, &spec.component).await?;
        tracing::info!(pipeline = %spec.name, version = %short(&version.hash), "plugin loaded");
        Self::with_version(spec, grants, runtime, metrics, version)
            .start_manifest_shadow()
            .await
    }

    /// Starts the shadow the manifest names, if any: a candidate that cannot be shadowed stops
    /// the load with the reason, as a bad component would.
    async fn start_manifest_shadow(self: Arc<Self>) -> Result<Arc<Self>, SwapError> {
        if let Some(sh) = self.spec.shadow.clone() {
            self.start_shadow(ShadowRequest {
                path: sh.path,
                sample: sh.sample,
            })
            .await?;
        }
        Ok(self)
    }

    /// Loads the pipeline like [`Pipeline::load`], remembering its active version in
    /// `state_dir` across restarts. The rule at start: if the state file names another
    /// version than the manifest's component, and the manifest's component is the one the
    /// file was written against (unchanged since), the host comes back on the remembered
    /// version (when its file still has that content) with the manifest's kept for rollback;
    /// otherwise it starts on the manifest's component. Either way the log says which, and why.
    pub async fn load_remembering(
        spec: PipelineSpec,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
        state_dir: &Path,
    ) -> Result<Arc<Pipeline>, SwapError> {
        let grants = Grants::build(&spec)?;
        let file = ActiveState::file(state_dir, &spec.name, &spec.group);
        let manifest = compile_version(&runtime, &spec, &grants, &spec.component).await?;
        let remembered = match ActiveState::read(&file) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(pipeline = %spec.name, "ignoring an unreadable state file: {e}");
                None
            }
        };
        let canary_ended = remembered.as_ref().is_some_and(|r| r.canary.is_some());
        if let Some(c) = remembered.as_ref().and_then(|r| r.canary.as_ref()) {
            tracing::warn!(pipeline = %spec.name, candidate = %short(&c.candidate), path = %c.path.display(), percent = c.percent, "a canary was running when the host stopped; the restart ended it (not resumed): the active version judges every batch, start the canary again to go on");
        }
        let restore = match remembered {
            Some(st) if st.active_hash == manifest.hash => {
                tracing::info!(pipeline = %spec.name, version = %short(&manifest.hash), state = %file.display(), "the version active before the restart is the manifest's component: starting on it");
                None
            }
            Some(st) if st.manifest_hash != manifest.hash => {
                tracing::info!(pipeline = %spec.name, remembered = %short(&st.active_hash), manifest = %short(&manifest.hash), "the manifest's component changed since the last run: starting on it, not on the version active before");
                None
            }
            Some(st) => match compile_version(&runtime, &spec, &grants, &st.active_path).await {
                Ok(c) if c.hash == st.active_hash => Some((st.active_path, c)),
                Ok(c) => {
                    tracing::warn!(pipeline = %spec.name, path = %st.active_path.display(), expected = %short(&st.active_hash), found = %short(&c.hash), "the version active before the restart has changed on disk: starting on the manifest's component");
                    None
                }
                Err(e) => {
                    tracing::warn!(pipeline = %spec.name, "the version active before the restart cannot be loaded, starting on the manifest's component: {e}");
                    None
                }
            },
            None => {
                tracing::info!(pipeline = %spec.name, state = %file.display(), "no version remembered for this pipeline and group: starting on the manifest's component");
                None
            }
        };
        let manifest_hash = manifest.hash.clone();
        let (start, kept) = match restore {
            Some((path, c)) => {
                tracing::info!(pipeline = %spec.name, version = %short(&c.hash), manifest = %short(&manifest_hash), "coming back on the version active before the restart (the manifest's component is unchanged; it is kept for rollback)");
                let kept = Kept {
                    hash: manifest.hash.clone(),
                    path: spec.component.clone(),
                    compiled: manifest,
                    loaded_at_ms: now_ms(),
                };
                ((path, c), Some(kept))
            }
            None => ((spec.component.clone(), manifest), None),
        };
        let version = instantiate_version(
            &runtime,
            &spec,
            &grants,
            &start.0,
            start.1,
            limits(&spec, &grants),
            spec.concurrency,
        )
        .await?;
        tracing::info!(pipeline = %spec.name, version = %short(&version.hash), "plugin loaded");
        let mut pipeline = Self::with_version(spec, grants, runtime, metrics, version);
        if let Some(p) = Arc::get_mut(&mut pipeline) {
            p.state_file = Some(file);
            p.manifest_hash = manifest_hash;
            if let Some(k) = kept {
                lock(&p.history).push_front(k);
            }
        }
        if canary_ended {
            pipeline.remember_active();
        }
        pipeline.start_manifest_shadow().await
    }

    /// A pipeline whose batches go to a trusted native handler instead of `spec.component`
    /// (which is not loaded). A hot-swap still loads a Wasm component in its place.
    pub fn native(
        spec: PipelineSpec,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
        handler: Arc<dyn NativeHandler>,
    ) -> Arc<Pipeline> {
        let version = Version::native(handler, spec.concurrency);
        tracing::info!(pipeline = %spec.name, version = %version.hash, "native handler in place of a plugin");
        // A native handler uses no grant; a later hot-swap to a component gets the
        // manifest's, or none when they cannot be built (say, a secret that is not set).
        let grants = Grants::build(&spec).unwrap_or_else(|e| {
            tracing::warn!(pipeline = %spec.name, "grants for a later hot-swap unavailable: {e}");
            Grants::default()
        });
        Self::with_version(spec, grants, runtime, metrics, version)
    }

    fn with_version(
        spec: PipelineSpec,
        grants: Grants,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
        version: Version,
    ) -> Arc<Pipeline> {
        let pipeline = Arc::new(Pipeline {
            spec,
            grants,
            runtime,
            metrics,
            manifest_hash: version.hash.clone(),
            active: Mutex::new(Arc::new(version)),
            history: Mutex::new(VecDeque::new()),
            shadow: Mutex::new(None),
            canary: Mutex::new(None),
            last_canary: Mutex::new(None),
            state_file: None,
            swapping: tokio::sync::Mutex::new(()),
            state: Mutex::new("starting".into()),
            counters: Mutex::new(HashMap::new()),
            dead_lettered: AtomicU64::new(0),
            broker_dlq: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            joined: std::sync::atomic::AtomicBool::new(false),
            engine: EngineCounts::default(),
            writes: WriteCounts::default(),
            last_swap_error: Mutex::new(None),
            last_error: Mutex::new(None),
            unmapped: Mutex::new(BTreeSet::new()),
            stall: Mutex::new(SwapStall::default()),
            last_faults: Mutex::new(LastFaults::default()),
            recent_faults: Arc::default(),
        });
        let active = lock(&pipeline.active).clone();
        pipeline.publish_version_info(&active, 1);
        pipeline.init_series(&active.hash);
        pipeline
    }

    /// Creates the pipeline's series of every family at zero, so dashboards and alerts see
    /// them from the start, not from their first event.
    fn init_series(&self, hash: &str) {
        let m = &self.metrics;
        let l: Labels = vec![("pipeline", self.spec.name.clone())];
        let _ = m.in_flight.get_or_create(&l);
        let _ = m.session_resets.get_or_create(&l);
        let _ = m.rebalances.get_or_create(&l);
        let _ = m.released_by_broker.get_or_create(&l);
        let _ = m.released_at_delivery_limit.get_or_create(&l);
        let _ = m.writes_waiting.get_or_create(&l);
        let _ = m.released_unwritten.get_or_create(&l);
        let _ = m.dead_letters_shrunk.get_or_create(&l);
        let _ = m.pipeline_up.get_or_create(&l);
        let _ = m.delivery_count.get_or_create(&l);
        for kind in ["output", "dead_letter"] {
            let mut l = l.clone();
            l.push(("kind", kind.into()));
            let _ = m.write_seconds.get_or_create(&l);
        }
        for request in ["fetch", "acknowledge"] {
            let mut l = l.clone();
            l.push(("request", request.into()));
            let _ = m.request_seconds.get_or_create(&l);
        }
        for result in ["ok", "failed"] {
            let mut l = l.clone();
            l.push(("result", result.into()));
            let _ = m.acks.get_or_create(&l);
        }
        // Alerts on rare events (`increase(...[15m]) > 0`) see the first one only when its
        // series was there before it, at 0.
        for result in ["ok", "failed", "rollback"] {
            let mut l = l.clone();
            l.push(("result", result.into()));
            let _ = m.swaps.get_or_create(&l);
        }
        for result in ["started", "promoted", "rolled_back"] {
            let mut l = l.clone();
            l.push(("result", result.into()));
            let _ = m.canary_transitions.get_or_create(&l);
        }
        let v = self.labels(hash);
        let _ = m.batches.get_or_create(&v);
        let _ = m.guest_seconds.get_or_create(&v);
        let _ = m.renewals.get_or_create(&v);
        let _ = m.dead_lettered.get_or_create(&v);
        for verdict in ["accept", "release", "reject", "renew", "retry"] {
            let mut l = v.clone();
            l.push(("verdict", verdict.into()));
            let _ = m.records.get_or_create(&l);
        }
        for result in ["produced", "discarded", "failed"] {
            let mut l = v.clone();
            l.push(("result", result.into()));
            let _ = m.emits.get_or_create(&l);
        }
    }

    /// The pipeline's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The component path of the active version.
    pub fn component(&self) -> PathBuf {
        lock(&self.active).path.clone()
    }

    /// Content hash of the active version.
    pub fn active_hash(&self) -> String {
        lock(&self.active).hash.clone()
    }

    /// The last faults this pipeline met (plugin faults of every role, refused swaps), newest
    /// first.
    pub fn recent_faults(&self) -> Vec<RecentFault> {
        self.recent_faults.newest_first()
    }

    /// Status for `GET /pipelines`.
    pub fn status(&self) -> PipelineStatus {
        let active = lock(&self.active).clone();
        let waiting = self.writes.waiting.load(Ordering::Relaxed);
        let state = lock(&self.state).clone();
        PipelineStatus {
            name: self.spec.name.clone(),
            state: match state.as_str() {
                "running" if !self.joined.load(Ordering::Relaxed) => "joining".to_owned(),
                "running" if waiting > 0 => "degraded".to_owned(),
                _ => state,
            },
            writes_waiting: waiting as u64,
            in_flight_peak: self.engine.peak.load(Ordering::Relaxed),
            in_flight_limit: self.engine.limit.load(Ordering::Relaxed),
            fetches: self.engine.fetches.load(Ordering::Relaxed),
            acquired: self.engine.acquired.load(Ordering::Relaxed),
            acquired_split: self.engine.acquired_split.load(Ordering::Relaxed),
            write_failures: self.writes.failures.load(Ordering::Relaxed),
            released_unwritten: self.writes.released.load(Ordering::Relaxed),
            dead_letters_shrunk: self.writes.shrunk.load(Ordering::Relaxed),
            active_version: active.hash.clone(),
            component: active.path.display().to_string(),
            versions: lock(&self.counters).clone(),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            last_error: lock(&self.last_error).clone(),
            unmapped_outputs: lock(&self.unmapped).iter().cloned().collect(),
            last_swap_error: lock(&self.last_swap_error).clone(),
            last_swap_stall_ms: lock(&self.stall).last.map(|d| d.as_secs_f64() * 1e3),
            signer: active.signer(),
            allocator: active
                .placement
                .as_ref()
                .map_or("native", |p| p.allocator.name())
                .to_owned(),
            allocator_reason: active.placement.as_ref().and_then(|p| p.reason.clone()),
            shadow: lock(&self.shadow).as_ref().map(|s| lock(&s.status).clone()),
            canary: match lock(&self.canary).as_ref() {
                Some(c) => Some(canary_status(c, CanaryState::Running, None)),
                None => lock(&self.last_canary).clone(),
            },
            grants: GrantsStatus {
                outputs: self.spec.outputs.clone(),
                allowed_outbound_hosts: self
                    .spec
                    .http
                    .as_ref()
                    .map(|h| h.allowed_outbound_hosts.clone())
                    .unwrap_or_default(),
                secrets: self.grants.secrets.names().map(str::to_owned).collect(),
            },
        }
    }

    /// Loads `path` as the new version; it takes the next batch. A version that fails to load
    /// or initialise leaves the old one running, and the failure is returned and remembered.
    pub async fn swap(&self, path: &Path) -> Result<String, SwapError> {
        let _one_at_a_time = self.swapping.lock().await;
        let labels: Labels = vec![("pipeline", self.spec.name.clone())];
        lock(&self.stall).swap_requested();
        match load_version(&self.runtime, &self.spec, &self.grants, path).await {
            Ok(v) => {
                let hash = v.hash.clone();
                lock(&self.stall).swap_ready(&hash);
                self.activate(v, "hot-swapped");
                *lock(&self.last_swap_error) = None;
                let mut l = labels;
                l.push(("result", "ok".into()));
                self.metrics.swaps.get_or_create(&l).inc();
                Ok(hash)
            }
            Err(e) => {
                lock(&self.stall).swap_refused();
                tracing::error!(pipeline = %self.spec.name, "hot-swap refused, the old version keeps running: {e}");
                self.recent_faults.note(RecentFault::now(
                    &self.spec.name,
                    FaultRole::Swap,
                    "refused",
                    &e.to_string(),
                ));
                *lock(&self.last_swap_error) = Some(e.to_string());
                let mut l = labels;
                l.push(("result", "failed".into()));
                self.metrics.swaps.get_or_create(&l).inc();
                Err(e)
            }
        }
    }

    /// Makes `v` the active version: the replaced one is kept compiled for rollback, and the
    /// state file remembers `v` for a restart. Batches already running finish on the version
    /// they started with.
    fn activate(&self, v: impl Into<Arc<Version>>, how: &str) {
        let v: Arc<Version> = v.into();
        let hash = v.hash.clone();
        self.publish_version_info(&v, 1);
        let old = std::mem::replace(&mut *lock(&self.active), v);
        self.publish_version_info(&old, 0);
        tracing::info!(pipeline = %self.spec.name, from = %short(&old.hash), to = %short(&hash), "plugin {how}");
        {
            let mut history = lock(&self.history);
            history.retain(|k| k.hash != hash && k.hash != old.hash);
            if let Some(compiled) = &old.compiled {
                history.push_front(Kept {
                    hash: old.hash.clone(),
                    path: old.path.clone(),
                    compiled: compiled.clone(),
                    loaded_at_ms: old.loaded_at_ms,
                });
            }
            history.truncate(KEPT_VERSIONS);
        }
        self.remember_active();
    }

    /// `sharehost_plugin_version{pipeline, version, signer}`: 1 for the active version, 0 for
    /// one it replaced, so dashboards join any per-version metric with who signed it.
    fn publish_version_info(&self, v: &Version, active: i64) {
        self.metrics
            .plugin_version
            .get_or_create(&vec![
                ("pipeline", self.spec.name.clone()),
                ("version", short(&v.hash).to_owned()),
                ("signer", v.signer().unwrap_or_default()),
            ])
            .set(active);
    }

    /// Writes the state file (when this pipeline keeps one); a failure is logged, not fatal.
    fn remember_active(&self) {
        let Some(file) = &self.state_file else {
            return;
        };
        let active = lock(&self.active).clone();
        let state = ActiveState {
            pipeline: self.spec.name.clone(),
            group: self.spec.group.clone(),
            active_hash: active.hash.clone(),
            active_path: active.path.clone(),
            manifest_hash: self.manifest_hash.clone(),
            canary: lock(&self.canary).as_ref().map(|c| CanaryNote {
                candidate: c.version.hash.clone(),
                path: c.version.path.clone(),
                percent: lock(&c.plan).request.percent,
            }),
        };
        if let Err(e) = state.write(file) {
            tracing::warn!(pipeline = %self.spec.name, "cannot remember the active version for a restart: {e}");
        }
    }

    /// Switches back to a kept version (the newest one, or the one whose hash starts with
    /// `hash`), without compiling: its code was kept. Returns the now active hash.
    pub async fn rollback(&self, hash: Option<&str>) -> Result<String, SwapError> {
        let _one_at_a_time = self.swapping.lock().await;
        let err = |message: String| SwapError {
            pipeline: self.spec.name.clone(),
            path: PathBuf::new(),
            message,
        };
        let kept = {
            let history = lock(&self.history);
            match hash {
                None => history.front().cloned(),
                Some(h) => history.iter().find(|k| k.hash.starts_with(h)).cloned(),
            }
        };
        let Some(kept) = kept else {
            let known: Vec<String> = lock(&self.history)
                .iter()
                .map(|k| short(&k.hash).to_owned())
                .collect();
            return Err(err(match hash {
                None => "no earlier version is kept to roll back to".into(),
                Some(h) => format!("no kept version matches {h:?} (kept: {known:?})"),
            }));
        };
        let v = instantiate_version(
            &self.runtime,
            &self.spec,
            &self.grants,
            &kept.path,
            kept.compiled.clone(),
            limits(&self.spec, &self.grants),
            self.spec.concurrency,
        )
        .await?;
        // The same version as before, loaded when it first was.
        let v = Version {
            loaded_at_ms: kept.loaded_at_ms,
            ..v
        };
        let hash = v.hash.clone();
        self.activate(v, "rolled back");
        self.metrics
            .swaps
            .get_or_create(&vec![
                ("pipeline", self.spec.name.clone()),
                ("result", "rollback".into()),
            ])
            .inc();
        Ok(hash)
    }

    /// The active version and the kept ones, for `GET /pipelines/NAME/versions`.
    pub fn versions(&self) -> VersionsStatus {
        let active = lock(&self.active).clone();
        let counters = lock(&self.counters).clone();
        let mut versions = vec![VersionInfo {
            hash: active.hash.clone(),
            path: active.path.display().to_string(),
            loaded_at_ms: active.loaded_at_ms,
            signer: active.signer(),
            active: true,
            counters: counters.get(&active.hash).cloned().unwrap_or_default(),
        }];
        for k in lock(&self.history).iter() {
            versions.push(VersionInfo {
                hash: k.hash.clone(),
                path: k.path.display().to_string(),
                loaded_at_ms: k.loaded_at_ms,
                signer: k.compiled.signer.clone(),
                active: false,
                counters: counters.get(&k.hash).cloned().unwrap_or_default(),
            });
        }
        VersionsStatus {
            active: active.hash.clone(),
            versions,
        }
    }

    /// Starts shadowing `req.path`: it judges copies of (a sample of) the batches the active
    /// version judged, on its own single instance, and is compared, never acted on. It gets
    /// the pipeline's output names but its emits are discarded, and no HTTP: a candidate that
    /// imports `wasi:http` is refused as a shadow (its answers would depend on calls that a
    /// shadow must not make). Replaces a running shadow.
    pub async fn start_shadow(&self, req: ShadowRequest) -> Result<String, SwapError> {
        let err = |message: String| SwapError {
            pipeline: self.spec.name.clone(),
            path: req.path.clone(),
            message,
        };
        req.validate().map_err(err)?;
        let _one_at_a_time = self.swapping.lock().await;
        let shadow_limits = PluginLimits {
            http: None,
            ..limits(&self.spec, &self.grants)
        };
        let compiled = self
            .runtime
            .compile(&req.path, &shadow_limits)
            .await
            .map_err(|e| err(format!("as a shadow: {e}")))?;
        let version = instantiate_version(
            &self.runtime,
            &self.spec,
            &self.grants,
            &req.path,
            compiled,
            shadow_limits,
            1,
        )
        .await?;
        let hash = version.hash.clone();
        let status = ShadowStatus {
            candidate: hash.clone(),
            path: req.path.display().to_string(),
            sample: req.sample,
            ..ShadowStatus::default()
        };
        *lock(&self.shadow) = Some(Arc::new(ShadowRun {
            version,
            sample: req.sample,
            offered: AtomicU64::new(0),
            queue: Arc::new(Semaphore::new(SHADOW_QUEUE)),
            turn: tokio::sync::Mutex::new(()),
            status: Mutex::new(status),
        }));
        tracing::info!(pipeline = %self.spec.name, candidate = %short(&hash), sample = req.sample, "shadow started");
        Ok(hash)
    }

    /// Stops the shadow; returns what it saw.
    pub fn stop_shadow(&self) -> Option<ShadowStatus> {
        let run = lock(&self.shadow).take()?;
        let status = lock(&run.status).clone();
        tracing::info!(pipeline = %self.spec.name, candidate = %short(&status.candidate), records = status.records, disagreed = ?status.disagreed, "shadow stopped");
        Some(status)
    }

    /// Starts a canary: the candidate judges `percent` of the batches for real, and is
    /// promoted or rolled back by [`CanaryPlan`]'s rules. Replaces nothing: a second canary
    /// while one runs is refused.
    pub async fn start_canary(&self, req: CanaryRequest) -> Result<String, SwapError> {
        let err = |message: String| SwapError {
            pipeline: self.spec.name.clone(),
            path: req.path.clone(),
            message,
        };
        req.validate().map_err(err)?;
        let _one_at_a_time = self.swapping.lock().await;
        if let Some(c) = lock(&self.canary).as_ref() {
            return Err(err(format!(
                "a canary of {} is already running: promote it or roll it back first",
                short(&c.version.hash)
            )));
        }
        let version = load_version(&self.runtime, &self.spec, &self.grants, &req.path).await?;
        if version.hash == lock(&self.active).hash {
            return Err(err("the candidate is the active version".into()));
        }
        let hash = version.hash.clone();
        tracing::info!(pipeline = %self.spec.name, candidate = %short(&hash), percent = req.percent, "canary started");
        self.count_canary("started");
        *lock(&self.canary) = Some(Arc::new(CanaryRun {
            version: Arc::new(version),
            plan: Mutex::new(CanaryPlan::new(req)),
        }));
        self.remember_active();
        Ok(hash)
    }

    /// Ends the running canary now, an operator's decision: promoted (`promote`) or rolled
    /// back. Returns the active hash.
    pub async fn end_canary_now(&self, promote: bool) -> Result<String, SwapError> {
        let _one_at_a_time = self.swapping.lock().await;
        let reason = if promote {
            "promoted by the operator"
        } else {
            "rolled back by the operator"
        };
        self.end_canary(promote, reason.into())
            .ok_or_else(|| SwapError {
                pipeline: self.spec.name.clone(),
                path: PathBuf::new(),
                message: "no canary is running".into(),
            })
    }

    /// Ends the running canary (if any, and if it is still the one running): promoted, its
    /// version becomes the active one; rolled back, it is dropped. Logged, counted and kept
    /// for `GET /pipelines` with `reason`. Returns the active hash.
    fn end_canary(&self, promote: bool, reason: String) -> Option<String> {
        let run = lock(&self.canary).take()?;
        let state = if promote {
            CanaryState::Promoted
        } else {
            CanaryState::RolledBack
        };
        let status = canary_status(&run, state, Some(reason.clone()));
        *lock(&self.last_canary) = Some(status);
        self.count_canary(if promote { "promoted" } else { "rolled_back" });
        if promote {
            tracing::info!(pipeline = %self.spec.name, candidate = %short(&run.version.hash), %reason, "canary promoted");
            // The canary's version (the same one: batches it is judging now give their
            // instance back to it) becomes the active one.
            self.activate(run.version.clone(), "promoted from canary");
        } else {
            tracing::warn!(pipeline = %self.spec.name, candidate = %short(&run.version.hash), %reason, "canary rolled back");
            self.remember_active();
        }
        Some(self.active_hash())
    }

    fn count_canary(&self, result: &str) {
        self.metrics
            .canary_transitions
            .get_or_create(&vec![
                ("pipeline", self.spec.name.clone()),
                ("result", result.to_owned()),
            ])
            .inc();
    }

    fn set_state(&self, s: &str) {
        *lock(&self.state) = s.to_owned();
        if s != "running" {
            self.metrics
                .pipeline_up
                .get_or_create(&vec![("pipeline", self.spec.name.clone())])
                .set(0);
        }
    }

    fn count(&self, hash: &str, f: impl FnOnce(&mut VersionCounters)) {
        f(lock(&self.counters).entry(hash.to_owned()).or_default());
    }

    fn labels(&self, hash: &str) -> Labels {
        vec![
            ("pipeline", self.spec.name.clone()),
            ("version", short(hash).to_owned()),
        ]
    }

    /// Runs the pipeline until `shutdown`: consume, judge, acknowledge, dead-letter; then drain:
    /// stop fetching, let running batches finish (bounded), flush verdicts, release the rest,
    /// close the sessions and leave the group.
    pub async fn run(
        self: Arc<Self>,
        client: Arc<KafkaClient>,
        shutdown: CancellationToken,
    ) -> Result<(), String> {
        let result = self.clone().serve(client, shutdown).await;
        if let Err(e) = &result {
            *lock(&self.last_error) = Some(e.clone());
            self.set_state("failed");
        }
        result
    }

    /// One run of the pipeline (see [`Pipeline::run`]).
    async fn serve(
        self: Arc<Self>,
        client: Arc<KafkaClient>,
        shutdown: CancellationToken,
    ) -> Result<(), String> {
        self.topics_exist(&client).await?;
        let delivery_limit = self.delivery_limit(&client).await?;
        self.broker_dead_letters(&client).await?;
        let spec = &self.spec;
        let mut cfg = ShareConsumerConfig::new(
            &spec.group,
            &spec.topics.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        cfg.max_in_flight = spec.max_in_flight;
        cfg.max_records = i32::try_from(spec.max_in_flight.min(10_000)).unwrap_or(500);
        cfg.batch_size = i32::try_from(spec.batch_size).unwrap_or(500);
        cfg.delivery_count_limit = spec.delivery_cap;
        cfg.archive_at = delivery_limit;
        // With a dead-letter topic, capped records come to us still acquired, so they can be
        // dead-lettered before their Reject goes out.
        cfg.reject_poison = spec.dead_letter_topic.is_none();
        cfg.auto_renew_after = Some(spec.auto_renew_after);
        cfg.pace_within = Some(PACE_WITHIN);
        // Whole producer batches while the room holds the largest one seen (a batch the broker
        // splits costs it a lock timer per record), at most MaxRecords per request otherwise:
        // `max_in_flight` holds unless a batch larger than any seen before arrives.
        cfg.acquire_mode = AcquireMode::Fitted;
        cfg.min_in_flight = spec.batch_size.saturating_mul(spec.concurrency);
        // Held (locked) for as long as the pipeline runs: see `MemberIdentity`.
        let identity = self.member_identity();
        cfg.member_id = identity.as_ref().map(|i| i.id().to_owned());
        cfg.observer = Some(Arc::new(RequestTimes {
            metrics: self.metrics.clone(),
            pipeline: spec.name.clone(),
        }));
        let consumer = Arc::new(
            ShareConsumer::start(client.clone(), cfg)
                .await
                .map_err(|e| format!("pipeline {}: {e}", spec.name))?,
        );
        self.set_state("running");
        *lock(&self.last_error) = None;
        tracing::info!(pipeline = %spec.name, group = %spec.group, topics = ?spec.topics, member = consumer.member_id(), "pipeline running");
        let permits = Arc::new(Semaphore::new(spec.concurrency));
        let (requeue_tx, mut requeue_rx) = mpsc::unbounded_channel::<ShareRecord>();
        // Records held at a plugin's `retry`, released when due (earliest first).
        let (retry_tx, mut retry_rx) = mpsc::unbounded_channel::<Held>();
        let mut held: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
        let renewals: Arc<Mutex<HashMap<(TopicIdPartition, i64), u32>>> = Arc::default();
        let mut running = JoinSet::new();
        let mut backlog: VecDeque<ShareRecord> = VecDeque::new();
        let mut failure = None;
        let ctx = BatchContext {
            consumer: consumer.clone(),
            client: client.clone(),
            requeue: requeue_tx.clone(),
            renewals: renewals.clone(),
            retries: retry_tx.clone(),
            stop: shutdown.clone(),
        };
        let lag_watch = {
            let (this, client, stop) = (self.clone(), client.clone(), shutdown.clone());
            tokio::spawn(async move { this.watch_lag(&client, &stop).await })
        };
        let _lag_watch = AbortOnDrop(lag_watch);
        loop {
            while let Ok(r) = requeue_rx.try_recv() {
                backlog.push_back(r);
            }
            while let Ok(h) = retry_rx.try_recv() {
                held.push(Reverse(h));
            }
            release_due(&consumer, &mut held);
            // Far in the future when nothing is held: the branch below then never fires.
            let next_due = held
                .peek()
                .map_or_else(|| Instant::now() + Duration::from_secs(3600), |h| h.0.due);
            if backlog.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep_until(next_due.into()) => continue,
                    h = retry_rx.recv() => if let Some(h) = h { held.push(Reverse(h)) },
                    r = consumer.poll(Duration::from_millis(500)) => match r {
                        Ok(Some(d)) => {
                            if !d.poison.is_empty() {
                                let this = self.clone();
                                let (c, k, stop) = (consumer.clone(), client.clone(), shutdown.clone());
                                running.spawn(async move { this.handle_poison(&c, &k, d.poison, &stop).await });
                            }
                            backlog.extend(d.records);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            failure = Some(format!("pipeline {}: {e}", spec.name));
                            break;
                        }
                    },
                    r = requeue_rx.recv() => if let Some(r) = r { backlog.push_back(r) },
                }
            }
            self.publish_engine_stats(&consumer);
            while let Some(Ok(())) = running.try_join_next() {}
            if backlog.is_empty() {
                continue;
            }
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next_due.into()) => continue,
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            };
            self.start_batch(&ctx, &mut backlog, permit, &mut running);
        }
        // Drain: no more records are acquired; what is held is judged while time allows (the
        // engine acquires only what the plugin judges within `PACE_WITHIN`, so usually all of
        // it), and only what is left then is released: each release spends a delivery.
        self.set_state("draining");
        consumer.stop_acquiring();
        tracing::info!(pipeline = %spec.name, running = running.len(), unjudged = backlog.len(), "draining");
        let drain_started = Instant::now();
        if failure.is_none() {
            let judge_until = tokio::time::Instant::now() + DRAIN_JUDGING;
            loop {
                while let Ok(r) = requeue_rx.try_recv() {
                    backlog.push_back(r);
                }
                // Deliveries already acquired and queued in the engine.
                while let Ok(Some(d)) = consumer.poll(Duration::ZERO).await {
                    if !d.poison.is_empty() {
                        let (this, c, k, stop) = (
                            self.clone(),
                            consumer.clone(),
                            client.clone(),
                            shutdown.clone(),
                        );
                        running.spawn(
                            async move { this.handle_poison(&c, &k, d.poison, &stop).await },
                        );
                    }
                    backlog.extend(d.records);
                }
                if backlog.is_empty() {
                    if running.is_empty() {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(judge_until) => break,
                        _ = running.join_next() => {}
                        r = requeue_rx.recv() => if let Some(r) = r { backlog.push_back(r) },
                    }
                    continue;
                }
                let permit = tokio::select! {
                    _ = tokio::time::sleep_until(judge_until) => break,
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                };
                self.start_batch(&ctx, &mut backlog, permit, &mut running);
            }
        }
        if !backlog.is_empty() {
            tracing::warn!(pipeline = %spec.name, records = backlog.len(), "not judged before the drain's end: released");
        }
        for r in backlog.drain(..) {
            let _ = consumer.acknowledge(&r, AckKind::Release);
        }
        let left = DRAIN_TIMEOUT.saturating_sub(drain_started.elapsed());
        if tokio::time::timeout(left, async { while running.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!(pipeline = %spec.name, "batches still running after {DRAIN_TIMEOUT:?}; their records are released");
            running.abort_all();
        }
        while let Ok(r) = requeue_rx.try_recv() {
            let _ = consumer.acknowledge(&r, AckKind::Release);
        }
        // Held records are released now, not at their due time: their delay was a plugin's
        // wish, and the next member honours it no less than a redelivery does.
        drop(retry_tx);
        while let Ok(h) = retry_rx.try_recv() {
            held.push(Reverse(h));
        }
        for Reverse(h) in held.drain() {
            let _ = consumer.acknowledge(&h.record, AckKind::Release);
        }
        if !consumer.flush(Duration::from_secs(30)).await {
            tracing::warn!(pipeline = %spec.name, "not every verdict was confirmed before close");
        }
        consumer.close(Duration::from_secs(30)).await;
        self.publish_engine_stats(&consumer);
        self.set_state(if failure.is_some() {
            "failed"
        } else {
            "stopped"
        });
        drop(identity);
        tracing::info!(pipeline = %spec.name, "pipeline stopped");
        match failure {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// Checks that the topics the pipeline writes to exist before it acquires anything: a
    /// record it could never write would only be held. Names the manifest key of each that
    /// is missing; the host runs the pipeline again (with backoff) until they exist.
    async fn topics_exist(&self, client: &KafkaClient) -> Result<(), String> {
        let spec = &self.spec;
        let mut needed: Vec<(String, &String)> = spec
            .outputs
            .iter()
            .map(|(name, topic)| (format!("pipeline.outputs.{name}"), topic))
            .collect();
        if let Some(dlq) = &spec.dead_letter_topic {
            needed.push(("dead_letter_topic".to_owned(), dlq));
        }
        if needed.is_empty() {
            return Ok(());
        }
        let topics: Vec<String> = needed.iter().map(|(_, t)| (*t).clone()).collect();
        client
            .refresh_metadata(&topics)
            .await
            .map_err(|e| format!("pipeline {}: {e}", spec.name))?;
        let missing: Vec<String> = needed
            .iter()
            .filter(|(_, t)| client.topic(t).is_none())
            .map(|(key, t)| format!("{key} names topic {t:?}, which does not exist"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "pipeline {}: {}; it waits for them before it acquires a record (create them)",
            spec.name,
            missing.join("; ")
        ))
    }

    /// Checks `delivery_cap` against the group's delivery limit (`share.delivery.count.limit`,
    /// the group's own or the broker's): above it, the broker archives a record at its last
    /// delivery before the host's cap is ever reached, without a dead letter.
    /// Sets up, or notices, the group's broker-side dead-letter topic (KIP-1191, `share.version`
    /// 2 and up), which receives what the broker archives at the delivery limit: records whose
    /// last delivery the host never finished (it crashed, was killed, or lost the broker), and
    /// with it the Rejects. With `broker_dead_letter_topic` the host configures it (topic and
    /// group configs), after checking what the broker would otherwise refuse at write time,
    /// silently; without, a group configured so by someone else is noticed. Either way the
    /// host's own dead letters are then acknowledged as done (see [`Pipeline::reject`]).
    async fn broker_dead_letters(&self, client: &KafkaClient) -> Result<(), String> {
        let spec = &self.spec;
        let level = client.feature_level("share.version").await;
        let Some(topic) = &spec.broker_dead_letter_topic else {
            // Only noticed, so a broker that will not say is taken for one without it.
            let level = level.ok().flatten().unwrap_or(0);
            let configured = client
                .group_config(&spec.group, "errors.deadletterqueue.topic.name")
                .await
                .ok()
                .flatten()
                .filter(|t| !t.trim().is_empty());
            let active = level >= 2 && configured.is_some();
            if active {
                tracing::info!(pipeline = %spec.name, group = %spec.group, topic = ?configured, "the group has a broker dead-letter topic: records the host dead-letters itself are acknowledged as done, so the broker writes no second copy");
            }
            self.broker_dlq.store(active, Ordering::Relaxed);
            return Ok(());
        };
        let fail = |why: String| {
            format!(
                "pipeline {}: broker_dead_letter_topic {topic}: {why}",
                spec.name
            )
        };
        let level = level
            .map_err(|e| fail(format!("cannot read the cluster's share.version: {e}")))?
            .unwrap_or(0);
        if level < 2 {
            return Err(fail(format!(
                "the cluster's share.version is {level}; broker dead-letter topics need share.version 2 (Kafka 4.4: kafka-features upgrade --feature share.version=2)"
            )));
        }
        let prefix = client
            .broker_config("errors.deadletterqueue.topic.name.prefix")
            .await
            .map_err(|e| fail(format!("cannot read the broker's dead-letter prefix: {e}")))?
            .unwrap_or_default();
        if !topic.starts_with(&prefix) {
            return Err(fail(format!(
                "the broker takes only dead-letter topics whose name starts with \"{prefix}\" (errors.deadletterqueue.topic.name.prefix) and would archive without writing"
            )));
        }
        client
            .alter_topic_configs(
                topic,
                &[("errors.deadletterqueue.group.enable", Some("true"))],
            )
            .await
            .map_err(|e| {
                fail(format!(
                    "cannot enable it as a group dead-letter topic: {e}"
                ))
            })?;
        client
            .alter_group_configs(
                &spec.group,
                &[
                    ("errors.deadletterqueue.topic.name", topic.as_str()),
                    ("errors.deadletterqueue.copy.record.enable", "true"),
                ],
            )
            .await
            .map_err(|e| fail(format!("cannot set it on group {}: {e}", spec.group)))?;
        tracing::info!(pipeline = %spec.name, group = %spec.group, %topic, "the broker dead-letters what it archives at the delivery limit into the broker dead-letter topic");
        self.broker_dlq.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The group's effective delivery limit (`None` when the broker would not say), checked
    /// against `delivery_cap`: a cap above it is refused, since the broker would archive a
    /// record before the cap saw it.
    async fn delivery_limit(&self, client: &KafkaClient) -> Result<Option<i16>, String> {
        let spec = &self.spec;
        let limit = match client
            .group_config(&spec.group, "share.delivery.count.limit")
            .await
        {
            Ok(v) => v.and_then(|v| v.parse::<i16>().ok()),
            Err(e) => {
                tracing::warn!(pipeline = %spec.name, group = %spec.group, "cannot read the group's delivery limit (to check delivery_cap against it and count what the broker archives): {e}");
                None
            }
        };
        match (spec.delivery_cap, limit) {
            (Some(cap), Some(limit)) if cap > limit => Err(format!(
                "pipeline {}: delivery_cap {cap} is above group {}'s delivery limit {limit} (share.delivery.count.limit): the broker would archive a record at its delivery {limit}, before the cap, without a dead letter; set delivery_cap to at most {limit}",
                spec.name, spec.group
            )),
            _ => Ok(limit),
        }
    }

    /// The member id this pipeline joined with before (beside its state file), claimed for
    /// this process; `None` (join with a fresh id) without a state file, when another live
    /// process holds it, or when the file cannot be used.
    fn member_identity(&self) -> Option<MemberIdentity> {
        let file = self.state_file.as_ref()?.with_extension("member");
        match MemberIdentity::claim(&file, &fresh_member_id()) {
            Ok(Claim::Claimed { identity, reused }) => {
                if reused {
                    tracing::info!(pipeline = %self.spec.name, member = identity.id(), "rejoining the group as the member this pipeline was before the restart");
                }
                Some(identity)
            }
            Ok(Claim::Taken) => {
                tracing::info!(pipeline = %self.spec.name, file = %file.display(), "another live process runs this pipeline with its kept member id: joining as a new member");
                None
            }
            Err(e) => {
                tracing::warn!(pipeline = %self.spec.name, file = %file.display(), "cannot keep the member id across restarts: {e}");
                None
            }
        }
    }

    /// Hands the next batch of `backlog` to a plugin instance, on a task of `running`.
    fn start_batch(
        self: &Arc<Self>,
        ctx: &BatchContext,
        backlog: &mut VecDeque<ShareRecord>,
        permit: OwnedSemaphorePermit,
        running: &mut JoinSet<()>,
    ) {
        let take = backlog.len().min(self.spec.batch_size);
        let mut batch: Vec<ShareRecord> = backlog.drain(..take).collect();
        // Records whose session died while they waited (a lost connection, a restarted
        // broker) are back with the broker already: judging them would only make duplicates.
        let stale = ctx.consumer.retain_held(&mut batch);
        if stale > 0 {
            tracing::debug!(pipeline = %self.spec.name, records = stale, "skipped records released with their share session");
        }
        if batch.is_empty() {
            return;
        }
        let (this, ctx) = (self.clone(), ctx.clone());
        running.spawn(async move { this.judge(&ctx, batch, permit).await });
    }

    /// Keeps `sharehost_share_group_lag` current: the group coordinator's lag per partition,
    /// asked every [`LAG_INTERVAL`] until `stop`. A failed ask keeps the last values (logged at
    /// debug: the run loop reports a coordinator that is really gone).
    async fn watch_lag(&self, client: &KafkaClient, stop: &CancellationToken) {
        loop {
            match crate::kafka::protocol::share_offsets::share_group_offsets(
                client,
                &self.spec.group,
            )
            .await
            {
                Ok(partitions) => {
                    for p in partitions
                        .iter()
                        .filter(|p| p.error_code == 0 && p.lag >= 0)
                    {
                        self.metrics
                            .share_group_lag
                            .get_or_create(&vec![
                                ("pipeline", self.spec.name.clone()),
                                ("topic", p.topic.clone()),
                                ("partition", p.partition.to_string()),
                            ])
                            .set(p.lag);
                    }
                }
                Err(e) => {
                    tracing::debug!(pipeline = %self.spec.name, group = %self.spec.group, "cannot read the group's lag: {e}");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(LAG_INTERVAL) => {}
            }
        }
    }

    fn publish_engine_stats(&self, consumer: &ShareConsumer) {
        let l: Labels = vec![("pipeline", self.spec.name.clone())];
        let s = consumer.stats();
        self.in_flight
            .store(consumer.in_flight() as u64, Ordering::Relaxed);
        let joined = consumer.joined();
        self.joined.store(joined, Ordering::Relaxed);
        let up = joined && lock(&self.state).as_str() == "running";
        self.metrics
            .pipeline_up
            .get_or_create(&l)
            .set(i64::from(up));
        let e = &self.engine;
        e.peak
            .store(s.in_flight_peak.load(Ordering::Relaxed), Ordering::Relaxed);
        e.limit
            .store(consumer.in_flight_limit() as u64, Ordering::Relaxed);
        e.fetches
            .store(s.fetches.load(Ordering::Relaxed), Ordering::Relaxed);
        e.acquired
            .store(s.acquired.load(Ordering::Relaxed), Ordering::Relaxed);
        e.acquired_split
            .store(s.acquired_split.load(Ordering::Relaxed), Ordering::Relaxed);
        self.metrics
            .in_flight
            .get_or_create(&l)
            .set(consumer.in_flight() as i64);
        // The engine's totals as counters: each advances by what its consumer counted since
        // the last look (a run after a failure starts a new consumer, whose totals start at 0).
        let m = &self.metrics;
        let mut last = lock(&self.engine.published);
        let mut advance = |i: usize, counter: &Counter, now: &AtomicU64| {
            let now = now.load(Ordering::Relaxed);
            let before = if now >= last[i] { last[i] } else { 0 };
            counter.inc_by(now - before);
            last[i] = now;
        };
        advance(0, &m.session_resets.get_or_create(&l), &s.session_resets);
        advance(1, &m.rebalances.get_or_create(&l), &s.assignment_changes);
        advance(
            2,
            &m.released_by_broker.get_or_create(&l),
            &s.released_by_broker,
        );
        for (i, (result, v)) in [("ok", &s.acks_ok), ("failed", &s.acks_failed)]
            .into_iter()
            .enumerate()
        {
            let mut l = l.clone();
            l.push(("result", result.into()));
            advance(3 + i, &m.acks.get_or_create(&l), v);
        }
        advance(
            5,
            &m.released_at_delivery_limit.get_or_create(&l),
            &s.released_at_limit,
        );
        drop(last);
        if let Some(http) = &self.grants.http {
            let c = http.stats().snapshot();
            for (result, v) in [
                ("sent", c.sent),
                ("refused_host", c.refused_by_list),
                ("refused_address", c.refused_by_address),
                ("failed", c.failed),
                ("timed_out", c.timed_out),
                ("too_large", c.too_large),
                ("in_flight", c.in_flight),
                ("waiting", c.waiting),
            ] {
                let mut l = l.clone();
                l.push(("result", result.into()));
                self.metrics
                    .http_requests
                    .get_or_create(&l)
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
    }

    /// One batch: plugin call, verdicts, acknowledgements. `permit` (one of the pipeline's
    /// `concurrency`) is held while the batch is judged and its writes first tried; a batch
    /// whose writes wait for a retry gives it back, so the pipeline judges on meanwhile.
    async fn judge(
        &self,
        ctx: &BatchContext,
        batch: Vec<ShareRecord>,
        permit: OwnedSemaphorePermit,
    ) {
        let BatchContext {
            consumer,
            client,
            requeue,
            renewals,
            retries,
            stop,
        } = ctx;
        let records: Arc<[Record]> = batch.iter().map(plugin_record).collect();
        let policy = match self.spec.fault_policy {
            FaultPolicy::Release => Verdict::Release,
            FaultPolicy::Reject => Verdict::Reject(None),
        };
        // A canary takes its share of the batches. Its verdicts are used only when it judged
        // the whole batch without a fault; otherwise nothing it decided is acted on (emits
        // included), it is rolled back, and the active version judges the batch: every
        // record is judged for real exactly once, by one version.
        let canary = lock(&self.canary)
            .clone()
            .filter(|c| lock(&c.plan).takes_next());
        let mut chosen = None;
        if let Some(run) = &canary {
            match self.judge_on(&run.version, &records, &policy, false).await {
                Some((judged, elapsed)) if judged.faults.is_empty() => {
                    let decision = {
                        let mut plan = lock(&run.plan);
                        plan.candidate.add(&judged.verdicts, false);
                        plan.after_candidate_batch()
                    };
                    chosen = Some((run.version.clone(), judged, elapsed));
                    self.decide_canary(run, decision);
                }
                other => {
                    let message = other
                        .as_ref()
                        .and_then(|(j, _)| j.faults.first())
                        .map_or_else(
                            || "no free instance".to_owned(),
                            |f| format!("{}: {}", f.kind, f.message),
                        );
                    tracing::warn!(pipeline = %self.spec.name, candidate = %short(&run.version.hash), records = batch.len(), "canary fault, the active version judges the batch: {message}");
                    let kind = other.as_ref().and_then(|(j, _)| j.faults.first());
                    self.recent_faults.note(
                        RecentFault::now(
                            &self.spec.name,
                            FaultRole::Canary,
                            kind.map_or("no_free_instance", |f| f.kind.as_str()),
                            &kind.map_or(message.clone(), |f| f.message.clone()),
                        )
                        .on_batch(
                            &run.version.hash,
                            batch.len(),
                            batch.first().map(|r| r.record.offset),
                            batch.last().map(|r| r.record.offset),
                        ),
                    );
                    if let Some((j, _)) = &other {
                        self.count(&run.version.hash, |c| {
                            c.faults += j.faults.len() as u64;
                            c.batches += 1;
                        });
                    }
                    let decision = {
                        let mut plan = lock(&run.plan);
                        plan.candidate.add_faulted();
                        plan.after_candidate_batch()
                    };
                    self.decide_canary(run, decision);
                }
            }
        }
        let by_canary = chosen.is_some();
        let (version, judged, elapsed) = match chosen {
            Some(c) => c,
            None => {
                let version = lock(&self.active).clone();
                let Some((judged, elapsed)) =
                    self.judge_on(&version, &records, &policy, true).await
                else {
                    // Cannot happen (one permit per instance); release rather than lose anything.
                    tracing::error!(pipeline = %self.spec.name, version = %short(&version.hash), records = batch.len(), "no free instance of the active version: batch released");
                    for r in &batch {
                        let _ = consumer.acknowledge(r, AckKind::Release);
                    }
                    return;
                };
                if let Some(run) = lock(&self.canary).as_ref() {
                    lock(&run.plan)
                        .active
                        .add(&judged.verdicts, !judged.faults.is_empty());
                }
                (version, judged, elapsed)
            }
        };
        let stall = lock(&self.stall).judged(&version.hash, Instant::now());
        if let Some(stall) = stall {
            tracing::info!(pipeline = %self.spec.name, version = %short(&version.hash), stall_ms = stall.as_secs_f64() * 1e3, "first batch judged by the swapped-in version");
        }
        let labels = self.labels(&version.hash);
        let Judged {
            verdicts,
            emits,
            faults,
            faulted,
        } = judged;
        if matches!(policy, Verdict::Release) && !faulted.is_empty() {
            let mut last = lock(&self.last_faults);
            for &(i, f) in &faulted {
                if let (Some(r), Some(fault)) = (batch.get(i), faults.get(f)) {
                    last.note(
                        (r.topic.clone(), r.partition.partition, r.record.offset),
                        fault,
                    );
                }
            }
        }
        if let Some(first) = faults.first() {
            let (lo, hi) = (
                batch.first().map(|r| r.record.offset),
                batch.last().map(|r| r.record.offset),
            );
            tracing::warn!(
                pipeline = %self.spec.name, version = %short(&version.hash), kind = %first.kind,
                records = batch.len(), first_offset = ?lo, last_offset = ?hi, faults = faults.len(),
                "plugin fault: {}", first.message
            );
            self.recent_faults.note(
                RecentFault::now(
                    &self.spec.name,
                    FaultRole::Active,
                    first.kind.as_str(),
                    &first.message,
                )
                .on_batch(&version.hash, batch.len(), lo, hi),
            );
            self.count(&version.hash, |c| c.faults += faults.len() as u64);
            for f in &faults {
                let mut l = labels.clone();
                l.push(("kind", f.kind.as_str().into()));
                self.metrics.faults.get_or_create(&l).inc();
            }
        }
        // A shadow compares what the active version decided (never a canary's batch).
        if !by_canary {
            self.offer_shadow(&batch, &records, &verdicts, &policy);
        }
        self.metrics
            .guest_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        {
            // One look-up per batch (the guard is not held across an await).
            let deliveries = self
                .metrics
                .delivery_count
                .get_or_create(&vec![("pipeline", self.spec.name.clone())]);
            for r in &batch {
                deliveries.observe(f64::from(r.delivery_count));
            }
        }
        self.metrics.batches.get_or_create(&labels).inc();
        self.count(&version.hash, |c| c.batches += 1);

        // Emits by source record: an accepted record with emits is accepted only after they
        // are produced; the emits of any other verdict are discarded.
        let mut emits_of: BTreeMap<usize, Vec<Emit>> = BTreeMap::new();
        for e in emits {
            emits_of.entry(e.record).or_default().push(e);
        }
        let mut discarded = 0u64;
        let mut rejects: Vec<(&ShareRecord, String)> = Vec::new();
        let mut finals: Vec<(&ShareRecord, AckKind)> = Vec::with_capacity(batch.len());
        let mut producing: Vec<(&ShareRecord, Vec<Emit>)> = Vec::new();
        {
            let mut renewed = lock(renewals);
            for (i, (r, v)) in batch.iter().zip(verdicts).enumerate() {
                let key = (r.partition, r.record.offset);
                let own = emits_of.remove(&i);
                // A record whose plugin meant to write where the manifest maps nothing ends
                // rejected with that reason, whatever its verdict: accepted, it would lack an
                // output; released, it would come back until the broker archives it.
                let unmapped = own
                    .iter()
                    .flatten()
                    .find(|e| !self.spec.outputs.contains_key(&*e.output));
                if let Some(e) = unmapped {
                    let why = self.misdirected(&e.output);
                    discarded += own.as_ref().map_or(0, |e| e.len() as u64);
                    if !renewed.is_empty() {
                        renewed.remove(&key);
                    }
                    rejects.push((r, why));
                    continue;
                }
                if !matches!(v, Verdict::Accept) {
                    discarded += own.as_ref().map_or(0, |e| e.len() as u64);
                }
                // A renewal the engine granted keeps the record's count; every other verdict
                // ends what the map knows of it (it only holds records a plugin renewed, so it
                // is usually empty, and it never outlives its records).
                if let Verdict::Renew = v {
                    let n = renewed.entry(key).or_insert(0);
                    *n += 1;
                    if *n <= self.spec.max_renewals
                        && matches!(consumer.acknowledge(r, AckKind::Renew), Ok(true))
                    {
                        self.record(&version.hash, "renew");
                        self.metrics.renewals.get_or_create(&labels).inc();
                        self.count(&version.hash, |c| c.renewed += 1);
                        let _ = requeue.send(r.clone());
                        continue;
                    }
                }
                if !renewed.is_empty() {
                    renewed.remove(&key);
                }
                let kind = match v {
                    Verdict::Accept => match own {
                        Some(own) => {
                            producing.push((r, own));
                            continue;
                        }
                        None => AckKind::Accept,
                    },
                    Verdict::Release => AckKind::Release,
                    Verdict::Reject(reason) => {
                        rejects.push((r, reject_reason(reason)));
                        continue;
                    }
                    Verdict::Retry(after_ms) => {
                        self.hold_for_retry(consumer, r, after_ms, retries, &version.hash);
                        continue;
                    }
                    // Out of renewals (or the record is no longer ours): give it back for
                    // another member or a later try.
                    Verdict::Renew => AckKind::Release,
                };
                finals.push((r, kind));
            }
        }
        if discarded > 0 {
            self.count_emits(&version.hash, "discarded", discarded);
        }
        self.ack_all(consumer, &finals, &version.hash);
        let permit = Mutex::new(Some(permit));
        if !producing.is_empty() {
            let unwritable = self
                .produce_outputs(client, consumer, &producing, &version.hash, stop, &permit)
                .await;
            rejects.extend(unwritable);
        }
        if !rejects.is_empty() {
            self.reject(consumer, client, &rejects, &version.hash, stop, &permit)
                .await;
        }
    }

    /// Judges `records` on one instance of `version` (taken and given back); `None` when the
    /// version has no free instance.
    async fn judge_on(
        &self,
        version: &Version,
        records: &Arc<[Record]>,
        policy: &Verdict,
        isolate: bool,
    ) -> Option<(Judged, Duration)> {
        let handler = lock(&version.instances).pop()?;
        let started = Instant::now();
        let (handler, judged) = handler.judge(records.clone(), policy, isolate).await;
        let elapsed = started.elapsed();
        if let Some(handler) = handler {
            lock(&version.instances).push(handler);
        }
        Some((judged, elapsed))
    }

    /// Acts on a canary's decision after one of its batches (if it is still the running one).
    fn decide_canary(&self, run: &Arc<CanaryRun>, decision: CanaryDecision) {
        let still_running = lock(&self.canary)
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, run));
        if !still_running {
            return;
        }
        match decision {
            CanaryDecision::Continue => {}
            CanaryDecision::Promote(reason) => {
                self.end_canary(true, reason);
            }
            CanaryDecision::RollBack(reason) => {
                self.end_canary(false, reason);
            }
        }
    }

    /// Hands a copy of the batch and the active version's verdicts to the shadow, if one runs
    /// and this batch is in its sample; dropped (and counted) when the shadow is behind.
    fn offer_shadow(
        &self,
        batch: &[ShareRecord],
        records: &Arc<[Record]>,
        verdicts: &[Verdict],
        policy: &Verdict,
    ) {
        let Some(run) = lock(&self.shadow).clone() else {
            return;
        };
        let n = run.offered.fetch_add(1, Ordering::Relaxed);
        let sampled = ((n + 1) as f64 * run.sample).floor() > (n as f64 * run.sample).floor();
        if !sampled {
            return;
        }
        let Ok(place) = run.queue.clone().try_acquire_owned() else {
            let mut st = lock(&run.status);
            st.dropped_batches += 1;
            st.dropped_records += records.len() as u64;
            return;
        };
        let coordinates: Vec<(String, i32, i64)> = batch
            .iter()
            .map(|r| (r.topic.to_string(), r.partition.partition, r.record.offset))
            .collect();
        let (records, active, policy) = (records.clone(), verdicts.to_vec(), policy.clone());
        let (metrics, pipeline) = (self.metrics.clone(), self.spec.name.clone());
        let recent_faults = self.recent_faults.clone();
        let (first, last) = (
            batch.first().map(|r| r.record.offset),
            batch.last().map(|r| r.record.offset),
        );
        tokio::spawn(async move {
            let _place = place;
            let _turn = run.turn.lock().await;
            let Some(handler) = lock(&run.version.instances).pop() else {
                return;
            };
            let started = Instant::now();
            // Its emits are dropped with `judged`: a shadow never produces anything.
            let (handler, judged) = handler.judge(records, &policy, true).await;
            let elapsed = started.elapsed();
            if let Some(handler) = handler {
                lock(&run.version.instances).push(handler);
            }
            if let Some(f) = judged.faults.first() {
                lock(&run.status).faults += judged.faults.len() as u64;
                recent_faults.note(
                    RecentFault::now(&pipeline, FaultRole::Shadow, f.kind.as_str(), &f.message)
                        .on_batch(&run.version.hash, coordinates.len(), first, last),
                );
                return;
            }
            lock(&run.status).compare(&coordinates, &active, &judged.verdicts, elapsed);
            let mut pairs: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for (a, c) in active.iter().zip(&judged.verdicts) {
                *pairs.entry((a.kind(), c.kind())).or_default() += 1;
            }
            for ((a, c), n) in pairs {
                metrics
                    .shadow_verdicts
                    .get_or_create(&vec![
                        ("pipeline", pipeline.clone()),
                        ("active", a.to_owned()),
                        ("candidate", c.to_owned()),
                    ])
                    .inc_by(n);
            }
        });
    }

    /// Holds a record a plugin asked to `retry` until its delay has passed (capped by
    /// `max_retry_delay_ms`, and by the lock time left when the engine cannot renew it), then
    /// the run loop releases it for redelivery. The record stays acquired and counted in
    /// flight meanwhile, so retries are bounded by `max_in_flight` like everything held.
    fn hold_for_retry(
        &self,
        consumer: &ShareConsumer,
        r: &ShareRecord,
        after_ms: u32,
        retries: &mpsc::UnboundedSender<Held>,
        hash: &str,
    ) {
        let mut delay = Duration::from_millis(u64::from(after_ms)).min(self.spec.max_retry_delay);
        if let Some(left) = consumer.hold_limit(r) {
            delay = delay.min(left.saturating_sub(RETRY_LOCK_MARGIN));
        }
        self.record(hash, "retry");
        self.count(hash, |c| c.retried += 1);
        let held = Held {
            due: Instant::now() + delay,
            record: r.clone(),
        };
        if let Err(mpsc::error::SendError(held)) = retries.send(held) {
            // The run loop is gone (draining): release now rather than hold.
            let _ = consumer.acknowledge(&held.record, AckKind::Release);
        }
    }

    fn count_emits(&self, hash: &str, result: &str, n: u64) {
        let mut l = self.labels(hash);
        l.push(("result", result.into()));
        self.metrics.emits.get_or_create(&l).inc_by(n);
        self.count(hash, |c| match result {
            "produced" => c.emits_produced += n,
            "discarded" => c.emits_discarded += n,
            _ => c.emits_failed += n,
        });
    }

    /// Produces the emits of accepted records (see [`crate::writes`]) and accepts each record
    /// once all of its emits landed. A record whose emits are still unwritten when the pipeline
    /// stops is released, never accepted: its outputs may then appear twice (those that did
    /// land), but an accepted record never lacks one. Returns the records whose emit can never
    /// be written (larger than its topic accepts), with the reason to reject them by.
    async fn produce_outputs<'r>(
        &self,
        client: &KafkaClient,
        consumer: &ShareConsumer,
        producing: &[(&'r ShareRecord, Vec<Emit>)],
        hash: &str,
        stop: &CancellationToken,
        permit: &Mutex<Option<OwnedSemaphorePermit>>,
    ) -> Vec<(&'r ShareRecord, String)> {
        let mut writes = Vec::new();
        for (owner, (r, emits)) in producing.iter().enumerate() {
            for e in emits {
                // A record with an emit to an unmapped output never gets here: `judge`
                // rejects it.
                if let Some(topic) = self.spec.outputs.get(&*e.output) {
                    writes.push(Write::new(
                        owner,
                        topic,
                        PartitionBy::KeyOrSource(r.partition.partition),
                        output_record(r, e),
                    ));
                }
            }
        }
        let per_owner: Vec<u64> = producing.iter().map(|(_, e)| e.len() as u64).collect();
        let records: Vec<&ShareRecord> = producing.iter().map(|(r, _)| *r).collect();
        let landings = self
            .write(client, consumer, &records, writes, "output", stop, permit)
            .await;
        let (mut accepted, mut released, mut unwritable) = (Vec::new(), Vec::new(), Vec::new());
        let (mut produced, mut failed) = (0u64, 0u64);
        for ((r, _), (landing, n)) in producing.iter().zip(landings.into_iter().zip(per_owner)) {
            match landing {
                Landing::Landed => {
                    produced += n;
                    accepted.push((*r, AckKind::Accept));
                }
                Landing::Stopped => {
                    failed += n;
                    released.push((*r, AckKind::Release));
                }
                Landing::Unwritable(why) => {
                    failed += n;
                    tracing::error!(pipeline = %self.spec.name, topic = %r.topic, partition = r.partition.partition, offset = r.record.offset, "an output of an accepted record can never be written; the record is rejected: {why}");
                    unwritable.push((*r, format!("output not writable: {why}")));
                }
            }
        }
        if produced > 0 {
            self.count_emits(hash, "produced", produced);
        }
        if failed > 0 {
            self.count_emits(hash, "failed", failed);
        }
        self.ack_all(consumer, &accepted, hash);
        self.release_unwritten(consumer, &released);
        unwritable
    }

    /// The reject reason of a record whose plugin emitted to `output`, which the manifest does
    /// not map (the runtime refused the emit as `unknown-output`); said loudly, once per name.
    fn misdirected(&self, output: &str) -> String {
        if lock(&self.unmapped).insert(output.to_owned()) {
            tracing::error!(pipeline = %self.spec.name, output, "the plugin emits to an output that [pipeline.outputs] does not map: every record with such an emit is rejected (dead-lettered where configured), whatever its verdict, and the pipeline is not ready until the manifest maps it");
        }
        format!("emitted to output {output:?}, which [pipeline.outputs] does not map")
    }

    /// Writes what `records` owe (see [`write_all`]): held until it lands or `stop`, within
    /// the records' locks on a broker that cannot renew them. `kind` (output, dead_letter)
    /// labels the failures.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        client: &KafkaClient,
        consumer: &ShareConsumer,
        records: &[&ShareRecord],
        writes: Vec<Write>,
        kind: &'static str,
        stop: &CancellationToken,
        permit: &Mutex<Option<OwnedSemaphorePermit>>,
    ) -> Vec<Landing> {
        if writes.is_empty() {
            return vec![Landing::Landed; records.len()];
        }
        let now = Instant::now();
        let deadline = records
            .iter()
            .filter_map(|r| consumer.hold_limit(r))
            .min()
            .map(|left| now + left.saturating_sub(RETRY_LOCK_MARGIN));
        let observer = WriteWatch {
            pipeline: self,
            kind,
            permit,
        };
        write_all(
            client,
            &self.spec.name,
            records.len(),
            writes,
            stop,
            deadline,
            &observer,
        )
        .await
        .landings
    }

    /// Releases records whose writes did not land before the pipeline stopped (or their lock
    /// ran out): the one delivery a stop spends. Counted apart from the plugin's releases.
    fn release_unwritten(&self, consumer: &ShareConsumer, released: &[(&ShareRecord, AckKind)]) {
        if released.is_empty() {
            return;
        }
        let taken = consumer
            .acknowledge_all(released)
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count() as u64;
        self.writes.released.fetch_add(taken, Ordering::Relaxed);
        self.metrics
            .released_unwritten
            .get_or_create(&vec![("pipeline", self.spec.name.clone())])
            .inc_by(taken);
    }

    fn record(&self, hash: &str, verdict: &str) {
        self.record_n(hash, verdict, 1);
    }

    fn record_n(&self, hash: &str, verdict: &str, n: u64) {
        let mut l = self.labels(hash);
        l.push(("verdict", verdict.into()));
        self.metrics.records.get_or_create(&l).inc_by(n);
    }

    /// Hands verdicts to the engine in one call, and counts the ones it took once per kind
    /// (not once per record: each count costs label allocations and locks).
    fn ack_all(&self, consumer: &ShareConsumer, verdicts: &[(&ShareRecord, AckKind)], hash: &str) {
        self.ack_all_as(consumer, verdicts, hash, false);
    }

    /// [`Pipeline::ack_all`]; with `accepts_are_rejects`, the Accepts stand for records the
    /// host dead-lettered itself on a group whose broker dead-letters Rejects too (counted as
    /// rejects, acknowledged as done so the broker writes no second dead letter).
    fn ack_all_as(
        &self,
        consumer: &ShareConsumer,
        verdicts: &[(&ShareRecord, AckKind)],
        hash: &str,
        accepts_are_rejects: bool,
    ) {
        if verdicts.is_empty() {
            return;
        }
        const KINDS: [(AckKind, &str); 5] = [
            (AckKind::Accept, "accept"),
            (AckKind::Release, "release"),
            (AckKind::Reject, "reject"),
            (AckKind::Renew, "renew"),
            (AckKind::Gap, "gap"),
        ];
        let mut taken = [0u64; KINDS.len()];
        for ((r, kind), result) in verdicts.iter().zip(consumer.acknowledge_all(verdicts)) {
            match result {
                Ok(true) => {
                    if let Some(i) = KINDS.iter().position(|(k, _)| k == kind) {
                        taken[i] += 1;
                    }
                }
                Ok(false) => {
                    tracing::debug!(pipeline = %self.spec.name, offset = r.record.offset, "verdict for a released record dropped")
                }
                Err(e) => {
                    tracing::error!(pipeline = %self.spec.name, offset = r.record.offset, "verdict refused: {e}")
                }
            }
        }
        if accepts_are_rejects {
            taken[2] += std::mem::take(&mut taken[0]);
        }
        for ((_, name), n) in KINDS.iter().zip(taken) {
            if n > 0 {
                self.record_n(hash, name, n);
            }
        }
        let [accepted, released, rejected, ..] = taken;
        if accepted + released + rejected > 0 {
            self.count(hash, |c| {
                c.accepted += accepted;
                c.released += released;
                c.rejected += rejected;
            });
        }
    }

    /// Rejects records: dead-letters them first when a topic is configured (see
    /// [`crate::writes`]); a record whose dead letter is still unwritten when the pipeline stops
    /// is released instead, never rejected unwritten.
    async fn reject(
        &self,
        consumer: &ShareConsumer,
        client: &KafkaClient,
        rejects: &[(&ShareRecord, String)],
        hash: &str,
        stop: &CancellationToken,
        permit: &Mutex<Option<OwnedSemaphorePermit>>,
    ) {
        let Some(dlq) = &self.spec.dead_letter_topic else {
            let all: Vec<_> = rejects.iter().map(|(r, _)| (*r, AckKind::Reject)).collect();
            self.ack_all(consumer, &all, hash);
            return;
        };
        let (plugin, signer) = self.identity(hash);
        let writes: Vec<Write> = rejects
            .iter()
            .enumerate()
            .map(|(owner, (r, reason))| {
                let full = self.dead_letter(r, reason, &plugin, hash, signer.as_deref(), true);
                let mut w =
                    Write::new(owner, dlq, PartitionBy::Source(r.partition.partition), full);
                w.smaller =
                    Some(self.dead_letter(r, reason, &plugin, hash, signer.as_deref(), false));
                w
            })
            .collect();
        let records: Vec<&ShareRecord> = rejects.iter().map(|(r, _)| *r).collect();
        let landings = self
            .write(
                client,
                consumer,
                &records,
                writes,
                "dead_letter",
                stop,
                permit,
            )
            .await;
        // On a group whose broker dead-letters Rejects itself, a record the host dead-lettered
        // (with its reason) is acknowledged as done: a Reject would write it a second time.
        let broker_dlq = self.broker_dlq.load(Ordering::Relaxed);
        let done = if broker_dlq {
            AckKind::Accept
        } else {
            AckKind::Reject
        };
        let (mut rejected, mut released) = (Vec::new(), Vec::new());
        for ((r, _), landing) in rejects.iter().zip(landings) {
            match landing {
                Landing::Landed => rejected.push((*r, done)),
                // A dead letter always has a smaller form to fall back on; what cannot land
                // is released like what the stop cut short.
                Landing::Stopped | Landing::Unwritable(_) => released.push((*r, AckKind::Release)),
            }
        }
        if !rejected.is_empty() {
            let n = rejected.len() as u64;
            self.dead_lettered.fetch_add(n, Ordering::Relaxed);
            self.metrics
                .dead_lettered
                .get_or_create(&self.labels(hash))
                .inc_by(n);
            self.ack_all_as(consumer, &rejected, hash, broker_dlq);
        }
        self.release_unwritten(consumer, &released);
    }

    /// The component path and signer of the version with `hash` (active, canary or kept), for
    /// dead-letter provenance: a record the canary rejected names the canary.
    fn identity(&self, hash: &str) -> (String, Option<String>) {
        let active = lock(&self.active).clone();
        if active.hash == hash {
            return (active.path.display().to_string(), active.signer());
        }
        if let Some(c) = lock(&self.canary).as_ref()
            && c.version.hash == hash
        {
            return (c.version.path.display().to_string(), c.version.signer());
        }
        if let Some(k) = lock(&self.history).iter().find(|k| k.hash == hash) {
            return (k.path.display().to_string(), k.compiled.signer.clone());
        }
        (active.path.display().to_string(), active.signer())
    }

    /// The dead letter of `r`: its key, value and headers (`whole`; without them when the whole
    /// record is larger than the dead-letter topic accepts, with their size instead), then
    /// its provenance and the reason it was rejected.
    fn dead_letter(
        &self,
        r: &ShareRecord,
        reason: &str,
        plugin: &str,
        hash: &str,
        signer: Option<&str>,
        whole: bool,
    ) -> ProduceRecord {
        let h = |k: &str, v: String| Header {
            key: k.to_owned(),
            value: Some(Bytes::from(v)),
        };
        let original = ProduceRecord {
            key: r.record.key.clone(),
            value: r.record.value.clone(),
            headers: r.record.headers.clone(),
            timestamp: Some(r.record.timestamp),
        };
        let mut dl = if whole {
            original
        } else {
            ProduceRecord {
                headers: vec![h(pv::DROPPED_BYTES, record_bytes(&original).to_string())],
                timestamp: original.timestamp,
                ..Default::default()
            }
        };
        dl.headers.extend([
            h(pv::ORIGINAL_TOPIC, r.topic.to_string()),
            h(pv::ORIGINAL_PARTITION, r.partition.partition.to_string()),
            h(pv::ORIGINAL_OFFSET, r.record.offset.to_string()),
            h(pv::ORIGINAL_DELIVERY_COUNT, r.delivery_count.to_string()),
            h(pv::REASON, reason.to_owned()),
            h(pv::PIPELINE, self.spec.name.clone()),
            h(pv::PLUGIN, plugin.to_owned()),
            h(pv::PLUGIN_VERSION, hash.to_owned()),
        ]);
        if let Some(signer) = signer {
            dl.headers.push(h(pv::PLUGIN_SIGNER, signer.to_owned()));
        }
        dl
    }

    /// Records at the delivery cap: dead-letter (when configured) then Reject.
    async fn handle_poison(
        &self,
        consumer: &ShareConsumer,
        client: &KafkaClient,
        poison: Vec<ShareRecord>,
        stop: &CancellationToken,
    ) {
        let hash = self.active_hash();
        if self.spec.dead_letter_topic.is_none() {
            // The engine already rejected them.
            for _ in &poison {
                self.record(&hash, "reject");
            }
            self.count(&hash, |c| c.rejected += poison.len() as u64);
            return;
        }
        let reasons: Vec<(&ShareRecord, String)> = {
            let mut last = lock(&self.last_faults);
            poison
                .iter()
                .map(|r| {
                    let key = (r.topic.clone(), r.partition.partition, r.record.offset);
                    let reason = match last.take(&key) {
                        Some(fault) => format!(
                            "delivery cap reached ({} deliveries); last plugin fault: {fault}",
                            r.delivery_count
                        ),
                        None => {
                            format!("delivery cap reached ({} deliveries)", r.delivery_count)
                        }
                    };
                    (r, reason)
                })
                .collect()
        };
        self.reject(consumer, client, &reasons, &hash, stop, &Mutex::new(None))
            .await;
    }
}

/// A canary's status from its run.
fn canary_status(run: &CanaryRun, state: CanaryState, reason: Option<String>) -> CanaryStatus {
    let plan = lock(&run.plan);
    CanaryStatus {
        candidate: run.version.hash.clone(),
        path: run.version.path.display().to_string(),
        percent: plan.request.percent,
        state,
        reason,
        candidate_tally: plan.candidate,
        active_tally: plan.active,
        seconds: plan.started.elapsed().as_secs(),
        promote_after: plan.request.promote_after.clone(),
        rollback_if: plan.request.rollback_if.clone(),
    }
}

/// Runs every pipeline until `shutdown`, as one host: the first pipeline to fail (or panic)
/// cancels `shutdown`, so the others drain too. Returns the failures, empty when every pipeline
/// drained cleanly.
pub async fn run_all(
    pipelines: &[Arc<Pipeline>],
    client: Arc<KafkaClient>,
    shutdown: CancellationToken,
) -> Vec<String> {
    let mut tasks = JoinSet::new();
    for p in pipelines {
        tasks.spawn(p.clone().run(client.clone(), shutdown.clone()));
    }
    join_failures(tasks, &shutdown).await
}

/// Waits for every pipeline task of `tasks`; the first to fail (or panic) cancels `shutdown`,
/// so the others drain too. Returns the failures, logged.
pub async fn join_failures(
    mut tasks: JoinSet<Result<(), String>>,
    shutdown: &CancellationToken,
) -> Vec<String> {
    let mut failures = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let failure = match r {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(e) => format!("pipeline task panicked: {e}"),
        };
        tracing::error!("{failure}");
        failures.push(failure);
        shutdown.cancel();
    }
    failures
}

/// What the plugin judges of `r`: the runtime's own record, built from the engine's without
/// copying a payload (the key and value are reference-counted). A negative delivery count,
/// never sent by a correct broker, reads as 0.
fn plugin_record(r: &ShareRecord) -> Record {
    let c = &r.record;
    Record {
        topic: r.topic.clone(),
        partition: r.partition.partition,
        offset: c.offset,
        timestamp: c.timestamp,
        delivery_count: u16::try_from(r.delivery_count).unwrap_or(0),
        key: c.key.clone(),
        value: c.value.clone(),
        headers: c
            .headers
            .iter()
            .map(|h| RuntimeHeader {
                key: h.key.clone(),
                value: h.value.clone(),
            })
            .collect(),
    }
}

/// Releases the held records whose retry delay has passed.
fn release_due(consumer: &ShareConsumer, held: &mut BinaryHeap<Reverse<Held>>) {
    let now = Instant::now();
    let mut due = Vec::new();
    while held.peek().is_some_and(|h| h.0.due <= now) {
        if let Some(Reverse(h)) = held.pop() {
            due.push(h.record);
        }
    }
    if !due.is_empty() {
        let acks: Vec<(&ShareRecord, AckKind)> =
            due.iter().map(|r| (r, AckKind::Release)).collect();
        consumer.acknowledge_all(&acks);
    }
}

/// An emit as the record produced to its output topic: the plugin's key, value and headers,
/// then the provenance headers a downstream consumer de-duplicates by.
fn output_record(source: &ShareRecord, e: &Emit) -> ProduceRecord {
    let h = |k: &str, v: String| Header {
        key: k.to_owned(),
        value: Some(Bytes::from(v)),
    };
    let mut headers: Vec<Header> = e
        .headers
        .iter()
        .map(|x| Header {
            key: x.key.clone(),
            value: x.value.clone(),
        })
        .collect();
    headers.extend([
        h(pv::SOURCE_TOPIC, source.topic.to_string()),
        h(pv::SOURCE_PARTITION, source.partition.partition.to_string()),
        h(pv::SOURCE_OFFSET, source.record.offset.to_string()),
        h(pv::SOURCE_DELIVERY_COUNT, source.delivery_count.to_string()),
    ]);
    ProduceRecord {
        key: e.key.clone(),
        value: e.value.clone(),
        headers,
        timestamp: None,
    }
}

/// The first 12 hex digits of a content hash, for logs and metric labels.
pub fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// How long judging paused around a hot swap (issue 14: a swap under load must not stall the
/// pipeline): the longest gap between two consecutive judged batches, from the last batch
/// judged before the swap was asked for to the first batch the new version judged.
#[derive(Debug, Default)]
struct SwapStall {
    /// When the last batch finished judging.
    last_done: Option<Instant>,
    /// A swap under way: the longest gap so far, and the new version's hash once it loaded.
    open: Option<(Duration, Option<String>)>,
    /// The last completed swap's stall.
    last: Option<Duration>,
}

impl SwapStall {
    fn swap_requested(&mut self) {
        self.open = Some((Duration::ZERO, None));
    }

    /// The new version loaded and is about to become active.
    fn swap_ready(&mut self, hash: &str) {
        if let Some((_, new)) = &mut self.open {
            *new = Some(hash.to_owned());
        }
    }

    fn swap_refused(&mut self) {
        self.open = None;
    }

    /// A batch finished judging on version `hash` at `now`; returns the stall of the swap
    /// that this batch, the new version's first, completes.
    fn judged(&mut self, hash: &str, now: Instant) -> Option<Duration> {
        let gap = self.last_done.map(|l| now.saturating_duration_since(l));
        self.last_done = Some(now);
        let (longest, new) = self.open.as_mut()?;
        *longest = (*longest).max(gap.unwrap_or_default());
        if new.as_deref() != Some(hash) {
            return None;
        }
        let stall = *longest;
        self.open = None;
        self.last = Some(stall);
        Some(stall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reject_without_a_reason_is_dead_lettered_saying_so() {
        assert_eq!(reject_reason(None), NO_REASON);
        assert_eq!(reject_reason(Some(String::new())), NO_REASON);
        assert_eq!(reject_reason(Some("not JSON".into())), "not JSON");
    }

    #[test]
    fn a_swap_stall_is_the_longest_gap_from_the_last_old_batch_to_the_first_new_one() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut stall = SwapStall::default();
        assert_eq!(stall.judged("old", at(0)), None, "no swap under way");
        assert_eq!(stall.judged("old", at(1)), None);
        stall.swap_requested();
        assert_eq!(
            stall.judged("old", at(3)),
            None,
            "a gap of 2 ms, still the old version"
        );
        stall.swap_ready("new");
        assert_eq!(
            stall.judged("old", at(10)),
            None,
            "a batch that started before the swap"
        );
        assert_eq!(
            stall.judged("new", at(12)),
            Some(Duration::from_millis(7)),
            "the longest gap: 3 -> 10"
        );
        assert_eq!(stall.last, Some(Duration::from_millis(7)));
        assert_eq!(
            stall.judged("new", at(100)),
            None,
            "closed: later gaps are not the swap's"
        );
        stall.swap_requested();
        stall.swap_refused();
        assert_eq!(
            stall.judged("new", at(101)),
            None,
            "a refused swap measures nothing"
        );
        assert_eq!(stall.last, Some(Duration::from_millis(7)));
    }

    /// Accepts every record, or answers one verdict short when told to.
    struct Native {
        short: bool,
    }

    impl NativeHandler for Native {
        fn name(&self) -> &str {
            "test"
        }

        fn handle(&self, records: &[Record]) -> Vec<Verdict> {
            let n = records.len() - usize::from(self.short);
            vec![Verdict::Accept; n]
        }
    }

    fn records(n: i64) -> Vec<Record> {
        (0..n)
            .map(|offset| Record {
                topic: Arc::from("t"),
                partition: 0,
                offset,
                timestamp: 0,
                delivery_count: 1,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Vec::new(),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_native_handler_judges_like_a_plugin_and_a_wrong_count_is_a_fault() {
        let batch: Arc<[Record]> = records(3).into();
        let good = Handler::Native(Arc::new(Native { short: false }));
        let (back, judged) = good.judge(batch.clone(), &Verdict::Release, true).await;
        assert!(back.is_some(), "the handler comes back");
        let Judged {
            verdicts, faults, ..
        } = judged;
        assert_eq!(verdicts, vec![Verdict::Accept; 3]);
        assert!(faults.is_empty());

        let bad = Handler::Native(Arc::new(Native { short: true }));
        let Judged {
            verdicts, faults, ..
        } = bad.judge(batch, &Verdict::Release, true).await.1;
        assert_eq!(
            verdicts,
            vec![Verdict::Release; 3],
            "the whole batch gets the fault policy"
        );
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].kind, FaultKind::WrongVerdictCount);
        assert!(faults[0].message.contains("2 verdicts for 3 records"));
    }

    #[test]
    fn a_native_version_is_named_after_its_handler() {
        let v = Version::native(Arc::new(Native { short: false }), 2);
        assert_eq!(v.hash, "native:test");
        assert_eq!(lock(&v.instances).len(), 2);
    }
}
