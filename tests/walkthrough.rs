//! The plugin guide's walkthrough against the real broker, in each language: the fraud-check
//! plugin (examples/fraud-check, examples/python/fraud-check, examples/js/fraud-check) built
//! with that language's own build command, then run the way the guide runs it:
//! `sharehost create-topics`, `sharehost produce --input orders.jsonl`, `sharehost run` with a
//! manifest granting the scoring host, the token as a secret, the `scored` output and a
//! dead-letter topic, and `sharehost consume` to read what came out.
//!
//! The scoring service is the test's own: it scores an order from its amount and answers 500 to
//! the first call for every ninth order, so those take the retry path. The ledger is kept by the
//! test, outside the host: every order id ends in the scored output (with the score the service
//! gave) or in the dead-letter topic (with the plugin's reason), none is lost, none is in both,
//! and the token reached the service on every call. One test per language, so that the three
//! builds and runs go side by side.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use sharehost_tests::host::{HostProcess, Watch};
use sharehost_tests::topics::{Follower, consume_all};
use sharehost_tests::{bootstrap, repo_root, sharehost_bin, unique};

/// Orders produced per language.
const ORDERS: usize = 200;
/// The plugin's default `max-score`: a higher score is rejected.
const MAX_SCORE: i64 = 80;

/// Where an order must end, as the test expects it.
#[derive(Debug, Clone, PartialEq)]
enum Fate {
    /// In the `scored` output with this score.
    Scored(i64),
    /// In the dead-letter topic with this reason.
    Dead(String),
}

/// One order of the input: its id (the record's key), its value, and where it must end.
struct Order {
    id: String,
    value: Option<String>,
    amount: f64,
    fate: Fate,
    /// The service answers 500 to its first call.
    flaky: bool,
}

/// What the scoring service gives an order of this amount.
fn score(amount: f64) -> i64 {
    (amount / 10.0).floor() as i64
}

/// The input: mostly valid orders, with scores above and below the maximum, and every few
/// dozen one that the plugin must reject without a call (not JSON, a tombstone, no id).
fn orders() -> Vec<Order> {
    (0..ORDERS)
        .map(|i| {
            let id = format!("o-{i:03}");
            let amount = ((i * 37) % 1000) as f64 + 0.5;
            // Only orders the plugin sends can be flaky: every ninth of them.
            let (value, fate, flaky) = match i % 50 {
                7 => (
                    Some("not json {".into()),
                    Fate::Dead("not JSON".into()),
                    false,
                ),
                17 => (None, Fate::Dead("tombstone".into()), false),
                27 => (
                    Some(json!({"amount": amount, "customer": "c-x"}).to_string()),
                    Fate::Dead("`id` missing or not a string".into()),
                    false,
                ),
                _ => {
                    let value =
                        json!({"id": id, "amount": amount, "customer": format!("c-{}", i % 13)});
                    let s = score(amount);
                    let fate = if s > MAX_SCORE {
                        Fate::Dead(format!("score {s} > {MAX_SCORE}"))
                    } else {
                        Fate::Scored(s)
                    };
                    (Some(value.to_string()), fate, i % 9 == 4)
                }
            };
            Order {
                id,
                value,
                amount,
                fate,
                flaky,
            }
        })
        .collect()
}

/// What the scoring service saw: each order id's calls, with the `Authorization` they carried.
#[derive(Default)]
struct Calls {
    by_id: BTreeMap<String, Vec<Option<String>>>,
    /// Calls whose body was not an order with an id (the plugin must never send one).
    unreadable: usize,
}

/// The scoring service's state: the orders whose first call fails, and what it saw.
#[derive(Default)]
struct Service {
    flaky: BTreeSet<String>,
    calls: Mutex<Calls>,
}

/// `POST /score`: counts the call and its token, answers 500 to a flaky order's first call and
/// the score of its amount otherwise.
async fn score_order(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let order: Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut calls = service.calls.lock().unwrap_or_else(PoisonError::into_inner);
    let (Some(id), Some(amount)) = (order["id"].as_str(), order["amount"].as_f64()) else {
        calls.unreadable += 1;
        return (StatusCode::BAD_REQUEST, String::new());
    };
    let seen = calls.by_id.entry(id.to_owned()).or_default();
    seen.push(auth);
    if seen.len() == 1 && service.flaky.contains(id) {
        return (StatusCode::INTERNAL_SERVER_ERROR, String::new());
    }
    (StatusCode::OK, json!({"score": score(amount)}).to_string())
}

/// The scoring service on a free loopback port, served by its own runtime for as long as the
/// returned runtime lives; returns its base URL and its state.
fn scoring_service(flaky: BTreeSet<String>) -> (tokio::runtime::Runtime, String, Arc<Service>) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let service = Arc::new(Service {
        flaky,
        ..Service::default()
    });
    let app = axum::Router::new()
        .route("/score", axum::routing::post(score_order))
        .with_state(service.clone());
    let addr: SocketAddr = rt.block_on(sharehost_tests::serve_on_loopback(app));
    (rt, format!("http://{addr}"), service)
}

/// Runs `cmd`, failing the test with its output when it fails; returns its stdout.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {:?}: {e}", cmd.get_program()));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the language's fraud check into `dir` with the command the guide gives for it.
fn build(language: &str, dir: &Path) -> PathBuf {
    let root = repo_root();
    match language {
        "rust" => {
            // dev/build-guests' target folder: after it, this build has nothing left to do.
            let target = root.join("target/guest-build");
            run(
                Command::new("cargo")
                    .args(["build", "--quiet", "--release", "--target", "wasm32-wasip2"])
                    .args(["-p", "fraud-check", "--manifest-path"])
                    .arg(root.join("examples/Cargo.toml"))
                    .env("CARGO_TARGET_DIR", &target),
                "cargo build",
            );
            // A copy of its own: a later build may rewrite the target folder's while it runs.
            let out = dir.join("fraud_check.wasm");
            std::fs::copy(target.join("wasm32-wasip2/release/fraud_check.wasm"), &out)
                .expect("copy the component");
            out
        }
        "python" => {
            let out = dir.join("fraud_check_py.wasm");
            run(
                Command::new(root.join("guest-sdk/python/build"))
                    .arg(root.join("examples/python/fraud-check"))
                    .arg(&out),
                "guest-sdk/python/build",
            );
            out
        }
        _ => {
            let out = dir.join("fraud_check_js.wasm");
            run(
                Command::new("node")
                    .arg(root.join("guest-sdk/js/build.mjs"))
                    .arg(root.join("examples/js/fraud-check/plugin.js"))
                    .arg(&out),
                "node guest-sdk/js/build.mjs",
            );
            out
        }
    }
}

/// The text of header `name` of a consumed record.
fn header<'a>(record: &'a Value, name: &str) -> Option<&'a str> {
    record["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)?
        .get(1)?
        .as_str()
}

/// The walkthrough in `language` (`rust`, `python` or `js`): build, topics, orders, run, ledger.
fn walkthrough(language: &str) {
    let started = Instant::now();
    let boot = bootstrap();
    let dir = std::env::temp_dir().join(unique(&format!("sharehost-walkthrough-{language}")));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let component = build(language, &dir);
    let built = started.elapsed();

    let orders = orders();
    let flaky = orders
        .iter()
        .filter(|o| o.flaky)
        .map(|o| o.id.clone())
        .collect();
    let (_runtime, url, service) = scoring_service(flaky);
    let base = unique(&format!("walkthrough-{language}"));
    let (input, scored, dlq) = (
        format!("{base}-orders"),
        format!("{base}-scored"),
        format!("{base}-dlq"),
    );
    let token = unique("scoring-token");
    let manifest = dir.join("manifest.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"[cluster]
bootstrap = "{boot}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "fraud-check"
topics = ["{input}"]
group = "{base}-group"
component = "{component}"
config = {{ score-url = "{url}/score" }}
start = "earliest"
allowed_outbound_hosts = ["{url}"]
dead_letter_topic = "{dlq}"
delivery_cap = 4
memory_limit_mib = 64
[pipeline.outputs]
scored = "{scored}"
[pipeline.secrets]
scoring-token = {{ env = "SCORING_TOKEN" }}
"#,
            component = component.display(),
        ),
    )
    .expect("write the manifest");

    let jsonl: String = orders
        .iter()
        .map(|o| json!({"key": o.id, "value": o.value}).to_string() + "\n")
        .collect();
    let input_file = dir.join("orders.jsonl");
    std::fs::write(&input_file, jsonl).expect("write the orders");
    let sharehost = sharehost_bin!();
    run(
        Command::new(sharehost)
            .args(["create-topics", &input, &scored, &dlq, "--partitions", "3"])
            .arg("--manifest")
            .arg(&manifest),
        "sharehost create-topics",
    );
    run(
        Command::new(sharehost)
            .args(["produce", &input, "--manifest"])
            .arg(&manifest)
            .arg("--input")
            .arg(&input_file),
        "sharehost produce",
    );

    // Read back as the records land: the wait ends when every order is out.
    let watch = Watch::default();
    let out = Follower::start(sharehost_bin!(), &manifest, &scored, &watch);
    let dead = Follower::start(sharehost_bin!(), &manifest, &dlq, &watch);
    let host = HostProcess::start_watched_with_env(
        sharehost,
        &manifest,
        &format!("walkthrough-{language}"),
        &watch,
        &[("SCORING_TOKEN", &token)],
    );
    let ids: BTreeSet<String> = orders.iter().map(|o| o.id.clone()).collect();
    watch.wait_until(
        "every order in the scored output or the dead-letter topic",
        || {
            assert!(
                !host.seen().ended,
                "{language}: the host ended before every order was out"
            );
            assert!(
                !out.ended() && !dead.ended(),
                "{language}: a consumer ended"
            );
            let mut done = out.keys();
            done.extend(dead.keys());
            ids.is_subset(&done)
        },
    );
    let judged = started.elapsed();
    let (_, _, log) = host.stop_with_log();
    drop((out, dead));

    // The ledger, from the topics read again to their ends now that the host has stopped.
    let by_id: BTreeMap<&str, &Order> = orders.iter().map(|o| (o.id.as_str(), o)).collect();
    let mut fates: BTreeMap<String, Vec<Fate>> = BTreeMap::new();
    for record in consume_all(sharehost_bin!(), &manifest, &scored) {
        let id = record["key"]
            .as_str()
            .expect("a scored order is keyed")
            .to_owned();
        let order = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("{language}: scored an unknown order {record}"));
        let value: Value = serde_json::from_str(record["value"].as_str().expect("a text value"))
            .expect("the scored order is JSON");
        let sent: Value =
            serde_json::from_str(order.value.as_deref().expect("a value")).expect("JSON");
        let mut want = sent.clone();
        want["score"] = value["score"].clone();
        assert_eq!(value, want, "{language}: {id} is the order plus its score");
        assert_eq!(value["amount"].as_f64(), Some(order.amount));
        let score = value["score"].as_i64().expect("an integer score");
        fates.entry(id).or_default().push(Fate::Scored(score));
    }
    let scored_records: usize = fates.values().map(Vec::len).sum();
    for record in consume_all(sharehost_bin!(), &manifest, &dlq) {
        let id = record["key"]
            .as_str()
            .expect("a dead letter keeps its key")
            .to_owned();
        let reason = header(&record, "sharehost.reason")
            .expect("a reason")
            .to_owned();
        fates.entry(id).or_default().push(Fate::Dead(reason));
    }
    let records: usize = fates.values().map(Vec::len).sum();
    let mut lost = Vec::new();
    let mut wrong = Vec::new();
    for order in &orders {
        match fates.get(&order.id) {
            None => lost.push(order.id.as_str()),
            Some(seen) if seen.iter().any(|f| *f != order.fate) => {
                wrong.push(format!("{}: {seen:?}, expected {:?}", order.id, order.fate));
            }
            Some(_) => {}
        }
    }
    assert!(lost.is_empty(), "{language}: lost {lost:?}");
    // A wrong fate is a wrong score, a wrong reason, or both topics (none in both).
    assert!(wrong.is_empty(), "{language}: {wrong:#?}");
    assert_eq!(
        fates.len(),
        ORDERS,
        "{language}: no order beyond those produced"
    );

    // What the service saw: the token on every call, a second call after each 500, and no call
    // for an order the plugin rejects unread.
    let calls = service.calls.lock().unwrap_or_else(PoisonError::into_inner);
    assert_eq!(calls.unreadable, 0, "{language}: a call without an order");
    let bearer = format!("Bearer {token}");
    let all: Vec<&Option<String>> = calls.by_id.values().flatten().collect();
    assert!(
        all.iter()
            .all(|auth| auth.as_deref() == Some(bearer.as_str())),
        "{language}: a call without the token"
    );
    for order in &orders {
        let n = calls.by_id.get(&order.id).map_or(0, Vec::len);
        let least = match (&order.fate, order.flaky) {
            (Fate::Dead(r), _) if !r.starts_with("score ") => 0,
            (_, true) => 2,
            _ => 1,
        };
        assert!(
            n >= least && (least > 0 || n == 0),
            "{language}: {} was scored {n} times",
            order.id
        );
    }
    let flaky = orders.iter().filter(|o| o.flaky).count();
    // The plugin's own line for each 500 reached the host log; the token never did.
    assert!(
        log.iter()
            .any(|l| l.contains("scoring service answered 500; again in 1000 ms")),
        "{language}: no retry in the host log"
    );
    assert!(
        log.iter().all(|l| !l.contains(&token)),
        "{language}: the token is in the host log"
    );
    let dead_letters = records - scored_records;
    println!(
        "walkthrough {language}: {ORDERS} orders, {scored_records} scored, {dead_letters} dead-lettered \
         ({} copies beyond the first), {} calls ({flaky} answered 500 first and retried), lost 0; \
         built in {:.1?}, every order out {:.1?} after start",
        records - ORDERS,
        all.len(),
        built,
        judged,
    );
    drop(calls);
    schema_encoded_offline(language, &component, &dir, &url, &token);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same component on an Avro topic with an Avro `scored` output, offline: `test-plugin`
/// with the schemas as files decodes each order into the JSON the plugin reads through its
/// SDK's usual calls, and checks what it emits against the output's schema. The decoding is
/// the host's, the same for every language (tests/schemas.rs runs it against the broker and a
/// real registry); this shows each SDK reading what it hands over.
fn schema_encoded_offline(language: &str, component: &Path, dir: &Path, url: &str, token: &str) {
    let manifest = dir.join("schema.toml");
    std::fs::write(
        &manifest,
        sharehost_tests::manifests::offline_schema_manifest(component, url, "avro", "scored"),
    )
    .expect("write the manifest");
    let input = dir.join("avro-orders.jsonl");
    let order = |id: &str, amount: f64| {
        json!({"topic": "orders", "key": id, "value": json!({
            "id": id, "amount": amount, "customer": "ann", "quantity": 2
        }).to_string()})
        .to_string()
    };
    std::fs::write(
        &input,
        [order("avro-1", 125.5), order("avro-2", 955.5)].join("\n"),
    )
    .expect("write the orders");
    let schemas = repo_root().join("tests/fixtures/schemas");
    let out = run(
        Command::new(sharehost_bin!())
            .arg("test-plugin")
            .arg(component)
            .arg("--input")
            .arg(&input)
            .arg("--manifest")
            .arg(&manifest)
            .arg("--schema-file")
            .arg(format!(
                "orders-value={}",
                schemas.join("order.avsc").display()
            ))
            .arg("--schema-file")
            .arg(format!(
                "scored-value={}",
                schemas.join("scored-order.avsc").display()
            ))
            .arg("--quiet")
            .env("SHAREHOST_LOG", "off")
            .env("SCORING_TOKEN", token),
        "sharehost test-plugin with schema files",
    );
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let emitted: Value = serde_json::from_str(
        lines[0]["emits"][0]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("{language}: no emit: {out}")),
    )
    .expect("the emit is JSON");
    assert_eq!(
        (lines[0]["verdict"].as_str(), &emitted),
        (
            Some("accept"),
            &json!({"id": "avro-1", "amount": 125.5, "customer": "ann", "quantity": 2, "score": 12})
        ),
        "{language}: the Avro order read as JSON, scored, its emit fits the Avro output: {out}"
    );
    assert_eq!(
        (lines[1]["verdict"].as_str(), lines[1]["reason"].as_str()),
        (Some("reject"), Some("score 95 > 80")),
        "{language}: {out}"
    );
}

#[test]
fn the_rust_fraud_check_scores_every_order_or_dead_letters_it_with_its_reason() {
    walkthrough("rust");
}

#[test]
fn the_python_fraud_check_scores_every_order_or_dead_letters_it_with_its_reason() {
    walkthrough("python");
}

#[test]
fn the_javascript_fraud_check_scores_every_order_or_dead_letters_it_with_its_reason() {
    walkthrough("js");
}
