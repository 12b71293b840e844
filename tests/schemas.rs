//! Schema-encoded records against the real broker and a real schema registry (`dev/registry`,
//! Apicurio Registry's Confluent-compatible API): records written by Confluent's own Avro,
//! Protobuf and JSON Schema serializers (dev/schema_records.py) are decoded by the host and
//! judged by the fraud check as the JSON it reads anyway; its emits are encoded with the
//! output's registered schema and read back by Confluent's own deserializers. A record naming a
//! schema id the registry does not know and one whose payload does not decode are
//! dead-lettered with their own bytes and a reason naming the id; an emit the output's schema
//! refuses rejects its record. A registry that cannot be reached holds the batch (the pipeline
//! degraded), and nothing is lost when it answers again.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use sharehost_tests::host::{HostProcess, Watch};
use sharehost_tests::topics::{Follower, consume_all};
use sharehost_tests::{bootstrap, guest, repo_root, sharehost_bin, unique};

#[path = "../host/examples/pricing_service.rs"]
#[allow(dead_code)]
mod pricing_service;

/// The password of dev/registry's user `sharehost`: every API request needs it.
fn registry_password() -> String {
    std::env::var("REGISTRY_PASSWORD").unwrap_or_else(|_| "registry-secret".to_owned())
}

/// dev/registry's https URL of the same API (`SHAREHOST_REGISTRY_TLS`) and the CA that signed
/// its certificate (`SHAREHOST_REGISTRY_CA`).
fn registry_tls() -> (String, PathBuf) {
    (
        std::env::var("SHAREHOST_REGISTRY_TLS")
            .unwrap_or_else(|_| "https://127.0.0.1:18083/apis/ccompat/v7".to_owned()),
        std::env::var_os("SHAREHOST_REGISTRY_CA")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target/registry/tls/ca.crt")),
    )
}

/// The registry's Confluent-compatible API: `dev/registry up`'s, or `SHAREHOST_REGISTRY`.
fn registry() -> String {
    let url = std::env::var("SHAREHOST_REGISTRY")
        .unwrap_or_else(|_| "http://127.0.0.1:18081/apis/ccompat/v7".to_owned());
    let ok = Command::new(repo_root().join("dev/registry"))
        .arg("status")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok || std::env::var("SHAREHOST_REGISTRY").is_ok(),
        "no schema registry: start one with `dev/registry up` (dev/test does), or set SHAREHOST_REGISTRY"
    );
    url
}

/// Runs dev/schema_records.py with `args`, `input` on its standard input; its output lines.
fn schema_records(args: &[&str], input: &str) -> Vec<String> {
    let mut child = Command::new("python3")
        .arg(repo_root().join("dev/schema_records.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dev/schema_records.py");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write its input");
    let out = child.wait_with_output().expect("dev/schema_records.py");
    assert!(
        out.status.success(),
        "dev/schema_records.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn schema_file(name: &str) -> String {
    repo_root()
        .join("tests/fixtures/schemas")
        .join(name)
        .display()
        .to_string()
}

/// The scoring service (the repository's example) on a free port, with its token.
fn scoring_service(token: &str) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let app = pricing_service::app(pricing_service::Args {
        token: Some(token.to_owned()),
        ..Default::default()
    });
    let addr: SocketAddr = rt.block_on(sharehost_tests::serve_on_loopback(app));
    (rt, format!("http://{addr}"))
}

/// A manifest for the fraud check on `input`, its values and its `scored` output in `format`;
/// the host signs in to the registry with the password in `REGISTRY_PASSWORD`, and trusts
/// dev/registry's CA when the URL is https.
fn manifest(dir: &Path, registry: &str, score_url: &str, topics: &Topics, format: &str) -> PathBuf {
    let path = dir.join("manifest.toml");
    let ca_file = if registry.starts_with("https:") {
        format!("ca_file = \"{}\"\n", registry_tls().1.display())
    } else {
        String::new()
    };
    std::fs::write(
        &path,
        format!(
            r#"[cluster]
bootstrap = "{boot}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "fraud-check-avro"
topics = ["{input}"]
group = "{input}-group"
component = "{component}"
config = {{ score-url = "{score_url}/score" }}
start = "earliest"
allowed_outbound_hosts = ["{score_url}"]
dead_letter_topic = "{dlq}"
delivery_cap = 4
[pipeline.outputs]
scored = "{scored}"
[pipeline.secrets]
scoring-token = {{ env = "SCORING_TOKEN" }}
[pipeline.schema]
registry = "{registry}"
{ca_file}value = "{format}"
username = "sharehost"
password = {{ env = "REGISTRY_PASSWORD" }}
[pipeline.schema.outputs]
scored = "{format}"
"#,
            boot = bootstrap(),
            input = topics.input,
            dlq = topics.dlq,
            scored = topics.scored,
            component = guest("fraud_check").display(),
        ),
    )
    .expect("write the manifest");
    path
}

struct Topics {
    input: String,
    scored: String,
    dlq: String,
}

/// The orders, encoded by Confluent's serializer for `format` (which registers the Order
/// schema, `schema`).
fn encoded_orders(
    registry: &str,
    topic: &str,
    n: usize,
    format: &str,
    schema: &str,
) -> (Vec<Value>, Vec<String>) {
    let orders: Vec<Value> = (0..n)
        .map(|i| {
            json!({"id": format!("o-{i:02}"), "amount": 5.0 + (i * 37 % 700) as f64, "customer": format!("c-{}", i % 5), "quantity": (i % 4) as i64})
        })
        .collect();
    let input: String = orders.iter().map(|o| format!("{o}\n")).collect();
    let lines = schema_records(
        &[
            "encode",
            "--registry",
            registry,
            "--format",
            format,
            "--schema",
            &schema_file(schema),
            "--topic",
            topic,
            "--key-field",
            "id",
        ],
        &input,
    );
    (orders, lines)
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().expect(what);
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn base64_of(record: &Value) -> Option<&str> {
    record["value"]["base64"].as_str()
}

/// The reason a dead letter carries.
fn reason_of(record: &Value) -> String {
    record["headers"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h[0] == "sharehost.reason"))
        .and_then(|h| h[1].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The fraud check on a topic in `format`, its `scored` output in the same format: the topics,
/// the output's schema registered (as its consumers' team would), the orders encoded by
/// Confluent's serializer, the manifest (its host reaching the registry at `host_registry`).
struct Case {
    registry: String,
    token: String,
    _service: tokio::runtime::Runtime,
    topics: Topics,
    dir: PathBuf,
    manifest: PathBuf,
    format: &'static str,
    orders: Vec<Value>,
    /// The encoded orders, as `sharehost produce` takes them.
    lines: Vec<String>,
}

impl Case {
    fn new(
        format: &'static str,
        input_schema: &str,
        output_schema: &str,
        n: usize,
        host_registry: Option<&str>,
    ) -> Case {
        let registry = registry();
        let token = unique("token");
        let (service, score_url) = scoring_service(&token);
        let base = unique(&format!("schemas-{format}"));
        let topics = Topics {
            input: format!("{base}-orders"),
            scored: format!("{base}-scored"),
            dlq: format!("{base}-dlq"),
        };
        let dir = std::env::temp_dir().join(&base);
        std::fs::create_dir_all(&dir).expect("dir");
        let manifest = manifest(
            &dir,
            host_registry.unwrap_or(&registry),
            &score_url,
            &topics,
            format,
        );
        schema_records(
            &[
                "register",
                "--registry",
                &registry,
                "--format",
                format,
                "--schema",
                &schema_file(output_schema),
                "--topic",
                &topics.scored,
            ],
            "",
        );
        let (orders, lines) = encoded_orders(&registry, &topics.input, n, format, input_schema);
        Case {
            registry,
            token,
            _service: service,
            topics,
            dir,
            manifest,
            format,
            orders,
            lines,
        }
    }

    /// Writes the orders and `extra` records after them to the input file, creates the
    /// topics and produces them; the input file.
    fn produce(&self, extra: &[String]) -> PathBuf {
        let input = self.dir.join("records.jsonl");
        let all: Vec<&str> = self.lines.iter().chain(extra).map(String::as_str).collect();
        std::fs::write(&input, all.join("\n") + "\n").expect("write the records");
        let bin = sharehost_bin!();
        let t = &self.topics;
        run(
            Command::new(bin)
                .args(["create-topics", &t.input, &t.scored, &t.dlq])
                .arg("--manifest")
                .arg(&self.manifest),
            "create-topics",
        );
        run(
            Command::new(bin)
                .args(["produce", &t.input, "--manifest"])
                .arg(&self.manifest)
                .arg("--input")
                .arg(&input),
            "produce",
        );
        input
    }

    /// Runs the host until every order and every one of `extra_keys` is in the output or the
    /// dead-letter topic; `before` runs once the host started. The host's log.
    fn run(
        &self,
        extra_keys: &[&str],
        before: impl FnOnce(&HostProcess, &Follower, &Follower, &Watch),
    ) -> Vec<String> {
        let bin = sharehost_bin!();
        let watch = Watch::default();
        let out = Follower::start(bin, &self.manifest, &self.topics.scored, &watch);
        let dead = Follower::start(bin, &self.manifest, &self.topics.dlq, &watch);
        let host = HostProcess::start_watched_with_env(
            bin,
            &self.manifest,
            &format!("schemas-{}", self.format),
            &watch,
            &[
                ("SCORING_TOKEN", &self.token),
                ("REGISTRY_PASSWORD", &registry_password()),
            ],
        );
        before(&host, &out, &dead, &watch);
        let mut want: Vec<&str> = self
            .orders
            .iter()
            .filter_map(|o| o["id"].as_str())
            .collect();
        want.extend(extra_keys);
        watch.wait_until("every order scored or dead-lettered", || {
            assert!(!host.seen().ended, "the host ended");
            let mut done = out.keys();
            done.extend(dead.keys());
            want.iter().all(|k| done.contains(*k))
        });
        let (_, _, log) = host.stop_with_log();
        log
    }

    /// The output as Confluent's deserializer reads it (`args` added to its command).
    fn decoded_output(&self, args: &[&str]) -> Vec<Value> {
        let scored = consume_all(sharehost_bin!(), &self.manifest, &self.topics.scored);
        let consumed: String = scored.iter().map(|r| format!("{r}\n")).collect();
        let mut all = vec![
            "decode",
            "--registry",
            &self.registry,
            "--format",
            self.format,
        ];
        all.extend(args);
        schema_records(&all, &consumed)
            .iter()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect()
    }

    /// The dead-letter topic, read to its end.
    fn dead_letters(&self) -> Vec<Value> {
        consume_all(sharehost_bin!(), &self.manifest, &self.topics.dlq)
    }

    /// The order `id` with the score the service gives it, as the output should hold it.
    fn scored(&self, id: &Value) -> Value {
        let order = self
            .orders
            .iter()
            .find(|o| &o["id"] == id)
            .unwrap_or_else(|| panic!("an unknown order {id}"));
        let mut want = order.clone();
        want["score"] = json!(score(order));
        want
    }
}

/// The scoring service's score of an order.
fn score(order: &Value) -> i64 {
    (order["amount"].as_f64().unwrap_or(0.0) / 10.0).floor() as i64
}

#[test]
fn avro_records_are_judged_as_json_emits_are_avro_and_what_does_not_decode_is_dead_lettered() {
    use base64::Engine as _;
    let case = Case::new("avro", "order.avsc", "scored-order.avsc", 20, None);
    // A record naming a schema id nobody registered, and one with a real id whose payload is
    // not the Order it says it is.
    let real_id = {
        let first: Value = serde_json::from_str(&case.lines[0]).expect("a record");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(base64_of(&first).expect("base64"))
            .expect("base64");
        u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]])
    };
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let unknown: Vec<u8> = [&[0u8, 0x7f, 0xff, 0xff, 0xf0][..], &[2, b'x']].concat();
    let garbled: Vec<u8> = [&[0u8][..], &real_id.to_be_bytes(), &[0xff; 12]].concat();
    let input = case.produce(&[
        json!({"key": "unknown-id", "value": {"base64": b64(&unknown)}}).to_string(),
        json!({"key": "garbled", "value": {"base64": b64(&garbled)}}).to_string(),
    ]);
    let orders = &case.orders;

    // Offline first, as an author would: test-plugin with the pipeline's manifest decodes
    // through the same registry and shows the two records that do not decode rejected, in
    // their places.
    let test_plugin = |password: &str| {
        Command::new(sharehost_bin!())
            .arg("test-plugin")
            .arg(guest("fraud_check"))
            .arg("--input")
            .arg(&input)
            .arg("--manifest")
            .arg(&case.manifest)
            .env("SCORING_TOKEN", &case.token)
            .env("REGISTRY_PASSWORD", password)
            .output()
            .expect("run test-plugin")
    };
    let offline = test_plugin(&registry_password());
    assert!(
        offline.status.success(),
        "{}",
        String::from_utf8_lossy(&offline.stderr)
    );
    let verdicts: Vec<(String, String)> = String::from_utf8_lossy(&offline.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("summary").is_none())
        .map(|v| {
            (
                v["verdict"].as_str().unwrap_or("?").to_owned(),
                v["reason"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(verdicts.len(), orders.len() + 2, "{verdicts:?}");
    assert!(
        verdicts[..orders.len()].iter().all(|(v, _)| v == "accept"),
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts[orders.len()],
        (
            "reject".to_owned(),
            "value: schema id 2147483632 is not in the registry".to_owned()
        )
    );
    assert!(
        verdicts[orders.len() + 1]
            .1
            .starts_with(&format!("value: schema id {real_id}: ")),
        "{verdicts:?}"
    );

    // The registry refuses a wrong password: no record is judged, and the error says why.
    let refused = test_plugin("not-the-password");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("refused (401 Unauthorized): check the registry's credentials"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");

    let log = case.run(&["unknown-id", "garbled"], |_, _, _, _| {});

    // What the host wrote to the output, read by Confluent's Avro deserializer.
    let decoded = case.decoded_output(&["--with-schema-id"]);
    assert_eq!(decoded.len(), orders.len(), "{decoded:#?}");
    for d in &decoded {
        let v = &d["value"];
        assert_eq!(
            v,
            &case.scored(&v["id"]),
            "the order and its score, as Avro"
        );
    }

    // The two records the host could not decode, with their own bytes and the reason naming
    // the id.
    let dlq = case.dead_letters();
    let letter = |key: &str| -> (String, Option<String>) {
        let r = dlq
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("{key} not dead-lettered: {dlq:#?}"));
        (reason_of(r), base64_of(r).map(str::to_owned))
    };
    let (why, bytes) = letter("unknown-id");
    assert_eq!(
        bytes.as_deref(),
        Some(b64(&unknown).as_str()),
        "its own bytes"
    );
    assert_eq!(why, "value: schema id 2147483632 is not in the registry");
    let (why, bytes) = letter("garbled");
    assert_eq!(
        bytes.as_deref(),
        Some(b64(&garbled).as_str()),
        "its own bytes"
    );
    assert!(
        why.starts_with(&format!(
            "value: schema id {real_id}: the payload does not decode as Avro"
        )),
        "{why}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("record not decoded, rejected")),
        "the host says so"
    );
}

/// A loopback gate to `target` on `port`: while open it forwards each connection, while shut it
/// closes each one as it comes (the registry's client opens one per request), as a registry
/// that stopped answering would look to the host.
struct Gate {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    _rt: tokio::runtime::Runtime,
}

impl Gate {
    fn shut(port: u16, target: SocketAddr) -> Gate {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("the gate's port is free again");
        let is_open = open.clone();
        rt.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !is_open.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Gate { open, _rt: rt }
    }

    fn set(&self, open: bool) {
        self.open.store(open, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_registry_that_stops_answering_mid_stream_holds_the_batch_and_nothing_is_lost() {
    let registry = registry();
    let registry_addr: SocketAddr = {
        let uri: http::Uri = registry.parse().expect("the registry's URL");
        let authority = uri.authority().expect("an authority").as_str().to_owned();
        std::net::ToSocketAddrs::to_socket_addrs(&authority)
            .expect("resolves")
            .next()
            .expect("an address")
    };
    // The host reaches the registry through a gate the test opens and shuts.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let path = registry
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, p)| p)
        .unwrap_or("");
    let through = format!("http://127.0.0.1:{port}/{path}");
    let case = Case::new(
        "avro",
        "order.avsc",
        "scored-order.avsc",
        10,
        Some(&through),
    );
    case.produce(&[]);
    let gate = Gate::shut(port, registry_addr);
    // Orders of the schema's next version (a new id), produced once the registry stops
    // answering: their schema is not among those the host keeps.
    let later: Vec<Value> = (0..10)
        .map(|i| json!({"id": format!("v2-{i:02}"), "amount": 3.0 + (i * 41 % 600) as f64, "customer": "c-v2", "quantity": 1, "channel": "web"}))
        .collect();
    let later_ids: Vec<String> = later
        .iter()
        .filter_map(|o| o["id"].as_str().map(str::to_owned))
        .collect();
    let later_keys: Vec<&str> = later_ids.iter().map(String::as_str).collect();
    let waits = |host: &HostProcess| {
        host.log_lines()
            .iter()
            .filter(|l| l.contains("the batch waits for it, holding its records"))
            .count()
    };
    case.run(&later_keys, |host, out, dead, watch| {
        // Shut from the start: the first batch waits, the pipeline degraded, nothing out.
        host.wait_for_log("the batch waits for it, holding its records");
        assert_eq!(host.status()[0]["state"], "degraded", "{}", host.status());
        assert!(out.records().is_empty() && dead.records().is_empty());
        gate.set(true);
        let first: Vec<&str> = case
            .orders
            .iter()
            .filter_map(|o| o["id"].as_str())
            .collect();
        watch.wait_until("the first orders scored", || {
            let done = out.keys();
            first.iter().all(|k| done.contains(*k))
        });
        // Mid-stream: the registry stops answering, and orders of a new schema version come.
        gate.set(false);
        let before = waits(host);
        let input: String = later.iter().map(|o| format!("{o}\n")).collect();
        let lines = schema_records(
            &[
                "encode",
                "--registry",
                &case.registry,
                "--format",
                "avro",
                "--schema",
                &schema_file("order-v2.avsc"),
                "--topic",
                &case.topics.input,
                "--key-field",
                "id",
            ],
            &input,
        );
        let file = case.dir.join("later.jsonl");
        std::fs::write(&file, lines.join("\n") + "\n").expect("write");
        run(
            Command::new(sharehost_bin!())
                .args(["produce", &case.topics.input, "--manifest"])
                .arg(&case.manifest)
                .arg("--input")
                .arg(&file),
            "produce",
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while waits(host) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "the new orders' batch never waited for the registry"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(host.status()[0]["state"], "degraded", "{}", host.status());
        let mut done = out.keys();
        done.extend(dead.keys());
        assert!(
            later_keys.iter().all(|k| !done.contains(*k)),
            "an order of the new version was judged while its schema could not be read"
        );
        gate.set(true);
    });
    let bin = sharehost_bin!();
    let mut seen = consume_all(bin, &case.manifest, &case.topics.scored);
    assert!(case.dead_letters().is_empty(), "{:#?}", case.dead_letters());
    for r in &seen {
        let id = r["key"].as_str().unwrap_or_default();
        assert!(!id.is_empty(), "{r}");
    }
    seen.sort_by_key(|r| r["key"].as_str().map(str::to_owned));
    let keys: Vec<&str> = seen.iter().filter_map(|r| r["key"].as_str()).collect();
    let mut want: Vec<&str> = case
        .orders
        .iter()
        .filter_map(|o| o["id"].as_str())
        .chain(later_keys.iter().copied())
        .collect();
    want.sort();
    assert_eq!(keys, want, "every order scored once, none lost");
}

#[test]
fn json_schema_records_are_judged_and_an_emit_its_output_schema_refuses_rejects_its_record() {
    // The output's schema allows scores up to 50: the fraud check's higher ones do not fit. The
    // host reaches the registry over https, trusting dev/registry's CA (`ca_file`).
    let (https, _) = registry_tls();
    let case = Case::new(
        "json-schema",
        "order.schema.json",
        "scored-order.schema.json",
        20,
        Some(&https),
    );
    let fits = case.orders.iter().filter(|o| score(o) <= 50).count();
    assert!(fits < case.orders.len() && fits > 0, "both kinds");
    case.produce(&[]);
    case.run(&[], |_, _, _, _| {});
    let decoded = case.decoded_output(&[]);
    assert_eq!(decoded.len(), fits, "{decoded:#?}");
    for d in &decoded {
        assert_eq!(d, &case.scored(&d["id"]));
    }
    let dlq = case.dead_letters();
    assert_eq!(dlq.len(), case.orders.len() - fits, "{dlq:#?}");
    for r in &dlq {
        let reason = reason_of(r);
        assert!(
            reason.starts_with("output scored (schema id ")
                && reason.contains("does not conform to the JSON Schema")
                && reason.contains("/score"),
            "{reason}"
        );
    }
}

#[test]
fn protobuf_records_are_judged_as_json_and_emits_are_protobuf() {
    let case = Case::new("protobuf", "order.proto", "scored-order.proto", 12, None);
    case.produce(&[]);
    case.run(&[], |_, _, _, _| {});
    assert!(case.dead_letters().is_empty());
    let schema = schema_file("scored-order.proto");
    let decoded = case.decoded_output(&["--schema", &schema]);
    assert_eq!(decoded.len(), case.orders.len(), "{decoded:#?}");
    for d in &decoded {
        let want = case.scored(&d["id"]);
        // Confluent's deserializer leaves out proto3's zero values: the fields that are never
        // zero here are compared.
        for field in ["id", "amount", "customer", "score"] {
            assert_eq!(d[field], want[field], "{field}: {d}");
        }
    }
}
