//! Safe rollout through the `sharehost` binary against the real broker: a shadow reports
//! exactly where a stricter candidate disagrees; a canary that traps is rolled back by itself
//! with nothing lost and no record judged by both versions; a good canary is promoted; and a
//! restarted host comes back on the version that was active, then rolls back to the kept one.
//!
//! Witnesses outside the engine: the ledger plugin's own log lines (what each version decided,
//! tests/fixtures/guests/ledger), the broker's view of the group (ShareGroupCommand lag 0), and
//! the ids produced. The candidates are the ledger built with a different behaviour
//! (`ledger-trap5`, `ledger-strict`) or the same ledger with a marker section (a new hash).
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharehost::kafka::KafkaClient;
use sharehost_tests::host::{HostProcess, Seen};
use sharehost_tests::ledger::Ledger;
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    FAULT_SETTINGS, blocking, bootstrap, client, guest, ledger_manifest, new_version, produce_ids,
    topic_and_group, unique, wait_until_drained,
};

const PARTITIONS: i32 = 3;

/// A topic (empty: records are produced once the candidate is in place), a group, and the
/// directory for manifests and candidates.
struct Scenario {
    name: &'static str,
    client: Arc<KafkaClient>,
    topic: String,
    group: String,
    dir: PathBuf,
    ids: Vec<String>,
}

impl Scenario {
    async fn new(name: &'static str) -> Scenario {
        let client = Arc::new(client().await);
        let (topic, group) = topic_and_group(&client, name, PARTITIONS).await;
        let dir = std::env::temp_dir().join(unique("sharehost-rollout"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scenario {
            name,
            client,
            topic,
            group,
            dir,
            ids: Vec::new(),
        }
    }

    fn manifest(&self, component: &Path, plugin_config: &str) -> PathBuf {
        let text = ledger_manifest(
            &bootstrap(),
            &self.topic,
            &self.group,
            component,
            plugin_config,
            FAULT_SETTINGS,
        );
        let path = self.dir.join(format!("{}.toml", unique("manifest")));
        std::fs::write(&path, text).expect("write manifest");
        path
    }

    async fn produce(&mut self, ids: std::ops::Range<u64>) {
        let more = produce_ids(&self.client, &self.topic, PARTITIONS, ids).await;
        self.ids.extend(more);
    }

    /// A new version of `component` (same behaviour, another hash), written to the scenario's
    /// directory.
    fn new_version(&self, component: &Path, tag: &str) -> PathBuf {
        let bytes = new_version(component, tag);
        let path = self.dir.join(format!("{tag}.wasm"));
        std::fs::write(&path, bytes).expect("write candidate");
        path
    }

    /// The ledger over what the plugins logged, once the broker has nothing left for the
    /// group; printed, and failing on a lost record.
    async fn ledger(&self, seen: &Seen) -> Ledger {
        let group = self.group.clone();
        blocking(move || wait_until_drained(&group)).await;
        let mut ledger = Ledger::new(self.name, self.ids.iter().cloned());
        seen.record(&mut ledger);
        ledger.check();
        ledger
    }
}

/// Polls `GET /pipelines` until `cond` holds for the first pipeline (the host has no way to
/// notify a test of its status); fails after a bound with the last status.
fn poll(
    host: &HostProcess,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let status = host.status();
        if cond(&status[0]) {
            return status[0].clone();
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn post(host: &HostProcess, path: &str, body: &str) -> serde_json::Value {
    let (code, text) = host.http("POST", path, body);
    assert_eq!(code, 200, "POST {path} {body}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

fn count(map: &serde_json::Value, key: &str) -> u64 {
    map[key].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_reports_exactly_where_a_stricter_candidate_disagrees() {
    let mut s = Scenario::new("shadow").await;
    // Active: ids divisible by 10 rejected. Candidate: the ledger that rejects ids divisible
    // by 3 whatever its configuration says.
    let manifest = s.manifest(&guest("fixture_ledger"), r#"reject-every = "10""#);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let candidate = guest("fixture_ledger_strict");
    let answer = post(
        &host,
        "/pipelines/ledger/shadow",
        &format!(r#"{{"path": "{}"}}"#, candidate.display()),
    );
    assert!(
        answer["candidate"].as_str().is_some_and(|h| h.len() == 64),
        "{answer}"
    );
    // Produced in steps of 100 ids, each step once the shadow has seen the last: a shadow
    // drops batches when it is behind (by design), and this test wants every record compared.
    const N: u64 = 900;
    let mut shadow = serde_json::Value::Null;
    for step in (0..N).step_by(100) {
        s.produce(step..step + 100).await;
        let h = host.clone();
        shadow = blocking(move || {
            poll(&h, "the shadow to compare the step", |p| {
                count(&p["shadow"], "records") + count(&p["shadow"], "dropped_records")
                    >= step + 100
            })
        })
        .await["shadow"]
            .clone();
    }
    let expect = |f: &dyn Fn(u64) -> bool| (0..N).filter(|&i| f(i)).count() as u64;
    assert_eq!(count(&shadow, "dropped_records"), 0, "{shadow}");
    assert_eq!(count(&shadow, "faults"), 0, "{shadow}");
    assert_eq!(count(&shadow, "records"), N);
    let agreed = &shadow["agreed"];
    let disagreed = &shadow["disagreed"];
    assert_eq!(
        count(agreed, "accept"),
        expect(&|i| i % 10 != 0 && i % 3 != 0),
        "{shadow}"
    );
    assert_eq!(
        count(agreed, "reject"),
        expect(&|i| i % 30 == 0),
        "{shadow}"
    );
    assert_eq!(
        count(disagreed, "accept→reject"),
        expect(&|i| i % 10 != 0 && i % 3 == 0),
        "{shadow}"
    );
    assert_eq!(
        count(disagreed, "reject→accept"),
        expect(&|i| i % 10 == 0 && i % 3 != 0),
        "{shadow}"
    );
    let first = shadow["first_disagreements"]
        .as_array()
        .expect("kept disagreements");
    assert_eq!(first.len(), 20, "{shadow}");
    assert!(
        first
            .iter()
            .all(|d| d["topic"] == s.topic.as_str() && d["offset"].is_i64())
    );
    // Nothing the shadow decided was acted on: every record ended as the active version said.
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let status = host.status();
    let active = status[0]["active_version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let counters = &status[0]["versions"][&active];
    assert_eq!(
        count(counters, "accepted"),
        expect(&|i| i % 10 != 0),
        "{status}"
    );
    assert_eq!(
        count(counters, "rejected"),
        expect(&|i| i % 10 == 0),
        "{status}"
    );
    assert_eq!(
        status[0]["versions"].as_object().map(|m| m.len()),
        Some(1),
        "only the active version acted: {status}"
    );
    let (_, metrics) = host.http("GET", "/metrics", "");
    let line = format!(
        r#"sharehost_shadow_verdicts_total{{pipeline="ledger",active="accept",candidate="reject"}} {}"#,
        expect(&|i| i % 10 != 0 && i % 3 == 0)
    );
    assert!(metrics.contains(&line), "{line} in {metrics}");
    host.wait_for_log("shadow started");
    blocking(move || host.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_traps_every_fifth_batch_is_rolled_back_and_loses_nothing() {
    let mut s = Scenario::new("canary-trap").await;
    let manifest = s.manifest(&guest("fixture_ledger"), "");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let candidate = guest("fixture_ledger_trap5");
    post(
        &host,
        "/pipelines/ledger/canary",
        &format!(
            r#"{{"path": "{}", "percent": 50, "promote_after": {{"batches": 1000}}}}"#,
            candidate.display()
        ),
    );
    s.produce(0..1500).await;
    let n = s.ids.len();
    let h = host.clone();
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let status = host.status();
    let canary = &status[0]["canary"];
    assert_eq!(canary["state"], "rolled_back", "{status}");
    assert!(
        canary["reason"]
            .as_str()
            .is_some_and(|r| r.contains("fault rate")),
        "{status}"
    );
    // Its two instances (concurrency 2) trap on their 5th call each: the first trap comes
    // after 4 to 8 good batches, and rolls it back at once.
    let batches = canary["candidate_tally"]["batches"].as_u64().unwrap_or(0);
    assert!((5..=9).contains(&batches), "{status}");
    assert_eq!(canary["candidate_tally"]["faulted_batches"], 1, "{status}");
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    host.wait_for_log("canary rolled back");
    let (_, seen) = blocking(move || host.stop()).await;
    let ledger = s.ledger(&seen).await;
    assert_eq!(ledger.duplicates(), 0, "no record judged by both versions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_canary_is_promoted_and_loses_nothing() {
    let mut s = Scenario::new("canary-good").await;
    let manifest = s.manifest(&guest("fixture_ledger"), "");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let candidate = s.new_version(&guest("fixture_ledger"), "canary-v2");
    let hash = post(
        &host,
        "/pipelines/ledger/canary",
        &format!(
            r#"{{"path": "{}", "percent": 50, "promote_after": {{"batches": 4}}}}"#,
            candidate.display()
        ),
    )["candidate"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    s.produce(0..1500).await;
    let n = s.ids.len();
    let h = host.clone();
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let status = host.status();
    assert_eq!(status[0]["canary"]["state"], "promoted", "{status}");
    assert_eq!(status[0]["active_version"], hash.as_str(), "{status}");
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    host.wait_for_log("canary promoted");
    let (_, seen, log) = blocking(move || host.stop_with_log()).await;
    let log = log.join("\n");
    // The promoted version has all its instances: no batch went without one.
    assert!(!log.contains("no free instance"), "{log}");
    let ledger = s.ledger(&seen).await;
    assert_eq!(ledger.duplicates(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_host_comes_back_on_the_active_version_and_rolls_back_to_the_kept_one() {
    let mut s = Scenario::new("restart-rollback").await;
    let v1 = guest("fixture_ledger");
    let manifest = s.manifest(&v1, "");
    let v2 = s.new_version(&v1, "restart-v2");
    let m = manifest.clone();
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &m, "first")).await;
    let v1_hash = host.status()[0]["active_version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let v2_hash = post(
        &host,
        "/pipelines/ledger/swap",
        &format!(r#"{{"path": "{}"}}"#, v2.display()),
    )["active_version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_ne!(v1_hash, v2_hash);
    blocking(move || host.stop()).await;

    // Restarted with the same manifest: back on v2, v1 kept for rollback.
    let m = manifest.clone();
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &m, "second")).await;
    assert_eq!(host.status()[0]["active_version"], v2_hash.as_str());
    // The log says which rule applied.
    host.wait_for_log("coming back on the version active before the restart");
    let (code, versions) = host.http("GET", "/pipelines/ledger/versions", "");
    assert_eq!(code, 200, "{versions}");
    let versions: serde_json::Value = serde_json::from_str(&versions).expect("JSON");
    let hashes: Vec<&str> = versions["versions"]
        .as_array()
        .map(|v| v.iter().filter_map(|x| x["hash"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(hashes, [v2_hash.as_str(), v1_hash.as_str()], "{versions}");
    let back = post(&host, "/pipelines/ledger/rollback", "");
    assert_eq!(back["active_version"], v1_hash.as_str(), "{back}");
    // The rolled-back version judges.
    s.produce(0..300).await;
    let n = s.ids.len();
    let v1 = v1_hash.clone();
    let seen = blocking(move || {
        host.wait_for("every id judged", |seen| seen.distinct().len() >= n);
        // Its counters follow the plugin's log (the acknowledgements are counted after it).
        poll(&host, "the rolled-back version's counters", |p| {
            count(&p["versions"][&v1], "accepted") >= n as u64
        });
        host.stop().1
    })
    .await;
    let ledger = s.ledger(&seen).await;
    assert_eq!(ledger.duplicates(), 0);

    // Restarted again: the rollback was remembered.
    let m = manifest.clone();
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &m, "third")).await;
    let status = host.status();
    let active = status[0]["active_version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (log, _) = blocking(move || host.stop()).await;
    assert_eq!(active, v1_hash, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_named_in_the_manifest_starts_with_the_pipeline_and_stops_on_request() {
    let s = Scenario::new("shadow-manifest").await;
    let candidate = guest("fixture_ledger_strict");
    let text = ledger_manifest(
        &bootstrap(),
        &s.topic,
        &s.group,
        &guest("fixture_ledger"),
        "",
        &format!(
            "{FAULT_SETTINGS}shadow = \"{}\"\nshadow_sample = 0.25\n",
            candidate.display()
        ),
    );
    let manifest = s.dir.join("shadow.toml");
    std::fs::write(&manifest, text).expect("write manifest");
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await;
    let status = host.status();
    assert_eq!(status[0]["shadow"]["sample"], 0.25, "{status}");
    assert_eq!(
        status[0]["shadow"]["path"],
        candidate.display().to_string().as_str()
    );
    let (code, stopped) = host.http("DELETE", "/pipelines/ledger/shadow", "");
    assert_eq!(code, 200, "{stopped}");
    assert!(host.status()[0]["shadow"].is_null());
    let (code, again) = host.http("DELETE", "/pipelines/ledger/shadow", "");
    assert_eq!(code, 422, "a second stop says there is none: {again}");
    blocking(move || host.stop()).await;
}
