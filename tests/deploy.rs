//! The operator's kit run for real: the image `dev/image` builds and the resources of
//! `deploy/kubernetes`, played with `podman kube play` against the local broker (pods on the
//! host's network). The pods become ready, judge every record, and drain when stopped; the
//! autoscaling example's lag query rises with a backlog and falls as it drains. The ledger is
//! kept outside the engine, from what the ledger plugin in each pod logs.
//!
//! The podman tests are ignored by `cargo test`: they need the image, which takes a release
//! build of its own. `dev/kube-test` builds it and runs them (`--ignored`); CI runs that after
//! `dev/test`. What podman does differently from a kubelet is in tests/support/pods.rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharehost_tests::host::{PATIENCE, Seen, Watch};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::pods::{self, Played, PodLog, image, podman_ok};
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
    let played = rendered.play(dir);
    let logs: Vec<PodLog> = (0..played.pods.len())
        .map(|i| played.follow(i, watch))
        .collect();
    let deadline = Instant::now() + PATIENCE;
    for log in &logs {
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
    (played, logs)
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
