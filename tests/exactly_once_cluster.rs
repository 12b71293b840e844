//! `guarantee = "exactly-once"` on the three-node cluster of `dev/kafka up --brokers 3`: the
//! source partitions led by the node that coordinates the pipeline's transactions move to
//! another node (leader moves), then that node is killed (SIGKILL) or stopped (SIGTERM, a
//! controlled shutdown: the single-node broker lost a confirmed commit's markers on one) while
//! the pipeline commits, and every output and dead letter is still written exactly once. Its own
//! test binary because it stops the cluster's nodes: it runs in the cluster's test group, one at
//! a time with the other cluster tests.
//!
//! The ledger is kept outside the host, as in `tests/exactly_once.rs`: the ids produced, against
//! the output and dead-letter topics read `read_committed`, once the broker has nothing left for
//! the group.

use std::sync::Arc;

use sharehost_tests::cluster::{NodeDown, cluster_bootstrap, cluster_client, cluster_harness};
use sharehost_tests::host::{HostProcess, Seen};
use sharehost_tests::ledger::{Written, check_exactly_once, report};
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    blocking, fresh_group_with, guest, ledger_manifest, produce_ids, unique, wait_until_drained_at,
};

const PARTITIONS: i32 = 3;
const RECORDS: u64 = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transaction_coordinator_killed_mid_commit_and_a_leader_move_write_each_output_once() {
    coordinator_down("coordinator-killed", "kill-broker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transaction_coordinator_stopped_mid_commit_and_a_leader_move_write_each_output_once() {
    coordinator_down("coordinator-stopped", "stop-broker").await;
}

/// The scenario: the coordinator's node taken down with `dev/kafka COMMAND` mid-commit.
async fn coordinator_down(name: &str, command: &'static str) {
    let bootstrap = cluster_bootstrap();
    let client = Arc::new(cluster_client().await);
    let topic = unique("eo-cluster");
    let (output, dlq) = (format!("{topic}-out"), format!("{topic}-dlq"));
    for (t, p) in [(&topic, PARTITIONS), (&output, PARTITIONS), (&dlq, 1)] {
        client
            .create_topic(t, p, 3, &[])
            .await
            .unwrap_or_else(|e| panic!("create {t} with replication 3: {e}"));
    }
    // A member session of 10 s: a host whose connections died with the node is back in the
    // group soon after the node is.
    let group = fresh_group_with(&client, None, &[("share.session.timeout.ms", "10000")]).await;
    let ids = produce_ids(&client, &topic, PARTITIONS, 0..RECORDS).await;
    let dir = std::env::temp_dir().join(unique("sharehost-eo-cluster"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifest = dir.join("sharehost.toml");
    std::fs::write(
        &manifest,
        ledger_manifest(
            &bootstrap,
            &topic,
            &group,
            &guest("fixture_ledger"),
            r#"reject-every = "7", emit-to = "out", pause-ms = "20""#,
            &format!(
                "batch_size = 50\nmax_in_flight = 500\nconcurrency = 2\nguarantee = \"exactly-once\"\ndead_letter_topic = \"{dlq}\"\noutputs = {{ out = \"{output}\" }}\n"
            ),
        ),
    )
    .expect("write manifest");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);

    // The node coordinating the pipeline's transactional id (`sharehost.<group>.<member>`).
    let h = host.clone();
    let member = blocking(move || h.member_id()).await;
    let transactional_id = format!("sharehost.{group}.{member}");
    let n = ids.len();
    let h = host.clone();
    blocking(move || h.wait_for("a quarter judged", |seen| seen.judged() >= n / 4)).await;
    let coordinator = client
        .find_transaction_coordinator(&transactional_id)
        .await
        .expect("find the transaction coordinator");
    // First the source partitions the coordinator's node leads move to another node, mid-stream
    // (a leader move); then that node, which now leads no source partition, is killed while
    // batches are being written and committed (their calls take 20 ms each, so a transaction
    // is always under way): what fails is the transactions, not the share sessions.
    client
        .refresh_metadata(std::slice::from_ref(&topic))
        .await
        .expect("metadata");
    let mut moved = Vec::new();
    for p in 0..PARTITIONS {
        let from = client
            .leader(&topic, p)
            .unwrap_or_else(|| panic!("partition {p} of {topic} has no leader"));
        if from == coordinator {
            let to = from % 3 + 1;
            let t = topic.clone();
            blocking(move || {
                cluster_harness(&["move-leader", &t, &p.to_string(), &to.to_string()])
            })
            .await;
            moved.push(format!("partition {p} from node {from} to {to}"));
        }
    }
    let h = host.clone();
    blocking(move || h.wait_for("a third judged", |seen| seen.judged() >= n / 3)).await;
    let down = NodeDown::take(command, coordinator).await;
    let h = host.clone();
    blocking(move || {
        h.wait_for(
            "two thirds judged with the coordinator's node down",
            |seen| seen.judged() >= 2 * n / 3,
        )
    })
    .await;
    down.restart(&bootstrap).await;
    let h = host.clone();
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let (b, g) = (bootstrap.clone(), group.clone());
    blocking(move || wait_until_drained_at(&b, &g)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen, lines) = blocking(move || host.stop_with_log()).await;
    let failed = lines
        .iter()
        .filter(|l| l.contains("transaction failed") || l.contains("did not commit"))
        .count();
    let recommitted = lines
        .iter()
        .filter(|l| l.contains("its partitions are committed again"))
        .count();
    report(&format!(
        "exactly-once {name}: moved {moved:?}, then node {coordinator} (the transaction coordinator) taken down ({command}); transactions failed or not committed: {failed}, commits written again for a missing marker: {recommitted}"
    ));
    let written = Written {
        source: (&topic, PARTITIONS),
        output: (&output, PARTITIONS),
        dead_letters: (&dlq, 1),
    };
    check_exactly_once(name, &client, &ids, written, Seen::judged(&seen)).await;
}
