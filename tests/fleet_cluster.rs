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

use std::sync::Arc;
use std::time::Instant;

use sharehost_tests::cluster::{NodeDown, cluster_bootstrap, cluster_client};
use sharehost_tests::fleet::{FleetKit, hash, poll_all, poll_fleet, wait_judged};
use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::{
    FAULT_SETTINGS, blocking, fresh_group, ledger_manifest, produce_ids, sharehost_bin, unique,
    wait_until_drained_at,
};

const PARTITIONS: i32 = 3;
const FLEET: &str = "cluster";

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
    let kit = FleetKit::new(FLEET);
    let manifest = |id: &str| {
        kit.manifest(
            id,
            "",
            &ledger_manifest(&bootstrap, &topic, &group, &kit.v1, "", FAULT_SETTINGS),
        )
    };
    let fleet = |args: &[&str]| kit.fleet(sharehost_bin!(), &manifest("operator"), args);
    let hosts: Vec<HostProcess> = ["a", "b", "c"]
        .iter()
        .map(|id| kit.start(sharehost_bin!(), &manifest(id), id))
        .collect();
    let refs: Vec<&HostProcess> = hosts.iter().collect();
    let mut ids = produce_ids(&client, &topic, PARTITIONS, 0..300).await;
    wait_judged(&refs, ids.len());

    // SIGKILL the node that leads the deployments topic (the hosts made it, replicated 3).
    let deployments = format!("{}{FLEET}.deployments", kit.prefix);
    client
        .refresh_metadata(std::slice::from_ref(&deployments))
        .await
        .expect("metadata of the deployments topic");
    let leader = client
        .leader(&deployments, 0)
        .expect("the deployments topic has a leader");
    let down = NodeDown::take("kill-broker", leader).await;

    // A deploy: recorded under the topic's new leader and applied by every host.
    let v2 = kit.version(&kit.v1, "v2");
    let started = Instant::now();
    fleet(&["deploy", v2.to_str().expect("utf-8 path")]);
    poll_all(&refs, "every host on v2", |p| {
        p["active_version"] == hash(&v2).as_str()
    });
    let deployed = started.elapsed();
    ids.extend(produce_ids(&client, &topic, PARTITIONS, 300..900).await);
    wait_judged(&refs, ids.len());

    // A canary, promoted on the fleet's sum: the decision is written with the node still down.
    let v3 = kit.version(&kit.v1, "v3");
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
    down.restart(&bootstrap).await;
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
