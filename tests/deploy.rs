//! The operator's kit run for real: the image `dev/image` builds and the resources of
//! `deploy/kubernetes`, played with `podman kube play` against the local broker (pods on the
//! host's network). The pods become ready, judge every record, and drain when stopped; the
//! autoscaling example's lag query rises with a backlog and falls as it drains; a pod of the
//! StatefulSet killed and replaced rejoins as the member it was. The ledger is kept outside
//! the engine, from what the ledger plugin in each pod logs.
//!
//! The podman tests are ignored by `cargo test`: they need the image, which takes a release
//! build of its own. `dev/kube-test` builds it and runs them (`--ignored`); CI runs that after
//! `dev/test`. What podman does differently from a kubelet is in tests/support/pods.rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost_tests::host::{PATIENCE, Seen, Watch};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::pods::{self, Ending, Played, PodLog, Workload, image, podman_ok};
use sharehost_tests::signing::Signer;
use sharehost_tests::{blocking, bootstrap, client, fresh_group, guest, produce_ids, unique};

/// The autoscaling example's query, in the one form this test evaluates.
const QUERY_HEAD: &str = "sum(max by (topic, partition) (";
const QUERY_TAIL: &str = "))";

/// The metric and the pipeline the autoscaling example's query reads:
/// `sum(max by (topic, partition) (METRIC{pipeline="NAME"}))`.
fn scaler_query() -> (String, String) {
    let path = sharehost_tests::repo_root().join("deploy/kubernetes/autoscaling/scaledobject.yaml");
    let docs = pods::yaml_docs(&path);
    let query = docs[0]["spec"]["triggers"][0]["metadata"]["query"]
        .as_str()
        .expect("the ScaledObject's first trigger has a query")
        .to_owned();
    let selector = query
        .strip_prefix(QUERY_HEAD)
        .and_then(|q| q.strip_suffix(QUERY_TAIL))
        .unwrap_or_else(|| {
            panic!("this test evaluates `{QUERY_HEAD}METRIC{{pipeline=\"NAME\"}}{QUERY_TAIL}`; the example says {query}")
        });
    let (metric, labels) = selector.split_once('{').expect("a label selector");
    let pipeline = labels
        .strip_prefix("pipeline=\"")
        .and_then(|l| l.strip_suffix("\"}"))
        .unwrap_or_else(|| panic!("one pipeline=\"NAME\" matcher, got {labels}"));
    (metric.to_owned(), pipeline.to_owned())
}

/// `metric`'s series of `pipeline` in a `/metrics` text, by (topic, partition).
fn series(text: &str, metric: &str, pipeline: &str) -> BTreeMap<(String, String), i64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|kv| {
                kv.strip_prefix(name)?
                    .strip_prefix("=\"")?
                    .strip_suffix('"')
                    .map(str::to_owned)
            })
        };
        if label("pipeline").as_deref() != Some(pipeline) {
            continue;
        }
        if let (Some(t), Some(p), Ok(v)) =
            (label("topic"), label("partition"), value.trim().parse())
        {
            out.insert((t, p), v);
        }
    }
    out
}

/// The query's value over the pods' scrapes, once every pod reports all `partitions` of
/// `topic`: the largest report per partition, summed over the partitions.
fn scaler_value(
    logs: &[PodLog],
    metric: &str,
    pipeline: &str,
    topic: &str,
    partitions: usize,
) -> Option<i64> {
    let mut max: BTreeMap<(String, String), i64> = BTreeMap::new();
    for log in logs {
        let (code, text) = log.http("GET", "/metrics");
        if code != 200 {
            return None;
        }
        let s = series(&text, metric, pipeline);
        if s.keys().filter(|(t, _)| t == topic).count() < partitions {
            return None;
        }
        for (k, v) in s.into_iter().filter(|((t, _), _)| t == topic) {
            let m = max.entry(k).or_insert(v);
            *m = (*m).max(v);
        }
    }
    Some(max.values().sum())
}

/// Polls the pods' `/metrics` until `cond` holds for the query's value; returns it. Polling: a
/// scrape cannot be waited on, and the host asks the coordinator every 10 s.
fn wait_for_value(
    what: &str,
    logs: &[PodLog],
    query: &(String, String),
    topic: &str,
    cond: impl Fn(i64) -> bool,
) -> i64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = scaler_value(logs, &query.0, &query.1, topic, PARTITIONS)
            && cond(v)
        {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

const PARTITIONS: usize = 3;

/// A directory of this test's own under target/, readable by the pods' user: the plugins'
/// host directory and the played file.
fn scratch(tag: &str) -> PathBuf {
    let dir = sharehost_tests::repo_root()
        .join("target/kube-test")
        .join(unique(tag));
    std::fs::create_dir_all(dir.join("plugins")).expect("scratch dir");
    dir
}

/// Copies the ledger plugin into `dir/plugins`, signs it with a fresh key pair as `minisign
/// -Sm` does, and returns the public key line the manifest's `trusted.pub` holds.
fn signed_ledger(dir: &Path) -> String {
    let component = dir.join("plugins/fixture_ledger.wasm");
    std::fs::copy(guest("fixture_ledger"), &component).expect("copy the ledger plugin");
    let publisher = Signer::new();
    publisher.sign(&component);
    publisher.public()
}

/// The manifest the pods run: the ledger plugin (signed, trusted through the ConfigMap's
/// `trusted.pub`) on `topic` in `group`, with the Secrets' admin token and plugin secret.
fn manifest(pipeline: &str, topic: &str, group: &str, plugin_config: &str) -> String {
    format!(
        r#"[cluster]
bootstrap = "{bootstrap}"

[admin]
# A port of its own per pod: they share the host's network.
listen = "127.0.0.1:0"
token_env = "SHAREHOST_ADMIN_TOKEN"

[trust]
keys_file = "trusted.pub"

[[pipeline]]
name = "{pipeline}"
topics = ["{topic}"]
group = "{group}"
component = "/plugins/fixture_ledger.wasm"
config = {{ {plugin_config} }}
batch_size = 50
max_in_flight = 500
concurrency = 2

[pipeline.secrets]
api-token = {{ env = "ORDERS_API_TOKEN" }}
"#,
        bootstrap = bootstrap()
    )
}

/// Plays the base with `manifest`, follows every pod's log and waits until each answers
/// `/readyz` 200 (joined and writing) and `/healthz` 200, as the kubelet's probes would see.
fn play_until_ready(
    dir: &Path,
    prefix: &str,
    manifest: &str,
    trusted: &str,
    watch: &Watch,
) -> (Played, Vec<PodLog>) {
    let rendered = pods::render(prefix, manifest, trusted, &dir.join("plugins"));
    follow_until_ready(rendered.play(dir), watch)
}

/// Follows every pod's log of `played` and waits until each is ready ([`wait_ready`]).
fn follow_until_ready(played: Played, watch: &Watch) -> (Played, Vec<PodLog>) {
    let logs: Vec<PodLog> = (0..played.pods.len())
        .map(|i| played.follow(i, watch))
        .collect();
    wait_ready(&logs);
    (played, logs)
}

/// Waits until every pod of `logs` answers `/readyz` 200 (joined and writing) and `/healthz`
/// 200, as the kubelet's probes would see. Polling: a probe is a request, not an event.
fn wait_ready(logs: &[PodLog]) {
    let deadline = Instant::now() + PATIENCE;
    for log in logs {
        loop {
            let (code, body) = log.http("GET", "/readyz");
            if code == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} never ready: {code} {body}",
                log.admin()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(log.http("GET", "/healthz").0, 200, "liveness");
    }
}

/// Every id the ledger plugin judged in any of `logs`.
fn judged(logs: &[PodLog]) -> std::collections::HashSet<String> {
    logs.iter()
        .flat_map(|l| {
            let s = l.seen();
            s.accepted.into_iter().chain(s.rejected)
        })
        .collect()
}

/// Stops every pod the kubelet's way (SIGTERM, the Deployment's grace) and removes them with
/// `podman kube down`; every host must have drained and exited 0. Returns what each logged.
fn stop_all(played: &Played, logs: Vec<PodLog>) -> Vec<(Seen, Vec<String>)> {
    let ended: Vec<(Seen, Vec<String>)> = logs
        .into_iter()
        .map(|log| {
            let i = log.replica;
            let code = played.stop(i);
            let (seen, lines) = log.ended();
            assert_eq!(code, 0, "pod {i}: sharehost exits 0 after SIGTERM");
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("signal received: draining")),
                "pod {i} drained on SIGTERM"
            );
            (seen, lines)
        })
        .collect();
    played.down();
    ended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image and podman: dev/kube-test builds the image and runs it"]
async fn the_pods_become_ready_judge_every_record_and_drain_when_stopped() {
    let started = Instant::now();
    let client = Arc::new(client().await);
    let topic = unique("kube");
    client
        .create_topic(&topic, PARTITIONS as i32, 1, &[])
        .await
        .expect("create topic");
    let group = fresh_group(&client, None).await;
    let dir = scratch("pods");
    let trusted = signed_ledger(&dir);
    // Each batch pauses a little, so the first pod's drain finds records in flight.
    let text = manifest("orders", &topic, &group, "pause-ms = \"100\"");
    let watch = Watch::default();
    let prefix = unique("t").chars().take(10).collect::<String>();
    let watch2 = watch.clone();
    let (played, logs) = {
        let (dir, watch) = (dir.clone(), watch.clone());
        blocking(move || play_until_ready(&dir, &prefix, &text, &trusted, &watch)).await
    };
    assert_eq!(played.pods.len(), 2, "the base runs two replicas");
    let pids = played.pids(0);
    assert!(
        pids.iter().any(|p| p == "1 sharehost"),
        "sharehost is PID 1 in its container: {pids:?}"
    );
    // The precompiled cache is written to its volume, in a directory only the host's user
    // may enter (the host refuses one that others can write).
    let cwasm = played.volume_path("cache").join("cwasm");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&cwasm)
            .unwrap_or_else(|e| panic!("{}: {e}", cwasm.display()))
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o700, "{}", cwasm.display());
    let entries = std::fs::read_dir(&cwasm).expect("read the cache").count();
    assert!(
        entries >= 2,
        "the cache's key and the ledger plugin's entry: {entries}"
    );
    assert_eq!(
        logs[0].http("POST", "/pipelines/orders/rollback").0,
        401,
        "the admin token from the Secret guards actions"
    );

    let mut ids = produce_ids(&client, &topic, PARTITIONS as i32, 0..1500).await;
    let (played, logs, first) = blocking(move || {
        watch.wait_until("a fifth of the first wave judged", || {
            judged(&logs).len() >= 300
        });
        // One pod goes while records are in flight; the other takes its partitions over.
        let mut logs = logs;
        let first = logs.remove(0);
        let code = played.stop(0);
        let first = first.ended();
        assert_eq!(code, 0, "pod 0: sharehost exits 0 after SIGTERM");
        assert!(
            first
                .1
                .iter()
                .any(|l| l.contains("signal received: draining")),
            "pod 0 drained on SIGTERM"
        );
        (played, logs, first)
    })
    .await;
    ids.extend(produce_ids(&client, &topic, PARTITIONS as i32, 1500..2000).await);
    let n = ids.len();
    let first_ids: std::collections::HashSet<String> = first
        .0
        .accepted
        .iter()
        .chain(&first.0.rejected)
        .cloned()
        .collect();
    let rest = blocking(move || {
        watch2.wait_until("every id judged", || {
            let mut all = judged(&logs);
            all.extend(first_ids.iter().cloned());
            all.len() >= n
        });
        stop_all(&played, logs)
    })
    .await;

    let mut ledger = Ledger::new("kube play (2 pods, one stopped mid-stream)", ids);
    first.0.record(&mut ledger);
    for (seen, _) in &rest {
        seen.record(&mut ledger);
    }
    ledger.check();
    report(&format!(
        "kube play: image {}, 2 pods ready, 2000 records, pod 0 stopped once 300 of the first 1,500 were judged, both drained and exited 0 (grace {} s): {} s in all",
        image(),
        played_grace(),
        started.elapsed().as_secs()
    ));
}

/// The Deployment's grace period, as the base says.
fn played_grace() -> u64 {
    let docs = pods::base_resources();
    docs.iter()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64())
        .expect("terminationGracePeriodSeconds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image and podman: dev/kube-test builds the image and runs it"]
async fn the_autoscaling_querys_lag_rises_with_a_backlog_and_falls_as_it_drains() {
    let started = Instant::now();
    let query = scaler_query();
    let client = Arc::new(client().await);
    let topic = unique("kube-lag");
    client
        .create_topic(&topic, PARTITIONS as i32, 1, &[])
        .await
        .expect("create topic");
    let group = fresh_group(&client, None).await;
    let dir = scratch("lag");
    let trusted = signed_ledger(&dir);
    let watch = Watch::default();
    let base = unique("l").chars().take(9).collect::<String>();

    // The hosts run, judge a first wave on every partition and report the lag at 0.
    let mut ids = produce_ids(&client, &topic, PARTITIONS as i32, 0..300).await;
    let text = manifest(&query.1, &topic, &group, "");
    let (d, w, t, k, q, p) = (
        dir.clone(),
        watch.clone(),
        topic.clone(),
        trusted.clone(),
        query.clone(),
        format!("{base}a"),
    );
    let (first, zero) = blocking(move || {
        let (played, logs) = play_until_ready(&d, &p, &text, &k, &w);
        w.wait_until("the first wave judged", || judged(&logs).len() >= 300);
        let zero = wait_for_value("the lag at 0 after the first wave", &logs, &q, &t, |v| {
            v == 0
        });
        (stop_all(&played, logs), zero)
    })
    .await;

    // With the hosts stopped, a backlog.
    ids.extend(produce_ids(&client, &topic, PARTITIONS as i32, 300..1200).await);
    // They come back slowed: every record's first delivery answers retry(20 s), so nothing of
    // the backlog is acknowledged before the first lag report, which comes as they start.
    let text = manifest(
        &query.1,
        &topic,
        &group,
        "retry-first-every = \"1\", retry-ms = \"20000\"",
    );
    let (d, w, t, q, p, n) = (
        dir.clone(),
        watch.clone(),
        topic.clone(),
        query.clone(),
        format!("{base}b"),
        ids.len(),
    );
    let (second, risen, fallen) = blocking(move || {
        let (played, logs) = play_until_ready(&d, &p, &text, &trusted, &w);
        let risen = wait_for_value("the lag to show the backlog", &logs, &q, &t, |_| true);
        w.wait_until("the backlog judged", || judged(&logs).len() + 300 >= n);
        let fallen = wait_for_value("the lag back at 0", &logs, &q, &t, |v| v == 0);
        (stop_all(&played, logs), risen, fallen)
    })
    .await;
    assert!(
        risen > 0 && risen <= 900,
        "the backlog of 900 records shows in the query's value: {risen}"
    );

    let mut ledger = Ledger::new("kube play, lag", ids);
    for (seen, _) in first.iter().chain(&second) {
        seen.record(&mut ledger);
    }
    ledger.check();
    report(&format!(
        "kube play, scaling on lag: `{QUERY_HEAD}{}{{pipeline=\"{}\"}}{QUERY_TAIL}` was {zero} after the first wave, {risen} with a backlog of 900 produced while the hosts were stopped, {fallen} once it drained: {} s in all",
        query.0,
        query.1,
        started.elapsed().as_secs()
    ));
}

/// The replacement test's topic: six partitions, three for each of the two pods.
const REPLACED_PARTITIONS: i32 = 6;
/// Records per partition every tenth of a second while a pod is replaced: 300 a second in all.
const PER_TICK: u64 = 5;

/// The partition [`steady`] writes record `id` to.
fn partition_of(id: &str) -> Option<i32> {
    let id: u64 = id.parse().ok()?;
    i32::try_from((id / PER_TICK) % REPLACED_PARTITIONS as u64).ok()
}

/// Produces ids 0, 1, 2, ... at 300 records a second (every tenth of a second [`PER_TICK`]
/// to each partition in turn) while `on` holds, counting them in `produced`; returns them. A
/// timer paces it: the rate is the point, nothing is waited for.
async fn steady(
    client: Arc<KafkaClient>,
    topic: String,
    on: Arc<AtomicBool>,
    produced: Arc<AtomicU64>,
) -> Vec<String> {
    let mut ids = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next = 0u64;
    while on.load(Ordering::SeqCst) {
        tick.tick().await;
        for p in 0..REPLACED_PARTITIONS {
            let batch: Vec<String> = (next..next + PER_TICK).map(|i| i.to_string()).collect();
            next += PER_TICK;
            let records: Vec<ProduceRecord> = batch
                .iter()
                .map(|id| ProduceRecord {
                    value: Some(Bytes::from(id.clone())),
                    ..Default::default()
                })
                .collect();
            client
                .produce(&topic, p, &records, Compression::Lz4)
                .await
                .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
            ids.extend(batch);
            produced.store(next, Ordering::SeqCst);
        }
    }
    ids
}

/// The member id a host's log says its pipeline runs as (its last `pipeline running` line).
fn member_of(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .rev()
        .find(|l| l.contains("pipeline running"))
        .and_then(|l| l.split("\"member\":\"").nth(1))
        .and_then(|r| r.split('"').next())
        .map(str::to_owned)
}

/// The verdicts in `container`'s log so far, each with the time its host logged it (the
/// JSON log's `timestamp`): `(when, id)`.
fn logged_verdicts(container: &str) -> Vec<(SystemTime, String)> {
    let out = pods::podman()
        .args(["logs", container])
        .output()
        .expect("run podman logs");
    // The host logs on stderr; podman hands both streams back as they were.
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let mut verdicts = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.split("ledger accepted=").nth(1) else {
            continue;
        };
        let Some(at) = line
            .split("\"timestamp\":\"")
            .nth(1)
            .and_then(|t| t.split('"').next())
            .and_then(utc_time)
        else {
            continue;
        };
        let ids = rest
            .split(|c: char| !(c.is_ascii_digit() || c == ','))
            .next()
            .unwrap_or_default();
        verdicts.extend(
            ids.split(',')
                .filter(|i| !i.is_empty())
                .map(|i| (at, i.to_owned())),
        );
    }
    verdicts
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, the host's log time, as a `SystemTime`.
fn utc_time(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|n| n.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|n| n.parse::<i64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + h * 3600 + min * 60 + sec).ok()?;
    let digits: String = fraction.chars().take(9).collect();
    let nanos: u64 = format!("{digits:0<9}").parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

/// Seconds from `from` to `to`, negative when `to` came first.
fn seconds(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// How one replaced pod went ([`replace_a_pod`]).
struct Replaced {
    what: String,
    old_member: String,
    new_member: String,
    /// The replacement logged that its member id came from its name.
    named: bool,
    /// The partitions the old pod judged in its last verdicts before it went.
    held: Vec<i32>,
    /// Per partition, from the old pod's end (SIGKILL or SIGTERM) to the first verdict on it
    /// seen after, and from the replacement container's start to that verdict, in seconds.
    gaps: BTreeMap<i32, (f64, f64)>,
    /// From the old pod's end to the replacement container's start (podman's part).
    played_after: f64,
    ledger: Ledger,
}

impl Replaced {
    /// One line for the report and docs/deploy.md.
    fn line(&self) -> String {
        let held: Vec<String> = self
            .held
            .iter()
            .filter_map(|p| {
                self.gaps
                    .get(p)
                    .map(|(end, start)| format!("p{p} {end:.2} s ({start:.2} s)"))
            })
            .collect();
        let others = self
            .gaps
            .iter()
            .filter(|(p, _)| !self.held.contains(p))
            .map(|(_, (end, _))| *end)
            .fold(0.0f64, f64::max);
        format!(
            "kube play, a replaced pod ({}): member {} -> {}{}; the old pod's partitions judged again after its end (after the replacement's start): {}; the other pod's partitions at most {others:.2} s; the replacement started {:.2} s after the end; {}",
            self.what,
            self.old_member,
            self.new_member,
            if self.named { " (from its name)" } else { "" },
            held.join(", "),
            self.played_after,
            self.ledger
        )
    }
}

/// Two pods of `workload` (played as Pods from its template: tests/support/pods.rs) judge
/// records arriving at 300 a second on six partitions of a group with the broker's default
/// session timeout (45 s); pod 0 goes as `ending` says and its replacement is played from the
/// template with new, empty `emptyDir`s (its state directory among them), as a controller
/// would. Waits until every partition is judged again and every record is judged.
async fn replace_a_pod(workload: Workload, ending: Ending) -> Replaced {
    let client = Arc::new(client().await);
    let topic = unique("kube-replace");
    client
        .create_topic(&topic, REPLACED_PARTITIONS, 1, &[])
        .await
        .expect("create topic");
    let group = fresh_group(&client, None).await;
    let dir = scratch("replace");
    let trusted = signed_ledger(&dir);
    let text = manifest("orders", &topic, &group, "");
    let watch = Watch::default();
    let prefix = unique("r").chars().take(10).collect::<String>();
    let on = Arc::new(AtomicBool::new(true));
    let produced = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(steady(
        client.clone(),
        topic.clone(),
        on.clone(),
        produced.clone(),
    ));

    let w = watch.clone();
    let (played, logs, old, old_member, ended_at, started_at, first_after) = blocking(move || {
        let rendered = pods::render_pods(&prefix, workload, &text, &trusted, &dir.join("plugins"));
        let (mut played, mut logs) = follow_until_ready(rendered.play(&dir), &w);
        // Both pods judging the steady stream, each its share of the partitions, past the
        // group's first assignments: each has judged 100 of the records produced from two
        // seconds after both were ready (a kill while the coordinator still moves partitions
        // measures the rebalance, not the replacement).
        let mark = produced.load(Ordering::SeqCst) + 600;
        w.wait_until("both pods judging the steady stream", || {
            logs.iter().all(|l| {
                l.seen()
                    .accepted
                    .iter()
                    .filter(|id| id.parse::<u64>().is_ok_and(|i| i >= mark))
                    .count()
                    >= 100
            })
        });
        let old_member = member_of(&logs[0].lines()).expect("pod 0 logged its member id");
        let survivor_before = logs[1].seen().accepted.len();
        let ended_at = SystemTime::now();
        let code = played.end(0, ending);
        let old = logs.remove(0).ended();
        match ending {
            Ending::Killed => assert_eq!(code, 137, "pod 0 was killed"),
            Ending::Drained => assert_eq!(code, 0, "pod 0 drained and exited 0"),
        }
        let started_at = played.replace(0);
        let new = played.follow(0, &w);
        // Every partition judged again, by the pods still there.
        let survivor = &logs[0];
        w.wait_until("every partition judged again after the replacement", || {
            let later = survivor.seen().accepted.split_off(survivor_before);
            let partitions: std::collections::BTreeSet<i32> = later
                .iter()
                .chain(&new.seen().accepted)
                .filter_map(|id| partition_of(id))
                .collect();
            partitions.len() == REPLACED_PARTITIONS as usize && member_of(&new.lines()).is_some()
        });
        // When: the hosts' own log times, not when this test read the lines (podman is slow
        // to hand them over while it plays a pod).
        let mut first: BTreeMap<i32, SystemTime> = BTreeMap::new();
        for container in [&played.containers[0], &played.containers[1]] {
            for (at, id) in logged_verdicts(container) {
                if let Some(p) = partition_of(&id)
                    && at >= ended_at
                {
                    let t = first.entry(p).or_insert(at);
                    *t = (*t).min(at);
                }
            }
        }
        logs.insert(0, new);
        (played, logs, old, old_member, ended_at, started_at, first)
    })
    .await;
    on.store(false, Ordering::SeqCst);
    let ids = producer.await.expect("the producer");
    let n = ids.len();
    let old_ids: std::collections::HashSet<String> = old
        .0
        .accepted
        .iter()
        .chain(&old.0.rejected)
        .cloned()
        .collect();
    // The partitions the old pod judged last (its final 100 verdicts, a third of a second).
    let mut held: Vec<i32> = old
        .0
        .accepted
        .iter()
        .rev()
        .take(100)
        .filter_map(|id| partition_of(id))
        .collect();
    held.sort_unstable();
    held.dedup();
    let new_lines = logs[0].lines();
    let new_member = member_of(&new_lines).expect("the replacement logged its member id");
    let named = new_lines
        .iter()
        .any(|l| l.contains("the member derived from this host's name"));
    let rest = blocking(move || {
        watch.wait_until("every id judged", || {
            let mut all = judged(&logs);
            all.extend(old_ids.iter().cloned());
            all.len() >= n
        });
        stop_all(&played, logs)
    })
    .await;
    let what = format!("{workload:?}, {ending:?}");
    let mut ledger = Ledger::new(&format!("kube play, a replaced pod ({what})"), ids);
    old.0.record(&mut ledger);
    for (seen, _) in &rest {
        seen.record(&mut ledger);
    }
    ledger.check();
    Replaced {
        what,
        old_member,
        new_member,
        named,
        held,
        gaps: first_after
            .into_iter()
            .map(|(p, t)| (p, (seconds(ended_at, t), seconds(started_at, t))))
            .collect(),
        played_after: seconds(ended_at, started_at),
        ledger,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image and podman: dev/kube-test builds the image and runs it"]
async fn a_replaced_statefulset_pod_rejoins_as_the_member_it_was_and_loses_nothing() {
    // SHAREHOST_KUBE_REPLACEMENTS adds the comparisons docs/deploy.md reports (each a
    // WORKLOAD-ENDING pair: statefulset or deployment, killed or drained); by default the
    // StatefulSet's pod is killed, the case a kept member id is for.
    let wanted = std::env::var("SHAREHOST_KUBE_REPLACEMENTS")
        .unwrap_or_else(|_| "statefulset-killed".to_owned());
    for case in wanted.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let (workload, ending) = match case {
            "statefulset-killed" => (Workload::StatefulSet, Ending::Killed),
            "statefulset-drained" => (Workload::StatefulSet, Ending::Drained),
            "deployment-killed" => (Workload::Deployment, Ending::Killed),
            "deployment-drained" => (Workload::Deployment, Ending::Drained),
            other => panic!("SHAREHOST_KUBE_REPLACEMENTS: unknown case {other}"),
        };
        let r = replace_a_pod(workload, ending).await;
        report(&r.line());
        match workload {
            Workload::StatefulSet => {
                assert_eq!(
                    r.new_member, r.old_member,
                    "the replacement rejoined as the member the old pod was"
                );
                assert!(
                    r.named,
                    "its member id came from its name: its state directory was new"
                );
            }
            // The Deployment sets no name: its replacement is a new member, whose wait for
            // the dead one's partitions is what the StatefulSet avoids.
            Workload::Deployment => assert_ne!(r.new_member, r.old_member),
        }
    }
}

#[test]
#[ignore = "needs the image and podman: dev/kube-test builds the image and runs it"]
fn the_image_is_small_static_non_root_and_has_no_shell() {
    let image = image();
    let inspect = |format: &str| podman_ok(&["image", "inspect", "--format", format, &image]);
    assert_eq!(inspect("{{.Config.User}}").trim(), "65532:65532");
    let size: u64 = inspect("{{.Size}}").trim().parse().expect("a size");
    let layers = inspect("{{len .RootFS.Layers}}");
    let version = podman_ok(&["run", "--rm", "--network", "none", &image, "--version"]);
    assert!(version.starts_with("sharehost "), "{version}");
    let shell = pods::podman()
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/bin/sh",
            &image,
            "-c",
            "true",
        ])
        .output()
        .expect("run podman");
    assert!(!shell.status.success(), "the image has no shell");
    // A guard against an image that grows by accident (a debug build, a base image), not a
    // target: the binary is most of it.
    assert!(size < 64 << 20, "the image is {size} bytes");
    report(&format!(
        "image {image}: {size} bytes ({:.1} MiB), {} layers, user 65532, no shell",
        size as f64 / f64::from(1 << 20),
        layers.trim()
    ));
}

#[test]
fn the_resources_agree_with_the_host_and_with_each_other() {
    let mut docs = pods::base_resources();
    let manifest =
        pods::find(&mut docs, "ConfigMap", "sharehost-manifest")["data"]["manifest.toml"]
            .as_str()
            .expect("manifest.toml")
            .to_owned();
    let listen = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("[admin] listen");
    let port: u64 = listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("a port");
    let dep = pods::find(&mut docs, "Deployment", "sharehost");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["ports"][0]["containerPort"], port,
        "the admin port is the manifest's"
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        assert_eq!(
            c[probe]["httpGet"]["port"], c["ports"][0]["name"],
            "{probe} port"
        );
    }
    // The drain: judging ends 20 s after SIGTERM, running batches get 30 s; the grace period
    // leaves time beyond that to flush acknowledgements and leave the groups.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace");
    assert!(
        grace > 30,
        "terminationGracePeriodSeconds {grace} covers the drain"
    );
    let env: Vec<&str> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(manifest.contains("token_env = \"SHAREHOST_ADMIN_TOKEN\""));
    assert!(env.contains(&"SHAREHOST_ADMIN_TOKEN") && env.contains(&"ORDERS_API_TOKEN"));
    let svc = pods::find(&mut docs, "Service", "sharehost-admin");
    assert_eq!(svc["spec"]["ports"][0]["port"], port);
    // `sharehost ctl --admin http://sharehost-admin:9464` sends the Service's name as Host.
    assert!(
        manifest.contains("allowed_hosts = [\"sharehost-admin\"]"),
        "the Service's name is one the listener answers to"
    );
    // The autoscaling example reads a metric the host exports, of a pipeline the manifest has.
    let (metric, pipeline) = scaler_query();
    // The host's own registry, with one lag report in it (the family shows once the
    // coordinator has answered): the query's name and labels read it back.
    let metrics = sharehost::metrics::Metrics::new();
    metrics
        .share_group_lag
        .get_or_create(&vec![
            ("pipeline", pipeline.clone()),
            ("topic", "t".to_owned()),
            ("partition", "0".to_owned()),
        ])
        .set(7);
    let exported = metrics.encode();
    assert!(
        exported.contains(&format!("# TYPE {metric} gauge")),
        "{metric} is a gauge the host exports:\n{exported}"
    );
    assert_eq!(
        series(&exported, &metric, &pipeline).get(&("t".to_owned(), "0".to_owned())),
        Some(&7),
        "the query's labels (pipeline, topic, partition) are the host's"
    );
    assert!(manifest.contains(&format!("name = \"{pipeline}\"")));
}

#[test]
fn the_statefulset_is_the_deployment_with_a_name_for_each_pod() {
    let base = pods::base_resources();
    let dep = base
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the base's Deployment");
    let docs = pods::component_resources("statefulset");
    assert!(
        !docs.iter().any(|d| d["kind"] == "Deployment"),
        "the component takes the Deployment's place: both would run twice the hosts"
    );
    let sts = docs
        .iter()
        .find(|d| d["kind"] == "StatefulSet")
        .expect("a StatefulSet");
    for key in ["replicas", "selector"] {
        assert_eq!(sts["spec"][key], dep["spec"][key], "{key}");
    }
    assert_eq!(sts["metadata"], dep["metadata"]);
    let governing = docs
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == sts["spec"]["serviceName"])
        .expect("its serviceName is a Service of the component");
    assert_eq!(governing["spec"]["clusterIP"], "None", "headless");
    // The pod template is the Deployment's with one more variable: the pod's own name, from
    // which the host derives each pipeline's member id.
    let name_var = sharehost::persisted::MEMBER_NAME_ENV;
    let mut template = sts["spec"]["template"].clone();
    let env = template["spec"]["containers"][0]["env"]
        .as_array_mut()
        .expect("env");
    let at = env
        .iter()
        .position(|e| e["name"] == name_var)
        .unwrap_or_else(|| panic!("the StatefulSet sets {name_var}"));
    let var = env.remove(at);
    assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    assert_eq!(
        template, dep["spec"]["template"],
        "otherwise the Deployment's pod template"
    );
    // A Deployment's pods share their template: one name would be every pod's.
    let dep_env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env");
    assert!(
        !dep_env.iter().any(|e| e["name"] == name_var),
        "the Deployment must not set {name_var}"
    );
}

#[test]
fn a_hosts_log_time_reads_as_utc() {
    let at = |s: &str| {
        utc_time(s)
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_micros())
    };
    assert_eq!(at("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(at("2000-02-29T23:59:59Z"), Some(951_868_799_000_000));
    assert_eq!(
        at("2026-12-06T05:11:21.416083Z"),
        Some(1_796_533_881_416_083)
    );
    assert_eq!(at("2026-12-06T05:11:21"), None, "UTC only");
}
