//! OpenTelemetry traces against the real broker and a real OpenTelemetry Collector
//! (`dev/otelcol`, OTLP in, its file exporter read by `dev/traces.py`): a record produced with a
//! producer's `traceparent` is judged in the producer's trace (the batch's span and the
//! record's are its children, with the verdict on the record's), the plugin's HTTP call to the
//! scoring service carries the batch's span, and the record the plugin emits carries the
//! record's span as its own `traceparent`, so the output's consumer continues the same trace.

use std::net::SocketAddr;
use std::process::Command;

use serde_json::{Value, json};
use sharehost_tests::host::{HostProcess, Watch};
use sharehost_tests::topics::{Follower, consume_all};
use sharehost_tests::{bootstrap, guest, repo_root, sharehost_bin, unique};

/// A scoring service that keeps the `traceparent` of every call it gets.
fn scoring_service() -> (
    tokio::runtime::Runtime,
    String,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/score",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
                    kept.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(tp.to_owned());
                }
                json!({"score": 12}).to_string()
            }
        }),
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let addr: SocketAddr = rt.block_on(sharehost_tests::serve_on_loopback(app));
    (rt, format!("http://{addr}"), seen)
}

/// The collector's OTLP/HTTP endpoint (`dev/otelcol up`, which dev/test starts).
fn collector() -> String {
    let ok = Command::new(repo_root().join("dev/otelcol"))
        .arg("status")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "no trace collector: start one with `dev/otelcol up` (dev/test does)"
    );
    format!(
        "http://127.0.0.1:{}",
        std::env::var("OTELCOL_OTLP_HTTP_PORT").unwrap_or_else(|_| "14318".to_owned())
    )
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().expect(what);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The trace's spans as the collector received them (waiting until there are `n`).
fn spans(trace: &str, n: usize) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(repo_root().join("dev/traces.py"))
        .args(["wait", "--trace-id", trace, "--spans", &n.to_string()])
        .args(["--timeout", "180", "--otlp-file"])
        .arg(repo_root().join("target/otelcol/spans.jsonl"))
        .output()
        .expect("run dev/traces.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("spans as JSON")
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

#[test]
fn a_record_is_judged_in_its_producers_trace_and_its_emit_continues_it() {
    let endpoint = collector();
    let token = unique("token");
    let (_service, score_url, calls) = scoring_service();
    let base = unique("traces");
    let (input, scored, dlq) = (
        format!("{base}-orders"),
        format!("{base}-scored"),
        format!("{base}-dlq"),
    );
    let dir = std::env::temp_dir().join(&base);
    std::fs::create_dir_all(&dir).expect("dir");
    let manifest = dir.join("manifest.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"[cluster]
bootstrap = "{boot}"

[admin]
listen = "127.0.0.1:0"

[telemetry]
otlp_endpoint = "{endpoint}"
service_name = "{base}"

[[pipeline]]
name = "fraud-check-traced"
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
"#,
            boot = bootstrap(),
            component = guest("fraud_check").display(),
        ),
    )
    .expect("write the manifest");
    // The producer's span, as an instrumented producer writes it into the record.
    let (trace, producer_span) = (random_hex(16), random_hex(8));
    let order = json!({"id": "o-1", "amount": 120.5, "customer": "c-7"}).to_string();
    let records = dir.join("records.jsonl");
    std::fs::write(
        &records,
        json!({"key": "o-1", "value": order, "headers": [["traceparent", format!("00-{trace}-{producer_span}-01")]]})
            .to_string()
            + "\n",
    )
    .expect("write the record");
    let bin = sharehost_bin!();
    run(
        Command::new(bin)
            .args(["create-topics", &input, &scored, &dlq, "--manifest"])
            .arg(&manifest),
        "create-topics",
    );
    run(
        Command::new(bin)
            .args(["produce", &input, "--manifest"])
            .arg(&manifest)
            .arg("--input")
            .arg(&records),
        "produce",
    );
    let watch = Watch::default();
    let out = Follower::start(bin, &manifest, &scored, &watch);
    let host = HostProcess::start_watched_with_env(
        bin,
        &manifest,
        "traces",
        &watch,
        &[("SCORING_TOKEN", &token)],
    );
    watch.wait_until("the scored order", || {
        assert!(!host.seen().ended, "the host ended");
        !out.records().is_empty()
    });
    // The host counts what became of its spans: the batch's and the record's, ended and taken
    // by the collector (the export queue is sent every half second), none failed.
    let spans_total = |outcome: &str| -> Option<u64> {
        let (_, text) = host.http("GET", "/metrics", "");
        let key = format!("sharehost_trace_spans_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|n| n.trim().parse().ok())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while spans_total("exported") != Some(2) {
        assert!(
            std::time::Instant::now() < deadline,
            "the host's /metrics never counted the two spans exported: {:?} ended, {:?} exported",
            spans_total("ended"),
            spans_total("exported")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        (spans_total("ended"), spans_total("failed")),
        (Some(2), Some(0))
    );
    // Stopping the host sends the spans it still holds.
    host.stop_with_log();
    drop(out);

    let got = spans(&trace, 2);
    let by_name = |name: &str| -> &Value {
        got.iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span: {got:#?}"))
    };
    let batch = by_name("sharehost.batch");
    let record = by_name("sharehost.record");
    assert_eq!(batch["parent_span_id"], producer_span, "{batch:#}");
    assert_eq!(record["parent_span_id"], producer_span, "{record:#}");
    assert_eq!(record["service"], base.as_str());
    assert_eq!(record["attributes"]["sharehost.verdict"], "accept");
    assert_eq!(
        record["attributes"]["messaging.destination.name"],
        input.as_str()
    );
    assert_eq!(record["attributes"]["messaging.kafka.offset"], 0);

    // The plugin's call to the scoring service continued the batch's span.
    let calls = calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(
        calls,
        [format!(
            "00-{trace}-{}-01",
            batch["span_id"].as_str().expect("a span id")
        )],
        "the scoring service got the batch's span as its parent"
    );

    // The emitted order carries the record's span: its consumer continues the trace there.
    let emitted = consume_all(bin, &manifest, &scored);
    assert_eq!(emitted.len(), 1, "{emitted:#?}");
    let traceparent = emitted[0]["headers"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h[0] == "traceparent"))
        .and_then(|h| h[1].as_str())
        .unwrap_or_else(|| panic!("no traceparent on the emit: {:#}", emitted[0]));
    assert_eq!(
        traceparent,
        format!(
            "00-{trace}-{}-01",
            record["span_id"].as_str().expect("a span id")
        )
    );
}
