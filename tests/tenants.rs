//! The pipelines of one host as tenants, against a real broker and the `sharehost` binary: a
//! pipeline whose plugin refuses its configuration is reported failed (`GET /pipelines`,
//! `/readyz`, a metric, the log) and tried again with backoff, while a healthy pipeline beside
//! it judges every record; `--strict` keeps the all-or-nothing start; a `delivery_cap` the
//! group's delivery limit would pass is refused before anything is acquired.
//!
//! The witness is outside the engine: the ledger plugin reports what it judged through the
//! host's log, and the broker says the healthy group is drained (ShareGroupCommand lag 0).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    blocking, bootstrap, client, fresh_group, fresh_group_with, guest, ledger_manifest,
    produce_ids, topic_with_dead_letters, unique, wait_until_drained,
};

/// A manifest of two ledger pipelines: `good` on `topic`, and `bad`, whose plugin refuses its
/// configuration (`pause-ms` is not a number) on another topic.
fn two_tenants(dir: &Path, topic: &str, group: &str, other: &str, other_group: &str) -> PathBuf {
    let ledger = guest("fixture_ledger");
    let text = format!(
        r#"[cluster]
bootstrap = "{bootstrap}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "bad"
topics = ["{other}"]
group = "{other_group}"
component = "{ledger}"
config = {{ pause-ms = "a while" }}

[[pipeline]]
name = "good"
topics = ["{topic}"]
group = "{group}"
component = "{ledger}"
config = {{ }}
"#,
        bootstrap = bootstrap(),
        ledger = ledger.display(),
    );
    let path = dir.join(format!("{}.toml", unique("tenants")));
    std::fs::write(&path, text).expect("write manifest");
    path
}

/// A manifest of one pipeline named `ledger` running guest `component` on `topic` in `group`,
/// with `settings` (more pipeline lines), written to a fresh directory.
fn one_pipeline(topic: &str, group: &str, component: &str, settings: &str) -> PathBuf {
    ledger_pipeline(topic, group, component, "", settings)
}

/// [`one_pipeline`] with the plugin configuration `plugin_config` (inline-table entries).
fn ledger_pipeline(
    topic: &str,
    group: &str,
    component: &str,
    plugin_config: &str,
    settings: &str,
) -> PathBuf {
    let dir = std::env::temp_dir().join(unique("sharehost-tenants"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let text = ledger_manifest(
        &bootstrap(),
        topic,
        group,
        &guest(component),
        plugin_config,
        settings,
    );
    let manifest = dir.join("manifest.toml");
    std::fs::write(&manifest, text).expect("write manifest");
    manifest
}

/// Polls `GET /pipelines` until `cond` holds for the entry named `name` (the host's own view;
/// there is nothing finer to wait on from outside).
fn pipeline_until(
    host: &HostProcess,
    name: &str,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = host.status();
        if let Some(p) = status
            .as_array()
            .and_then(|a| a.iter().find(|p| p["name"] == name))
            && cond(p)
        {
            return p.clone();
        }
        assert!(Instant::now() < deadline, "{name}: never {what}: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_fails_to_load_is_reported_and_retried_while_the_others_run() {
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_dead_letters(&client, "tenants-good", 3, 1).await;
    let (other, _) = topic_with_dead_letters(&client, "tenants-bad", 1, 1).await;
    let group = fresh_group(&client, None).await;
    let other_group = fresh_group(&client, None).await;
    let ids = produce_ids(&client, &topic, 3, 0..600).await;
    let dir = std::env::temp_dir().join(unique("sharehost-tenants"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifest = two_tenants(&dir, &topic, &group, &other, &other_group);
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let (h, n) = (host.clone(), ids.len());
    let seen = blocking(move || h.wait_for("every id judged", |s| s.distinct().len() >= n)).await;
    let h = host.clone();
    let (bad, ready, metrics) = blocking(move || {
        let bad = pipeline_until(&h, "bad", "retried", |p| {
            p["state"] == "failed" && p["attempts"].as_u64().unwrap_or(0) >= 2
        });
        (
            bad,
            h.http("GET", "/readyz", ""),
            h.http("GET", "/metrics", ""),
        )
    })
    .await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, at_end) = blocking(move || host.stop()).await;
    let g = group.clone();
    blocking(move || wait_until_drained(&g)).await;
    let mut ledger = Ledger::new("tenants", ids.iter().cloned());
    at_end.record(&mut ledger);
    ledger.check();
    report(&format!(
        "tenants: beside a pipeline that failed to load {} times, the healthy one judged {} of {} records, lost {}",
        bad["attempts"],
        seen.distinct().len(),
        ids.len(),
        ledger.lost().len()
    ));
    let error = bad["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("pause-ms"),
        "the failure names what the plugin refused: {bad}"
    );
    assert_eq!(
        ready.0, 503,
        "not ready while a pipeline is failed: {ready:?}"
    );
    assert!(ready.1.contains("bad: failed"), "{ready:?}");
    assert!(
        metrics
            .1
            .lines()
            .any(|l| l.starts_with("sharehost_pipeline_failures_total{")
                && l.contains("pipeline=\"bad\"")
                && l.contains("stage=\"load\"")),
        "a metric counts the failures"
    );
}

#[test]
fn strict_refuses_to_start_when_a_pipeline_fails_to_load() {
    let dir = std::env::temp_dir().join(unique("sharehost-tenants"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifest = two_tenants(&dir, "t", "g", "u", "h");
    let out = Command::new(sharehost_bin!())
        .args(["run", "--strict"])
        .arg(&manifest)
        .output()
        .expect("run sharehost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("pipeline bad") && stderr.contains("pause-ms"),
        "the error names the pipeline and what its plugin refused: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_cap_above_the_groups_delivery_limit_is_refused_naming_both() {
    // At the group's limit (3) the broker archives a released record; a host cap of 4 would
    // never see a poison record's last delivery, and it would go without a dead letter.
    let client = Arc::new(client().await);
    let (topic, dlq) = topic_with_dead_letters(&client, "tenants-cap", 1, 1).await;
    let group = fresh_group_with(&client, None, &[("share.delivery.count.limit", "3")]).await;
    produce_ids(&client, &topic, 1, 0..10).await;
    let manifest = one_pipeline(
        &topic,
        &group,
        "fixture_ledger",
        &format!("delivery_cap = 4\ndead_letter_topic = \"{dlq}\"\n"),
    );
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let p =
        blocking(move || pipeline_until(&h, "ledger", "refused", |p| p["last_error"].is_string()))
            .await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    blocking(move || host.stop()).await;
    let error = p["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("delivery_cap 4") && error.contains("delivery limit 3"),
        "{p}"
    );
    assert_eq!(p["acquired"], 0, "nothing acquired: {p}");
}

async fn an_emit_to_an_output_the_manifest_does_not_map_is_dead_lettered_and_said_loudly_in(
    exactly_once: bool,
) {
    // The splitter routes high-priority orders to `urgent`, the rest to `normal`; this
    // manifest maps only `normal`. The splitter releases a record whose emit is refused, so
    // without the host's rule every urgent order came back until the broker archived it.
    let client = Arc::new(client().await);
    let name = if exactly_once {
        "tenants-unmapped-eo"
    } else {
        "tenants-unmapped"
    };
    let (topic, dlq) = topic_with_dead_letters(&client, name, 1, 1).await;
    let normal = format!("{topic}-normal");
    client
        .create_topic(&normal, 1, 1, &[])
        .await
        .expect("create the normal output");
    let group = fresh_group(&client, None).await;
    let orders: Vec<sharehost::kafka::ProduceRecord> = (0..40)
        .map(|i| {
            let priority = if i % 4 == 0 { "high" } else { "low" };
            sharehost::kafka::ProduceRecord {
                value: Some(bytes::Bytes::from(format!(
                    r#"{{"id":{i},"priority":"{priority}"}}"#
                ))),
                ..Default::default()
            }
        })
        .collect();
    client
        .produce(&topic, 0, &orders, sharehost::kafka::Compression::None)
        .await
        .expect("produce");
    let manifest = one_pipeline(
        &topic,
        &group,
        "splitter",
        &format!(
            "dead_letter_topic = \"{dlq}\"\n{}[pipeline.outputs]\nnormal = \"{normal}\"\n",
            if exactly_once {
                "guarantee = \"exactly-once\"\n"
            } else {
                ""
            }
        ),
    );
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let (p, ready) = blocking(move || {
        let p = pipeline_until(&h, "ledger", "dead-lettered the urgent orders", |p| {
            p["dead_lettered"].as_u64() == Some(10)
        });
        (p, h.http("GET", "/readyz", ""))
    })
    .await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, _, log) = blocking(move || host.stop_with_log()).await;
    let g = group.clone();
    blocking(move || wait_until_drained(&g)).await;
    // Read as a downstream consumer of an exactly-once pipeline reads (the same records for
    // an at-least-once one).
    let letters = sharehost_tests::committed_records(&client, &dlq, 1).await;
    let outputs = sharehost_tests::committed_records(&client, &normal, 1).await;
    let reasons: Vec<String> = letters
        .into_iter()
        .map(|(p, r)| sharehost::dlq::DeadLetter::from_record(p, r))
        .map(|d| {
            assert_eq!(d.delivery_count, Some(1), "on its first delivery: {d:?}");
            d.reason
        })
        .collect();
    report(&format!(
        "{name}: 10 of 40 orders emitted to an unmapped output: dead letters {}, outputs {}, unmapped {}",
        reasons.len(),
        outputs.len(),
        p["unmapped_outputs"]
    ));
    assert_eq!(reasons.len(), 10, "every urgent order dead-lettered once");
    assert_eq!(outputs.len(), 30, "every other order's output once");
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("\"urgent\"") && r.contains("[pipeline.outputs]")),
        "{reasons:?}"
    );
    assert_eq!(p["unmapped_outputs"], serde_json::json!(["urgent"]), "{p}");
    assert_eq!(ready.0, 503, "misconfigured, so not ready: {ready:?}");
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("does not map") && l.contains("ERROR"))
            .count(),
        1,
        "said loudly, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_to_an_output_the_manifest_does_not_map_is_dead_lettered_and_said_loudly() {
    an_emit_to_an_output_the_manifest_does_not_map_is_dead_lettered_and_said_loudly_in(false).await;
}

/// The same in an exactly-once pipeline: the dead letters and outputs read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_to_an_output_the_manifest_does_not_map_is_dead_lettered_and_said_loudly_exactly_once()
 {
    an_emit_to_an_output_the_manifest_does_not_map_is_dead_lettered_and_said_loudly_in(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_is_there_from_the_start_and_cumulative_counts_are_counters() {
    let client = Arc::new(client().await);
    let (topic, dlq) = topic_with_dead_letters(&client, "tenants-metrics", 1, 1).await;
    let group = fresh_group(&client, None).await;
    let manifest = one_pipeline(
        &topic,
        &group,
        "fixture_ledger",
        &format!("dead_letter_topic = \"{dlq}\"\n"),
    );
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await;
    // Before any record: the host has only just announced its admin address.
    let (_, text) = host.http("GET", "/metrics", "");
    blocking(move || host.stop()).await;
    for family in [
        "sharehost_released_by_broker_total{pipeline=\"ledger\"} 0",
        "sharehost_session_resets_total{pipeline=\"ledger\"} 0",
        "sharehost_rebalances_total{pipeline=\"ledger\"}",
        "sharehost_acknowledged_offsets_total{pipeline=\"ledger\",result=\"failed\"} 0",
        "sharehost_released_unwritten_total{pipeline=\"ledger\"} 0",
        "sharehost_verdicts_lost_total{pipeline=\"ledger\",when=\"unsent\"} 0",
        "sharehost_verdicts_lost_total{pipeline=\"ledger\",when=\"late\"} 0",
        "sharehost_verdicts_replayed_total{pipeline=\"ledger\"} 0",
        "sharehost_settled_earlier_total{pipeline=\"ledger\"} 0",
        "sharehost_dead_letters_shrunk_total{pipeline=\"ledger\"} 0",
        "sharehost_writes_waiting{pipeline=\"ledger\"} 0",
        "sharehost_pipeline_up{pipeline=\"ledger\"}",
        "sharehost_delivery_count_count{pipeline=\"ledger\"} 0",
        "sharehost_build_info{version=",
        "sharehost_write_seconds_count{pipeline=\"ledger\",kind=\"dead_letter\"} 0",
        "sharehost_request_seconds_count{pipeline=\"ledger\",request=\"acknowledge\"}",
        "sharehost_released_at_delivery_limit_total{pipeline=\"ledger\"} 0",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "le=\"26.2144\"",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(family) || l.contains(family)),
            "{family} is there from the start:\n{text}"
        );
    }
    for counter in [
        "released_by_broker",
        "session_resets",
        "rebalances",
        "acknowledged_offsets",
    ] {
        assert!(
            text.contains(&format!("# TYPE sharehost_{counter} counter")),
            "{counter} is a counter:\n{text}"
        );
    }
}

/// The lag series of `topic` partition `partition` in a `/metrics` text, if there is one.
fn lag_of(text: &str, topic: &str, partition: i32) -> Option<i64> {
    let series = format!(
        "sharehost_share_group_lag{{pipeline=\"ledger\",topic=\"{topic}\",partition=\"{partition}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_groups_lag_per_partition_is_exported_and_follows_the_backlog() {
    // A slow plugin (1 s a batch of at most 20) in front of 300 records on 3 partitions (15 s
    // of work, past the 10 s between two asks of the coordinator):
    // the coordinator's lag is seen above 0 on some partition, and 0 on every partition once
    // every record was judged.
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_dead_letters(&client, "tenants-lag", 3, 1).await;
    let group = fresh_group(&client, None).await;
    let ids = produce_ids(&client, &topic, 3, 0..300).await;
    let manifest = ledger_pipeline(
        &topic,
        &group,
        "fixture_ledger",
        "pause-ms = \"1000\"",
        "batch_size = 20\n",
    );
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let (h, t) = (host.clone(), topic.clone());
    let seen_backlog = blocking(move || {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, text) = h.http("GET", "/metrics", "");
            let lags: Vec<i64> = (0..3).filter_map(|p| lag_of(&text, &t, p)).collect();
            if lags.iter().any(|l| *l > 0) {
                return lags;
            }
            if h.seen().distinct().len() >= 300 {
                return lags;
            }
            assert!(Instant::now() < deadline, "no lag series above 0:\n{text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await;
    assert!(
        seen_backlog.iter().any(|l| *l > 0),
        "the backlog was drained before a lag above 0 was exported: {seen_backlog:?}"
    );
    let (h, n) = (host.clone(), ids.len());
    blocking(move || h.wait_for("every id judged", |s| s.distinct().len() >= n)).await;
    let (h, t) = (host.clone(), topic.clone());
    blocking(move || {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, text) = h.http("GET", "/metrics", "");
            let lags: Vec<Option<i64>> = (0..3).map(|p| lag_of(&text, &t, p)).collect();
            if lags.iter().all(|l| *l == Some(0)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "lag never 0 everywhere: {lags:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    blocking(move || host.stop()).await;
    wait_until_drained(&group);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_released_at_their_last_delivery_are_counted_as_archived() {
    // A plugin that traps on every call, fault policy release, a group delivery limit of 2:
    // each record is released twice, and the second release archives it. The host counts
    // exactly those (what an operator without a broker dead-letter topic loses).
    let client = Arc::new(client().await);
    let (topic, _) = topic_with_dead_letters(&client, "tenants-archived", 1, 1).await;
    let group = fresh_group_with(&client, None, &[("share.delivery.count.limit", "2")]).await;
    produce_ids(&client, &topic, 1, 0..10).await;
    let manifest = ledger_pipeline(&topic, &group, "fixture_ledger", "trap-every = \"1\"", "");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let series = "sharehost_released_at_delivery_limit_total{pipeline=\"ledger\"} ";
    let archived = blocking(move || {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, text) = h.http("GET", "/metrics", "");
            let n: u64 = text
                .lines()
                .find_map(|l| l.strip_prefix(series))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if n >= 10 {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "only {n} counted archived:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await;
    assert_eq!(archived, 10, "each record once, at its second delivery");
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, _, log) = blocking(move || host.stop_with_log()).await;
    // Named in the log as well, a line per batch: an operator can find what was archived.
    let lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("records released at their last delivery"))
        .collect();
    assert!(!lines.is_empty() && lines.len() <= 10, "{log:#?}");
    let named: usize = lines
        .iter()
        .map(|l| l.matches(&format!("{topic}-0@")).count())
        .sum();
    assert_eq!(named, 10, "every archived record named once: {lines:#?}");
    for offset in 0..10 {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("{topic}-0@{offset}"))),
            "offset {offset} not named: {lines:#?}"
        );
    }
    wait_until_drained(&group);
}
