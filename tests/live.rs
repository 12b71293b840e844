//! Live pipelines through the `sharehost` binary against the real broker: the manifest file
//! replaced by rename (as Kubernetes updates a ConfigMap volume) while records flow adds a
//! pipeline, restarts a changed one and drains a removed one, while the untouched pipeline
//! keeps its member and its records (one join, no assignment change, nothing judged twice);
//! a manifest that does not validate, or that changes what only a restart applies, is refused
//! whole and the host runs on.
//!
//! Witnesses outside the engine: the ledger plugin's log lines (ids judged), the broker's view
//! of the groups (lag 0) and the ids produced.
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    blocking, bootstrap, client, fresh_group_with, guest, produce_ids, unique, wait_until_drained,
};

const PARTITIONS: i32 = 3;
/// B's ids start here, apart from A's.
const B_IDS: u64 = 1_000_000;

/// The manifest: pipeline `a` always, pipeline `b` when given (its topic, group and batch
/// size); `admin` the admin listener.
fn manifest(a: (&str, &str), b: Option<(&str, &str, u32)>, admin: &str) -> String {
    let ledger = guest("fixture_ledger");
    let pipeline = |name: &str, topic: &str, group: &str, batch: u32| {
        format!(
            "[[pipeline]]\nname = \"{name}\"\ntopics = [\"{topic}\"]\ngroup = \"{group}\"\ncomponent = \"{}\"\nconfig = {{ pause-ms = \"20\" }}\nbatch_size = {batch}\nmax_in_flight = 500\nconcurrency = 2\n\n",
            ledger.display()
        )
    };
    let mut text = format!(
        "[cluster]\nbootstrap = \"{}\"\n\n[admin]\nlisten = \"{admin}\"\n\n",
        bootstrap()
    );
    text.push_str(&pipeline("a", a.0, a.1, 50));
    if let Some((topic, group, batch)) = b {
        text.push_str(&pipeline("b", topic, group, batch));
    }
    text
}

/// Replaces `path` by rename, as a ConfigMap volume is updated.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, path).expect("rename manifest");
}

/// Polls `GET path` until `cond` holds; fails after a bound with the last answer.
fn poll(host: &HostProcess, path: &str, what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let until = Instant::now() + PATIENCE;
    loop {
        let (code, body) = host.http("GET", path, "");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if code == 200 && cond(&v) {
            return;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pipeline<'a>(status: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    status
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
}

/// Log lines that say pipeline `name` joined its group.
fn joins(host: &HostProcess, name: &str) -> usize {
    let needle = format!("pipeline running pipeline={name} ");
    host.log_lines()
        .iter()
        .filter(|l| l.contains(&needle))
        .count()
}

/// A metric's value (the line that starts with `series`).
fn metric(host: &HostProcess, series: &str) -> Option<String> {
    let (_, text) = host.http("GET", "/metrics", "");
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_are_added_changed_and_removed_live_while_the_untouched_one_keeps_its_member() {
    let client = client().await;
    let (ta, tb) = (unique("live-a"), unique("live-b"));
    for t in [&ta, &tb] {
        client
            .create_topic(t, PARTITIONS, 1, &[])
            .await
            .expect("create topic");
    }
    let ga = fresh_group_with(&client, Some(30_000), &[]).await;
    let gb = fresh_group_with(&client, Some(30_000), &[]).await;
    let dir = std::env::temp_dir().join(unique("sharehost-live"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path: PathBuf = dir.join("host.toml");
    let admin = "127.0.0.1:0";
    replace(&path, &manifest((&ta, &ga), None, admin));
    let p = path.clone();
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &p, "host")).await;
    let mut ids: Vec<String> = produce_ids(&client, &ta, PARTITIONS, 0..1000).await;
    let wait_ids = |host: &HostProcess, n: usize| {
        host.wait_for("every id judged", |s| s.distinct().len() >= n);
    };
    wait_ids(&host, 200);
    let rebalances_a = metric(&host, "sharehost_rebalances_total{pipeline=\"a\"}");
    assert_eq!(joins(&host, "a"), 1);

    // Added, under load.
    ids.extend(produce_ids(&client, &ta, PARTITIONS, 1000..3000).await);
    replace(&path, &manifest((&ta, &ga), Some((&tb, &gb, 50)), admin));
    poll(&host, "/pipelines", "pipeline b running", |s| {
        pipeline(s, "b").is_some_and(|b| b["state"] == "running")
    });
    ids.extend(produce_ids(&client, &tb, PARTITIONS, B_IDS..B_IDS + 500).await);
    wait_ids(&host, 3500);

    // Changed: b restarts alone.
    ids.extend(produce_ids(&client, &ta, PARTITIONS, 3000..5000).await);
    replace(&path, &manifest((&ta, &ga), Some((&tb, &gb, 20)), admin));
    poll(&host, "/manifest", "the change applied", |m| {
        m["applied"] == 2
    });
    poll(&host, "/pipelines", "pipeline b running again", |s| {
        pipeline(s, "b").is_some_and(|b| b["state"] == "running")
    });
    let until = Instant::now() + PATIENCE;
    while joins(&host, "b") < 2 {
        assert!(Instant::now() < until, "b never joined again");
        std::thread::sleep(Duration::from_millis(20));
    }
    ids.extend(produce_ids(&client, &tb, PARTITIONS, B_IDS + 500..B_IDS + 1000).await);
    wait_ids(&host, 6000);

    // Removed: b drains and stops.
    ids.extend(produce_ids(&client, &ta, PARTITIONS, 5000..7000).await);
    replace(&path, &manifest((&ta, &ga), None, admin));
    poll(&host, "/pipelines", "pipeline b gone", |s| {
        pipeline(s, "b").is_none() && pipeline(s, "a").is_some()
    });

    // Refused whole: a manifest that does not validate, one that changes [admin].
    replace(&path, "[cluster]\nbootstrap = 42\n");
    poll(&host, "/manifest", "the invalid manifest refused", |m| {
        m["refused"] == 1
            && m["last_refused"]
                .as_str()
                .is_some_and(|e| e.contains("host.toml") && e.contains("bootstrap"))
    });
    replace(&path, &manifest((&ta, &ga), None, "127.0.0.1:1"));
    poll(&host, "/manifest", "the [admin] change refused", |m| {
        m["refused"] == 2
            && m["last_refused"]
                .as_str()
                .is_some_and(|e| e.contains("[admin]") && e.contains("restart"))
    });
    ids.extend(produce_ids(&client, &ta, PARTITIONS, 7000..8000).await);
    wait_ids(&host, ids.len());

    // The untouched pipeline joined once and its assignment never changed.
    assert_eq!(
        joins(&host, "a"),
        1,
        "a joined once: {:#?}",
        host.log_lines()
    );
    assert_eq!(
        metric(&host, "sharehost_rebalances_total{pipeline=\"a\"}"),
        rebalances_a
    );
    assert_eq!(
        metric(
            &host,
            "sharehost_manifest_rereads_total{result=\"applied\"}"
        )
        .as_deref(),
        Some("3")
    );
    let (_, seen) = blocking(move || host.stop()).await;
    for g in [ga, gb] {
        blocking(move || wait_until_drained(&g)).await;
    }
    let mut ledger = Ledger::new("live", ids.iter().cloned());
    seen.record(&mut ledger);
    ledger.check();
    let a_judged = seen
        .accepted
        .iter()
        .chain(&seen.rejected)
        .filter(|id| id.parse::<u64>().is_ok_and(|i| i < B_IDS))
        .count();
    assert_eq!(
        a_judged, 8000,
        "every one of a's ids judged once: nothing it held was released"
    );
    report(&format!(
        "live manifest: b added, changed and removed, two manifests refused; a joined once, judged 8000 ids once each; {ledger}"
    ));
}
