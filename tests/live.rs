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

/// Waits for `GET /manifest` to satisfy `done`; fails at once, with the body, when it
/// satisfies `wrong` instead (a regression fails fast, not after PATIENCE).
fn manifest_until(
    host: &HostProcess,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
    wrong: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let until = Instant::now() + PATIENCE;
    loop {
        let (code, body) = host.http("GET", "/manifest", "");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert!(code != 200 || !wrong(&v), "{what}: {body}");
        if code == 200 && done(&v) {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host's data segment (heap and private writable mappings) now, in bytes.
fn data_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmData:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_that_is_a_device_or_too_large_is_refused_and_one_written_in_place_is_read_whole()
 {
    let client = client().await;
    let (ta, tb) = (unique("bounds-a"), unique("bounds-b"));
    for t in [&ta, &tb] {
        client
            .create_topic(t, PARTITIONS, 1, &[])
            .await
            .expect("create topic");
    }
    let ga = fresh_group_with(&client, Some(30_000), &[]).await;
    let gb = fresh_group_with(&client, Some(30_000), &[]).await;
    let dir = std::env::temp_dir().join(unique("sharehost-live-bounds"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path: PathBuf = dir.join("host.toml");
    let admin = "127.0.0.1:0";
    replace(&path, &manifest((&ta, &ga), Some((&tb, &gb, 50)), admin));
    let p = path.clone();
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &p, "host")).await;
    // At most 1 GiB more heap from here: a manifest read without its bound makes the host
    // fail fast (and the test with it) instead of taking the machine.
    let limit = data_bytes(host.pid()) + (1 << 30);
    let limited = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", host.pid()))
        .arg(format!("--data={limit}"))
        .status()
        .expect("prlimit");
    assert!(limited.success());
    let both_running = |s: &serde_json::Value| {
        s.as_array().is_some_and(|a| a.len() == 2)
            && ["a", "b"]
                .iter()
                .all(|n| pipeline(s, n).is_some_and(|p| p["state"] == "running"))
    };
    poll(&host, "/pipelines", "a and b running", both_running);

    // The manifest replaced by a symlink to /dev/zero: refused naming the file, the host runs on.
    let link = dir.join("zero.link");
    std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
    std::fs::rename(&link, &path).expect("rename");
    manifest_until(
        &host,
        "the /dev/zero manifest refused",
        |m| {
            m["refused"] == 1
                && m["last_refused"]
                    .as_str()
                    .is_some_and(|e| e.contains("host.toml") && e.contains("is a character device"))
        },
        |m| m["applied"] != 0,
    );
    poll(&host, "/pipelines", "a and b running on", both_running);

    // 10,002 pipelines: refused whole, naming the bound; a and b untouched.
    let mut many = manifest((&ta, &ga), Some((&tb, &gb, 50)), admin);
    for i in 0..10_000 {
        many.push_str(&format!(
            "[[pipeline]]\nname = \"p{i}\"\ntopics = [\"{ta}\"]\ngroup = \"g{i}\"\ncomponent = {:?}\n\n",
            guest("fixture_ledger")
        ));
    }
    replace(&path, &many);
    manifest_until(
        &host,
        "the 10,002-pipeline manifest refused",
        |m| {
            m["last_refused"]
                .as_str()
                .is_some_and(|e| e.contains("10002 pipelines, more than the 256 allowed"))
        },
        |m| m["applied"] != 0,
    );
    poll(&host, "/pipelines", "a and b, and only them", both_running);

    // A good manifest (b's batch changed): applied, and the last refusal is still shown.
    replace(&path, &manifest((&ta, &ga), Some((&tb, &gb, 20)), admin));
    let m = manifest_until(
        &host,
        "the good manifest applied",
        |m| m["applied"] == 1,
        |_| false,
    );
    assert!(
        m["last_refused"]
            .as_str()
            .is_some_and(|e| e.contains("10002 pipelines")),
        "the refusal is kept after a good read: {m}"
    );
    assert!(
        m["last_refused_at_ms"].as_u64().is_some_and(|t| t > 0),
        "{m}"
    );

    // Written in place, in two writes split at b's table: the first half alone is a valid
    // manifest without b. The host must wait for the writer to close the file.
    let text = manifest((&ta, &ga), Some((&tb, &gb, 30)), admin);
    let cut = text.find("[[pipeline]]\nname = \"b\"").expect("b's table");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("open in place");
    use std::io::Write;
    file.write_all(&text.as_bytes()[..cut]).expect("first half");
    let until = Instant::now() + PATIENCE;
    loop {
        let log = host.log_lines();
        assert!(
            !log.iter().any(|l| l.contains("pipeline removed")),
            "a half-written manifest was read: {log:#?}"
        );
        if log.iter().any(|l| l.contains("is being written")) {
            break;
        }
        assert!(Instant::now() < until, "the host never saw the write");
        std::thread::sleep(Duration::from_millis(20));
    }
    file.write_all(&text.as_bytes()[cut..])
        .expect("second half");
    drop(file);
    manifest_until(
        &host,
        "the whole manifest applied",
        |m| m["applied"] == 2,
        |_| false,
    );
    poll(&host, "/pipelines", "a and b running", both_running);
    assert!(
        !host
            .log_lines()
            .iter()
            .any(|l| l.contains("pipeline removed")),
        "no pipeline was removed"
    );

    // Widening b's grants (an outbound host) is logged at WARN, naming it.
    let widened = manifest((&ta, &ga), Some((&tb, &gb, 30)), admin).replace(
        "concurrency = 2\n\n[[pipeline]]\nname = \"b\"",
        "concurrency = 2\n\n[[pipeline]]\nallowed_outbound_hosts = [\"http://127.0.0.1:9\"]\nname = \"b\"",
    );
    assert_ne!(widened, text);
    replace(&path, &widened);
    let until = Instant::now() + PATIENCE;
    while !host.log_lines().iter().any(|l| {
        l.contains("WARN") && l.contains("grants widen") && l.contains("http://127.0.0.1:9")
    }) {
        assert!(Instant::now() < until, "no WARN for the widened grant");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = blocking(move || host.stop()).await;
    let _ = std::fs::remove_dir_all(&dir);
}
