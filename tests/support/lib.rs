//! Shared helpers for the integration tests: finding the broker that `dev/kafka up` started,
//! unique names, and clients.
//!
//! A test that needs the broker and cannot reach it FAILS with instructions; it never skips.

use std::collections::HashSet;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
pub mod cluster;
pub mod fake_broker;
pub mod host;
pub mod ledger;
pub mod pods;
pub mod proxy;

use sharehost::kafka::{
    Compression, ConnectionConfig, KafkaClient, Mechanism, ProduceRecord, SaslSettings, Secret,
    TlsSettings,
};

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

/// The repository root (tests run with the package directory as cwd).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
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

/// Installs a test log subscriber once (RUST_LOG-style filter from `SHAREHOST_LOG`).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHAREHOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
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

/// Creates a topic with `partitions` partitions and `per_partition` records in each; values
/// name their partition and index so the test can check exactly-once delivery.
pub async fn topic_with_records(
    client: &KafkaClient,
    partitions: i32,
    per_partition: usize,
) -> (String, HashSet<String>) {
    let topic = unique("topic");
    client
        .create_topic(&topic, partitions, 1, &[])
        .await
        .expect("create topic");
    let mut ids = HashSet::new();
    for p in 0..partitions {
        let records: Vec<ProduceRecord> = (0..per_partition)
            .map(|i| {
                let id = format!("{p}-{i}");
                ids.insert(id.clone());
                ProduceRecord {
                    value: Some(Bytes::from(id)),
                    ..Default::default()
                }
            })
            .collect();
        client
            .produce(&topic, p, &records, Compression::Lz4)
            .await
            .expect("produce");
    }
    (topic, ids)
}

/// Path of a guest component built by `dev/build-guests` (name without `.wasm`); fails with
/// the fix when the guests were not built.
pub fn guest(name: &str) -> PathBuf {
    let path = repo_root()
        .join("target/guests")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "guest component {} is missing: run dev/build-guests first (dev/test does)",
        path.display()
    );
    path
}

/// The pipeline settings the fault suite and `dev/chaos` run the ledger plugin with: small
/// batches and a low in-flight bound (so a fault always catches records mid-flight), a delivery
/// cap below the broker's limit, and two batches judged at once.
pub const FAULT_SETTINGS: &str =
    "batch_size = 50\nmax_in_flight = 500\ndelivery_cap = 4\nconcurrency = 2\n";

/// The text of a manifest with one pipeline named `ledger` (admin on an ephemeral loopback
/// port) that runs `component` on `topic` in `group`, with the plugin configuration
/// `plugin_config` (TOML inline-table entries) and `settings` (more pipeline lines).
pub fn ledger_manifest(
    bootstrap: &str,
    topic: &str,
    group: &str,
    component: &std::path::Path,
    plugin_config: &str,
    settings: &str,
) -> String {
    format!(
        r#"[cluster]
bootstrap = "{bootstrap}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "ledger"
topics = ["{topic}"]
group = "{group}"
component = "{component}"
config = {{ {plugin_config} }}
{settings}"#,
        component = component.display(),
    )
}

/// A fresh topic named after `prefix` with `partitions` partitions, and its dead-letter topic
/// `TOPIC-dlq` with `dlq_partitions` (both with one replica): what every scenario whose
/// pipeline rejects records starts from. Returns (topic, dead-letter topic).
pub async fn topic_with_dead_letters(
    client: &KafkaClient,
    prefix: &str,
    partitions: i32,
    dlq_partitions: i32,
) -> (String, String) {
    let topic = unique(prefix);
    let dlq = format!("{topic}-dlq");
    client
        .create_topic(&topic, partitions, 1, &[])
        .await
        .expect("create topic");
    client
        .create_topic(&dlq, dlq_partitions, 1, &[])
        .await
        .expect("create dead-letter topic");
    (topic, dlq)
}

/// The bytes of `component` with a custom section appended: the same plugin, another content
/// hash. A new version for a hot-swap, a canary or a rollback, and a file no earlier run has
/// cached.
pub fn new_version(component: &std::path::Path, tag: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(component).expect("read component");
    let name = b"sharehost-test-version";
    let payload = tag.as_bytes();
    let len = 1 + name.len() + payload.len();
    assert!(len < 128, "one-byte LEB128 sizes");
    bytes.push(0); // custom section
    bytes.push(u8::try_from(len).expect("small"));
    bytes.push(u8::try_from(name.len()).expect("small"));
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(payload);
    bytes
}

/// A plugin runtime for the runtime tests: 64 MiB plugins, 8 instances in the pool.
pub fn plugin_runtime() -> sharehost::runtime::PluginRuntime {
    sharehost::runtime::PluginRuntime::new(sharehost::runtime::RuntimeConfig {
        max_plugin_memory: 64 << 20,
        max_instances: 8,
        ..sharehost::runtime::RuntimeConfig::default()
    })
    .expect("runtime")
}

/// Runs blocking work (a child process, a tool) off the test's async workers.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("join")
}

/// Serves `app` on an ephemeral loopback port for the rest of the test; returns its address.
pub async fn serve_on_loopback(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// A record as a plugin judges it (topic `orders`, partition 3, first delivery, key `k{offset}`)
/// with `value` and `headers`: what the runtime tests hand to fixtures.
pub fn plugin_record(
    offset: i64,
    value: &str,
    headers: &[(&str, &str)],
) -> sharehost::runtime::Record {
    sharehost::runtime::Record {
        topic: std::sync::Arc::from("orders"),
        partition: 3,
        offset,
        timestamp: 1_700_000_000_000 + offset,
        delivery_count: 1,
        key: Some(Bytes::from(format!("k{offset}"))),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
        headers: headers
            .iter()
            .map(|(k, v)| sharehost::runtime::Header {
                key: (*k).to_owned(),
                value: Some(Bytes::copy_from_slice(v.as_bytes())),
            })
            .collect(),
    }
}

/// Waits until the broker reports nothing left for `group` (lag 0 on every partition: each
/// record accepted, rejected or archived), polling Apache's ShareGroupCommand, which has no
/// way to be notified.
pub fn wait_until_drained(group: &str) {
    let deadline = std::time::Instant::now() + host::PATIENCE;
    loop {
        let lag = group_lag(group);
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

/// Produces the decimal ids of `ids` as record values into `topic`, 100 per batch, batches
/// round-robin over `partitions`; returns the ids (what the fault tests' ledgers start from).
pub async fn produce_ids(
    client: &KafkaClient,
    topic: &str,
    partitions: i32,
    ids: std::ops::Range<u64>,
) -> Vec<String> {
    let all: Vec<String> = ids.map(|i| i.to_string()).collect();
    for (n, chunk) in all.chunks(100).enumerate() {
        let records: Vec<ProduceRecord> = chunk
            .iter()
            .map(|id| ProduceRecord {
                value: Some(Bytes::from(id.clone())),
                ..Default::default()
            })
            .collect();
        let p = i32::try_from(n).unwrap_or(0) % partitions;
        client
            .produce(topic, p, &records, Compression::Lz4)
            .await
            .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
    }
    all
}

/// Every record value in `topic` (partitions `0..partitions`) up to its current end, as text:
/// how the fault tests read a dead-letter topic.
pub async fn topic_values(client: &KafkaClient, topic: &str, partitions: i32) -> Vec<String> {
    topic_records(client, topic, partitions)
        .await
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

/// Every record in `topic` (partitions `0..partitions`) up to its current end, with its
/// partition, read with plain Fetch (no group): how tests read output and dead-letter topics.
pub async fn topic_records(
    client: &KafkaClient,
    topic: &str,
    partitions: i32,
) -> Vec<(i32, sharehost::kafka::ConsumedRecord)> {
    use sharehost::kafka::OffsetSpec;
    let mut records = Vec::new();
    for p in 0..partitions {
        let end = client
            .list_offset(topic, p, OffsetSpec::Latest)
            .await
            .unwrap_or_else(|e| panic!("end offset of {topic}-{p}: {e}"));
        let mut next = 0;
        while next < end {
            let f = client
                .fetch(topic, p, next, Duration::from_millis(500))
                .await
                .unwrap_or_else(|e| panic!("fetch {topic}-{p} at {next}: {e}"));
            for r in f.records {
                next = next.max(r.offset + 1);
                records.push((p, r));
            }
        }
    }
    records
}

/// A `tracing` writer that keeps everything in memory, so a test can read what was logged.
#[derive(Clone, Default)]
pub struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
