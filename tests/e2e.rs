//! End to end through the `sharehost` binary against the real broker: verdict counts and dead
//! letters, hot-swaps under load, and SIGTERM followed by a restart.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost_tests::host::HostProcess;
use sharehost_tests::{bootstrap, client, group_lag, guest, unique};

/// Starts `sharehost run MANIFEST`.
fn start(manifest: &Path) -> HostProcess {
    HostProcess::start(sharehost_tests::sharehost_bin!(), manifest, "host")
}

/// Runs the host until `n` records are judged, then stops it; returns its stdout and the last
/// `/pipelines` status.
async fn run_until_judged(manifest: PathBuf, n: u64) -> (String, serde_json::Value) {
    tokio::task::spawn_blocking(move || {
        let host = start(&manifest);
        host.wait_judged(n);
        let status = host.status();
        (host.stop().0, status)
    })
    .await
    .expect("join")
}

/// The counters of the only plugin version that judged records.
fn only_version(status: &serde_json::Value) -> serde_json::Value {
    let versions = status[0]["versions"].as_object().expect("versions");
    assert_eq!(versions.len(), 1, "one plugin version: {status}");
    versions.values().next().cloned().expect("one version")
}

fn write_manifest(
    dir: &Path,
    topic: &str,
    group: &str,
    dlq: &str,
    component: &Path,
    extra: &str,
) -> PathBuf {
    let text = format!(
        r#"[cluster]
bootstrap = "{}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "orders"
topics = ["{topic}"]
group = "{group}"
component = "{}"
config = {{ max-quantity = "100" }}
batch_size = 50
max_in_flight = 500
delivery_cap = 4
concurrency = 2
dead_letter_topic = "{dlq}"
{extra}
"#,
        bootstrap(),
        component.display()
    );
    let path = dir.join("manifest.toml");
    std::fs::write(&path, text).expect("write manifest");
    path
}

fn order(i: usize) -> Bytes {
    if i.is_multiple_of(10) {
        Bytes::from(format!("{{broken order {i}"))
    } else {
        Bytes::from(format!(
            r#"{{"id":"o{i}","sku":"A","quantity":{},"price":1.5}}"#,
            i % 7 + 1
        ))
    }
}

async fn produce_orders(client: &KafkaClient, topic: &str, range: std::ops::Range<usize>) {
    for chunk in range.collect::<Vec<_>>().chunks(100) {
        let records: Vec<ProduceRecord> = chunk
            .iter()
            .map(|i| ProduceRecord {
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(order(*i)),
                ..Default::default()
            })
            .collect();
        let p = (chunk[0] / 100 % 3) as i32;
        client
            .produce(topic, p, &records, Compression::None)
            .await
            .expect("produce");
    }
}

async fn setup(client: &KafkaClient) -> (String, String, String, PathBuf) {
    let topic = unique("e2e");
    let dlq = format!("{topic}-dlq");
    client.create_topic(&topic, 3, 1, &[]).await.expect("topic");
    client.create_topic(&dlq, 1, 1, &[]).await.expect("dlq");
    let group = sharehost_tests::fresh_group(client, None).await;
    let dir = std::env::temp_dir().join(unique("sharehost-e2e"));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    (topic, dlq, group, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_counts_match_the_plugin_and_dead_letters_carry_their_provenance() {
    let client = client().await;
    let (topic, dlq, group, dir) = setup(&client).await;
    let n = 600;
    produce_orders(&client, &topic, 0..n).await;
    let manifest = write_manifest(&dir, &topic, &group, &dlq, &guest("order_validator"), "");
    let (stdout, status) = run_until_judged(manifest, n as u64).await;
    let counters = only_version(&status);
    let malformed = (0..n).filter(|i| i.is_multiple_of(10)).count() as u64;
    assert_eq!(counters["rejected"].as_u64(), Some(malformed), "{status}");
    assert_eq!(
        counters["accepted"].as_u64(),
        Some(n as u64 - malformed),
        "{status}"
    );
    assert_eq!(status[0]["dead_lettered"].as_u64(), Some(malformed));
    assert!(
        stdout.contains(&format!(
            "accepted {}, rejected {malformed}",
            n as u64 - malformed
        )),
        "{stdout}"
    );

    // The dead-letter topic holds exactly the malformed records, with provenance headers.
    let mut dead = Vec::new();
    while dead.len() < malformed as usize {
        let f = client
            .fetch(&dlq, 0, dead.len() as i64, Duration::from_millis(500))
            .await
            .expect("fetch dlq");
        dead.extend(f.records);
    }
    let fetched = client
        .fetch(&dlq, 0, dead.len() as i64, Duration::from_millis(200))
        .await
        .expect("fetch dlq");
    assert!(
        fetched.records.is_empty(),
        "nothing but the rejected records"
    );
    let mut seen = HashSet::new();
    for d in &dead {
        let h: HashMap<&str, String> = d
            .headers
            .iter()
            .map(|h| {
                (
                    h.key.as_str(),
                    String::from_utf8_lossy(h.value.as_deref().unwrap_or_default()).into_owned(),
                )
            })
            .collect();
        let value = String::from_utf8_lossy(d.value.as_deref().unwrap_or_default()).into_owned();
        assert!(
            value.starts_with("{broken order"),
            "only malformed orders are dead-lettered: {value}"
        );
        assert_eq!(h.get("sharehost.original.topic"), Some(&topic));
        assert!(
            h.get("sharehost.original.offset")
                .is_some_and(|o| o.parse::<i64>().is_ok())
        );
        assert!(h.contains_key("sharehost.original.partition"));
        assert_eq!(
            h.get("sharehost.original.delivery-count")
                .map(String::as_str),
            Some("1")
        );
        assert!(
            h.get("sharehost.reason")
                .is_some_and(|r| r.contains("not JSON")),
            "{h:?}"
        );
        assert_eq!(
            h.get("sharehost.pipeline").map(String::as_str),
            Some("orders")
        );
        assert_eq!(h.get("sharehost.plugin.version").map(String::len), Some(64));
        assert!(
            seen.insert(value),
            "each rejected record dead-lettered once"
        );
    }
    assert!(
        group_lag(&group).iter().all(|l| *l == 0),
        "nothing left in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hot_swaps_under_load_lose_nothing_and_judge_nothing_twice() {
    let client = Arc::new(client().await);
    let (topic, dlq, group, dir) = setup(&client).await;
    // The component path in the manifest is a copy the test replaces (the file watch), and the
    // HTTP endpoint swaps to another file.
    let live = dir.join("plugin.wasm");
    std::fs::copy(guest("order_validator"), &live).expect("copy");
    let manifest = write_manifest(&dir, &topic, &group, &dlq, &live, "");
    let n = 3000;
    produce_orders(&client, &topic, 0..500).await;
    let host = tokio::task::spawn_blocking(move || start(&manifest))
        .await
        .expect("join");
    let host = Arc::new(host);
    // Swap 1, through the file watch: the manifest's component file is replaced (atomically,
    // as a deploy would) while records flow.
    let h = host.clone();
    tokio::task::spawn_blocking(move || h.wait_judged(200))
        .await
        .expect("join");
    let first_version = host.status()[0]["active_version"]
        .as_str()
        .expect("hash")
        .to_owned();
    produce_orders(&client, &topic, 500..1500).await;
    let staged = dir.join("plugin.wasm.new");
    std::fs::copy(guest("accept_all"), &staged).expect("copy");
    std::fs::rename(&staged, &live).expect("replace");
    let h = host.clone();
    let second_version = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let v = h.status()[0]["active_version"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if v != first_version {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the file watch did not pick up the new component"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .expect("join");
    // A component of the wrong world is refused and the active version keeps running.
    let h = host.clone();
    let bad = guest("fixture_missing_handle");
    let (code, body) = tokio::task::spawn_blocking(move || {
        h.http(
            "POST",
            "/pipelines/orders/swap",
            &format!(r#"{{"path":"{}"}}"#, bad.display()),
        )
    })
    .await
    .expect("join");
    assert_eq!(code, 422, "a broken version is refused: {body}");
    assert_eq!(
        host.status()[0]["active_version"].as_str(),
        Some(second_version.as_str())
    );
    produce_orders(&client, &topic, 1500..2500).await;
    // Swap 2, over HTTP, back to the validator.
    let h = host.clone();
    tokio::task::spawn_blocking(move || h.wait_judged(1000))
        .await
        .expect("join");
    let validator = guest("order_validator");
    let h = host.clone();
    let (code, body) = tokio::task::spawn_blocking(move || {
        h.http(
            "POST",
            "/pipelines/orders/swap",
            &format!(r#"{{"path":"{}"}}"#, validator.display()),
        )
    })
    .await
    .expect("join");
    assert_eq!(code, 200, "{body}");
    produce_orders(&client, &topic, 2500..n).await;
    let h = host.clone();
    tokio::task::spawn_blocking(move || h.wait_judged(n as u64))
        .await
        .expect("join");
    let status = host.status();
    let (_, metrics) = host.http("GET", "/metrics", "");
    assert!(
        metrics.contains("sharehost_swaps_total{pipeline=\"orders\",result=\"ok\"} 2"),
        "exactly two swaps took effect (no reload echoes): {metrics}"
    );
    assert!(
        metrics.contains("sharehost_swaps_total{pipeline=\"orders\",result=\"failed\"} 1"),
        "{metrics}"
    );
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    tokio::task::spawn_blocking(move || host.stop())
        .await
        .expect("join");
    let versions = status[0]["versions"].as_object().expect("versions");
    assert_eq!(
        versions.len(),
        2,
        "two versions judged records (validator and accept-all): {status}"
    );
    let judged: u64 = versions
        .values()
        .map(|c| c["accepted"].as_u64().unwrap_or(0) + c["rejected"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        judged, n as u64,
        "per-version counts add up to N: none lost, none judged twice: {status}"
    );
    assert!(
        status[0]["last_swap_error"].is_null(),
        "the later good swap cleared the error"
    );
    assert!(group_lag(&group).iter().all(|l| *l == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_then_a_restart_judges_every_record() {
    let client = client().await;
    let (topic, dlq, group, dir) = setup(&client).await;
    let n = 2000;
    produce_orders(&client, &topic, 0..n).await;
    let manifest = write_manifest(&dir, &topic, &group, &dlq, &guest("order_validator"), "");
    let m = manifest.clone();
    let first = tokio::task::spawn_blocking(move || {
        let host = start(&m);
        host.wait_judged(1);
        let judged = host.judged();
        (host.stop().0, judged)
    })
    .await
    .expect("join");
    let m = manifest.clone();
    let (second_out, _) = tokio::task::spawn_blocking(move || {
        let host = start(&m);
        // Whatever the first run did not judge, the second one does.
        sharehost_tests::wait_until_drained(&group);
        (host.stop().0, ())
    })
    .await
    .expect("join");
    let parse = |out: &str, what: &str| -> u64 {
        out.split(&format!("{what} "))
            .nth(1)
            .and_then(|r| r.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let total = |out: &str| parse(out, "accepted") + parse(out, "rejected");
    let (first_out, _) = first;
    let judged = total(&first_out) + total(&second_out);
    assert!(
        total(&first_out) > 0,
        "the first run judged something before the signal: {first_out}"
    );
    assert!(
        judged >= n as u64,
        "every record judged across the two runs ({judged} of {n})"
    );
    println!(
        "ledger: produced {n}, judged {judged}, duplicates {}",
        judged - n as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_asks_for_renew_gets_its_records_again_until_it_judges_them() {
    let client = client().await;
    let (topic, dlq, group, dir) = setup(&client).await;
    // Every 10th order is malformed, but slow-renew only counts work: it judges `budget` (10)
    // records per call and renews the rest, which must come back to it.
    let n = 300;
    produce_orders(&client, &topic, 0..n).await;
    let manifest = write_manifest(
        &dir,
        &topic,
        &group,
        &dlq,
        &guest("slow_renew"),
        "max_renewals = 50",
    );
    let (_, status) = run_until_judged(manifest, n as u64).await;
    let counters = only_version(&status);
    assert_eq!(
        counters["accepted"].as_u64(),
        Some(n as u64),
        "every record judged in the end: {status}"
    );
    assert!(
        counters["renewed"].as_u64().unwrap_or(0) >= (n as u64) / 2,
        "most records were renewed at least once: {status}"
    );
    assert!(group_lag(&group).iter().all(|l| *l == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_released_for_a_fault_until_its_cap_is_dead_lettered_naming_the_fault() {
    let client = client().await;
    let (topic, dlq, group, dir) = setup(&client).await;
    // Twenty good records and two that make the plugin panic on every delivery: released by
    // the fault policy each time, until the delivery cap (4) dead-letters them.
    let values: Vec<Bytes> = (0..22)
        .map(|i| Bytes::from_static(if i % 11 == 5 { b"bad" } else { b"ok" }))
        .collect();
    let records: Vec<ProduceRecord> = values
        .iter()
        .map(|v| ProduceRecord {
            value: Some(v.clone()),
            ..ProduceRecord::default()
        })
        .collect();
    client
        .produce(&topic, 0, &records, Compression::None)
        .await
        .expect("produce");
    let manifest = write_manifest(&dir, &topic, &group, &dlq, &guest("fixture_panic"), "");
    let host = tokio::task::spawn_blocking(move || start(&manifest))
        .await
        .expect("join");
    let mut dead = Vec::new();
    let patience = std::time::Instant::now() + sharehost_tests::host::PATIENCE;
    while dead.len() < 2 {
        assert!(
            std::time::Instant::now() < patience,
            "only {} of 2 dead letters: {}",
            dead.len(),
            host.status()
        );
        let f = client
            .fetch(&dlq, 0, dead.len() as i64, Duration::from_millis(500))
            .await
            .expect("fetch dlq");
        dead.extend(f.records);
    }
    tokio::task::spawn_blocking(move || host.stop())
        .await
        .expect("join");
    for d in &dead {
        let reason = d
            .headers
            .iter()
            .find(|h| h.key == "sharehost.reason")
            .and_then(|h| h.value.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        assert!(
            reason.starts_with("delivery cap reached (")
                && reason.contains("last plugin fault: panic: ")
                && reason.contains("poison record at offset"),
            "the dead letter names the fault its record met: {reason:?}"
        );
    }
}

/// Records judged by pipeline `name` (accepted or rejected, every version), from `/pipelines`.
fn judged_by(status: &serde_json::Value, name: &str) -> u64 {
    let p = status
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no pipeline {name} in {status}"));
    p["versions"]
        .as_object()
        .map(|vs| {
            vs.values()
                .map(|v| v["accepted"].as_u64().unwrap_or(0) + v["rejected"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_start_position_decides_where_its_new_group_starts() {
    let client = client().await;
    let topic = unique("e2e-start");
    client.create_topic(&topic, 1, 1, &[]).await.expect("topic");
    // Before any group reads the topic: 100 records two hours old, 100 ten minutes old.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    // `n` records `TAG-i` created at `timestamp` (now when `None`).
    let produce = |tag: &'static str, n: usize, timestamp: Option<i64>| {
        let records: Vec<ProduceRecord> = (0..n)
            .map(|i| ProduceRecord {
                value: Some(Bytes::from(format!("{tag}-{i}"))),
                timestamp,
                ..Default::default()
            })
            .collect();
        let (client, topic) = (&client, &topic);
        async move {
            client
                .produce(topic, 0, &records, Compression::None)
                .await
                .expect("produce");
        }
    };
    produce("old", 100, Some(now - 2 * 3_600_000)).await;
    produce("recent", 100, Some(now - 600_000)).await;
    // Four pipelines in groups nobody configured; the last leaves `start` out.
    let groups: Vec<String> = (0..4).map(|_| unique("group")).collect();
    let dir = std::env::temp_dir().join(unique("sharehost-e2e-start"));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let component = guest("fixture_ledger");
    let pipeline = |name: &str, group: &str, start: &str| {
        format!(
            "[[pipeline]]\nname = \"{name}\"\ntopics = [\"{topic}\"]\ngroup = \"{group}\"\ncomponent = \"{}\"\n{start}\n\n",
            component.display()
        )
    };
    let manifest = dir.join("manifest.toml");
    std::fs::write(
        &manifest,
        format!(
            "[cluster]\nbootstrap = \"{}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n{}{}{}{}",
            bootstrap(),
            pipeline("earliest", &groups[0], "start = \"earliest\""),
            pipeline("hour", &groups[1], "start = { by_duration = \"PT1H\" }"),
            pipeline("latest", &groups[2], "start = \"latest\""),
            pipeline("unset", &groups[3], ""),
        ),
    )
    .expect("write manifest");
    let host = tokio::task::spawn_blocking(move || start(&manifest))
        .await
        .expect("start");
    // Every pipeline's group has its share state for the partition before the next records,
    // so `latest` means "after now": the broker sets it up before it answers the group's first
    // ShareFetch, and a pipeline sends its second fetch only after the first is answered.
    // (ShareGroupCommand cannot witness it: it shows no start offset for a `latest` group until
    // it acknowledges something.)
    let host = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + sharehost_tests::host::PATIENCE;
        loop {
            let status = host.status();
            let fetched = status.as_array().is_some_and(|ps| {
                ps.len() == 4 && ps.iter().all(|p| p["fetches"].as_u64().unwrap_or(0) >= 2)
            });
            if fetched {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pipelines never fetched twice: {status:#}"
            );
            // A host has no way to notify a test: poll GET /pipelines.
            std::thread::sleep(Duration::from_millis(50));
        }
        host
    })
    .await
    .expect("groups initialised");
    // Set (or read) before each join, so shown by now.
    let shown: Vec<(String, serde_json::Value)> = host
        .status()
        .as_array()
        .expect("pipelines")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("?").to_owned(),
                p["start"].clone(),
            )
        })
        .collect();
    produce("new", 50, None).await;
    let gs = groups.clone();
    let host = tokio::task::spawn_blocking(move || {
        for g in &gs {
            sharehost_tests::wait_until_drained(g);
        }
        host
    })
    .await
    .expect("drained");
    let status = host.status();
    let judged: Vec<(&str, u64)> = ["earliest", "hour", "latest", "unset"]
        .into_iter()
        .map(|p| (p, judged_by(&status, p)))
        .collect();
    tokio::task::spawn_blocking(move || host.stop())
        .await
        .expect("stop");
    assert_eq!(
        judged,
        vec![
            ("earliest", 250),
            ("hour", 150),
            ("latest", 50),
            ("unset", 50)
        ],
        "records judged per pipeline once every group drained"
    );
    assert_eq!(
        shown,
        vec![
            ("earliest".to_owned(), serde_json::json!("earliest")),
            ("hour".to_owned(), serde_json::json!("by_duration:PT1H")),
            ("latest".to_owned(), serde_json::json!("latest")),
            ("unset".to_owned(), serde_json::json!("latest")),
        ],
        "/pipelines shows each group's start position"
    );
}
