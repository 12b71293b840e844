//! A randomized fault schedule (a Jepsen-style nemesis): three `sharehost run` hosts in one share
//! group on the three-node cluster of `dev/kafka up --brokers 3`, every host connection through
//! loopback proxies, ids produced at a steady rate, and a schedule drawn from a seeded PRNG of
//!
//! - broker SIGKILL and broker SIGTERM (`dev/kafka kill-broker` / `stop-broker`), each followed
//!   a few seconds later by its restart (`start-broker`, then a wait until every partition is
//!   fully replicated again). Never more than one broker is down at a time, and the next broker
//!   fault waits for the restarted node to be back in every ISR: with replication 3 and
//!   min.insync.replicas 2 every partition keeps a leader and accepts writes throughout;
//! - host SIGKILL, followed a few seconds later by a restart with the same manifest (at most one
//!   host down at a time);
//! - every host↔broker connection cut at once through the proxies;
//! - a partition's leadership moved to another node (`dev/kafka move-leader`, only while every
//!   broker is up);
//! - a hot-swap of one host's plugin (`POST /pipelines/ledger/swap`) between two versions of the
//!   ledger fixture (the same plugin with a different custom section, so a different hash);
//! - fleet actions (the hosts are one fleet, docs/fleet.md): `sharehost fleet deploy` and `fleet
//!   canary` of a fresh signed version (the canary promoted by the fleet's sum after a few
//!   batches, unless the next action ends it first) and `fleet rollback`. An action the fleet's
//!   state refuses at that moment (a second canary while one runs, a rollback with nothing to
//!   roll back to) is logged as refused; any other failure of the command fails the run.
//!
//! Once everything is healed, one more `fleet deploy` must reach every host (the fleet
//! converges after the faults), then the group must drain.
//!
//! It prints the seed and the whole schedule first, each action as it happens, and at the end the
//! independent ledger (the ids produced against what the ledger plugin reports judging through
//! every host's log, and the dead-letter topic). It fails when a record was lost or when the
//! group does not drain (ShareGroupCommand lag 0) once everything is healed. The same seed gives
//! the same schedule, so a failure can be replayed:
//! `CHAOS_SEED=S CHAOS_SECONDS=N cargo test -p sharehost --test chaos -- --nocapture loses_nothing`
//! (what `dev/chaos --seed S` runs, on a cluster of its own).
//!
//! The same schedule runs a second time with the pipeline's `guarantee = "exactly-once"` and
//! every id emitted to an output topic (`... writes_each_output_once`, `dev/chaos --guarantee
//! exactly-once`): then the output and dead-letter topics, read `read_committed`, must also
//! hold every id exactly once.
//!
//! Env: `CHAOS_SECONDS` (default 60: the test command's short run), `CHAOS_SEED` (default a fresh
//! random seed, printed), `CHAOS_RATE` (ids produced per second, default 100; at most
//! rate × seconds ids in all), and the cluster's `SHAREHOST_CLUSTER_BOOTSTRAP` /
//! `SHAREHOST_CLUSTER_DIR` as for tests/cluster.rs. The test FAILS when the cluster is not
//! reachable; it never skips.
//!
//! Part of the host package's tests (it needs the `sharehost` binary Cargo builds for them), kept
//! here with the other broker tests.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost_tests::cluster::{
    NodeDown, cluster_bootstrap, cluster_client, cluster_harness, try_cluster_harness,
    wait_fully_replicated,
};
use sharehost_tests::fleet::{FleetKit, hash};
use sharehost_tests::host::{HostProcess, PATIENCE, Seen, Watch};
use sharehost_tests::ledger::{Ledger, Written, check_exactly_once};
use sharehost_tests::proxy::Proxy;
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    FAULT_SETTINGS, fresh_group_with, group_lag_at, guest, ledger_manifest, topic_values, unique,
};
use tokio::sync::{Mutex, watch};

/// Both tests stop and start the cluster's nodes: one at a time, or each restarts a node the
/// other is restarting too.
static CLUSTER: Mutex<()> = Mutex::const_new(());

/// Nodes of the cluster (`dev/kafka` node N has node id N).
const BROKERS: u8 = 3;
/// `sharehost run` processes in the share group.
const HOSTS: usize = 3;
const PARTITIONS: i32 = 6;
/// Time between two faults the schedule draws (milliseconds, inclusive range).
const GAP_MS: std::ops::RangeInclusive<u64> = 4_000..=12_000;
/// How long a killed or stopped broker stays down before its restart.
const BROKER_DOWN_MS: std::ops::RangeInclusive<u64> = 5_000..=20_000;
/// How long a killed host stays down before its restart.
const HOST_DOWN_MS: std::ops::RangeInclusive<u64> = 2_000..=10_000;
/// Ids per produce request; requests go round-robin over the partitions.
const PRODUCE_BATCH: u64 = 20;

/// One thing the nemesis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// SIGKILL broker node N (`dev/kafka kill-broker N`).
    KillBroker(u8),
    /// SIGTERM broker node N and wait for it to exit (`dev/kafka stop-broker N`).
    StopBroker(u8),
    /// Restart node N, then wait until no partition is under-replicated.
    StartBroker(u8),
    /// SIGKILL host H (no draining: a crash).
    KillHost(usize),
    /// Start host H again with the same manifest.
    StartHost(usize),
    /// Cut every connection through the proxies (hosts reconnect through them).
    CutConnections,
    /// Move the leadership of a partition to a node (a no-op when it already leads).
    MoveLeader { partition: i32, to: u8 },
    /// Hot-swap host H's plugin to the other version.
    Swap(usize),
    /// `sharehost fleet deploy` of a fresh signed version.
    Deploy,
    /// `sharehost fleet canary` of a fresh signed version on half the batches.
    Canary,
    /// `sharehost fleet rollback` to the version before.
    Rollback,
}

impl Action {
    /// The action's kind, for the per-kind counts.
    fn kind(&self) -> &'static str {
        match self {
            Action::KillBroker(_) => "broker SIGKILL",
            Action::StopBroker(_) => "broker SIGTERM",
            Action::StartBroker(_) => "broker restart",
            Action::KillHost(_) => "host SIGKILL",
            Action::StartHost(_) => "host restart",
            Action::CutConnections => "connection cut",
            Action::MoveLeader { .. } => "leader move",
            Action::Swap(_) => "hot-swap",
            Action::Deploy => "fleet deploy",
            Action::Canary => "fleet canary",
            Action::Rollback => "fleet rollback",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::KillBroker(n) => write!(f, "SIGKILL broker {n}"),
            Action::StopBroker(n) => write!(f, "SIGTERM broker {n}"),
            Action::StartBroker(n) => write!(f, "restart broker {n}"),
            Action::KillHost(h) => write!(f, "SIGKILL host-{h}"),
            Action::StartHost(h) => write!(f, "restart host-{h}"),
            Action::CutConnections => write!(f, "cut every proxied connection"),
            Action::MoveLeader { partition, to } => {
                write!(
                    f,
                    "move the leadership of partition {partition} to node {to}"
                )
            }
            Action::Swap(h) => write!(f, "hot-swap the plugin of host-{h}"),
            Action::Deploy => write!(f, "fleet deploy of a new version"),
            Action::Canary => write!(f, "fleet canary of a new version"),
            Action::Rollback => write!(f, "fleet rollback"),
        }
    }
}

/// An action and when it is due, from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    at: Duration,
    action: Action,
}

fn ms(range: &std::ops::RangeInclusive<u64>, rng: &mut StdRng) -> Duration {
    Duration::from_millis(rng.random_range(range.clone()))
}

/// The seeded schedule of a run of `length`: a fault every [`GAP_MS`], drawn uniformly among
/// the kinds the current state allows, each broker or host fault followed by its restart, and
/// everything still down restarted at the end. Pure: the same seed and length give the same
/// schedule (with the `rand` version Cargo.lock pins).
fn schedule(seed: u64, length: Duration) -> Vec<Step> {
    #[derive(Clone, Copy)]
    enum Kind {
        KillBroker,
        StopBroker,
        KillHost,
        Cut,
        Move,
        Swap,
        Deploy,
        Canary,
        Rollback,
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    // What is down, and when its restart is due.
    let mut broker_down: Option<(u8, Duration)> = None;
    let mut host_down: Option<(usize, Duration)> = None;
    let mut t = Duration::ZERO;
    loop {
        t += ms(&GAP_MS, &mut rng);
        let mut due = Vec::new();
        if let Some((n, at)) = broker_down
            && at <= t
        {
            due.push(Step {
                at,
                action: Action::StartBroker(n),
            });
            broker_down = None;
        }
        if let Some((h, at)) = host_down
            && at <= t
        {
            due.push(Step {
                at,
                action: Action::StartHost(h),
            });
            host_down = None;
        }
        due.sort_by_key(|s| s.at);
        steps.extend(due);
        if t >= length {
            break;
        }
        let mut kinds = vec![
            Kind::Cut,
            Kind::Swap,
            Kind::Deploy,
            Kind::Canary,
            Kind::Rollback,
        ];
        if broker_down.is_none() {
            kinds.extend([Kind::KillBroker, Kind::StopBroker, Kind::Move]);
        }
        if host_down.is_none() {
            kinds.push(Kind::KillHost);
        }
        let up_hosts: Vec<usize> = (0..HOSTS)
            .filter(|h| host_down.is_none_or(|(d, _)| d != *h))
            .collect();
        let action = match kinds[rng.random_range(0..kinds.len())] {
            kind @ (Kind::KillBroker | Kind::StopBroker) => {
                let n = rng.random_range(1..=BROKERS);
                broker_down = Some((n, t + ms(&BROKER_DOWN_MS, &mut rng)));
                if matches!(kind, Kind::KillBroker) {
                    Action::KillBroker(n)
                } else {
                    Action::StopBroker(n)
                }
            }
            Kind::KillHost => {
                let h = rng.random_range(0..HOSTS);
                host_down = Some((h, t + ms(&HOST_DOWN_MS, &mut rng)));
                Action::KillHost(h)
            }
            Kind::Cut => Action::CutConnections,
            Kind::Move => Action::MoveLeader {
                partition: rng.random_range(0..PARTITIONS),
                to: rng.random_range(1..=BROKERS),
            },
            Kind::Swap => Action::Swap(up_hosts[rng.random_range(0..up_hosts.len())]),
            Kind::Deploy => Action::Deploy,
            Kind::Canary => Action::Canary,
            Kind::Rollback => Action::Rollback,
        };
        steps.push(Step { at: t, action });
    }
    // Heal: whatever is still down comes back (after the run's length if its restart falls there).
    let mut heal: Vec<Step> = broker_down
        .map(|(n, at)| Step {
            at,
            action: Action::StartBroker(n),
        })
        .into_iter()
        .chain(host_down.map(|(h, at)| Step {
            at,
            action: Action::StartHost(h),
        }))
        .collect();
    heal.sort_by_key(|s| s.at);
    steps.extend(heal);
    steps
}

/// Actions per kind, in a fixed order (for the summary line and docs/reliability.md).
fn counts(steps: &[Step]) -> BTreeMap<&'static str, usize> {
    let mut c = BTreeMap::new();
    for s in steps {
        *c.entry(s.action.kind()).or_default() += 1;
    }
    c
}

fn counts_line(steps: &[Step]) -> String {
    counts(steps)
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a whole number: {e}")),
    )
}

/// Produces ids `0, 1, 2, ...` at `rate` per second (batches of [`PRODUCE_BATCH`], round-robin
/// over the partitions) until `stop` or `max` ids; a produce that fails (a broker down, a
/// leader moving) is retried with the same ids, so an id may be in the topic twice but is
/// produced once. Returns the ids the broker acknowledged.
fn spawn_producer(
    client: Arc<KafkaClient>,
    topic: String,
    rate: u64,
    max: u64,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let every = Duration::from_millis(1000 * PRODUCE_BATCH / rate.max(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next = 0u64;
        let mut batch = 0i32;
        while next < max {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let chunk: Vec<String> = (next..(next + PRODUCE_BATCH).min(max))
                .map(|i| i.to_string())
                .collect();
            let records: Vec<ProduceRecord> = chunk
                .iter()
                .map(|id| ProduceRecord {
                    value: Some(Bytes::from(id.clone())),
                    ..Default::default()
                })
                .collect();
            let p = batch % PARTITIONS;
            let deadline = Instant::now() + PATIENCE;
            loop {
                match client.produce(&topic, p, &records, Compression::Lz4).await {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(
                            Instant::now() < deadline,
                            "produce to {topic}-{p} kept failing: {e}"
                        );
                        println!("chaos: produce to partition {p} failed ({e}); retrying");
                        // A backoff before the retry, not a synchronisation.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            next += chunk.len() as u64;
            ids.extend(chunk);
            batch += 1;
        }
        ids
    })
}

/// The hosts, the proxies and what is down: the state the schedule acts on.
struct Nemesis {
    bootstrap: String,
    topic: String,
    /// Each host's manifest (its own `fleet.host_id`).
    manifests: Vec<PathBuf>,
    versions: [PathBuf; 2],
    /// The fleet's operator (key, versions, state directories) and the manifest `sharehost
    /// fleet` reads.
    kit: FleetKit,
    operator_manifest: PathBuf,
    /// How many fresh fleet versions were made.
    fleet_versions: u32,
    proxies: Vec<Arc<Proxy>>,
    hosts: Vec<Option<HostProcess>>,
    /// Which of `versions` each host runs now.
    version: Vec<usize>,
    /// How many times each host was started (names its log lines).
    starts: Vec<u32>,
    /// What killed hosts had reported up to their death.
    dead: Vec<Seen>,
    watch: Watch,
    broker_down: Option<u8>,
}

impl Nemesis {
    fn start_host(&mut self, h: usize) {
        self.starts[h] += 1;
        let name = format!("host-{h}.{}", self.starts[h]);
        let state = self.kit.state(&format!("host-{h}"));
        let state = state.to_str().expect("utf-8 path");
        self.hosts[h] = Some(HostProcess::start_watched_with_env(
            sharehost_bin!(),
            &self.manifests[h],
            &name,
            &self.watch,
            // Each commit's records in the log: a record written twice names its transactions.
            &[
                ("SHAREHOST_STATE_DIR", state),
                ("SHAREHOST_LOG", "info,sharehost::pipeline::transact=debug"),
            ],
        ));
        self.version[h] = 0;
    }

    /// A fresh version of the ledger plugin (a new hash), signed by the operator.
    fn fresh_version(&mut self) -> (PathBuf, String) {
        self.fleet_versions += 1;
        let path = self
            .kit
            .version(&self.versions[0], &format!("fleet-{}", self.fleet_versions));
        let hash = hash(&path);
        (path, hash)
    }

    /// Runs `sharehost fleet ARGS` as the operator; `refusals` are the answers of the fleet's
    /// state this action may meet (logged, not a failure). Returns what happened.
    fn fleet(&self, args: &[&str], refusals: &[&str]) -> String {
        let (ok, out) = self
            .kit
            .try_fleet(sharehost_bin!(), &self.operator_manifest, args);
        let last = out.trim().lines().last().unwrap_or_default().to_owned();
        if ok {
            return last;
        }
        assert!(
            refusals.iter().any(|r| out.contains(r)),
            "sharehost fleet {args:?} failed:\n{out}"
        );
        format!("refused by the fleet's state: {last}")
    }

    fn host(&self, h: usize) -> &HostProcess {
        self.hosts[h]
            .as_ref()
            .unwrap_or_else(|| panic!("the schedule acts on host-{h}, which is down"))
    }

    /// Carries out one action; returns what it did, for the log.
    fn apply(&mut self, action: Action) -> String {
        match action {
            Action::KillBroker(n) | Action::StopBroker(n) => {
                assert!(self.broker_down.is_none(), "one broker down at a time");
                let cmd = if matches!(action, Action::KillBroker(_)) {
                    "kill-broker"
                } else {
                    "stop-broker"
                };
                self.broker_down = Some(n);
                cluster_harness(&[cmd, &n.to_string()]);
                format!("node {n} down")
            }
            Action::StartBroker(n) => {
                cluster_harness(&["start-broker", &n.to_string()]);
                self.broker_down = None;
                wait_fully_replicated(&self.bootstrap);
                format!("node {n} up and back in every ISR")
            }
            Action::KillHost(h) => {
                let host = self.hosts[h]
                    .take()
                    .unwrap_or_else(|| panic!("host-{h} is already down"));
                let seen = host.kill();
                let judged = seen.judged();
                self.dead.push(seen);
                format!("host-{h} had reported {judged} verdicts")
            }
            Action::StartHost(h) => {
                self.start_host(h);
                format!("host-{h} running again")
            }
            Action::CutConnections => {
                let cut: usize = self.proxies.iter().map(|p| p.cut_all()).sum();
                format!("{cut} connections cut")
            }
            Action::MoveLeader { partition, to } => {
                // A follower can fall out of an ISR for a moment even with every broker up (a
                // fresh topic, a loaded machine), and dev/kafka refuses to make it leader then:
                // wait until it is back and try again; a node still out of sync is skipped.
                let mut refused = String::new();
                for _ in 0..3 {
                    wait_fully_replicated(&self.bootstrap);
                    let (ok, text) = try_cluster_harness(&[
                        "move-leader",
                        &self.topic,
                        &partition.to_string(),
                        &to.to_string(),
                    ]);
                    if ok {
                        return text.lines().last().unwrap_or_default().to_owned();
                    }
                    assert!(
                        text.contains("cannot lead yet"),
                        "dev/kafka move-leader {partition} {to} failed:\n{text}"
                    );
                    refused = text;
                }
                format!(
                    "skipped, node {to} stayed out of sync: {}",
                    refused.lines().last().unwrap_or_default()
                )
            }
            Action::Swap(h) => {
                let next = 1 - self.version[h];
                let path = self.versions[next].display().to_string();
                let (code, body) = self.host(h).http(
                    "POST",
                    "/pipelines/ledger/swap",
                    &format!(r#"{{"path":"{path}"}}"#),
                );
                assert_eq!(
                    code,
                    200,
                    "swap of host-{h} to v{} took effect: {body}",
                    next + 1
                );
                self.version[h] = next;
                format!("host-{h} runs v{} now", next + 1)
            }
            Action::Deploy => {
                let (path, hash) = self.fresh_version();
                let out = self.fleet(&["deploy", path.to_str().expect("utf-8 path")], &[]);
                format!("{} ({out})", sharehost::pipeline::short(&hash))
            }
            Action::Canary => {
                let (path, hash) = self.fresh_version();
                let out = self.fleet(
                    &[
                        "canary",
                        path.to_str().expect("utf-8 path"),
                        "--percent",
                        "50",
                        "--promote-after-batches",
                        "20",
                    ],
                    &["is running: promote or abort it first"],
                );
                format!("{} ({out})", sharehost::pipeline::short(&hash))
            }
            Action::Rollback => self.fleet(&["rollback"], &["nothing to roll back to"]),
        }
    }

    /// A last `fleet deploy` once everything is healed, and a wait until every host judges with
    /// it: the fleet converges whatever the schedule did to it.
    fn converge(&mut self) -> String {
        let (path, hash) = self.fresh_version();
        self.fleet(&["deploy", path.to_str().expect("utf-8 path")], &[]);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let running: Vec<String> = self
                .hosts
                .iter()
                .flatten()
                .map(|h| {
                    h.status()[0]["active_version"]
                        .as_str()
                        .unwrap_or("?")
                        .to_owned()
                })
                .collect();
            if running.iter().all(|v| *v == hash) {
                return hash;
            }
            assert!(
                Instant::now() < deadline,
                "the healed fleet did not converge on {hash}: the hosts run {running:?}"
            );
            // A host has no way to notify a test of its version: poll GET /pipelines.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Everything every host incarnation reported so far (the dead ones, and the live ones
    /// now); fails when a live host's log ended (it exited by itself).
    fn seen(&self) -> Vec<Seen> {
        let mut all = self.dead.clone();
        for (h, host) in self.hosts.iter().enumerate() {
            if let Some(host) = host {
                let s = host.seen();
                assert!(!s.ended, "host-{h} exited by itself (see its log above)");
                all.push(s);
            }
        }
        all
    }
}

impl Drop for Nemesis {
    fn drop(&mut self) {
        // A failing run must not leave a broker of a shared cluster down behind it.
        if let Some(n) = self.broker_down.take() {
            let _ = try_cluster_harness(&["start-broker", &n.to_string()]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_fault_schedule_on_three_brokers_and_three_hosts_loses_nothing() {
    chaos(Guarantee::AtLeastOnce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_fault_schedule_on_three_brokers_and_three_hosts_writes_each_output_once() {
    chaos(Guarantee::ExactlyOnce).await;
}

/// The pipeline's guarantee in a chaos run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guarantee {
    /// The default: the ledger plugin's log and the dead-letter topic must hold every id.
    AtLeastOnce,
    /// `guarantee = "exactly-once"`, every id emitted to an output: also the output and
    /// dead-letter topics, read `read_committed`, must hold every id exactly once.
    ExactlyOnce,
}

async fn chaos(guarantee: Guarantee) {
    let _cluster = CLUSTER.lock().await;
    let seconds = env_u64("CHAOS_SECONDS").unwrap_or(60);
    let rate = env_u64("CHAOS_RATE").unwrap_or(100).max(1);
    let seed = env_u64("CHAOS_SEED").unwrap_or_else(|| rand::rng().random());
    let length = Duration::from_secs(seconds);
    let plan = schedule(seed, length);
    println!(
        "chaos: seed {seed}, {seconds} s, {rate} ids/s, {} actions ({})",
        plan.len(),
        counts_line(&plan)
    );
    println!(
        "chaos: replay with CHAOS_SEED={seed} CHAOS_SECONDS={seconds} CHAOS_RATE={rate} cargo test -p sharehost --test chaos -- --nocapture {}",
        match guarantee {
            Guarantee::AtLeastOnce => "loses_nothing",
            Guarantee::ExactlyOnce => "writes_each_output_once",
        }
    );
    for s in &plan {
        println!("chaos: plan +{:>7.1}s  {}", s.at.as_secs_f64(), s.action);
    }

    let bootstrap = cluster_bootstrap();
    let client = Arc::new(cluster_client().await);
    let topic = unique("chaos");
    let dlq = format!("{topic}-dlq");
    let output = format!("{topic}-out");
    client
        .create_topic(&topic, PARTITIONS, 3, &[])
        .await
        .expect("create topic");
    if guarantee == Guarantee::ExactlyOnce {
        client
            .create_topic(&output, PARTITIONS, 3, &[])
            .await
            .expect("create output topic");
    }
    client
        .create_topic(&dlq, 1, 3, &[])
        .await
        .expect("create dead-letter topic");
    let group =
        fresh_group_with(&client, Some(3000), &[("share.session.timeout.ms", "6000")]).await;

    // One proxy per node: node N's PROXIED listener binds its client port + 6 and advertises
    // client port + 5 (dev/kafka), where the proxy listens.
    let mut proxies = Vec::new();
    let mut listens = Vec::new();
    for addr in bootstrap.split(',') {
        let (host, port) = addr
            .trim()
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .unwrap_or_else(|| panic!("bootstrap entry {addr:?} is not host:port"));
        let listen = format!("{host}:{}", port + 5);
        let target = format!("{host}:{}", port + 6);
        proxies.push(Arc::new(Proxy::start(&listen, &target).await));
        listens.push(listen);
    }
    assert_eq!(
        proxies.len(),
        usize::from(BROKERS),
        "one bootstrap address per node: {bootstrap}"
    );

    // One fleet of the three hosts (topics of this run's own), each host its own id and state
    // directory; the operator's manifest reaches the nodes directly, not through the proxies.
    let kit = FleetKit::new("chaos");
    let original = guest("fixture_ledger");
    let versions = [
        kit.version(&original, "ledger-v1"),
        kit.version(&original, "ledger-v2"),
    ];
    let manifest = |id: &str, bootstrap: &str| {
        kit.manifest(
            id,
            "",
            &ledger_manifest(
                bootstrap,
                &topic,
                &group,
                &versions[0],
                match guarantee {
                    Guarantee::AtLeastOnce => r#"reject-every = "7", pause-ms = "10""#,
                    Guarantee::ExactlyOnce => {
                        r#"reject-every = "7", pause-ms = "10", emit-to = "out""#
                    }
                },
                &match guarantee {
                    Guarantee::AtLeastOnce => {
                        format!("{FAULT_SETTINGS}dead_letter_topic = \"{dlq}\"\n")
                    }
                    Guarantee::ExactlyOnce => format!(
                        "{FAULT_SETTINGS}dead_letter_topic = \"{dlq}\"\nguarantee = \"exactly-once\"\noutputs = {{ out = \"{output}\" }}\n"
                    ),
                },
            ),
        )
    };
    let manifests: Vec<PathBuf> = (0..HOSTS)
        .map(|h| manifest(&format!("host-{h}"), &listens.join(",")))
        .collect();
    let operator_manifest = manifest("operator", &bootstrap);

    let (stop_tx, stop_rx) = watch::channel(false);
    let producer = spawn_producer(client.clone(), topic.clone(), rate, rate * seconds, stop_rx);

    let mut nemesis = Nemesis {
        bootstrap: bootstrap.clone(),
        topic: topic.clone(),
        manifests,
        versions,
        kit,
        operator_manifest,
        fleet_versions: 0,
        proxies: proxies.clone(),
        hosts: (0..HOSTS).map(|_| None).collect(),
        version: vec![0; HOSTS],
        starts: vec![0; HOSTS],
        dead: Vec::new(),
        watch: Watch::default(),
        broker_down: None,
    };
    let started = Instant::now();
    let (nemesis, wall) = tokio::task::spawn_blocking(move || {
        for h in 0..HOSTS {
            nemesis.start_host(h);
        }
        let t0 = Instant::now();
        for step in &plan {
            if let Some(wait) = step.at.checked_sub(t0.elapsed()) {
                // Keeping to the schedule's clock, not waiting for an event.
                std::thread::sleep(wait);
            }
            let at = t0.elapsed();
            let result = nemesis.apply(step.action);
            println!(
                "chaos: +{:>7.1}s (planned +{:.1}s, took {:.1}s)  {}: {result}",
                at.as_secs_f64(),
                step.at.as_secs_f64(),
                (t0.elapsed() - at).as_secs_f64(),
                step.action
            );
        }
        // Whatever the schedule's length, the load lasts at least that long.
        if let Some(wait) = length.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        (nemesis, t0.elapsed())
    })
    .await
    .expect("nemesis");
    let _ = stop_tx.send(true);
    let ids = producer.await.expect("producer");
    println!(
        "chaos: schedule done in {:.1}s, {} ids produced; waiting for the group to drain",
        wall.as_secs_f64(),
        ids.len()
    );

    // Healed: every broker up and in sync, every host running. The fleet must converge on one
    // more deploy and the broker must end with nothing left for the group, then the hosts drain
    // and stop and the ledger is read.
    let (g, b) = (group.clone(), bootstrap.clone());
    let nemesis = tokio::task::spawn_blocking(move || {
        let mut nemesis = nemesis;
        let hash = nemesis.converge();
        println!(
            "chaos: the healed fleet converged: every host judges with {}",
            sharehost::pipeline::short(&hash)
        );
        // Patience runs from the last progress: a backlog the faults left drains at the
        // plugin's pace, however long that takes, as long as it shrinks.
        let mut deadline = Instant::now() + PATIENCE;
        let mut least: Option<i64> = None;
        loop {
            let _ = nemesis.seen(); // fails at once if a host died by itself
            let lag = group_lag_at(&b, &g);
            if !lag.is_empty() && lag.iter().all(|l| *l == 0) {
                break;
            }
            let total: i64 = lag.iter().sum();
            if !lag.is_empty() && least.is_none_or(|l| total < l) {
                least = Some(total);
                deadline = Instant::now() + PATIENCE;
            }
            if Instant::now() >= deadline {
                // What each host's engine says it holds, for the diagnosis.
                let held: Vec<String> = nemesis
                    .hosts
                    .iter()
                    .flatten()
                    .map(|h| {
                        let s = &h.status()[0];
                        format!(
                            "state {}, in flight {}, limit {}, fetches {}",
                            s["state"], s["in_flight"], s["in_flight_limit"], s["fetches"]
                        )
                    })
                    .collect();
                panic!(
                    "group {g} did not drain after the schedule healed everything (its lag stopped shrinking for {PATIENCE:?}): lag {lag:?}; hosts: {held:?}"
                );
            }
            // ShareGroupCommand cannot notify: poll it.
            std::thread::sleep(Duration::from_millis(1000));
        }
        nemesis
    })
    .await
    .expect("drain");
    let mut nemesis = nemesis;
    let hosts: Vec<HostProcess> = nemesis.hosts.iter_mut().filter_map(Option::take).collect();
    let mut seen = std::mem::take(&mut nemesis.dead);
    seen.extend(
        tokio::task::spawn_blocking(move || {
            hosts.into_iter().map(|h| h.stop().1).collect::<Vec<_>>()
        })
        .await
        .expect("stop hosts"),
    );
    drop(nemesis);

    let plan = schedule(seed, length);
    let mut ledger = Ledger::new(
        &format!("chaos seed {seed}, {seconds} s, {} actions", plan.len()),
        ids.iter().cloned(),
    );
    for s in &seen {
        s.record(&mut ledger);
    }
    let dead = topic_values(&client, &dlq, 1).await;
    for id in &dead {
        ledger.dead_lettered(id.clone());
    }
    println!("chaos: seed {seed}, actions: {}", counts_line(&plan));
    println!(
        "chaos: wall {:.1}s (schedule {:.1}s)",
        started.elapsed().as_secs_f64(),
        wall.as_secs_f64()
    );
    let dead: HashSet<&String> = dead.iter().collect();
    let rejected: BTreeSet<&String> = seen.iter().flat_map(|s| &s.rejected).collect();
    // A rejected record's dead letter is its only copy once the broker archives it: one that
    // never reached the dead-letter topic is lost too, even though the plugin judged it.
    let missing: Vec<&String> = rejected
        .into_iter()
        .filter(|id| !dead.contains(id))
        .collect();
    println!(
        "chaos: rejected but never dead-lettered: {}{}",
        missing.len(),
        if missing.is_empty() {
            String::new()
        } else {
            format!(" (first {:?})", &missing[..missing.len().min(10)])
        }
    );
    ledger.check();
    assert!(
        missing.is_empty(),
        "{} rejected ids never reached the dead-letter topic (seed {seed}), first: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        proxies.iter().map(|p| p.accepted()).sum::<usize>() > 0,
        "the hosts connected through the proxies"
    );
    if guarantee == Guarantee::ExactlyOnce {
        let written = Written {
            source: (&topic, PARTITIONS),
            output: (&output, PARTITIONS),
            dead_letters: (&dlq, 1),
        };
        let judged = seen.iter().map(Seen::judged).sum();
        check_exactly_once(
            &format!("chaos seed {seed}"),
            &client,
            &ids,
            written,
            judged,
        )
        .await;
    }
}

#[test]
fn the_same_seed_gives_the_same_schedule() {
    let length = Duration::from_secs(600);
    for seed in [0, 1, 42, u64::MAX] {
        assert_eq!(
            schedule(seed, length),
            schedule(seed, length),
            "seed {seed}"
        );
    }
    assert_ne!(schedule(1, length), schedule(2, length));
}

#[test]
fn a_schedule_keeps_one_broker_and_one_host_down_at_most_and_heals_everything() {
    let length = Duration::from_secs(600);
    let mut kinds = BTreeSet::new();
    for seed in 0..300 {
        let plan = schedule(seed, length);
        let mut broker_down: Option<u8> = None;
        let mut host_down: Option<usize> = None;
        let mut last = Duration::ZERO;
        for s in &plan {
            assert!(s.at >= last, "seed {seed}: steps in time order");
            last = s.at;
            kinds.insert(s.action.kind());
            match s.action {
                Action::KillBroker(n) | Action::StopBroker(n) => {
                    assert_eq!(
                        broker_down, None,
                        "seed {seed}: a second broker down at {s:?}"
                    );
                    assert!((1..=BROKERS).contains(&n));
                    broker_down = Some(n);
                }
                Action::StartBroker(n) => {
                    assert_eq!(
                        broker_down,
                        Some(n),
                        "seed {seed}: restart of a running broker"
                    );
                    broker_down = None;
                }
                Action::MoveLeader { partition, to } => {
                    assert_eq!(
                        broker_down, None,
                        "seed {seed}: a leader move with a broker down"
                    );
                    assert!((0..PARTITIONS).contains(&partition) && (1..=BROKERS).contains(&to));
                }
                Action::KillHost(h) => {
                    assert_eq!(host_down, None, "seed {seed}: a second host down at {s:?}");
                    host_down = Some(h);
                }
                Action::StartHost(h) => {
                    assert_eq!(host_down, Some(h), "seed {seed}: restart of a running host");
                    host_down = None;
                }
                Action::Swap(h) => {
                    assert_ne!(host_down, Some(h), "seed {seed}: a swap on a dead host");
                }
                Action::CutConnections | Action::Deploy | Action::Canary | Action::Rollback => {}
            }
        }
        assert_eq!(
            (broker_down, host_down),
            (None, None),
            "seed {seed}: healed at the end"
        );
    }
    assert_eq!(kinds.len(), 11, "every kind of action is drawn: {kinds:?}");
}

/// Found by `dev/chaos` (docs/reliability.md, "Randomized fault schedule"): while a broker is
/// down, a metadata refresh for another topic replaces the client's broker list (the dead node
/// is no longer listed) but keeps this topic's cached leader, the dead node. A produce then
/// fails at once with "broker N is not in the cluster metadata", classified fatal, so it never
/// refreshes the metadata that would name the new leader. In the host this is the dead-letter
/// produce: it fails for every rejected record, the record is released, judged again, fails
/// again, until the broker's delivery limit archives it without a dead letter. Fixed in
/// `KafkaClient::leader_connection`: a cached leader missing from the broker list refreshes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_finds_the_new_leader_after_a_refresh_dropped_the_old_one() {
    let _cluster = CLUSTER.lock().await;
    let bootstrap = cluster_bootstrap();
    let client = cluster_client().await;
    let (target, other) = (unique("chaos-dlq"), unique("chaos-other"));
    client
        .create_topic(&target, 1, 3, &[])
        .await
        .expect("create topic");
    client
        .create_topic(&other, 1, 3, &[])
        .await
        .expect("create topic");
    client
        .refresh_metadata(&[target.clone(), other.clone()])
        .await
        .expect("metadata");
    let leader = client.leader(&target, 0).expect("a leader");
    let record = [ProduceRecord {
        value: Some(Bytes::from_static(b"1")),
        ..Default::default()
    }];
    // The two other nodes keep every partition in sync (min.insync.replicas 2).
    let down = NodeDown::take("stop-broker", leader).await;
    // What the share consumer does on a leadership error for its own topic.
    client
        .refresh_metadata(std::slice::from_ref(&other))
        .await
        .expect("metadata of the other topic");
    let produced = client.produce(&target, 0, &record, Compression::None).await;
    down.restart(&bootstrap).await;
    if let Err(e) = produced {
        panic!("produce to {target}-0 after node {leader} (its old leader) stopped: {e}");
    }
}

/// Found by `dev/chaos` once it ran fleet actions: a client whose cached leader was SIGKILLed
/// (so still in the metadata until the controller fences it) dialled the dead node on every
/// retry until its request timeout, never asking who leads now; `sharehost fleet deploy` failed
/// with "cannot connect to broker N". Fixed in `KafkaClient::with_leader`: a leader that cannot
/// be reached refreshes the metadata before the next try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_finds_the_new_leader_when_the_cached_one_was_killed() {
    let _cluster = CLUSTER.lock().await;
    let bootstrap = cluster_bootstrap();
    let client = cluster_client().await;
    let target = unique("chaos-killed-leader");
    client
        .create_topic(&target, 1, 3, &[])
        .await
        .expect("create topic");
    client
        .refresh_metadata(std::slice::from_ref(&target))
        .await
        .expect("metadata");
    let leader = client.leader(&target, 0).expect("a leader");
    let record = [ProduceRecord {
        value: Some(Bytes::from_static(b"1")),
        ..Default::default()
    }];
    client
        .produce(&target, 0, &record, Compression::None)
        .await
        .expect("produce while every node is up");
    let down = NodeDown::take("kill-broker", leader).await;
    let produced = client.produce(&target, 0, &record, Compression::None).await;
    down.restart(&bootstrap).await;
    if let Err(e) = produced {
        panic!("produce to {target}-0 after node {leader} (its leader) was killed: {e}");
    }
}
