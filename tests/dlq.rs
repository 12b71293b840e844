//! `sharehost dlq` against the real broker and the binary: dead letters written by a running
//! host are replayed to their original topic once, with `sharehost.replayed-from` and without
//! the provenance headers, and a rerun replays nothing; `--reason`, `--offsets` and
//! `--partition` choose; `--dry-run` produces nothing; a bad regex or range is a clear error.
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use sharehost::kafka::{Compression, ConsumedRecord, Header, KafkaClient, ProduceRecord};
use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::ledger::report;
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    FAULT_SETTINGS, bootstrap, client, fresh_group_with, guest, ledger_manifest, produce_ids,
    topic_records, topic_with_dead_letters, unique,
};

/// A test's own directory (manifest, replay state).
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("sharehost-dlq"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A manifest whose pipeline `ledger` reads `topic` and dead-letters to `dlq`, every 7th id
/// rejected.
fn manifest(dir: &Path, topic: &str, group: &str, dlq: &str) -> PathBuf {
    manifest_with(dir, topic, group, dlq, "")
}

/// [`manifest`] with more pipeline lines, `settings`.
fn manifest_with(dir: &Path, topic: &str, group: &str, dlq: &str, settings: &str) -> PathBuf {
    let text = ledger_manifest(
        &bootstrap(),
        topic,
        group,
        &guest("fixture_ledger"),
        r#"reject-every = "7""#,
        &format!("{FAULT_SETTINGS}dead_letter_topic = \"{dlq}\"\n{settings}"),
    );
    let path = dir.join("manifest.toml");
    std::fs::write(&path, text).expect("write manifest");
    path
}

/// What one `sharehost dlq` run printed.
struct Run {
    ok: bool,
    /// `--json` lines before the summary.
    lines: Vec<Value>,
    summary: Value,
    stderr: String,
}

/// Runs `sharehost dlq MANIFEST --pipeline ledger ARGS... --json` with its replay state in
/// `dir/state`.
async fn sharehost_dlq(dir: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(sharehost_bin!());
    cmd.arg("dlq")
        .arg(dir.join("manifest.toml"))
        .args(["--pipeline", "ledger", "--json"])
        .args(args)
        .env("SHAREHOST_STATE_DIR", dir.join("state"));
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run sharehost dlq");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let summary = match lines.pop() {
        Some(mut v) if v.get("summary").is_some() => v["summary"].take(),
        other => {
            lines.extend(other);
            Value::Null
        }
    };
    Run {
        ok: out.status.success(),
        lines,
        summary,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn header<'a>(r: &'a ConsumedRecord, key: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| std::str::from_utf8(h.value.as_deref()?).ok())
}

/// Reads `topic` partition 0 until it holds `count` committed records (all of them, for a
/// topic no transaction writes), long-polling the broker.
async fn wait_for_records(client: &KafkaClient, topic: &str, count: usize) {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = 0;
    let mut next = 0;
    while seen < count {
        assert!(
            Instant::now() < deadline,
            "{topic}: {seen} of {count} records"
        );
        let f = client
            .fetch_committed(topic, 0, next, Duration::from_millis(1000))
            .await
            .expect("fetch");
        seen += f.records.len();
        next = f.next_offset;
    }
}

async fn dead_letters_of_a_running_host_are_replayed_to_their_topic_once_in(exactly_once: bool) {
    let client = Arc::new(client().await);
    let name = if exactly_once {
        "dlq-replay-eo"
    } else {
        "dlq-replay"
    };
    let (topic, dlq) = topic_with_dead_letters(&client, name, 3, 1).await;
    let ids = produce_ids(&client, &topic, 3, 0..300).await;
    let rejected: HashSet<String> = ids
        .iter()
        .filter(|id| id.parse::<u64>().is_ok_and(|n| n % 7 == 0))
        .cloned()
        .collect();
    let group = fresh_group_with(&client, Some(30_000), &[]).await;
    let dir = scratch();
    let guarantee = if exactly_once {
        "guarantee = \"exactly-once\"\n"
    } else {
        ""
    };
    let manifest = manifest_with(&dir, &topic, &group, &dlq, guarantee);
    let host = tokio::task::spawn_blocking(move || {
        HostProcess::start(sharehost_bin!(), &manifest, "host")
    })
    .await
    .expect("join");
    wait_for_records(&client, &dlq, rejected.len()).await;
    tokio::task::spawn_blocking(move || host.stop())
        .await
        .expect("join");
    let before = topic_records(&client, &topic, 3).await;
    assert_eq!(before.len(), ids.len());
    let original: BTreeMap<String, (i32, i64)> = before
        .iter()
        .map(|(p, r)| {
            let id = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
            (id, (*p, r.offset))
        })
        .collect();

    let listed = sharehost_dlq(&dir, &["list"]).await;
    assert!(listed.ok, "{}", listed.stderr);
    assert_eq!(listed.lines.len(), rejected.len());
    for l in &listed.lines {
        let id = l["value"].as_str().expect("value preview");
        assert!(rejected.contains(id), "{l}");
        assert_eq!(
            (
                l["original_topic"].as_str(),
                l["original_partition"].as_i64(),
                l["original_offset"].as_i64()
            ),
            (
                Some(topic.as_str()),
                Some(i64::from(original[id].0)),
                Some(original[id].1)
            ),
            "the provenance names the record's place: {l}"
        );
        assert_eq!(l["pipeline"], "ledger");
        assert_eq!(
            l["reason"],
            format!("ledger: {id} is divisible by 7"),
            "{l}"
        );
        assert_eq!(l["plugin_version"].as_str().map(str::len), Some(64), "{l}");
    }

    let first = sharehost_dlq(&dir, &["replay"]).await;
    assert!(first.ok, "{}", first.stderr);
    assert_eq!(
        first.summary["replayed"],
        rejected.len(),
        "{}",
        first.summary
    );
    let after = topic_records(&client, &topic, 3).await;
    let replayed: Vec<&(i32, ConsumedRecord)> = after
        .iter()
        .filter(|(_, r)| header(r, "sharehost.replayed-from").is_some())
        .collect();
    assert_eq!(replayed.len(), rejected.len());
    assert_eq!(after.len(), ids.len() + rejected.len());
    let mut back = HashSet::new();
    for (p, r) in &replayed {
        let id = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
        assert_eq!(*p, original[&id].0, "{id} went back to its own partition");
        let from = header(r, "sharehost.replayed-from").expect("header");
        assert!(from.starts_with(&format!("{dlq}/0/")), "{from}");
        assert!(
            !r.headers
                .iter()
                .any(|h| h.key != "sharehost.replayed-from" && h.key.starts_with("sharehost.")),
            "no provenance header survives: {:?}",
            r.headers
        );
        back.insert(id);
    }
    assert_eq!(back, rejected, "each rejected record came back once");

    let second = sharehost_dlq(&dir, &["replay"]).await;
    assert!(second.ok, "{}", second.stderr);
    assert_eq!(second.summary["replayed"], 0, "{}", second.summary);
    assert_eq!(second.summary["already_replayed"], rejected.len());
    assert_eq!(topic_records(&client, &topic, 3).await.len(), after.len());
    let _ = std::fs::remove_dir_all(&dir);
    report(&format!(
        "{name}: {} produced, {} dead-lettered by the host, {} replayed to {topic} once, rerun replayed 0",
        ids.len(),
        rejected.len(),
        back.len()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_a_running_host_are_replayed_to_their_topic_once() {
    dead_letters_of_a_running_host_are_replayed_to_their_topic_once_in(false).await;
}

/// The same for an exactly-once pipeline, whose dead letters are written in transactions: the
/// topic holds their commit markers between the records, and only committed ones are listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_a_running_host_are_replayed_to_their_topic_once_exactly_once() {
    dead_letters_of_a_running_host_are_replayed_to_their_topic_once_in(true).await;
}

/// Whether `topic` exists, asked so that the broker does not create it.
async fn exists(client: &KafkaClient, topic: &str) -> bool {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, TopicName};
    let req = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(kafka_protocol::protocol::StrBytes::from_string(
                topic.to_owned(),
            )),
        ))]));
    let resp = client.send_any(&req).await.expect("metadata");
    resp.topics.iter().any(|t| t.error_code == 0)
}

/// A dead letter as the pipeline writes it, from `pipeline`, of a record at `partition`.
fn dead_letter(
    pipeline: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    reason: &str,
) -> ProduceRecord {
    let h = |k: &str, v: String| Header {
        key: k.to_owned(),
        value: Some(Bytes::from(v)),
    };
    ProduceRecord {
        key: Some(Bytes::from(format!("key-{offset}"))),
        value: Some(Bytes::from(format!("value-{offset}"))),
        headers: vec![
            h("trace-id", format!("t{offset}")),
            h("sharehost.original.topic", topic.to_owned()),
            h("sharehost.original.partition", partition.to_string()),
            h("sharehost.original.offset", offset.to_string()),
            h("sharehost.delivery.count", "1".to_owned()),
            h("sharehost.reason", reason.to_owned()),
            h("sharehost.pipeline", pipeline.to_owned()),
            h("sharehost.plugin", "/p.wasm".to_owned()),
            h("sharehost.plugin.version", "ab".repeat(32)),
        ],
        timestamp: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reason_offsets_and_dry_run_choose_what_is_replayed() {
    let client = client().await;
    let (topic, dlq) = topic_with_dead_letters(&client, "dlq-select", 2, 2).await;
    // Partition 0: offsets 0..10 alternate "too big" / "no sku"; offset 10 comes from another
    // pipeline, 11 is no dead letter at all, 12 names a partition the topic no longer has.
    let mut records: Vec<ProduceRecord> = (0..10)
        .map(|o| {
            dead_letter(
                "ledger",
                &topic,
                (o % 2) as i32,
                o,
                if o % 2 == 0 { "too big" } else { "no sku" },
            )
        })
        .collect();
    records.push(dead_letter("other", &topic, 0, 10, "no sku"));
    records.push(ProduceRecord {
        value: Some(Bytes::from_static(b"plain")),
        ..Default::default()
    });
    records.push(dead_letter("ledger", &topic, 7, 12, "no sku"));
    // Offset 13: its original topic is gone (and must stay gone).
    let gone = format!("{topic}-gone");
    records.push(dead_letter("ledger", &gone, 0, 13, "too big"));
    client
        .produce(&dlq, 0, &records, Compression::Lz4)
        .await
        .expect("produce dead letters");
    // Partition 1: one more.
    client
        .produce(
            &dlq,
            1,
            &[dead_letter("ledger", &topic, 1, 100, "too big")],
            Compression::None,
        )
        .await
        .expect("produce dead letter");
    let dir = scratch();
    manifest(&dir, &topic, "unused-group", &dlq);

    for (args, says) in [
        (
            vec!["list", "--reason", "no (sku"],
            "--reason \"no (sku\" is not a valid regular expression",
        ),
        (
            vec!["replay", "--offsets", "9..3"],
            "--offsets \"9..3\": the range is empty",
        ),
        (
            vec!["replay", "--offsets", "a..3"],
            "--offsets \"a..3\": start \"a\" is not a whole number",
        ),
        (
            vec!["list", "--partition", "5"],
            "--partition 5: the dead-letter topic",
        ),
    ] {
        let r = sharehost_dlq(&dir, &args).await;
        assert!(!r.ok && r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }

    let elsewhere = scratch();
    manifest(&elsewhere, &topic, "unused-group", &gone);
    let r = sharehost_dlq(&elsewhere, &["list"]).await;
    assert!(
        !r.ok
            && r.stderr
                .contains(&format!("the dead-letter topic {gone} does not exist")),
        "{}",
        r.stderr
    );

    let listed = sharehost_dlq(&dir, &["list"]).await;
    assert!(listed.ok, "{}", listed.stderr);
    assert_eq!(
        (
            &listed.summary["read"],
            &listed.summary["selected"],
            &listed.summary["other_pipeline"],
            &listed.summary["not_dead_letters"]
        ),
        (
            &Value::from(15),
            &Value::from(13),
            &Value::from(1),
            &Value::from(1)
        ),
        "{}",
        listed.summary
    );

    let dry = sharehost_dlq(&dir, &["replay", "--dry-run", "--reason", "^no sku$"]).await;
    assert!(dry.ok, "{}", dry.stderr);
    assert_eq!(
        dry.summary["replayed"], 6,
        "offsets 1,3,5,7,9 and 12: {}",
        dry.summary
    );
    assert!(
        dry.lines
            .iter()
            .all(|l| l["replay"]["status"] == "would-replay")
    );
    assert_eq!(
        topic_records(&client, &topic, 2).await.len(),
        0,
        "a dry run produces nothing"
    );

    let some = sharehost_dlq(
        &dir,
        &[
            "replay",
            "--reason",
            "sku",
            "--offsets",
            "2..=7",
            "--partition",
            "0",
        ],
    )
    .await;
    assert!(some.ok, "{}", some.stderr);
    let offsets: Vec<i64> = some
        .lines
        .iter()
        .filter_map(|l| l["offset"].as_i64())
        .collect();
    assert_eq!(offsets, [3, 5, 7], "{:?}", some.lines);
    let produced = topic_records(&client, &topic, 2).await;
    let froms: Vec<(i32, &str)> = produced
        .iter()
        .map(|(p, r)| (*p, header(r, "sharehost.replayed-from").unwrap_or_default()))
        .collect();
    let want: Vec<String> = [3, 5, 7].iter().map(|o| format!("{dlq}/0/{o}")).collect();
    assert_eq!(
        froms,
        want.iter().map(|w| (1, w.as_str())).collect::<Vec<_>>(),
        "odd offsets came from partition 1"
    );
    let (_, r) = &produced[0];
    assert_eq!(r.key.as_deref(), Some(&b"key-3"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"value-3"[..]));
    assert_eq!(
        header(r, "trace-id"),
        Some("t3"),
        "the record's own headers stay"
    );

    let rest = sharehost_dlq(&dir, &["replay"]).await;
    assert!(rest.ok, "{}", rest.stderr);
    assert_eq!(
        (
            &rest.summary["replayed"],
            &rest.summary["already_replayed"],
            &rest.summary["original_topic_missing"]
        ),
        (&Value::from(9), &Value::from(3), &Value::from(1)),
        "{}",
        rest.summary
    );
    let all = topic_records(&client, &topic, 2).await;
    assert_eq!(all.len(), 12);
    let moved = all
        .iter()
        .find(|(_, r)| header(r, "sharehost.replayed-from") == Some(&format!("{dlq}/0/12")))
        .expect("the record of the vanished partition 7 was replayed");
    // Partition 7 does not exist: by key, as the Java client would place `key-12`.
    assert!(moved.0 == 0 || moved.0 == 1);
    let again = sharehost_dlq(&dir, &["replay"]).await;
    assert_eq!(again.summary["replayed"], 0, "{}", again.summary);
    assert_eq!(again.summary["original_topic_missing"], 1);
    assert!(
        !exists(&client, &gone).await,
        "looking for the original topic did not create it"
    );
    assert_eq!(topic_records(&client, &topic, 2).await.len(), 12);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&elsewhere);
    report(
        "dlq select: --reason/--offsets/--partition chose 3, the rest 9, a rerun 0, dry run produced 0",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_left_unanswered_by_a_stopped_run_is_found_not_replayed_again() {
    let client = client().await;
    let (topic, dlq) = topic_with_dead_letters(&client, "dlq-pending", 1, 1).await;
    let letters: Vec<ProduceRecord> = (0..4)
        .map(|o| dead_letter("ledger", &topic, 0, o, "too big"))
        .collect();
    client
        .produce(&dlq, 0, &letters, Compression::None)
        .await
        .expect("produce dead letters");
    let dir = scratch();
    manifest(&dir, &topic, "unused-group", &dlq);
    // A first run replays dead letter 3: the original topic's offset 0.
    let first = sharehost_dlq(&dir, &["replay", "--offsets", "3"]).await;
    assert!(first.ok, "{}", first.stderr);
    assert_eq!(first.summary["replayed"], 1);

    // Then a run that stopped mid-produce: it had noted dead letters 0, 1 and 2 as pending at
    // the partition's end (1), and 0 and 1 reached the broker before it died.
    let state_dir = dir.join("state");
    let files: Vec<PathBuf> = std::fs::read_dir(&state_dir)
        .expect("state dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(files.len(), 1, "one state file: {files:?}");
    let mut state: Value =
        serde_json::from_slice(&std::fs::read(&files[0]).expect("read state")).expect("json");
    assert_eq!(state["topic"], dlq.as_str());
    state["pending"] = serde_json::json!({
        "topic": topic, "partition": 0, "from_offset": 1,
        "dead_letters": [[0, 0], [0, 1], [0, 2]],
    });
    std::fs::write(&files[0], state.to_string()).expect("write state");
    let arrived: Vec<ProduceRecord> = (0..2)
        .map(|o| {
            let mut r = dead_letter("ledger", &topic, 0, o, "too big");
            r.headers = vec![Header {
                key: "sharehost.replayed-from".to_owned(),
                value: Some(Bytes::from(format!("{dlq}/0/{o}"))),
            }];
            r
        })
        .collect();
    client
        .produce(&topic, 0, &arrived, Compression::None)
        .await
        .expect("produce what the stopped run got through");

    let dry = sharehost_dlq(&dir, &["replay", "--dry-run"]).await;
    assert!(dry.ok, "{}", dry.stderr);
    assert_eq!(
        (&dry.summary["recovered"], &dry.summary["replayed"]),
        (&Value::from(2), &Value::from(1)),
        "a dry run sees the same: {}",
        dry.summary
    );
    let rerun = sharehost_dlq(&dir, &["replay"]).await;
    assert!(rerun.ok, "{}", rerun.stderr);
    assert_eq!(
        (
            &rerun.summary["recovered"],
            &rerun.summary["replayed"],
            &rerun.summary["already_replayed"]
        ),
        (&Value::from(2), &Value::from(1), &Value::from(3)),
        "{}",
        rerun.summary
    );
    let mut froms: Vec<String> = topic_records(&client, &topic, 1)
        .await
        .iter()
        .filter_map(|(_, r)| header(r, "sharehost.replayed-from").map(str::to_owned))
        .collect();
    froms.sort();
    let want: Vec<String> = (0..4).map(|o| format!("{dlq}/0/{o}")).collect();
    assert_eq!(froms, want, "every dead letter in the topic exactly once");
    let state: Value =
        serde_json::from_slice(&std::fs::read(&files[0]).expect("read state")).expect("json");
    assert!(state.get("pending").is_none(), "settled: {state}");
    let again = sharehost_dlq(&dir, &["replay"]).await;
    assert_eq!(
        (&again.summary["replayed"], &again.summary["recovered"]),
        (&Value::from(0), &Value::from(0))
    );
    let _ = std::fs::remove_dir_all(&dir);
    report(
        "dlq pending: a stopped run's 3-record produce (2 arrived) settled: 2 found, 1 replayed, 0 twice",
    );
}
