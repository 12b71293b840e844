//! The three-node cluster of `dev/kafka up --brokers 3`: where it is, and the harness commands
//! that stop, restart and move leadership on it.
//!
//! A test that needs the cluster and cannot reach it FAILS with instructions; it never skips.
//! Before any node is stopped, the harness state dir is checked to really hold the cluster at
//! the test's bootstrap, so a test can never stop a broker other tests are using.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sharehost::kafka::{ConnectionConfig, KafkaClient};

use crate::host::PATIENCE;
use crate::{is_reachable, repo_root};

/// The cluster's default client addresses: `dev/kafka up --brokers 3` with the default base
/// port puts node N on 9092 + 10·(N-1).
pub const DEFAULT_CLUSTER_BOOTSTRAP: &str = "127.0.0.1:9092,127.0.0.1:9102,127.0.0.1:9112";

const HOW: &str = "start it with `dev/kafka up --brokers 3` (beside another broker: \
     `KAFKA_PORT=29092 KAFKA_CONTROLLER_PORT=29093 KAFKA_SASL_SSL_PORT=29094 \
     SHAREHOST_KAFKA_DIR=target/kafka-cluster dev/kafka up --brokers 3`, then run the test with \
     `SHAREHOST_CLUSTER_BOOTSTRAP=127.0.0.1:29092 SHAREHOST_CLUSTER_DIR=target/kafka-cluster`)";

/// The state dir of the cluster's harness (`SHAREHOST_CLUSTER_DIR`, else what `dev/kafka`
/// itself would use: `SHAREHOST_KAFKA_DIR` or `target/kafka`). A relative path is taken from
/// the repository root (tests run in their package directory).
pub fn cluster_dir() -> PathBuf {
    std::env::var("SHAREHOST_CLUSTER_DIR")
        .or_else(|_| std::env::var("SHAREHOST_KAFKA_DIR"))
        .map(|d| repo_root().join(d))
        .unwrap_or_else(|_| repo_root().join("target/kafka"))
}

/// The cluster's bootstrap addresses (`SHAREHOST_CLUSTER_BOOTSTRAP`, default
/// [`DEFAULT_CLUSTER_BOOTSTRAP`]). Fails the test with instructions when the cluster is not
/// reachable, not fully up, or not the one the harness state dir describes.
pub fn cluster_bootstrap() -> String {
    let addr = std::env::var("SHAREHOST_CLUSTER_BOOTSTRAP")
        .unwrap_or_else(|_| DEFAULT_CLUSTER_BOOTSTRAP.to_owned());
    assert!(
        is_reachable(&addr),
        "this test needs the three-node Kafka cluster at {addr}, which is not reachable: {HOW}"
    );
    let (ok, status) = try_cluster_harness(&["status"]);
    let listed = status
        .lines()
        .find_map(|l| l.strip_prefix("bootstrap: "))
        .unwrap_or_default()
        .to_owned();
    let nodes = status.lines().filter(|l| l.starts_with("node ")).count();
    assert!(
        ok && nodes >= 3,
        "this test needs every node of a three-node cluster running, but `dev/kafka status` for {} says:\n{status}\n{HOW}",
        cluster_dir().display()
    );
    let ours = addr
        .split(',')
        .all(|a| listed.split(',').any(|l| l.trim() == a.trim()));
    assert!(
        ours,
        "SHAREHOST_CLUSTER_BOOTSTRAP is {addr}, but the harness in {} runs the cluster at {listed}: \
         the test would stop the wrong brokers. Point SHAREHOST_CLUSTER_DIR at the cluster's state dir.",
        cluster_dir().display()
    );
    addr
}

/// A connected plain-text client for the cluster.
pub async fn cluster_client() -> KafkaClient {
    let addr = cluster_bootstrap();
    match KafkaClient::connect(&addr, ConnectionConfig::new("sharehost-cluster-tests")).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test cluster at {addr}: {e}"),
    }
}

/// Runs `dev/kafka ARGS` on the cluster's state dir; returns whether it succeeded and what it
/// printed (the caller decides whether a failure fails the test).
pub fn try_cluster_harness(args: &[&str]) -> (bool, String) {
    let out = Command::new(repo_root().join("dev/kafka"))
        .args(args)
        .env("SHAREHOST_KAFKA_DIR", cluster_dir())
        .output()
        .expect("run dev/kafka");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Runs a `dev/kafka` command on the cluster (`stop-broker 2`, `move-leader T 0 3`, ...),
/// failing the test if it fails; returns what it printed.
pub fn cluster_harness(args: &[&str]) -> String {
    let (ok, text) = try_cluster_harness(args);
    assert!(ok, "dev/kafka {} failed:\n{text}", args.join(" "));
    text
}

/// Partitions (of every topic, internal ones included) whose ISR lacks a replica, as Apache's
/// TopicCommand lists them.
pub fn under_replicated(bootstrap: &str) -> Vec<String> {
    let (ok, text) = try_cluster_harness(&[
        "tool",
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--under-replicated-partitions",
    ]);
    if !ok {
        return vec![format!("TopicCommand failed: {text}")];
    }
    text.lines()
        .filter(|l| l.contains("Partition:"))
        .map(str::to_owned)
        .collect()
}

/// Polls (TopicCommand has no way to notify) until no partition is under-replicated.
pub fn wait_fully_replicated(bootstrap: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let urp = under_replicated(bootstrap);
        if urp.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "partitions still under-replicated after a broker restart: {urp:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A node a test took down (`dev/kafka kill-broker` or `stop-broker`): started again when
/// dropped, so a failing test leaves the shared cluster whole.
pub struct NodeDown(Option<i32>);

impl NodeDown {
    /// Takes node `n` down with `dev/kafka COMMAND n` (`kill-broker`: SIGKILL, `stop-broker`:
    /// SIGTERM and a wait for its exit).
    pub async fn take(command: &'static str, n: i32) -> NodeDown {
        let down = NodeDown(Some(n));
        tokio::task::spawn_blocking(move || cluster_harness(&[command, &n.to_string()]))
            .await
            .expect("take the node down");
        down
    }

    /// Starts the node again and waits until no partition is under-replicated.
    pub async fn restart(mut self, bootstrap: &str) {
        let n = self.0.take().expect("a node that is down");
        let bootstrap = bootstrap.to_owned();
        tokio::task::spawn_blocking(move || {
            cluster_harness(&["start-broker", &n.to_string()]);
            wait_fully_replicated(&bootstrap);
        })
        .await
        .expect("restart the node");
    }
}

impl Drop for NodeDown {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            let _ = try_cluster_harness(&["start-broker", &n.to_string()]);
        }
    }
}
