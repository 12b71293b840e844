//! The broker `dev/kafka up` started: where it is (plain and SASL_SSL), clients, the harness
//! commands, share groups and their lag. A test that cannot reach it FAILS with the command
//! that starts it; it never skips.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sharehost::kafka::{
    ConnectionConfig, KafkaClient, Mechanism, SaslSettings, Secret, TlsSettings,
};

use crate::{host, repo_root, unique};

/// The plain-text bootstrap address (`SHAREHOST_BOOTSTRAP`, default the harness's 127.0.0.1:9092).
pub fn bootstrap() -> String {
    let addr = std::env::var("SHAREHOST_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    require_reachable(&addr);
    addr
}

/// Whether anything listens at one of the comma-separated addresses.
pub fn is_reachable(addr: &str) -> bool {
    addr.split(',')
        .filter_map(|a| std::net::ToSocketAddrs::to_socket_addrs(a.trim()).ok())
        .flatten()
        .any(|sa| TcpStream::connect_timeout(&sa, Duration::from_secs(2)).is_ok())
}

/// Panics with instructions when nothing listens at `addr`.
pub fn require_reachable(addr: &str) {
    assert!(
        is_reachable(addr),
        "this test needs the Kafka broker at {addr}, which is not reachable: start it with `dev/kafka up --sasl-ssl` \
         (the test command `dev/test` does this itself)"
    );
}

/// A connected plain-text client.
pub async fn client() -> KafkaClient {
    match KafkaClient::connect(&bootstrap(), ConnectionConfig::new("sharehost-tests")).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to the test broker: {e}"),
    }
}

/// Where the SASL_SSL listener of `dev/kafka up --sasl-ssl` is, and its CA and credentials.
#[derive(Debug, Clone)]
pub struct SaslSsl {
    /// Bootstrap address of the SASL_SSL listener.
    pub bootstrap: String,
    /// The CA certificate the harness generated.
    pub ca_file: PathBuf,
    /// User known to every mechanism.
    pub username: String,
    /// Its password.
    pub password: String,
}

impl SaslSsl {
    /// Reads the harness's `sasl-ssl.env`; fails the test when the listener is not running.
    pub fn from_harness() -> SaslSsl {
        let get = harness_env(
            "sasl-ssl.env",
            "the SASL_SSL listener",
            "dev/kafka up --sasl-ssl",
        );
        let s = SaslSsl {
            bootstrap: get("KAFKA_SASL_SSL_BOOTSTRAP"),
            ca_file: PathBuf::from(get("KAFKA_CA_FILE")),
            username: get("KAFKA_SASL_USER"),
            password: get("KAFKA_SASL_PASSWORD"),
        };
        require_reachable(&s.bootstrap);
        s
    }

    /// A connection config for `mechanism` with the harness's CA and credentials.
    pub fn config(&self, mechanism: Mechanism, password: &str) -> ConnectionConfig {
        ConnectionConfig::new("sharehost-tests")
            .with_tls(&TlsSettings {
                ca_file: Some(self.ca_file.clone()),
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("harness CA unusable: {e}"))
            .with_sasl(SaslSettings {
                mechanism,
                username: self.username.clone(),
                password: Secret::new(password),
            })
    }
}

/// A `KEY=value` file the harness writes into its state dir (`SHAREHOST_KAFKA_DIR`, default
/// `target/kafka`), as a lookup that fails the test naming the file and the missing key; a
/// missing file fails it saying what needs `needs` and which command provides it.
fn harness_env(name: &str, needs: &str, command: &str) -> impl Fn(&str) -> String {
    let dir = std::env::var("SHAREHOST_KAFKA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target/kafka"));
    let file = dir.join(name);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "this test needs {needs}: {} is unreadable ({e}); start the broker with `{command}`",
            file.display()
        )
    });
    move |k: &str| {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(key, _)| key.trim() == k)
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("{} lacks {k}", file.display()))
    }
}

/// Where the harness broker's `PROXIED` listener really listens, and the address it advertises
/// instead (where a test's [`proxy::Proxy`] must listen), from `proxied.env` in the harness
/// state dir. Fails the test when the broker was started without it.
pub fn proxied_listener() -> (String, String) {
    let get = harness_env(
        "proxied.env",
        "the broker's PROXIED listener",
        "dev/kafka up",
    );
    let target = get("KAFKA_PROXIED_TARGET");
    require_reachable(&target);
    (get("KAFKA_PROXIED_BOOTSTRAP"), target)
}

/// Runs a `dev/kafka` command (stop-broker, start-broker, ...) and fails the test if it fails.
pub fn harness(cmd: &str) {
    let status = Command::new(repo_root().join("dev/kafka"))
        .arg(cmd)
        .status()
        .expect("run dev/kafka");
    assert!(status.success(), "dev/kafka {cmd} failed");
}

/// A fresh share group that starts at the earliest offset and heartbeats every second (the
/// harness lowers the broker minimum so tests do not wait 5 s for an assignment), with the
/// record lock duration set when given (the harness allows 1 s and up).
pub async fn fresh_group(client: &KafkaClient, lock_ms: Option<u32>) -> String {
    fresh_group_with(client, lock_ms, &[]).await
}

/// [`fresh_group`] with more group configs, e.g. a short `share.session.timeout.ms` so a
/// killed member's partitions move on quickly.
pub async fn fresh_group_with(
    client: &KafkaClient,
    lock_ms: Option<u32>,
    extra: &[(&str, &str)],
) -> String {
    let group = unique("group");
    let lock = lock_ms.map(|l| l.to_string());
    let mut configs = vec![
        ("share.auto.offset.reset", "earliest"),
        ("share.heartbeat.interval.ms", "1000"),
    ];
    if let Some(l) = &lock {
        configs.push(("share.record.lock.duration.ms", l.as_str()));
    }
    configs.extend_from_slice(extra);
    client
        .alter_group_configs(&group, &configs)
        .await
        .unwrap_or_else(|e| panic!("group config: {e}"));
    group
}

/// The group's lag per partition, from Apache's own ShareGroupCommand (records not yet
/// acknowledged, accepted or archived).
pub fn group_lag(group: &str) -> Vec<i64> {
    group_lag_at(&bootstrap(), group)
}

/// [`group_lag`] on the cluster at `bootstrap` (the three-node one, say).
pub fn group_lag_at(bootstrap: &str, group: &str) -> Vec<i64> {
    let out = Command::new(repo_root().join("dev/kafka"))
        .args([
            "tool",
            "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
            "--bootstrap-server",
            bootstrap,
        ])
        .args(["--describe", "--group", group])
        .output()
        .expect("run ShareGroupCommand");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ShareGroupCommand failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.starts_with(group))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect()
}

/// Waits until the broker reports nothing left for `group` (lag 0 on every partition: each
/// record accepted, rejected or archived), polling Apache's ShareGroupCommand, which has no
/// way to be notified.
pub fn wait_until_drained(group: &str) {
    wait_until_drained_at(&bootstrap(), group);
}

/// [`wait_until_drained`] on the brokers at `bootstrap` (the three-node cluster's, say).
pub fn wait_until_drained_at(bootstrap: &str, group: &str) {
    let deadline = std::time::Instant::now() + host::PATIENCE;
    loop {
        let lag = group_lag_at(bootstrap, group);
        if !lag.is_empty() && lag.iter().all(|l| *l == 0) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group} still has records left: lag {lag:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
