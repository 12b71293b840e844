//! The operator's kit against a running host (`sharehost run` through the binary, against the
//! broker): the Prometheus rules pass `promtool check rules` and their unit tests; every
//! metric the Grafana dashboard and the rules name is in the host's /metrics, with the labels
//! their matchers use, and every family the host exports has a panel; the console in headless
//! Chromium shows the pipelines, a canary's and a shadow's tallies as bars, records per second,
//! dead letters grouped by reason and recent faults, and its replay button is refused without
//! the admin token and replays the group with it.
//!
//! Needs Debian's `prometheus` (promtool) and `chromium`, and Node.js; `dev/test` installs the
//! Debian packages, and this test installs playwright-core from tests/console's lockfile into
//! target/ itself. Screenshots go to target/console-screenshots
//! (`SHAREHOST_CONSOLE_SCREENSHOTS=docs/img` refreshes the ones the docs show).
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost_tests::fleet::{FleetKit, poll_all, poll_fleet};
use sharehost_tests::host::{HostProcess, PATIENCE};
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    blocking, bootstrap, client, fresh_group, guest, ledger_manifest, new_version, produce_ids,
    repo_root, topic_records, topic_with_dead_letters, unique,
};

const TOKEN: &str = "console-test-token-5f2c";

/// A value the orders pipeline rejects (not a decimal id) that a page which put record values
/// into markup would run.
const HOSTILE_VALUE: &str = r#"<img src=x onerror="document.body.dataset.pwned='yes'">"#;

/// Ids produced to orders (every 7th rejected) and payments.
const ORDER_IDS: u64 = 700;
const HOSTILE_RECORDS: usize = 5;
const PAYMENT_IDS: u64 = 200;

fn rules_file() -> PathBuf {
    repo_root().join("deploy/prometheus/sharehost-rules.yml")
}

fn dashboard_file() -> PathBuf {
    repo_root().join("deploy/grafana/sharehost-dashboard.json")
}

fn promtool(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install Debian's prometheus package (dev/test does)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{text}", args.join(" "));
    text
}

// ---- reading PromQL ------------------------------------------------------------------------

/// A metric a query names, with the label names its matchers use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Reference {
    name: String,
    labels: Vec<String>,
}

/// Words of PromQL that are not metric names: aggregations, operators, modifiers. A function
/// is told by the `(` after it.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "limitk",
    "limit_ratio",
];

/// Modifiers whose parenthesised list holds label names, not expressions.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The end (exclusive) of the quoted string starting at `at`.
fn skip_string(chars: &[char], at: usize) -> usize {
    let quote = chars[at];
    let mut i = at + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    panic!(
        "unterminated string in {}",
        chars.iter().collect::<String>()
    )
}

fn skip_spaces(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

fn ident_end(chars: &[char], mut i: usize) -> usize {
    while i < chars.len()
        && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
    {
        i += 1;
    }
    i
}

/// The label names of the matchers `{...}` starting at `at`, and the end of the braces.
fn matchers(chars: &[char], at: usize) -> (Vec<String>, usize) {
    let mut labels = Vec::new();
    let mut i = at + 1;
    loop {
        i = skip_spaces(chars, i);
        match chars.get(i) {
            Some('}') => return (labels, i + 1),
            Some(',') => i += 1,
            Some(_) => {
                let end = ident_end(chars, i);
                assert!(end > i, "a label name expected at {i}");
                labels.push(chars[i..end].iter().collect());
                i = skip_spaces(chars, end);
                while matches!(chars.get(i), Some('=' | '!' | '~')) {
                    i += 1;
                }
                i = skip_spaces(chars, i);
                assert!(
                    matches!(chars.get(i), Some('"' | '\'' | '`')),
                    "a label value expected at {i}"
                );
                i = skip_string(chars, i);
            }
            None => panic!("unterminated matchers"),
        }
    }
}

/// Every metric `expr` names. Strings, durations, numbers, functions, aggregations, operators
/// and label lists (`by (...)`, `on (...)`) are not metrics; a name followed by `{...}` carries
/// the label names of its matchers. (promtool checks the syntax itself, so this reader only
/// has to take valid PromQL apart.)
fn references(expr: &str) -> Vec<Reference> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&chars, i);
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
        } else if c == '{' {
            panic!("a selector without a metric name in {expr}");
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let end = ident_end(&chars, i);
            let word: String = chars[i..end].iter().collect();
            let next = skip_spaces(&chars, end);
            i = end;
            if LABEL_LISTS.contains(&word.as_str()) {
                if chars.get(next) == Some(&'(') {
                    i = next;
                    while i < chars.len() && chars[i] != ')' {
                        i += 1;
                    }
                }
            } else if KEYWORDS.contains(&word.as_str()) || chars.get(next) == Some(&'(') {
                // an aggregation, an operator or a function
            } else {
                let mut labels = Vec::new();
                if chars.get(next) == Some(&'{') {
                    (labels, i) = matchers(&chars, next);
                }
                out.push(Reference { name: word, labels });
            }
            continue;
        }
        i += 1;
    }
    out
}

/// Grafana's variables replaced by what PromQL takes: intervals by durations, `$pipeline` and
/// the like (always inside a `=~` string here) by `.*`.
fn without_variables(query: &str) -> String {
    let mut q = query
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h");
    while let Some(at) = q.find('$') {
        let end = q
            .split_at(at + 1) // `$` is one byte
            .1
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(q.len(), |n| at + 1 + n);
        q.replace_range(at..end, ".*");
    }
    q
}

/// Every PromQL query of the dashboard: panel targets, and the metric selector of each
/// `label_values(SELECTOR, LABEL)` variable.
fn dashboard_queries() -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                for v in m.values() {
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(dashboard_file()).expect("read the dashboard");
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    for var in dash["templating"]["list"].as_array().expect("variables") {
        let query = match &var["query"] {
            Value::String(s) => s.clone(),
            Value::Object(o) => o
                .get("query")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            _ => String::new(),
        };
        if let Some(args) = query
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
        {
            let (selector, _label) = args
                .rsplit_once(',')
                .expect("label_values(SELECTOR, LABEL)");
            out.push(selector.trim().to_owned());
        }
    }
    out
}

/// The rules file's recording rules (name, expression) and alerting expressions.
fn rules() -> (Vec<(String, String)>, Vec<String>) {
    use yaml_rust2::YamlLoader;
    let text = std::fs::read_to_string(rules_file()).expect("read the rules");
    let docs = YamlLoader::load_from_str(&text).expect("the rules are YAML");
    let (mut recorded, mut alerts) = (Vec::new(), Vec::new());
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr").to_owned();
            match rule["record"].as_str() {
                Some(name) => recorded.push((name.to_owned(), expr)),
                None => alerts.push(expr),
            }
        }
    }
    (recorded, alerts)
}

#[test]
fn the_promql_reader_finds_metric_names_and_matcher_labels_not_functions_or_label_lists() {
    let refs = references(
        r#"histogram_quantile(0.99, sum by (pipeline, le) (rate(a_bucket{job=~"x|y", le!="1"}[5m])))
           / on (job) group_left (instance) b_total offset 1h > bool 0.5 and time() - c:rec:rate5m
           unless count without (d) (e{f="}{,\"g"})"#,
    );
    let got: Vec<(&str, Vec<&str>)> = refs
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.labels.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a_bucket", vec!["job", "le"]),
            ("b_total", vec![]),
            ("c:rec:rate5m", vec![]),
            ("e", vec!["f"]),
        ]
    );
    assert_eq!(
        without_variables(r#"rate(x{job=~"$job"}[$__rate_interval])"#),
        r#"rate(x{job=~".*"}[5m])"#
    );
}

#[test]
fn the_rules_pass_promtool_and_the_dashboards_queries_are_valid_promql() {
    let dir = rules_file().parent().expect("deploy/prometheus").to_owned();
    let checked = promtool(&["check", "rules", "sharehost-rules.yml"], &dir);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "sharehost-rules.test.yml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // promtool checks any expression given as a recording rule: one per dashboard query.
    let queries = dashboard_queries();
    let mut text = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, q) in queries.iter().enumerate() {
        let expr = serde_json::to_string(&without_variables(q)).expect("json string");
        text += &format!("      - record: dashboard:query_{n}\n        expr: {expr}\n");
    }
    let scratch = std::env::temp_dir().join(unique("sharehost-dashboard"));
    std::fs::create_dir_all(&scratch).expect("temp dir");
    std::fs::write(scratch.join("dashboard-queries.yml"), text).expect("write");
    let checked = promtool(&["check", "rules", "dashboard-queries.yml"], &scratch);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
    let names: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| references(q))
        .map(|r| r.name)
        .collect();
    assert!(names.len() >= 30, "the dashboard names {names:?}");
}

// ---- a busy host ---------------------------------------------------------------------------

/// A host with two pipelines doing what an operator watches: `orders` (every 7th id and every
/// value that is no id rejected and dead-lettered) with a canary that traps on every 5th call
/// of an instance and a shadow that rejects more, and `payments`, whose plugin traps on every
/// second call and whose faulted records are dead-lettered (it may call one host over HTTP,
/// and never does).
struct Busy {
    host: HostProcess,
    client: Arc<KafkaClient>,
    orders: String,
    payments: String,
    payments_dlq: String,
    dir: PathBuf,
}

fn status_of<'a>(status: &'a Value, name: &str) -> &'a Value {
    status
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or(&Value::Null)
}

fn total(p: &Value, field: &str) -> u64 {
    p["versions"]
        .as_object()
        .map(|m| m.values().map(|c| c[field].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// Polls the admin API until `cond` holds on `GET /pipelines` (the host has no way to notify;
/// each look is an HTTP request), failing with the last status after [`PATIENCE`].
fn wait_for_status(host: &HostProcess, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = host.status();
        if cond(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {what}: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn busy_host() -> Busy {
    let client = Arc::new(client().await);
    let (orders, orders_dlq) = topic_with_dead_letters(&client, "console-orders", 3, 1).await;
    let (payments, payments_dlq) = topic_with_dead_letters(&client, "console-payments", 1, 1).await;
    let orders_group = fresh_group(&client, None).await;
    let payments_group = fresh_group(&client, None).await;
    let dir = std::env::temp_dir().join(unique("sharehost-console"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ledger = guest("fixture_ledger");
    let manifest = dir.join("host.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"[cluster]
bootstrap = "{bootstrap}"

[admin]
listen = "127.0.0.1:0"
token_env = "SHAREHOST_CONSOLE_TEST_TOKEN"

[[pipeline]]
name = "orders"
topics = ["{orders}"]
group = "{orders_group}"
component = "{ledger}"
config = {{ reject-every = "7" }}
batch_size = 20
concurrency = 2
dead_letter_topic = "{orders_dlq}"

[[pipeline]]
name = "payments"
topics = ["{payments}"]
group = "{payments_group}"
component = "{ledger}"
config = {{ trap-every = "2" }}
fault_policy = "reject"
# Granted, never used: the outbound HTTP series of a pipeline that may call out.
allowed_outbound_hosts = ["https://payments.example"]
batch_size = 20
dead_letter_topic = "{payments_dlq}"
"#,
            bootstrap = bootstrap(),
            ledger = ledger.display(),
        ),
    )
    .expect("write manifest");
    // A canary that judges the same (every 7th id rejected) and traps on every 5th call of an
    // instance, kept running by bounds it cannot break; a shadow that rejects every 3rd id.
    let canary = dir.join("canary.wasm");
    std::fs::write(
        &canary,
        new_version(&guest("fixture_ledger_trap5"), "console"),
    )
    .expect("canary");
    let state = dir.join("state");
    let host = blocking({
        let (manifest, state) = (manifest.clone(), state.clone());
        move || {
            HostProcess::start_with_env(
                sharehost_bin!(),
                &manifest,
                "host",
                &[
                    ("SHAREHOST_CONSOLE_TEST_TOKEN", TOKEN),
                    ("SHAREHOST_STATE_DIR", state.to_str().expect("utf-8 path")),
                ],
            )
        }
    })
    .await;
    let host = blocking(move || {
        let deadline = Instant::now() + PATIENCE;
        while host.http("GET", "/readyz", "").0 != 200 {
            assert!(Instant::now() < deadline, "the host never got ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        let auth = format!("Bearer {TOKEN}");
        let json = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
        let body = serde_json::json!({
            "path": canary, "percent": 50, "promote_after": {"batches": 1_000_000},
            "rollback_if": {"max_fault_rate": 1.0, "max_reject_rate_increase": 1.0, "max_release_rate_increase": 1.0},
        });
        let (code, text) = host.request("POST", "/pipelines/orders/canary", &json, &body.to_string());
        assert_eq!(code, 200, "canary: {text}");
        let body = serde_json::json!({ "path": guest("fixture_ledger_strict"), "sample": 1.0 });
        let (code, text) = host.request("POST", "/pipelines/orders/shadow", &json, &body.to_string());
        assert_eq!(code, 200, "shadow: {text}");
        host
    })
    .await;

    produce_ids(&client, &orders, 3, 0..ORDER_IDS).await;
    let hostile: Vec<ProduceRecord> = (0..HOSTILE_RECORDS)
        .map(|_| ProduceRecord {
            value: Some(Bytes::from_static(HOSTILE_VALUE.as_bytes())),
            ..Default::default()
        })
        .collect();
    client
        .produce(&orders, 1, &hostile, Compression::None)
        .await
        .expect("produce hostile values");
    produce_ids(&client, &payments, 1, 0..PAYMENT_IDS).await;

    let orders_rejected = ORDER_IDS.div_ceil(7) + HOSTILE_RECORDS as u64;
    let host = blocking(move || {
        wait_for_status(&host, "every record judged, the canary faulting", |s| {
            let o = status_of(s, "orders");
            let p = status_of(s, "payments");
            o["dead_lettered"] == orders_rejected
                && total(o, "accepted") + total(o, "rejected") == ORDER_IDS + HOSTILE_RECORDS as u64
                && o["canary"]["candidate_tally"]["faulted_batches"].as_u64() > Some(0)
                && o["canary"]["active_tally"]["records"].as_u64() > Some(0)
                && o["shadow"]["records"].as_u64() > Some(0)
                && total(p, "faults") > 0
                && total(p, "accepted") + p["dead_lettered"].as_u64().unwrap_or(0) == PAYMENT_IDS
        });
        // The lag appears with the coordinator's first answer (every 10 s).
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, metrics) = host.http("GET", "/metrics", "");
            let lagged = ["orders", "payments"].iter().all(|p| {
                metrics
                    .lines()
                    .any(|l| l.starts_with(&format!("sharehost_share_group_lag{{pipeline=\"{p}\"")))
            });
            if lagged {
                break;
            }
            assert!(Instant::now() < deadline, "no lag series in:\n{metrics}");
            std::thread::sleep(Duration::from_millis(500));
        }
        host
    })
    .await;
    Busy {
        host,
        client,
        orders,
        payments,
        payments_dlq,
        dir,
    }
}

// ---- the metrics a running host exports ---------------------------------------------------

/// What a scrape shows: each sample name with the label names its series carry, and the
/// families declared by `# TYPE` (a family without a series yet still names its samples).
struct Exposition {
    samples: HashMap<String, BTreeSet<String>>,
    declared: HashMap<String, String>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut samples: HashMap<String, BTreeSet<String>> = HashMap::new();
        let mut declared = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    declared.insert(name.to_owned(), kind.to_owned());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let chars: Vec<char> = line.chars().collect();
            let end = ident_end(&chars, 0);
            let name: String = chars[..end].iter().collect();
            let labels = samples.entry(name).or_default();
            if chars.get(end) == Some(&'{') {
                labels.extend(matchers(&chars, end).0);
            }
        }
        Exposition { samples, declared }
    }

    /// Sample names of family `name` as its type makes them.
    fn names_of(name: &str, kind: &str) -> Vec<String> {
        match kind {
            "counter" => vec![format!("{name}_total")],
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{name}{s}"))
                .collect(),
            _ => vec![name.to_owned()],
        }
    }

    fn exports(&self, name: &str) -> bool {
        self.samples.contains_key(name)
            || self
                .declared
                .iter()
                .any(|(family, kind)| Exposition::names_of(family, kind).iter().any(|n| n == name))
    }
}

/// `GET /metrics` of the admin listener at `admin`.
fn scrape(admin: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin).expect("connect to the admin listener");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// Labels Prometheus adds to every series it scrapes (the target's), beside the host's own.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// Names no exporter exports: Prometheus makes `up` for every target it scrapes.
const PROMETHEUS_OWN: &[&str] = &["up"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_rules_name_is_exported_by_a_running_host() {
    let busy = busy_host().await;
    // A write that fails: the payments dead-letter topic deleted, new faulted records to
    // dead-letter (retried while the test looks; the host is killed at the end).
    busy.client
        .delete_topic(&busy.payments_dlq)
        .await
        .expect("delete the dead-letter topic");
    produce_ids(
        &busy.client,
        &busy.payments,
        1,
        PAYMENT_IDS..PAYMENT_IDS + 100,
    )
    .await;
    let text = blocking({
        let admin = busy.host.admin().to_owned();
        move || {
            let deadline = Instant::now() + PATIENCE;
            loop {
                let text = scrape(&admin);
                if text.contains("sharehost_write_failures_total{") {
                    return text;
                }
                assert!(Instant::now() < deadline, "no failed write in:\n{text}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    })
    .await;
    let exposition = Exposition::parse(&text);
    let (recorded, alerts) = rules();
    let recorded_names: HashSet<&str> = recorded.iter().map(|(n, _)| n.as_str()).collect();

    let mut uses: BTreeMap<String, BTreeSet<Reference>> = BTreeMap::new();
    for (name, expr) in &recorded {
        uses.entry(format!("recording rule {name}"))
            .or_default()
            .extend(references(expr));
    }
    for (n, expr) in alerts.iter().enumerate() {
        uses.entry(format!("alert expression {n}"))
            .or_default()
            .extend(references(expr));
    }
    for q in dashboard_queries() {
        uses.entry(format!("dashboard query {q}"))
            .or_default()
            .extend(references(&without_variables(&q)));
    }
    let mut missing = Vec::new();
    let mut used = HashSet::new();
    for (place, refs) in &uses {
        for r in refs {
            used.insert(r.name.clone());
            if recorded_names.contains(r.name.as_str()) || PROMETHEUS_OWN.contains(&r.name.as_str())
            {
                continue;
            }
            if !exposition.exports(&r.name) {
                missing.push(format!("{place}: {} is not exported", r.name));
                continue;
            }
            if let Some(labels) = exposition.samples.get(&r.name) {
                for l in &r.labels {
                    if !labels.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                        missing.push(format!(
                            "{place}: {} has no label {l} (it has {labels:?})",
                            r.name
                        ));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "names the host does not export:\n{}\n\nits /metrics:\n{text}",
        missing.join("\n")
    );
    for name in [
        "sharehost_records_total",
        "sharehost_share_group_lag",
        "sharehost_ready",
    ] {
        assert!(used.contains(name), "{name} is watched");
    }

    // And the other way round: every family the host exports has a panel or a rule.
    let unwatched: Vec<&String> = exposition
        .declared
        .iter()
        .filter(|(family, kind)| {
            !Exposition::names_of(family, kind)
                .iter()
                .any(|n| used.contains(n))
        })
        .map(|(family, _)| family)
        .collect();
    assert!(
        unwatched.is_empty(),
        "families no panel or rule shows: {unwatched:?}"
    );
    let _ = blocking(move || busy.host.kill()).await;
}

// ---- the console ----------------------------------------------------------------------------

/// Where playwright-core is installed: `npm ci` from tests/console's lockfile into target/, once.
fn node_modules() -> PathBuf {
    let src = repo_root().join("tests/console");
    let dir = repo_root().join("target/console-node");
    let lock =
        std::fs::read(src.join("package-lock.json")).expect("tests/console/package-lock.json");
    let installed = std::fs::read(dir.join("package-lock.json")).ok();
    if installed.as_deref() != Some(&lock[..]) || !dir.join("node_modules/playwright-core").is_dir()
    {
        std::fs::create_dir_all(&dir).expect("target/console-node");
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dir.join(f)).expect("copy the package files");
        }
        let ok = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--silent"])
            .current_dir(&dir)
            .status()
            .expect("run npm (Node.js is needed for the console test)")
            .success();
        assert!(ok, "npm ci in {} failed", dir.display());
    }
    dir
}

/// Debian's Chromium (or `CHROMIUM`), which the browser tests need.
fn chromium() -> String {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: install Debian's chromium (dev/test does)"
    );
    chromium
}

/// Where the browser test's screenshots go.
fn screenshots() -> PathBuf {
    std::env::var_os("SHAREHOST_CONSOLE_SCREENSHOTS")
        .map(|d| repo_root().join(d))
        .unwrap_or_else(|| repo_root().join("target/console-screenshots"))
}

/// Runs tests/console/console.test.mjs in Chromium against the host at `admin`, checking what
/// `expect` names; fails the test with the script's report when a check fails.
async fn browser_test(admin: &str, expect: &Value, shots: &Path, modules: &Path, chromium: &str) {
    let mut cmd = Command::new("node");
    cmd.arg(repo_root().join("tests/console/console.test.mjs"))
        .env("CONSOLE_URL", format!("http://{admin}"))
        .env("CONSOLE_TOKEN", TOKEN)
        .env("CONSOLE_EXPECT", expect.to_string())
        .env("CONSOLE_SCREENSHOTS", shots)
        .env("CONSOLE_NODE_MODULES", modules)
        .env("CHROMIUM", chromium);
    let out = blocking(move || cmd.output()).await.expect("run node");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{report}");
    assert!(out.status.success(), "the browser test failed:\n{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_pipelines_rollouts_and_dead_letters_and_replays_only_with_the_token() {
    let chromium = chromium();
    let modules = blocking(node_modules).await;
    let busy = busy_host().await;
    let host = &busy.host;
    // Records keep arriving while the page is open, so its charts have rates to draw: ids the
    // orders plugin accepts (its dead letters stay as counted), and payments ids. A load, paced;
    // nothing waits on it.
    let traffic = tokio::spawn({
        let (client, orders, payments) = (
            busy.client.clone(),
            busy.orders.clone(),
            busy.payments.clone(),
        );
        async move {
            for round in 0u64.. {
                let base = 1_000_000 + round * 70;
                let accepted: Vec<u64> = (0..10).map(|k| base + 7 * k + 1).collect();
                let records: Vec<ProduceRecord> = accepted
                    .iter()
                    .map(|id| ProduceRecord {
                        value: Some(Bytes::from(id.to_string())),
                        ..Default::default()
                    })
                    .collect();
                let p = i32::try_from(round % 3).unwrap_or(0);
                let _ = client
                    .produce(&orders, p, &records, Compression::None)
                    .await;
                let _ = client
                    .produce(&payments, 0, &records, Compression::None)
                    .await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });

    // The API under the page first: reading is open, acting needs the token and a JSON body.
    let (code, text) = host.http("GET", "/host", "");
    assert_eq!(code, 200, "{text}");
    let about: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        (
            about["actions_need_token"].as_bool(),
            about["ready"].as_bool()
        ),
        (Some(true), Some(true))
    );
    let (code, text) = host.http("GET", "/pipelines/orders/dead-letters", "");
    assert_eq!(code, 200, "{text}");
    let view: Value = serde_json::from_str(&text).expect("json");
    let groups: BTreeMap<&str, (u64, u64)> = view["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            (
                g["shape"].as_str().unwrap_or_default(),
                (
                    g["count"].as_u64().unwrap_or(0),
                    g["to_replay"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect();
    let divisible = ORDER_IDS.div_ceil(7);
    let hostile = HOSTILE_RECORDS as u64;
    assert_eq!(
        groups,
        BTreeMap::from([
            ("ledger: # is divisible by #", (divisible, divisible)),
            ("ledger: value is not a decimal id", (hostile, hostile)),
        ]),
        "{view:#}"
    );
    let replay = "/pipelines/orders/dead-letters/replay";
    let body = r#"{"reason": "^ledger: value is not a decimal id$", "dry_run": true}"#;
    let (code, _) = host.request(
        "POST",
        replay,
        &[("Content-Type", "application/json")],
        body,
    );
    assert_eq!(code, 401, "no token");
    let auth = format!("Bearer {TOKEN}");
    let (code, _) = host.request(
        "POST",
        replay,
        &[("Content-Type", "text/plain"), ("Authorization", &auth)],
        body,
    );
    assert_eq!(code, 415, "a form's body is not taken");
    let (code, text) = host.request(
        "POST",
        replay,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &auth),
        ],
        body,
    );
    assert_eq!(code, 200, "{text}");
    let dry: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(dry["summary"]["replayed"], hostile, "{dry}");
    let (code, text) = host.http("GET", "/faults", "");
    assert_eq!(code, 200);
    let faults: Value = serde_json::from_str(&text).expect("json");
    let roles: HashSet<(&str, &str)> = faults["faults"]
        .as_array()
        .expect("faults")
        .iter()
        .map(|f| {
            (
                f["pipeline"].as_str().unwrap_or(""),
                f["role"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        roles.contains(&("orders", "canary")) && roles.contains(&("payments", "active")),
        "{faults:#}"
    );

    // The page, in Chromium.
    let shots = screenshots();
    let expect = serde_json::json!({
        "pipelines": ["orders", "payments"],
        "canary_pipeline": "orders",
        "faulty_pipeline": "payments",
        "orders_rejected": divisible + hostile,
        "groups": {
            "ledger: # is divisible by #": divisible,
            "ledger: value is not a decimal id": hostile,
        },
        "replay_group": "ledger: value is not a decimal id",
        "hostile_value": HOSTILE_VALUE,
        "fault_roles": ["canary", "active"],
    });
    browser_test(host.admin(), &expect, &shots, &modules, &chromium).await;
    for page in [
        "console-host.png",
        "console-pipeline.png",
        "console-faults.png",
    ] {
        assert!(shots.join(page).is_file(), "{page} was taken");
    }

    // The click replayed the hostile records to their topic, once each, and nothing else.
    let replayed: Vec<String> = topic_records(&busy.client, &busy.orders, 3)
        .await
        .iter()
        .filter(|(_, r)| r.headers.iter().any(|h| h.key == "sharehost.replayed-from"))
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(replayed, vec![HOSTILE_VALUE.to_owned(); HOSTILE_RECORDS]);
    let state = std::fs::read_dir(busy.dir.join("state"))
        .expect("the replay state directory")
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("dlq-replay-"));
    assert!(
        state,
        "the replay was remembered where `sharehost dlq` looks"
    );
    traffic.abort();
    let Busy { host, .. } = busy;
    let _ = blocking(move || host.stop()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_fleet_its_canary_and_a_stale_host() {
    let chromium = chromium();
    let modules = blocking(node_modules).await;
    let client = Arc::new(client().await);
    let topic = unique("console-fleet");
    client.create_topic(&topic, 3, 1, &[]).await.expect("topic");
    let group = fresh_group(&client, None).await;
    let kit = FleetKit::new("payments");
    let manifest = |id: &str| {
        // A host silent for 3 s is stale, so the killed one is marked soon.
        kit.manifest(
            id,
            "stale_after_ms = 3000\n\n",
            &ledger_manifest(&bootstrap(), &topic, &group, &kit.v1, "", ""),
        )
    };
    let start = |id: &str| kit.start(sharehost_bin!(), &manifest(id), id);
    let (a, b) = (start("a"), start("b"));
    produce_ids(&client, &topic, 3, 0..300).await;
    let candidate = kit.version(&kit.v1, "console-v2");
    kit.fleet(
        sharehost_bin!(),
        &manifest("operator"),
        &[
            "canary",
            candidate.to_str().expect("utf-8 path"),
            "--percent",
            "50",
            "--promote-after-batches",
            "1000000",
        ],
    );
    // Records keep arriving while the page is open (a load, paced; nothing waits on it).
    let traffic = tokio::spawn({
        let (client, topic) = (client.clone(), topic.clone());
        async move {
            for round in 0u64.. {
                produce_ids(
                    &client,
                    &topic,
                    3,
                    1_000 + round * 30..1_000 + (round + 1) * 30,
                )
                .await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    poll_all(&[&a, &b], "the canary running on both hosts", |p| {
        p["canary"]["state"] == "running"
    });
    // Host b is heard by the fleet (its first status read by host a) before it dies.
    poll_fleet(&a, "host a hearing from host b", |v| {
        v["hosts"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(|h| h["host"] == "b"))
    });
    // Host b dies: the fleet shows it stale once it is silent for stale_after_ms.
    let _ = blocking(move || b.kill()).await;
    let expect = serde_json::json!({
        "fleet": {
            "name": "payments",
            "pipeline": "ledger",
            "hosts": ["a", "b"],
            "live": "a",
            "stale": "b",
        },
    });
    browser_test(a.admin(), &expect, &screenshots(), &modules, &chromium).await;
    assert!(screenshots().join("console-fleet.png").is_file());
    traffic.abort();
    let _ = blocking(move || a.stop()).await;
}
