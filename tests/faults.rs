//! The fault-injection suite: the `sharehost` binary, a real broker, and the faults users meet —
//! a broker restart mid-stream, a host killed mid-batch and restarted, the TCP connection cut,
//! one of three hosts killed, a plugin that traps every tenth batch, hot-swaps under load.
//!
//! Each scenario keeps an independent ledger: the ids it produced, against the ids the ledger
//! plugin (tests/fixtures/guests/ledger) reports judging through the host's log, and the ids
//! found in the dead-letter topic; and the broker must end with nothing left for the group
//! (ShareGroupCommand lag 0). Each prints `ledger NAME: produced, accepted, rejected,
//! dead-lettered, duplicates, lost` and fails if anything was lost.
//!
//! Part of the host package's tests (it needs the `sharehost` binary Cargo builds for them), kept
//! here with the other broker tests. `SHAREHOST_FAULT_SCALE=N` multiplies every scenario's record
//! count (`dev/faults` runs the long version).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sharehost::dlq::DeadLetter;
use sharehost::kafka::KafkaClient;
use sharehost_tests::host::{HostProcess, Seen, Watch, run_until_judged};
use sharehost_tests::ledger::{Ledger, Written, check_exactly_once, report};
use sharehost_tests::proxy::Proxy;
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    FAULT_SETTINGS, blocking, bootstrap, client, committed_records, fresh_group_with, guest,
    ledger_manifest, new_version, produce_ids, proxied_listener, topic_with_dead_letters, unique,
    wait_until_drained,
};
use tokio::sync::RwLock;

/// Scenarios share the broker; the one that restarts it runs alone.
static BROKER: RwLock<()> = RwLock::const_new(());

const PARTITIONS: i32 = 6;

fn scale() -> u64 {
    std::env::var("SHAREHOST_FAULT_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s >= 1)
        .unwrap_or(1)
}

/// One scenario's topic, dead-letter topic, group and produced ids.
struct Scenario {
    name: &'static str,
    client: Arc<KafkaClient>,
    topic: String,
    dlq: String,
    group: String,
    dir: PathBuf,
    ids: Vec<String>,
    /// The output topic of an exactly-once twin (see [`Scenario::exactly_once`]).
    output: Option<String>,
}

impl Scenario {
    /// A fresh topic of `records` ids (times the scale), its dead-letter topic, and a group
    /// with a `lock_ms` record lock and a 6 s member session (so a killed host's partitions
    /// move on quickly).
    async fn new(name: &'static str, records: u64, lock_ms: u32) -> Scenario {
        Scenario::with_records(name, 0..records * scale(), lock_ms).await
    }

    /// [`Scenario::new`] with the ids produced up front chosen by the caller.
    async fn with_records(name: &'static str, ids: std::ops::Range<u64>, lock_ms: u32) -> Scenario {
        Scenario::with_group(
            name,
            ids,
            Some(lock_ms),
            &[("share.session.timeout.ms", "6000")],
        )
        .await
    }

    /// [`Scenario::with_records`] with the group's record lock (`None`: the broker's default)
    /// and other group configs chosen by the caller.
    async fn with_group(
        name: &'static str,
        ids: std::ops::Range<u64>,
        lock_ms: Option<u32>,
        configs: &[(&str, &str)],
    ) -> Scenario {
        let client = Arc::new(client().await);
        let (topic, dlq) = topic_with_dead_letters(&client, name, PARTITIONS, 1).await;
        let group = fresh_group_with(&client, lock_ms, configs).await;
        let ids = produce_ids(&client, &topic, PARTITIONS, ids).await;
        let dir = std::env::temp_dir().join(unique("sharehost-faults"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scenario {
            name,
            client,
            topic,
            dlq,
            group,
            dir,
            ids,
            output: None,
        }
    }

    /// The same scenario run `guarantee = "exactly-once"` when `exactly_once`: the plugin also
    /// emits every id to an output topic (created now), and the ledger then requires the output
    /// and dead-letter topics, read `read_committed`, to hold every id exactly once.
    async fn guarantee(self, exactly_once: bool) -> Scenario {
        if !exactly_once {
            return self;
        }
        let output = format!("{}-out", self.topic);
        self.client
            .create_topic(&output, PARTITIONS, 1, &[])
            .await
            .expect("create the output topic");
        Scenario {
            output: Some(output),
            ..self
        }
    }

    /// Produces more ids while the scenario runs.
    async fn produce(&mut self, ids: std::ops::Range<u64>) {
        let more = produce_ids(&self.client, &self.topic, PARTITIONS, ids).await;
        self.ids.extend(more);
    }

    /// A manifest of one pipeline running `component` with the ledger plugin's `plugin_config`
    /// (TOML inline-table entries), every 7th id rejected and dead-lettered.
    fn manifest(&self, bootstrap: &str, component: &Path, plugin_config: &str) -> PathBuf {
        self.manifest_with(bootstrap, component, plugin_config, FAULT_SETTINGS)
    }

    /// Runs one host of the ledger fixture with `plugin_config` and `settings` until it has
    /// judged every id, stops it, checks the ledger and returns its last `/pipelines` status.
    async fn judge_all(&self, plugin_config: &str, settings: &str) -> serde_json::Value {
        let manifest = self.manifest_with(
            &bootstrap(),
            &guest("fixture_ledger"),
            plugin_config,
            settings,
        );
        let (status, seen) =
            run_until_judged(sharehost_bin!(), manifest, self.ids.len(), &self.group).await;
        self.ledger(&[seen]).await;
        status
    }

    /// [`Scenario::manifest`] with `settings` instead of [`FAULT_SETTINGS`].
    fn manifest_with(
        &self,
        bootstrap: &str,
        component: &Path,
        plugin_config: &str,
        settings: &str,
    ) -> PathBuf {
        let (emit, guarantee) = match &self.output {
            Some(out) => (
                r#"emit-to = "out", "#,
                format!("guarantee = \"exactly-once\"\noutputs = {{ out = \"{out}\" }}\n"),
            ),
            None => ("", String::new()),
        };
        let text = ledger_manifest(
            bootstrap,
            &self.topic,
            &self.group,
            component,
            &format!(r#"reject-every = "7", {emit}{plugin_config}"#),
            &format!(
                "{settings}{guarantee}dead_letter_topic = \"{}\"\n",
                self.dlq
            ),
        );
        let path = self.dir.join(format!("{}.toml", unique("manifest")));
        std::fs::write(&path, text).expect("write manifest");
        path
    }

    /// The broker has nothing left for the group, then the ledger over what every host's plugin
    /// reported and what the dead-letter topic holds (read `read_committed`); prints it and fails
    /// on a lost record. An exactly-once twin's also fails on an output or dead letter written
    /// twice.
    async fn ledger(&self, seen: &[Seen]) -> Ledger {
        let group = self.group.clone();
        tokio::task::spawn_blocking(move || wait_until_drained(&group))
            .await
            .expect("join");
        let mut ledger = Ledger::new(self.name, self.ids.iter().cloned());
        for s in seen {
            s.record(&mut ledger);
        }
        let letters: Vec<DeadLetter> = committed_records(&self.client, &self.dlq, 1)
            .await
            .into_iter()
            .map(|(p, r)| DeadLetter::from_record(p, r))
            .collect();
        let dead: Vec<String> = letters
            .iter()
            .map(|d| String::from_utf8_lossy(d.value().map_or(&[][..], |v| v)).into_owned())
            .collect();
        for id in &dead {
            ledger.dead_lettered(id.clone());
        }
        ledger.check();
        if let Some(output) = &self.output {
            let written = Written {
                source: (&self.topic, PARTITIONS),
                output: (output, PARTITIONS),
                dead_letters: (&self.dlq, 1),
            };
            let judged = seen.iter().map(Seen::judged).sum();
            check_exactly_once(self.name, &self.client, &self.ids, written, judged).await;
            // Every id once is not enough: a pipeline whose transactions never committed sends
            // every record back until the cap, and dead-letters each once.
            let capped = letters
                .iter()
                .filter(|d| d.reason.starts_with("delivery cap"))
                .count();
            assert_eq!(
                capped, 0,
                "{}: no record of these faults reaches the delivery cap",
                self.name
            );
        }
        let dead: std::collections::HashSet<&String> = dead.iter().collect();
        let rejected: std::collections::BTreeSet<&String> =
            seen.iter().flat_map(|s| &s.rejected).collect();
        for id in rejected {
            assert!(
                dead.contains(id),
                "{}: rejected id {id} is in the dead-letter topic",
                self.name
            );
        }
        ledger
    }
}

/// The sum of every sample of a metric family whose labels hold `label` (all when empty).
fn metric_sum(metrics: &str, family: &str, label: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{'))
        })
        .filter(|l| {
            l.split('}')
                .next()
                .is_some_and(|labels| labels.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Reports, beside the scenario's ledger, what the host's engine says of its duplicates:
/// verdicts waiting when a session ended (`unsent`) or made after it had (`late`), failed
/// acknowledgements, the lost verdicts applied to their records' next delivery without a plugin
/// call, and how many sessions ended. Read before the host stops (a drain adds nothing to them).
fn report_lost_verdicts(scenario: &str, host: &HostProcess) {
    let (_, m) = host.http("GET", "/metrics", "");
    report(&format!(
        "engine {scenario}: verdicts lost {} unsent + {} late, acknowledgements failed {}, replayed without a plugin call {}, session resets {}",
        metric_sum(&m, "sharehost_verdicts_lost_total", "when=\"unsent\""),
        metric_sum(&m, "sharehost_verdicts_lost_total", "when=\"late\""),
        metric_sum(
            &m,
            "sharehost_acknowledged_offsets_total",
            "result=\"failed\""
        ),
        metric_sum(&m, "sharehost_verdicts_replayed_total", ""),
        metric_sum(&m, "sharehost_session_resets_total", ""),
    ));
}

/// The plugin faults of the first pipeline of a `/pipelines` status, summed over its versions.
fn faults_of(status: &serde_json::Value) -> u64 {
    status[0]["versions"]
        .as_object()
        .map(|m| m.values().map(|c| c["faults"].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// The ledger plugin `component` traps on every tenth call of an instance; every record is
/// still judged, none twice. Returns the host's last `/pipelines` status.
async fn traps_every_tenth_batch(
    name: &'static str,
    component: &Path,
    exactly_once: bool,
) -> serde_json::Value {
    let s = Scenario::new(name, 3000, 30_000)
        .await
        .guarantee(exactly_once)
        .await;
    let manifest = s.manifest(&bootstrap(), component, r#"trap-every = "10""#);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let n = s.ids.len();
    let seen = blocking(move || h.wait_for("every id judged", |s| s.distinct().len() >= n)).await;
    let status = host.status();
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen_at_end) = blocking(move || host.stop()).await;
    let ledger = s.ledger(&[seen_at_end]).await;
    assert!(
        faults_of(&status) >= 3,
        "the plugin trapped on every tenth call of an instance: {status}"
    );
    assert_eq!(
        ledger.duplicates(),
        0,
        "a trap is contained: the faulted batch is judged once, on a fresh instance"
    );
    assert!(seen.calls > 0);
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_traps_every_tenth_batch_loses_nothing() {
    let _shared = BROKER.read().await;
    traps_every_tenth_batch("trap-every-tenth", &guest("fixture_ledger"), false).await;
}

/// The same in an exactly-once pipeline that writes every id's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_traps_every_tenth_batch_loses_nothing_exactly_once() {
    let _shared = BROKER.read().await;
    traps_every_tenth_batch("trap-every-tenth-eo", &guest("fixture_ledger"), true).await;
}

/// The same witness written in Python (tests/fixtures/guests-py/ledger): an uncaught exception
/// is its trap, and its instances come from the on-demand allocator (38 core instances).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_plugin_that_traps_every_tenth_batch_loses_nothing() {
    let _shared = BROKER.read().await;
    let status = traps_every_tenth_batch("trap-every-tenth-py", &guest("ledger_py"), false).await;
    assert_eq!(status[0]["allocator"], "on-demand", "{status}");
}

/// The same Python witness in an exactly-once pipeline that writes every id's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_plugin_that_traps_every_tenth_batch_loses_nothing_exactly_once() {
    let _shared = BROKER.read().await;
    traps_every_tenth_batch("trap-every-tenth-py-eo", &guest("ledger_py"), true).await;
}

async fn hot_swaps_under_load_lose_nothing_in(exactly_once: bool) {
    let chunk = 500 * scale();
    let name = if exactly_once {
        "hot-swap-eo"
    } else {
        "hot-swap"
    };
    let mut s = Scenario::with_records(name, 0..2 * chunk, 30_000)
        .await
        .guarantee(exactly_once)
        .await;
    let v1 = s.dir.join("ledger-v1.wasm");
    let v2 = s.dir.join("ledger-v2.wasm");
    let original = guest("fixture_ledger");
    std::fs::write(&v1, new_version(&original, "v1")).expect("write v1");
    std::fs::write(&v2, new_version(&original, "v2")).expect("write v2");
    let manifest = s.manifest(&bootstrap(), &v1, r#"pause-ms = "20""#);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    // Each swap is asked for while records of the old version are still being judged, and new
    // records arrive after it: both versions work, and the hand-over happens under load.
    for (i, next) in [&v2, &v1, &v2, &v1].into_iter().enumerate() {
        let (h, path) = (host.clone(), next.clone());
        let busy = s.ids.len() - usize::try_from(chunk / 2).unwrap_or(0);
        let (code, body) = blocking(move || {
            h.wait_for("records judged before the next swap", |seen| {
                seen.judged() >= busy
            });
            h.http(
                "POST",
                "/pipelines/ledger/swap",
                &format!(r#"{{"path":"{}"}}"#, path.display()),
            )
        })
        .await;
        assert_eq!(code, 200, "swap {} took effect: {body}", i + 1);
        let next_ids = (2 + i as u64) * chunk..(3 + i as u64) * chunk;
        s.produce(next_ids).await;
    }
    let (h, n) = (host.clone(), s.ids.len());
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let status = host.status();
    let (_, metrics) = host.http("GET", "/metrics", "");
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    let ledger = s.ledger(&[seen]).await;
    let versions = status[0]["versions"].as_object().expect("versions");
    assert_eq!(versions.len(), 2, "both versions judged records: {status}");
    assert!(
        versions
            .values()
            .all(|c| c["batches"].as_u64().unwrap_or(0) > 0),
        "{status}"
    );
    assert!(
        metrics.contains(r#"sharehost_swaps_total{pipeline="ledger",result="ok"} 4"#),
        "four swaps: {metrics}"
    );
    assert_eq!(
        ledger.duplicates(),
        0,
        "a swap hands over between batches: nothing judged twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swaps_under_load_lose_nothing() {
    let _shared = BROKER.read().await;
    hot_swaps_under_load_lose_nothing_in(false).await;
}

/// The same in an exactly-once pipeline that writes every id's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swaps_under_load_lose_nothing_exactly_once() {
    let _shared = BROKER.read().await;
    hot_swaps_under_load_lose_nothing_in(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_batch_and_restarted_loses_nothing() {
    let _shared = BROKER.read().await;
    // A 2 s lock: what the killed host held comes back quickly.
    let s = Scenario::new("host-sigkill", 2000, 2000).await;
    let manifest = s.manifest(
        &bootstrap(),
        &guest("fixture_ledger"),
        r#"pause-ms = "100""#,
    );
    let m = manifest.clone();
    let first = blocking(move || {
        let host = HostProcess::start(sharehost_bin!(), &m, "first");
        // Woken by the 5th `ledger begin`: that call is in its 100 ms pause when the kill lands.
        host.wait_for("five plugin calls begun", |s| s.calls >= 5);
        host.kill()
    })
    .await;
    assert!(
        first.judged() > 0 && first.judged() < s.ids.len(),
        "killed mid-stream"
    );
    let watch = Watch::default();
    let second =
        blocking(move || HostProcess::start_watched(sharehost_bin!(), &manifest, "second", &watch))
            .await;
    let second = Arc::new(second);
    let (h, ids) = (second.clone(), s.ids.clone());
    let first_seen = first.clone();
    blocking(move || {
        h.wait_for("every id judged across both runs", |seen| {
            let mut all = first_seen.distinct();
            all.extend(seen.distinct());
            all.len() >= ids.len()
        })
    })
    .await;
    let second = Arc::try_unwrap(second).ok().expect("sole owner");
    let (_, second_seen) = blocking(move || second.stop()).await;
    s.ledger(&[first, second_seen]).await;
}

async fn three_hosts_in_one_group_one_killed_lose_nothing_in(exactly_once: bool) {
    let name = if exactly_once {
        "three-hosts-one-killed-eo"
    } else {
        "three-hosts-one-killed"
    };
    // An exactly-once pipeline needs locks of 3 s at least (manifest.md).
    let lock_ms = if exactly_once { 6000 } else { 2000 };
    let s = Arc::new(
        Scenario::new(name, 6000, lock_ms)
            .await
            .guarantee(exactly_once)
            .await,
    );
    let manifest = s.manifest(
        &bootstrap(),
        &guest("fixture_ledger"),
        r#"pause-ms = "100""#,
    );
    let watch = Watch::default();
    let (m, w) = (manifest.clone(), watch.clone());
    let hosts = blocking(move || {
        ["host-1", "host-2", "host-3"]
            .map(|name| HostProcess::start_watched(sharehost_bin!(), &m, name, &w))
    })
    .await;
    let [h1, h2, h3] = hosts;
    let victim_seen = blocking(move || {
        // All three take part before one dies: the group spread the partitions.
        for h in [&h1, &h2, &h3] {
            h.wait_for("each host judging", |s| s.calls >= 2);
        }
        h2.wait_for("host-2 begins another call", |s| s.calls >= 3);
        (h1, h2.kill(), h3)
    })
    .await;
    let (h1, killed, h3) = victim_seen;
    let (h1, h3) = (Arc::new(h1), Arc::new(h3));
    let (a, b, sc, k) = (h1.clone(), h3.clone(), s.clone(), killed.clone());
    blocking(move || {
        let ids = sc.ids.len();
        watch.wait_until("the survivors judge every remaining id", || {
            let (sa, sb) = (a.seen(), b.seen());
            let mut all = k.distinct();
            all.extend(sa.distinct());
            all.extend(sb.distinct());
            all.len() >= ids
        });
    })
    .await;
    // What the killed host judged and never settled comes back to the survivors (once its
    // locks, and an exactly-once host's open transaction, ran out): they run until the broker
    // has nothing left for the group.
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let h1 = Arc::try_unwrap(h1).ok().expect("sole owner");
    let h3 = Arc::try_unwrap(h3).ok().expect("sole owner");
    let (seen1, seen3) = blocking(move || (h1.stop().1, h3.stop().1)).await;
    assert!(
        seen1.judged() > 0 && seen3.judged() > 0 && killed.judged() > 0,
        "all three hosts judged records"
    );
    s.ledger(&[seen1, killed, seen3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_in_one_group_one_killed_lose_nothing() {
    let _shared = BROKER.read().await;
    three_hosts_in_one_group_one_killed_lose_nothing_in(false).await;
}

/// The same in an exactly-once pipeline that writes every id's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_in_one_group_one_killed_lose_nothing_exactly_once() {
    let _shared = BROKER.read().await;
    three_hosts_in_one_group_one_killed_lose_nothing_in(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_between_host_and_broker_lose_nothing() {
    let _shared = BROKER.read().await;
    let s = Scenario::new("cut-connections", 3000, 30_000).await;
    // Every connection of the host (bootstrap, partition leaders, coordinator) goes through the
    // proxy: the broker advertises the proxy's address on this listener.
    let (listen, target) = proxied_listener();
    let proxy = Proxy::start(&listen, &target).await;
    let manifest = s.manifest(&listen, &guest("fixture_ledger"), r#"pause-ms = "20""#);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let n = s.ids.len();
    let mut cut = 0;
    for part in [4, 2] {
        let h = host.clone();
        blocking(move || h.wait_for("records judged", |seen| seen.judged() >= n / part)).await;
        cut += proxy.cut_all();
    }
    let h = host.clone();
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    report_lost_verdicts(s.name, &host);
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    s.ledger(&[seen]).await;
    assert!(cut >= 2, "connections were open when cut ({cut})");
    assert!(
        proxy.accepted() > cut,
        "the host reconnected through the proxy after the cuts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_loses_nothing() {
    // Restarting the broker disturbs every other scenario: this one runs alone.
    let _alone = BROKER.write().await;
    let s = Scenario::new("broker-restart", 3000, 30_000).await;
    let manifest = s.manifest(&bootstrap(), &guest("fixture_ledger"), r#"pause-ms = "20""#);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let (h, n) = (host.clone(), s.ids.len());
    blocking(move || h.restart_broker_mid_stream(n)).await;
    // A verdict whose acknowledgement the restart cut off is delivered again: the host runs
    // until the broker has nothing left for the group, as every other scenario's does.
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    report_lost_verdicts(s.name, &host);
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    s.ledger(&[seen]).await;
}

async fn three_quick_drains_of_a_slow_plugin_dead_letter_no_record_it_never_saw_in(
    exactly_once: bool,
) {
    // A slow plugin (500 ms a batch of 50) under a generous bound, as operators set it: each
    // host is stopped (SIGTERM, a drain) moments after its plugin starts. A host that acquired
    // up to the bound and released what it had not judged at every drain spent a delivery of
    // each such record per drain, and the fourth host dead-lettered them at the delivery cap,
    // unseen.
    let name = if exactly_once {
        "quick-drains-eo"
    } else {
        "quick-drains"
    };
    let s = Scenario::new(name, 1500, 30_000)
        .await
        .guarantee(exactly_once)
        .await;
    let settings = "batch_size = 50\nmax_in_flight = 5000\ndelivery_cap = 4\nconcurrency = 2\n";
    let manifest = s.manifest_with(
        &bootstrap(),
        &guest("fixture_ledger"),
        r#"pause-ms = "500""#,
        settings,
    );
    let mut seen = Vec::new();
    let mut peaks = Vec::new();
    for round in 0..3 {
        let m = manifest.clone();
        let (drained, peak) = blocking(move || {
            let host = HostProcess::start(sharehost_bin!(), &m, "drained");
            host.wait_for("the plugin's second call begun", |s| s.calls >= 2);
            let peak = host.status()[0]["in_flight_peak"].as_u64().unwrap_or(0);
            let (_, seen) = host.stop();
            (seen, peak)
        })
        .await;
        assert!(
            drained.judged() < s.ids.len(),
            "drain {round} came mid-stream"
        );
        seen.push(drained);
        peaks.push(peak);
    }
    let all: std::collections::HashSet<String> = seen
        .iter()
        .flat_map(|s| s.distinct())
        .map(str::to_owned)
        .collect();
    let last =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "last")).await);
    let (h, ids) = (last.clone(), s.ids.len());
    blocking(move || {
        h.wait_for("every id judged across the four runs", |seen| {
            let mut judged = all.clone();
            judged.extend(seen.distinct().into_iter().map(str::to_owned));
            judged.len() >= ids
        })
    })
    .await;
    let last = Arc::try_unwrap(last).ok().expect("sole owner");
    let (_, last_seen) = blocking(move || last.stop()).await;
    seen.push(last_seen);
    let ledger = s.ledger(&seen).await;
    let capped: Vec<String> = committed_records(&s.client, &s.dlq, 1)
        .await
        .into_iter()
        .map(|(p, r)| DeadLetter::from_record(p, r))
        .filter(|d| d.reason.starts_with("delivery cap"))
        .map(|d| d.reason)
        .collect();
    report(&format!(
        "ledger {}: three drains, in-flight peaks {peaks:?} (max_in_flight 5000), dead-lettered at the cap {}, duplicates {}",
        s.name,
        capped.len(),
        ledger.duplicates()
    ));
    assert!(
        capped.is_empty(),
        "no record reached the delivery cap through drains: {capped:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_quick_drains_of_a_slow_plugin_dead_letter_no_record_it_never_saw() {
    let _shared = BROKER.read().await;
    three_quick_drains_of_a_slow_plugin_dead_letter_no_record_it_never_saw_in(false).await;
}

/// The same in an exactly-once pipeline that writes every id's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_quick_drains_of_a_slow_plugin_dead_letter_no_record_it_never_saw_exactly_once() {
    let _shared = BROKER.read().await;
    three_quick_drains_of_a_slow_plugin_dead_letter_no_record_it_never_saw_in(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_never_passes_max_in_flight_when_producer_batches_are_larger() {
    let _shared = BROKER.read().await;
    // Producer batches of 100 records against a bound of 60: acquiring whole batches would
    // hold 100 or more at once.
    let s = Scenario::new("in-flight-bound", 600, 30_000).await;
    let settings = "batch_size = 20\nmax_in_flight = 60\ndelivery_cap = 4\nconcurrency = 1\n";
    let status = s.judge_all(r#"pause-ms = "20""#, settings).await;
    let peak = status[0]["in_flight_peak"].as_u64().unwrap_or(u64::MAX);
    report(&format!(
        "ledger {}: max_in_flight 60, producer batches of 100, in-flight peak {peak}, fetches {}, records acquired {}",
        s.name, status[0]["fetches"], status[0]["acquired"]
    ));
    assert!(peak > 0, "{status}");
    assert!(
        peak <= 60,
        "in flight passed max_in_flight: {peak}: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_batches_that_fit_the_bound_are_acquired_whole() {
    let _shared = BROKER.read().await;
    // Producer batches of 100 records against a bound of 500: a fetch that ended inside a
    // batch would make the broker track it record by record (a lock timer per offset).
    let s = Scenario::new("whole-batches", 3000, 30_000).await;
    let settings = "batch_size = 50\nmax_in_flight = 500\ndelivery_cap = 4\nconcurrency = 2\n";
    let status = s.judge_all(r#"pause-ms = "1""#, settings).await;
    let split = status[0]["acquired_split"].as_u64().unwrap_or(u64::MAX);
    let fetches = status[0]["fetches"].as_u64().unwrap_or(0);
    report(&format!(
        "ledger {}: producer batches of 100, max_in_flight 500: {fetches} fetches, {split} acquired ranges cutting a batch, in-flight peak {}",
        s.name, status[0]["in_flight_peak"]
    ));
    assert!(fetches > 0, "{status}");
    // Only the first fetch, before any batch is seen, asks by record count.
    assert!(split <= 1, "acquired ranges cut producer batches: {status}");
    assert!(
        status[0]["in_flight_peak"].as_u64().unwrap_or(u64::MAX) <= 500,
        "{status}"
    );
}

/// The member id a host's pipeline joined with, from its log's "pipeline running" line.
fn member_of(host: &HostProcess) -> String {
    host.log_lines()
        .iter()
        .find(|l| l.contains("pipeline running"))
        .and_then(|l| l.split("member=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no member id in the log: {:?}", host.log_lines()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_and_restarted_rejoins_as_the_same_member_and_takes_its_work_back() {
    let _shared = BROKER.read().await;
    // The broker's own member session timeout (45 s) and record lock (30 s): a restarted host
    // that joined as a new member would get no partition until the dead member's session
    // ended, and the records the dead one held would wait for their locks.
    let s = Scenario::with_group("restart-rejoin", 0..2000 * scale(), None, &[]).await;
    let manifest = s.manifest(
        &bootstrap(),
        &guest("fixture_ledger"),
        r#"pause-ms = "100""#,
    );
    let m = manifest.clone();
    let (first, first_member) = blocking(move || {
        let host = HostProcess::start(sharehost_bin!(), &m, "first");
        host.wait_for("five plugin calls begun", |s| s.calls >= 5);
        let member = member_of(&host);
        (host.kill(), member)
    })
    .await;
    assert!(first.judged() < s.ids.len(), "killed mid-stream");
    let restarted = std::time::Instant::now();
    let second =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "second")).await);
    let h = second.clone();
    let to_first_record = blocking(move || {
        h.wait_for("the restarted host's first plugin call", |s| s.calls >= 1);
        restarted.elapsed()
    })
    .await;
    let second_member = member_of(&second);
    let (h, ids, first_seen) = (second.clone(), s.ids.len(), first.clone());
    blocking(move || {
        h.wait_for("every id judged across both runs", |seen| {
            let mut all = first_seen.distinct();
            all.extend(seen.distinct());
            all.len() >= ids
        })
    })
    .await;
    let second = Arc::try_unwrap(second).ok().expect("sole owner");
    let (_, second_seen) = blocking(move || second.stop()).await;
    let ledger = s.ledger(&[first, second_seen]).await;
    report(&format!(
        "ledger {}: SIGKILL, restart to first record {:.2} s with the broker's 45 s session timeout and 30 s lock, same member {}, duplicates {}",
        s.name,
        to_first_record.as_secs_f64(),
        first_member == second_member,
        ledger.duplicates()
    ));
    assert_eq!(
        second_member, first_member,
        "the restarted host rejoins as the member it was"
    );
}
