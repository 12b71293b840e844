//! A fleet of hosts operated as one, through the `sharehost` binary against the real broker:
//! `sharehost fleet deploy` reaches every host and a host started later judges its first batch
//! with the deployed version; a fleet canary that faults on one host's records is rolled back
//! on every host by the fleet's sum, and a good one promoted; actions that are unsigned,
//! tampered with, signed by an unknown key or replayed are refused on every host while the
//! active version judges on; a host reading the compacted deployments topic from its start
//! reaches the state the others reached.
//!
//! Witnesses outside the engine: the ledger plugin's log lines on every host (what each
//! version decided), the broker's view of the group (lag 0) and the ids produced; each host's
//! `GET /pipelines` for the version it runs.
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sharehost::fleet::desired::Desired;
use sharehost::fleet::records::{Action, Change, SignedAction, action_key};
use sharehost::fleet::sign;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost_tests::fleet::{
    FleetKit, explain_duplicates, hash, poll_all, poll_fleet, wait_judged, wait_judged_with,
};
use sharehost_tests::host::{HostProcess, PATIENCE, Seen};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::sharehost_bin;
use sharehost_tests::signing::{Signer, minisign_keys, minisign_sign};
use sharehost_tests::{
    FAULT_SETTINGS, blocking, bootstrap, client, guest, ledger_manifest, new_version, produce_ids,
    topic_and_group, topic_records, wait_until_drained,
};

const PARTITIONS: i32 = 3;

/// A fleet's scenario: a topic, a group, fleet topics of its own, an operator key, signed
/// components and one manifest per host.
struct Fleet {
    /// The operator's key, the signed ledger plugin, the fleet's topics and files.
    kit: FleetKit,
    client: Arc<KafkaClient>,
    topic: String,
    group: String,
    ids: Vec<String>,
}

/// The kit's fields (`f.operator`, `f.v1`, `f.dir`, ...) read as the scenario's own.
impl std::ops::Deref for Fleet {
    type Target = FleetKit;

    fn deref(&self) -> &FleetKit {
        &self.kit
    }
}

impl std::ops::DerefMut for Fleet {
    fn deref_mut(&mut self) -> &mut FleetKit {
        &mut self.kit
    }
}

impl Fleet {
    async fn new(name: &'static str) -> Fleet {
        let client = Arc::new(client().await);
        let (topic, group) = topic_and_group(&client, name, PARTITIONS).await;
        Fleet {
            kit: FleetKit::new(name),
            client,
            topic,
            group,
            ids: Vec::new(),
        }
    }

    /// Host `id`'s manifest: the same pipeline on every host, its own fleet host id.
    fn manifest(&self, id: &str) -> PathBuf {
        self.manifest_with(id, &self.v1, "")
    }

    /// [`Fleet::manifest`] with another component and more lines at the end of the pipeline's
    /// table (its own `[pipeline.trust]`, say).
    fn manifest_with(&self, id: &str, component: &Path, extra: &str) -> PathBuf {
        self.kit.manifest(
            id,
            "",
            &ledger_manifest(
                &bootstrap(),
                &self.topic,
                &self.group,
                component,
                "",
                &format!("{FAULT_SETTINGS}{extra}"),
            ),
        )
    }

    /// Starts host `id` with a state directory of its own.
    fn start(&self, id: &str) -> HostProcess {
        self.start_with(id, &self.v1, "")
    }

    /// [`Fleet::start`] with another component and more lines in the pipeline's table.
    fn start_with(&self, id: &str, component: &Path, extra: &str) -> HostProcess {
        let manifest = self.manifest_with(id, component, extra);
        self.kit.start(sharehost_bin!(), &manifest, id)
    }

    /// Runs `sharehost fleet ARGS` as the operator; returns its output, failing the test when
    /// it fails.
    fn fleet(&self, args: &[&str]) -> String {
        self.kit
            .fleet(sharehost_bin!(), &self.manifest("operator"), args)
    }

    async fn produce(&mut self, ids: std::ops::Range<u64>) {
        let more = produce_ids(&self.client, &self.topic, PARTITIONS, ids).await;
        self.ids.extend(more);
    }

    /// The ledger over what every host's plugin logged, once the broker has nothing left for
    /// the group; printed, and failing on a lost record.
    async fn ledger(&self, seen: &[Seen]) -> Ledger {
        let group = self.group.clone();
        blocking(move || wait_until_drained(&group)).await;
        let mut ledger = Ledger::new(&self.name, self.ids.iter().cloned());
        for s in seen {
            s.record(&mut ledger);
        }
        ledger.check();
        ledger
    }

    /// Writes a raw record to the fleet's deployments topic (as anyone with write access to
    /// it could).
    async fn write_deployment(&self, key: &str, value: &[u8]) {
        self.write_raw("deployments", key, value).await;
    }

    /// Writes a raw record to the fleet's topic `<prefix><name>.KIND` (deployments, status or
    /// components), as anyone with write access to it could; returns its offset.
    async fn write_raw(&self, kind: &str, key: &str, value: &[u8]) -> i64 {
        let topic = format!("{}{}.{kind}", self.prefix, self.name);
        let record = ProduceRecord {
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::copy_from_slice(value)),
            headers: Vec::new(),
            timestamp: None,
        };
        self.client
            .produce(&topic, 0, &[record], Compression::None)
            .await
            .unwrap_or_else(|e| panic!("write to {topic}: {e}"))
    }

    /// Starts host `id` with `fleet_extra` lines in its `[fleet]` table.
    fn start_fleet_extra(&self, id: &str, fleet_extra: &str) -> HostProcess {
        let manifest = self.kit.manifest(
            id,
            fleet_extra,
            &ledger_manifest(
                &bootstrap(),
                &self.topic,
                &self.group,
                &self.v1,
                "",
                FAULT_SETTINGS,
            ),
        );
        self.kit.start(sharehost_bin!(), &manifest, id)
    }
}

/// The lines of a host's `GET /metrics` that count skipped fleet records of topic kind `kind`
/// (deployments, status, components) for `reason`, summed.
fn skipped(host: &HostProcess, kind: &str, reason: &str) -> u64 {
    let (_, metrics) = host.http("GET", "/metrics", "");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("sharehost_fleet_records_skipped_total")
                && l.contains(&format!(".{kind}\""))
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits until `host` has counted a skipped record of topic kind `kind` for `reason`.
fn wait_skipped(host: &HostProcess, kind: &str, reason: &str) {
    let until = Instant::now() + PATIENCE;
    while skipped(host, kind, reason) == 0 {
        let (_, metrics) = host.http("GET", "/metrics", "");
        assert!(
            Instant::now() < until,
            "no {reason} record of the {kind} topic counted: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn counted(status: &serde_json::Value, version: &str) -> u64 {
    let c = &status["versions"][version];
    ["accepted", "rejected", "released"]
        .iter()
        .map(|k| c[k].as_u64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_reaches_every_host_and_a_host_started_later_judges_its_first_batch_with_it() {
    let mut f = Fleet::new("deploy").await;
    let f_ref = &f;
    let hosts: Vec<HostProcess> = ["a", "b", "c"].iter().map(|id| f_ref.start(id)).collect();
    f.produce(0..300).await;
    let n = f.ids.len();
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    wait_judged(&refs, n);

    let v1 = hash(&f.v1);
    let v2_path = f.version(&f.v1, "deploy-v2");
    let v2 = hash(&v2_path);
    let started = Instant::now();
    let out = f.fleet(&["deploy", v2_path.to_str().expect("utf-8")]);
    assert!(out.contains("action 1 (deploy"), "{out}");
    poll_all(&refs, "every host on v2", |p| {
        p["active_version"] == v2.as_str()
    });
    let uncached = started.elapsed();

    let started = Instant::now();
    f.fleet(&["rollback"]);
    poll_all(&refs, "every host back on v1", |p| {
        p["active_version"] == v1.as_str()
    });
    let rollback = started.elapsed();

    let started = Instant::now();
    f.fleet(&["deploy", v2_path.to_str().expect("utf-8")]);
    poll_all(&refs, "every host on v2 again", |p| {
        p["active_version"] == v2.as_str()
    });
    let cached = started.elapsed();
    report(&format!(
        "fleet of 3 hosts: from `fleet deploy` to the last host on the new version {:.2} s (uncached), {:.2} s (cached); a rollback {:.2} s",
        uncached.as_secs_f64(),
        cached.as_secs_f64(),
        rollback.as_secs_f64()
    ));

    // The fleet as every host sees it: three hosts, one desired version.
    let view = poll_fleet(&hosts[0], "three hosts in the fleet's status", |v| {
        v["hosts"].as_array().is_some_and(|h| h.len() == 3)
    });
    assert_eq!(view["pipelines"]["ledger"]["seq"], 3, "{view:#}");
    assert_eq!(
        view["pipelines"]["ledger"]["active"]["digest"],
        v2.as_str(),
        "{view:#}"
    );
    let status = f.fleet(&["status"]);
    assert!(
        status.contains("host a:") && status.contains("host c:"),
        "{status}"
    );

    // A host that starts after the deploy judges its first batch with the deployed version.
    let late = f.start("d");
    poll_all(&[&late], "the late host running", |p| {
        p["state"] == "running"
    });
    let mut all: Vec<&HostProcess> = hosts.iter().collect();
    all.push(&late);
    // Records until the late host has judged some (the broker spreads them over four
    // members now; each round waits for every id to be judged somewhere).
    let mut next = 300;
    while late.seen().judged() == 0 {
        assert!(next < 300 + 20 * 300, "the late host never got a record");
        f.produce(next..next + 300).await;
        next += 300;
        wait_judged(&all, f.ids.len());
    }
    let late_status = late.status();
    assert_eq!(
        late_status[0]["active_version"],
        v2.as_str(),
        "{:#?}",
        late.log_lines()
    );
    assert_eq!(
        counted(&late_status[0], &v1),
        0,
        "the late host judged nothing with the version the fleet replaced: {late_status:#}"
    );
    let mut seen = Vec::new();
    for h in hosts.into_iter().chain([late]) {
        seen.push(blocking(move || h.stop().1).await);
    }
    let ledger = f.ledger(&seen).await;
    assert_eq!(ledger.duplicates(), 0, "no record judged twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_canary_is_rolled_back_everywhere_on_one_hosts_faults_and_a_good_one_promoted() {
    let mut f = Fleet::new("canary").await;
    let f_ref = &f;
    let hosts: Vec<HostProcess> = ["a", "b", "c"].iter().map(|id| f_ref.start(id)).collect();
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    f.produce(0..300).await;
    wait_judged(&refs, f.ids.len());
    let v1 = hash(&f.v1);

    // A candidate that traps on any batch of partition 0: only the host that holds it faults.
    let bad = f.dir.join("trap-p0.wasm");
    std::fs::copy(guest("fixture_ledger_trap_p0"), &bad).expect("copy candidate");
    f.operator.sign(&bad);
    f.fleet(&[
        "canary",
        bad.to_str().expect("utf-8"),
        "--percent",
        "50",
        "--promote-after-batches",
        "100000",
    ]);
    poll_all(&refs, "the canary running on every host", |p| {
        p["canary"]["state"] == "running" || p["canary"]["state"] == "rolled_back"
    });
    f.produce(300..1500).await;
    let view = poll_fleet(&hosts[0], "the fleet to roll the canary back", |v| {
        v["pipelines"]["ledger"]["last_canary"]["promoted"] == false
    });
    let reason = view["pipelines"]["ledger"]["last_canary"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("fault rate"), "{view:#}");
    poll_all(&refs, "the canary rolled back on every host", |p| {
        p["canary"]["state"] == "rolled_back" && p["active_version"] == v1.as_str()
    });
    let faulting: Vec<String> = hosts
        .iter()
        .filter(|h| {
            h.status()[0]["canary"]["candidate_tally"]["faulted_batches"]
                .as_u64()
                .unwrap_or(0)
                > 0
        })
        .map(|h| h.status()[0]["name"].to_string())
        .collect();
    report(&format!(
        "fleet canary rolled back on every host ({reason}); hosts that saw its faults: {}",
        faulting.len()
    ));
    wait_judged(&refs, f.ids.len());

    // A good candidate, promoted on the fleet's sum of batches.
    let good = f.version(&f.v1, "canary-v2");
    let v2 = hash(&good);
    f.fleet(&[
        "canary",
        good.to_str().expect("utf-8"),
        "--percent",
        "50",
        "--promote-after-batches",
        "6",
    ]);
    // Records produced before a host runs the canary are judged by v1 alone: on a busy machine
    // they all were, and the fleet never summed six candidate batches.
    poll_all(&refs, "the good canary running on every host", |p| {
        p["canary"]["candidate"] == v2.as_str() && p["canary"]["state"] == "running"
    });
    f.produce(1500..3000).await;
    poll_all(&refs, "the good canary promoted on every host", |p| {
        p["active_version"] == v2.as_str()
    });
    let view = poll_fleet(&hosts[0], "the promotion recorded", |v| {
        v["pipelines"]["ledger"]["last_canary"]["promoted"] == true
    });
    assert_eq!(
        view["pipelines"]["ledger"]["active"]["digest"],
        v2.as_str(),
        "{view:#}"
    );
    wait_judged(&refs, f.ids.len());
    let mut stopped = Vec::new();
    for h in hosts {
        stopped.push(blocking(move || h.stop_with_log()).await);
    }
    let seen: Vec<Seen> = stopped.iter().map(|(_, s, _)| s.clone()).collect();
    let ledger = f.ledger(&seen).await;
    let named: Vec<(&str, &Seen, &[String])> = ["a", "b", "c"]
        .iter()
        .zip(&stopped)
        .map(|(n, (_, s, l))| (*n, s, l.as_slice()))
        .collect();
    explain_duplicates(&ledger, &named);
    assert_eq!(ledger.duplicates(), 0, "no record judged by both versions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_tampered_foreign_and_replayed_actions_are_refused_while_the_active_version_judges()
 {
    let mut f = Fleet::new("refused").await;
    let f_ref = &f;
    let hosts: Vec<HostProcess> = ["a", "b"].iter().map(|id| f_ref.start(id)).collect();
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    let v2_path = f.version(&f.v1, "refused-v2");
    let v3_path = f.version(&f.v1, "refused-v3");
    let v3 = hash(&v3_path);
    f.fleet(&["deploy", v2_path.to_str().expect("utf-8")]);
    f.fleet(&["deploy", v3_path.to_str().expect("utf-8")]);
    poll_all(&refs, "every host on v3", |p| {
        p["active_version"] == v3.as_str()
    });
    let view = poll_fleet(&hosts[0], "two actions", |v| {
        v["pipelines"]["ledger"]["seq"] == 2
    });
    let v2_ref = view["pipelines"]["ledger"]["history"][0].clone();
    let v2_ref: sharehost::fleet::records::ComponentRef =
        serde_json::from_value(v2_ref).expect("v2 in the history");

    // An action that would bring v2 back, written five ways no host may apply.
    let action = |seq| Action {
        fleet: f.name.to_owned(),
        pipeline: "ledger".into(),
        seq,
        issued_at_ms: 1,
        change: Change::Deploy {
            component: v2_ref.clone(),
        },
        then: Desired {
            seq,
            active: Some(v2_ref.clone()),
            ..Desired::default()
        },
    };
    let unsigned = SignedAction {
        action: serde_json::to_string(&action(3)).expect("json"),
        signature: String::new(),
    };
    let mut tampered = sign::sign(&action(3), &f.operator.sk).expect("sign");
    tampered.action = tampered.action.replace("\"seq\":3", "\"seq\":4");
    let stranger = Signer::new();
    let foreign = sign::sign(&action(3), &stranger.sk).expect("sign");
    // A replay: an old action, signed by the operator, under its own key and number.
    let replayed = sign::sign(&action(1), &f.operator.sk).expect("sign");
    for signed in [&unsigned, &tampered, &foreign, &replayed] {
        let seq = serde_json::from_str::<Action>(&signed.action).map_or(1, |a| a.seq);
        f.write_deployment(
            &action_key("ledger", seq),
            &serde_json::to_vec(signed).expect("json"),
        )
        .await;
    }
    // Bad input of every other kind: not JSON, an unknown key, an oversized value.
    f.write_deployment("action/ledger/x", b"{not json").await;
    f.write_deployment("who-knows", b"{}").await;
    f.write_deployment("action/ledger/y", &vec![b' '; 300 << 10])
        .await;
    // A last, good action: once every host has applied it, they have read everything before.
    let v4_path = f.version(&f.v1, "refused-v4");
    let v4 = hash(&v4_path);
    f.fleet(&["deploy", v4_path.to_str().expect("utf-8")]);
    poll_all(&refs, "every host on v4", |p| {
        p["active_version"] == v4.as_str()
    });
    for h in &hosts {
        let (_, metrics) = h.http("GET", "/metrics", "");
        for reason in ["unverified", "malformed", "unknown_key", "too_large"] {
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with("sharehost_fleet_records_skipped_total")
                        && l.contains(&format!("reason=\"{reason}\""))),
                "{reason} counted: {metrics}"
            );
        }
        let refused = metrics
            .lines()
            .find(|l| {
                l.starts_with("sharehost_fleet_actions_total") && l.contains("result=\"refused\"")
            })
            .unwrap_or_default();
        assert!(
            refused.ends_with(" 1"),
            "the replayed action refused: {refused}"
        );
    }
    let view = poll_fleet(&hosts[0], "the fleet's view", |_| true);
    assert_eq!(view["pipelines"]["ledger"]["seq"], 3, "{view:#}");
    // The active version judges on.
    f.produce(0..300).await;
    wait_judged(&refs, f.ids.len());
    let mut seen = Vec::new();
    for h in hosts {
        h.wait_for_log("fleet record skipped");
        seen.push(blocking(move || h.stop().1).await);
    }
    f.ledger(&seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_canary_comes_back_into_it_and_the_promotion_reaches_every_host() {
    let mut f = Fleet::new("killed").await;
    let f_ref = &f;
    let mut hosts: Vec<HostProcess> = ["a", "b", "c"].iter().map(|id| f_ref.start(id)).collect();
    let candidate = f.version(&f.v1, "killed-v2");
    let v2 = hash(&candidate);
    f.fleet(&[
        "canary",
        candidate.to_str().expect("utf-8"),
        "--percent",
        "50",
        "--promote-after-batches",
        "1000000",
    ]);
    {
        let refs: Vec<&HostProcess> = hosts.iter().collect();
        poll_all(&refs, "the canary running on every host", |p| {
            p["canary"]["state"] == "running" && p["canary"]["candidate"] == v2.as_str()
        });
    }
    f.produce(0..600).await;
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    wait_judged(&refs, f.ids.len());

    // SIGKILL one host mid-canary and start it again (same id, same state directory).
    let killed = hosts.remove(1);
    let mut seen = vec![blocking(move || killed.kill()).await];
    let back = f.start("b");
    poll_all(&[&back], "the restarted host back in the canary", |p| {
        p["canary"]["state"] == "running" && p["canary"]["candidate"] == v2.as_str()
    });
    hosts.push(back);
    f.produce(600..1200).await;
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    wait_judged_with(&refs, &seen, f.ids.len());

    f.fleet(&["promote"]);
    poll_all(&refs, "the promotion on every host", |p| {
        p["active_version"] == v2.as_str() && p["canary"]["state"] == "promoted"
    });
    f.produce(1200..1500).await;
    wait_judged_with(&refs, &seen, f.ids.len());
    for h in hosts {
        seen.push(blocking(move || h.stop().1).await);
    }
    // Records the killed host held are delivered again; nothing is lost.
    f.ledger(&seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_cannot_verify_a_deploy_keeps_its_version_and_a_local_swap_lasts_until_the_next_action()
 {
    let f = Fleet::new("keeps").await;
    // Host b's pipeline trusts another key only (its v1 signed by it): it cannot verify what
    // the operator signs.
    let stranger = Signer::new();
    let b_v1 = f.dir.join("v1-b.wasm");
    std::fs::copy(&f.v1, &b_v1).expect("copy v1");
    stranger.sign(&b_v1);
    let a = f.start("a");
    let b = f.start_with(
        "b",
        &b_v1,
        &format!("\n[pipeline.trust]\nkeys = [\"{}\"]\n", stranger.public()),
    );
    let v1 = hash(&f.v1);
    let v2_path = f.version(&f.v1, "keeps-v2");
    let v2 = hash(&v2_path);
    f.fleet(&["deploy", v2_path.to_str().expect("utf-8")]);
    poll_all(&[&a], "host a on v2", |p| {
        p["active_version"] == v2.as_str()
    });
    let view = poll_fleet(&a, "host b saying why it keeps v1", |v| {
        v["hosts"].as_array().is_some_and(|hs| {
            hs.iter().any(|h| {
                h["host"] == "b"
                    && h["pipelines"][0]["refused"]
                        .as_str()
                        .is_some_and(|r| r.contains("[trust]"))
            })
        })
    });
    assert_eq!(b.status()[0]["active_version"], v1.as_str(), "{view:#}");
    let (_, metrics) = b.http("GET", "/metrics", "");
    assert!(
        metrics.contains("sharehost_fleet_actions_total{result=\"not_applied\"} 1"),
        "{metrics}"
    );

    // A swap made on host a alone lasts (three more statuses of a's, still on v1) ...
    let (code, body) = a.http(
        "POST",
        "/pipelines/ledger/swap",
        &format!(r#"{{"path": "{}"}}"#, f.v1.display()),
    );
    assert_eq!(code, 200, "{body}");
    let at = |v: &serde_json::Value| {
        v["hosts"]
            .as_array()
            .and_then(|hs| hs.iter().find(|h| h["host"] == "a"))
            .and_then(|h| h["at_ms"].as_u64())
            .unwrap_or(0)
    };
    let since = at(&poll_fleet(&a, "a's status", |_| true));
    poll_fleet(&a, "three more statuses of host a", |v| {
        at(v) >= since + 3 * 500
    });
    assert_eq!(a.status()[0]["active_version"], v1.as_str());
    // ... until the fleet's next action.
    let v3_path = f.version(&f.v1, "keeps-v3");
    let v3 = hash(&v3_path);
    f.fleet(&["deploy", v3_path.to_str().expect("utf-8")]);
    poll_all(&[&a], "host a on v3", |p| {
        p["active_version"] == v3.as_str()
    });
    assert_eq!(b.status()[0]["active_version"], v1.as_str());
    blocking(move || a.stop()).await;
    blocking(move || b.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_cannot_write_its_status_judges_on_and_still_applies_the_fleets_actions() {
    let mut f = Fleet::new("unwritable").await;
    let a = f.start("a");
    f.produce(0..300).await;
    wait_judged(&[&a], f.ids.len());

    // The status topic refuses every record from now on: larger than it accepts.
    let status = format!("{}{}.status", f.prefix, f.name);
    f.client
        .alter_topic_configs(&status, &[("max.message.bytes", Some("64"))])
        .await
        .expect("shrink the status topic's records");
    let failures = |h: &HostProcess| {
        let (_, metrics) = h.http("GET", "/metrics", "");
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("sharehost_fleet_write_failures_total{record=\"status\"} ")
            })
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let until = Instant::now() + PATIENCE;
    while failures(&a) < 2.0 {
        assert!(Instant::now() < until, "no failed status writes counted");
        // A host has no way to notify a test of a metric: poll it.
        std::thread::sleep(Duration::from_millis(50));
    }

    // Its actions still arrive and are applied; records are judged with them.
    let v2 = f.version(&f.v1, "unwritable-v2");
    f.fleet(&["deploy", v2.to_str().expect("utf-8")]);
    poll_all(&[&a], "host a on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    f.produce(300..900).await;
    wait_judged(&[&a], f.ids.len());
    // Logged once per run of failures (a warning when it starts, a line when it ends), not every
    // interval: the run going on now is the one warning not yet ended.
    let lines = a.wait_for_log("cannot publish this host's status");
    let count = |text: &str| lines.iter().filter(|l| l.contains(text)).count();
    assert_eq!(
        count("cannot publish this host's status") - count("status is published again"),
        1,
        "the failure is logged once, not every interval"
    );

    // Writable again: the host's status reaches the fleet once more.
    f.client
        .alter_topic_configs(&status, &[("max.message.bytes", None)])
        .await
        .expect("restore the status topic");
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    // Witnessed by the operator's reading of the status topic (a host's own `GET /fleet` shows
    // its status whether or not it got out).
    let until = Instant::now() + PATIENCE;
    loop {
        let out = f.fleet(&["status", "--json"]);
        let view: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
        let at = view["hosts"].as_array().and_then(|hs| {
            hs.iter()
                .find(|h| h["host"] == "a")
                .and_then(|h| h["at_ms"].as_u64())
        });
        if at.is_some_and(|at| at > since) {
            break;
        }
        assert!(
            Instant::now() < until,
            "host a's status never reached the topic again: {view:#}"
        );
        // The status topic has no way to notify a test: read it again.
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = blocking(move || a.stop().1).await;
    f.ledger(&[seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_reading_the_compacted_deployments_topic_from_its_start_reaches_the_same_state() {
    let mut f = Fleet::new("compacted").await;
    // The deployments topic, made here to be compacted eagerly: a segment rolls 100 ms after
    // its first record and any duplicate key makes it worth cleaning.
    let deployments = format!("{}{}.deployments", f.prefix, f.name);
    f.client
        .create_topic(
            &deployments,
            1,
            1,
            &[
                ("cleanup.policy", "compact"),
                ("segment.ms", "100"),
                ("min.cleanable.dirty.ratio", "0.001"),
                ("delete.retention.ms", "100"),
            ],
        )
        .await
        .expect("create the deployments topic");
    let a = f.start("a");
    f.produce(0..300).await;
    wait_judged(&[&a], f.ids.len());

    // A history: a deploy, a canary promoted by the fleet's decision, another deploy, a rollback.
    let v2 = f.version(&f.v1, "compacted-v2");
    f.fleet(&["deploy", v2.to_str().expect("utf-8")]);
    poll_all(&[&a], "host a on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    let v3 = f.version(&f.v1, "compacted-v3");
    f.fleet(&[
        "canary",
        v3.to_str().expect("utf-8"),
        "--percent",
        "50",
        "--promote-after-batches",
        "2",
    ]);
    let mut next = 300;
    let until = Instant::now() + PATIENCE;
    while a.status()[0]["active_version"] != hash(&v3).as_str() {
        assert!(Instant::now() < until, "the canary of v3 was not promoted");
        f.produce(next..next + 300).await;
        next += 300;
        wait_judged(&[&a], f.ids.len());
    }
    let v4 = f.version(&f.v1, "compacted-v4");
    f.fleet(&["deploy", v4.to_str().expect("utf-8")]);
    f.fleet(&["rollback"]);
    poll_all(&[&a], "host a back on v3", |p| {
        p["active_version"] == hash(&v3).as_str()
    });

    // The first action written again at the end, as anyone with write access could: compaction
    // then keeps only this later copy, behind every action after it. Written again until the
    // broker's cleaner has dropped the original (a copy in a segment that rolled is what lets
    // the cleaner see the duplicate; the topic cannot notify, so it is read again).
    let records = topic_records(&f.client, &deployments, 1).await;
    let (_, first) = records
        .iter()
        .find(|(_, r)| r.key.as_deref() == Some(action_key("ledger", 1).as_bytes()))
        .expect("action 1 in the topic");
    assert_eq!(first.offset, 0, "action 1 is the topic's first record");
    let value = first.value.clone().expect("action 1's value");
    let until = Instant::now() + PATIENCE;
    loop {
        f.write_deployment(&action_key("ledger", 1), &value).await;
        let records = topic_records(&f.client, &deployments, 1).await;
        if records.first().is_some_and(|(_, r)| r.offset > 0) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the broker never compacted {deployments}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // A host that reads the compacted topic from its start reaches what host a reached.
    let b = f.start("b");
    let fleet_of = |h: &HostProcess| {
        let (code, body) = h.http("GET", "/fleet", "");
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON fleet");
        v["pipelines"]["ledger"].clone()
    };
    poll_all(&[&b], "host b on v3", |p| {
        p["active_version"] == hash(&v3).as_str()
    });
    let (seen_by_a, seen_by_b) = (fleet_of(&a), fleet_of(&b));
    assert_eq!(seen_by_a, seen_by_b, "the fleet's state on a and on b");
    assert_eq!(seen_by_b["active"]["digest"], hash(&v3).as_str());
    assert_eq!(seen_by_b["last_canary"]["promoted"], true, "{seen_by_b:#}");
    report(&format!(
        "fleet: a host reading the compacted deployments topic (its first action compacted behind the others) reached the same state: action {}, active {}",
        seen_by_b["seq"],
        sharehost::pipeline::short(&hash(&v3))
    ));
    f.produce(next..next + 300).await;
    wait_judged(&[&a, &b], f.ids.len());
    let mut seen = Vec::new();
    for h in [a, b] {
        seen.push(blocking(move || h.stop().1).await);
    }
    f.ledger(&seen).await;
}

/// A JSON object whose only field is 100 euro signs (307 bytes): serde's error text quotes the
/// field, so its 200th byte falls inside a character. Cut there with `String::truncate`, it
/// panicked every host's fleet agent, and a host starting while it was in a topic exited.
fn euro_record() -> Vec<u8> {
    format!("{{\"{}\": 1}}", "€".repeat(100)).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_cut_inside_a_character_stops_no_agent_and_no_host_starting_while_it_is_there() {
    let f = Fleet::new("euro").await;
    let a = f.start("a");
    poll_fleet(&a, "host a in its own view", |v| {
        v["hosts"].as_array().is_some_and(|h| h.len() == 1)
    });
    let bad = euro_record();
    f.write_deployment(&action_key("ledger", 1), &bad).await;
    f.write_raw("status", "ghost", &bad).await;

    // Host a's agent reads on: a deploy after the bad records reaches it, and both are counted.
    let v2 = f.version(&f.v1, "euro-v2");
    f.fleet(&["deploy", v2.to_str().expect("utf-8")]);
    poll_all(&[&a], "host a on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    wait_skipped(&a, "deployments", "malformed");
    wait_skipped(&a, "status", "malformed");

    // A host started while the records are in the topics starts, converges and stays up.
    let b = f.start("b");
    poll_all(&[&b], "host b on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    wait_skipped(&b, "deployments", "malformed");
    wait_skipped(&b, "status", "malformed");
    let view = poll_fleet(&b, "hosts a and b in b's view", |v| {
        v["hosts"].as_array().is_some_and(|h| h.len() == 2)
    });
    assert_eq!(view["pipelines"]["ledger"]["seq"], 1, "{view:#}");
    for h in [a, b] {
        let (_, metrics) = h.http("GET", "/metrics", "");
        assert!(
            metrics
                .lines()
                .any(|l| l == "sharehost_fleet_agent_restarts_total 0"),
            "the agent never panicked: {metrics}"
        );
        h.wait_for_log("fleet record skipped");
        blocking(move || h.stop()).await;
    }
}

/// A status record of host `host` as instance `instance`, written at `at_ms`.
fn forged_status(host: &str, instance: &str, at_ms: u64) -> Vec<u8> {
    serde_json::to_vec(&sharehost::fleet::records::HostStatus {
        host: host.into(),
        instance: instance.into(),
        at_ms,
        version: "0.0.0".into(),
        pipelines: Vec::new(),
    })
    .expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_statuses_are_bounded_aged_and_flagged_and_a_forged_chunk_is_never_kept() {
    let f = Fleet::new("forged").await;
    let a = f.start_fleet_extra("a", "max_hosts = 4\n");
    poll_fleet(&a, "host a in its own view", |v| {
        v["hosts"].as_array().is_some_and(|h| h.len() == 1)
    });

    // Statuses anyone who can write the topic could write: three old hosts, one from the
    // year 2100, and a host whose id two writers take turns on.
    let now = sharehost::kafka::now_ms();
    for (i, h) in ["old-1", "old-2", "old-3"].iter().enumerate() {
        f.write_raw("status", h, &forged_status(h, h, now - 60_000 + i as u64))
            .await;
    }
    f.write_raw(
        "status",
        "future",
        &forged_status("future", "f", 4_102_444_800_000),
    )
    .await;
    for (i, instance) in ["one", "two", "one"].iter().enumerate() {
        f.write_raw(
            "status",
            "twice",
            &forged_status("twice", instance, now + i as u64),
        )
        .await;
    }
    let view = poll_fleet(&a, "two writers of one host id flagged", |v| {
        v["hosts"].as_array().is_some_and(|h| {
            h.iter()
                .any(|h| h["host"] == "twice" && h["conflict"].is_object())
        })
    });
    let hosts: Vec<&str> = view["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .filter_map(|h| h["host"].as_str())
        .collect();
    assert_eq!(hosts.len(), 4, "at most fleet.max_hosts kept: {view:#}");
    assert!(
        hosts.contains(&"a") && hosts.contains(&"future") && !hosts.contains(&"old-1"),
        "the oldest dropped, the host's own kept: {view:#}"
    );
    let future = view["hosts"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["host"] == "future"))
        .expect("future");
    let read_by = sharehost::kafka::now_ms();
    assert!(
        future["at_ms"].as_u64().is_some_and(|t| t <= read_by),
        "a status from the future taken as written when read: {future:#}"
    );
    for reason in ["host_limit", "future_at_ms", "clashing_writers"] {
        wait_skipped(&a, "status", reason);
    }

    // A chunk forged under a real version's digest, garbage beside it, and a signed deploy
    // that names the forged chunk's offset (as compaction would leave it named): the host
    // refuses the version with the reason and keeps v1; nothing of it is kept on disk.
    let v2 = f.version(&f.v1, "forged-v2");
    let real = std::fs::read(&v2).expect("v2");
    let digest = hash(&v2);
    let mut forged = real.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0xff;
    f.write_raw("components", "junk", b"not a chunk").await;
    let offset = f
        .write_raw(
            "components",
            &sharehost::fleet::records::chunk_key(&digest, 0),
            &forged,
        )
        .await;
    let component = sharehost::fleet::records::ComponentRef {
        digest: digest.clone(),
        size: real.len() as u64,
        name: "forged-v2.wasm".into(),
        signature: std::fs::read_to_string(sharehost::runtime::signature_path(&v2))
            .expect("v2's signature"),
        chunks: vec![offset],
    };
    let deploy = Action {
        fleet: f.name.clone(),
        pipeline: "ledger".into(),
        seq: 1,
        issued_at_ms: now,
        change: Change::Deploy {
            component: component.clone(),
        },
        then: Desired {
            seq: 1,
            active: Some(component),
            ..Desired::default()
        },
    };
    let signed = sign::sign(&deploy, &f.operator.sk).expect("sign");
    f.write_deployment(
        &action_key("ledger", 1),
        &serde_json::to_vec(&signed).expect("json"),
    )
    .await;
    let view = poll_fleet(&a, "the forged version refused on host a", |v| {
        v["hosts"].as_array().is_some_and(|h| {
            h.iter().any(|h| {
                h["host"] == "a"
                    && h["pipelines"][0]["refused"]
                        .as_str()
                        .is_some_and(|r| r.contains("forged or damaged"))
            })
        })
    });
    assert_eq!(
        a.status()[0]["active_version"],
        hash(&f.v1).as_str(),
        "{view:#}"
    );
    wait_skipped(&a, "components", "unknown_key");
    wait_skipped(&a, "components", "bad_chunk");
    let kept = f
        .state("a")
        .join("fleet")
        .join(&f.name)
        .join(format!("{digest}.wasm"));
    assert!(!kept.exists(), "{} kept", kept.display());
    blocking(move || a.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_by_minisign_w_deploys_through_sharehost_fleet() {
    let mut f = Fleet::new("minisign").await;
    // A key as Debian's minisign 0.11 writes it with -W: unencrypted, no checksum.
    let (sk, public) = minisign_keys(&f.dir, None);
    f.also_trusted.push(public);
    let a = f.start("a");
    poll_all(&[&a], "host a running", |p| p["state"] == "running");
    let v2 = f.dir.join("minisign-v2.wasm");
    std::fs::write(&v2, new_version(&f.v1, "minisign-v2")).expect("write v2");
    minisign_sign(&sk, &v2, None);
    let out = std::process::Command::new(sharehost_bin!())
        .arg("fleet")
        .arg("deploy")
        .arg(f.manifest("operator"))
        .args(["--pipeline", "ledger", "--key"])
        .arg(&sk)
        .arg(&v2)
        .env("SHAREHOST_SIGNING_KEY_PASSWORD", "")
        .output()
        .expect("run sharehost fleet");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    poll_all(&[&a], "host a on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    blocking(move || a.stop()).await;
}
