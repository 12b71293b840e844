//! A fleet on the three-node cluster of `dev/kafka up --brokers 3`: with the node that leads
//! the fleet's deployments topic SIGKILLed, `sharehost fleet deploy` still records its action
//! and every host applies it, and a fleet canary is promoted by the fleet's sum (its decision
//! written to that topic under its new leader); the node comes back and nothing was lost.
//!
//! Witnesses outside the engine: the ledger plugin's log lines on every host, each host's
//! `GET /pipelines` for the version it runs, `GET /fleet` for the canary's outcome, and the
//! broker's view of the group (ShareGroupCommand lag 0).
//!
//! Its own test binary because it stops a node of the shared cluster (tests/cluster.rs and
//! tests/chaos.rs do the same, one binary at a time). The test FAILS when the cluster is not
//! reachable; it never skips.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sharehost_tests::cluster::{
    cluster_bootstrap, cluster_client, cluster_harness, try_cluster_harness, wait_fully_replicated,
};
use sharehost_tests::fleet::{
    fleet_command, fleet_tables, hash, poll_all, poll_fleet, wait_judged,
};
use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::signing::Signer;
use sharehost_tests::{
    FAULT_SETTINGS, blocking, fresh_group, guest, ledger_manifest, new_version, produce_ids,
    sharehost_bin, unique, wait_until_drained_at,
};

const PARTITIONS: i32 = 3;
const FLEET: &str = "cluster";

/// Restarts a node when dropped, so a failing test leaves the shared cluster whole.
struct Restart(Option<i32>);

impl Drop for Restart {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            let _ = try_cluster_harness(&["start-broker", &n.to_string()]);
        }
    }
}

/// A signed copy of `component` with a new hash.
fn version(operator: &Signer, dir: &Path, component: &Path, tag: &str) -> PathBuf {
    let path = dir.join(format!("{tag}.wasm"));
    std::fs::write(&path, new_version(component, tag)).expect("write version");
    operator.sign(&path);
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_and_a_canary_reach_every_host_while_the_deployments_leader_is_down() {
    let bootstrap = cluster_bootstrap();
    let client = Arc::new(cluster_client().await);
    let topic = unique("fleet-cluster");
    client
        .create_topic(&topic, PARTITIONS, 3, &[])
        .await
        .expect("create topic");
    let group = fresh_group(&client, None).await;
    let dir = std::env::temp_dir().join(unique("sharehost-fleet-cluster"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let operator = Signer::new();
    let key = dir.join("operator.key");
    operator.write_key(&key);
    let v1 = dir.join("v1.wasm");
    std::fs::copy(guest("fixture_ledger"), &v1).expect("copy v1");
    operator.sign(&v1);
    let prefix = format!("{}.", unique("fleet"));
    let manifest = |id: &str| {
        let path = dir.join(format!("{id}.toml"));
        let text = format!(
            "{}{}",
            fleet_tables(&operator.public(), FLEET, id, &prefix),
            ledger_manifest(&bootstrap, &topic, &group, &v1, "", FAULT_SETTINGS)
        );
        std::fs::write(&path, text).expect("write manifest");
        path
    };
    let fleet = |args: &[&str]| {
        let (ok, out) = fleet_command(
            sharehost_bin!(),
            &manifest("operator"),
            "ledger",
            &key,
            args,
        );
        assert!(ok, "sharehost fleet {args:?}: {out}");
    };
    let hosts: Vec<HostProcess> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            let state = dir.join(format!("state-{id}"));
            HostProcess::start_with_env(
                sharehost_bin!(),
                &manifest(id),
                id,
                &[("SHAREHOST_STATE_DIR", state.to_str().expect("utf-8 path"))],
            )
        })
        .collect();
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    let mut ids = produce_ids(&client, &topic, PARTITIONS, 0..300).await;
    wait_judged(&refs, ids.len());

    // SIGKILL the node that leads the deployments topic (the hosts made it, replicated 3).
    let deployments = format!("{prefix}{FLEET}.deployments");
    client
        .refresh_metadata(std::slice::from_ref(&deployments))
        .await
        .expect("metadata of the deployments topic");
    let leader = client
        .leader(&deployments, 0)
        .expect("the deployments topic has a leader");
    let mut restart = Restart(Some(leader));
    blocking(move || cluster_harness(&["kill-broker", &leader.to_string()])).await;

    // A deploy: recorded under the topic's new leader and applied by every host.
    let v2 = version(&operator, &dir, &v1, "v2");
    let started = Instant::now();
    fleet(&["deploy", v2.to_str().expect("utf-8 path")]);
    poll_all(&refs, "every host on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    let deployed = started.elapsed();
    ids.extend(produce_ids(&client, &topic, PARTITIONS, 300..900).await);
    wait_judged(&refs, ids.len());

    // A canary, promoted on the fleet's sum: the decision is written with the node still down.
    let v3 = version(&operator, &dir, &v1, "v3");
    fleet(&[
        "canary",
        v3.to_str().expect("utf-8 path"),
        "--percent",
        "50",
        "--promote-after-batches",
        "6",
    ]);
    // Records arrive until the fleet has judged its 6 batches with the candidate (how many
    // records that takes depends on how the broker batches them) and every host promoted it.
    let v3_hash = hash(&v3);
    let promoted = |h: &HostProcess| h.status()[0]["active_version"] == v3_hash.as_str();
    let until = Instant::now() + PATIENCE;
    let mut next = 900;
    while !refs.iter().all(|h| promoted(h)) {
        assert!(
            Instant::now() < until,
            "the canary was not promoted on every host after {} records",
            next - 900
        );
        ids.extend(produce_ids(&client, &topic, PARTITIONS, next..next + 300).await);
        next += 300;
        wait_judged(&refs, ids.len());
    }
    poll_all(&refs, "the canary promoted on every host", |p| {
        p["active_version"] == v3_hash.as_str()
    });
    let view = poll_fleet(&hosts[0], "the promotion recorded", |v| {
        v["pipelines"]["ledger"]["last_canary"]["promoted"] == true
    });
    assert_eq!(
        view["pipelines"]["ledger"]["active"]["digest"],
        hash(&v3).as_str(),
        "{view:#}"
    );
    wait_judged(&refs, ids.len());

    // The node back, in every ISR; the last records judged with v3.
    let n = restart.0.take().expect("killed node");
    let b = bootstrap.clone();
    blocking(move || {
        cluster_harness(&["start-broker", &n.to_string()]);
        wait_fully_replicated(&b);
    })
    .await;
    ids.extend(produce_ids(&client, &topic, PARTITIONS, next..next + 300).await);
    wait_judged(&refs, ids.len());
    let (b, g) = (bootstrap.clone(), group.clone());
    blocking(move || wait_until_drained_at(&b, &g)).await;
    let mut seen = Vec::new();
    for h in hosts {
        seen.push(blocking(move || h.stop().1).await);
    }
    let mut ledger = Ledger::new(
        "fleet on three nodes, the deployments leader killed",
        ids.iter().cloned(),
    );
    for s in &seen {
        s.record(&mut ledger);
    }
    report(&format!(
        "fleet of 3 hosts on 3 nodes, node {leader} (the deployments topic's leader) killed: from `fleet deploy` to the last host on the new version {:.2} s; canary promoted on the fleet's sum",
        deployed.as_secs_f64()
    ));
    ledger.check();
}
