//! One plugin in three languages: the order-validator written in Rust (examples/order-validator),
//! Python (examples/python/order-validator) and JavaScript (examples/js/order-validator) must
//! decide the same way, reason for reason, on the same records. Run through `sharehost
//! test-plugin`, the way an author tries a plugin offline, on
//! tests/fixtures/orders-three-languages.jsonl: valid orders, every rejection reason, and the
//! JSON edge cases where parsers disagree (5.0 and 1e2 as quantities, `true` as a number,
//! integers past 2^53 and 2^64, lone surrogates, deep nesting, duplicate keys).

use std::path::{Path, PathBuf};
use std::process::Command;

use sharehost::runtime::{BatchOutcome, PluginLimits, Verdict};
use sharehost_tests::{guest, plugin_record, plugin_runtime, repo_root};

const LANGUAGES: [(&str, &str); 3] = [
    ("Rust", "order_validator"),
    ("Python", "order_validator_py"),
    ("JavaScript", "order_validator_js"),
];

fn orders() -> PathBuf {
    repo_root().join("tests/fixtures/orders-three-languages.jsonl")
}

/// Runs `sharehost test-plugin` and returns (success, verdict lines, summary, stderr).
fn test_plugin(component: &Path, input: &Path, config: &[&str]) -> (bool, Vec<String>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sharehost"));
    cmd.arg("test-plugin")
        .arg(component)
        .arg("--input")
        .arg(input)
        .env("SHAREHOST_LOG", "off");
    for c in config {
        cmd.args(["--config", c]);
    }
    let out = cmd.output().expect("run sharehost");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    if out.status.success() {
        let summary = lines.pop().unwrap_or_default();
        assert!(summary.starts_with(r#"{"summary""#), "{summary}");
    }
    (
        out.status.success(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_order_validator_decides_alike_in_rust_python_and_javascript() {
    let input = orders();
    let records = std::fs::read_to_string(&input)
        .expect("input")
        .lines()
        .count();
    for config in [&[][..], &["max-quantity=5"][..]] {
        let (ok, rust, stderr) = test_plugin(&guest("order_validator"), &input, config);
        assert!(ok, "{stderr}");
        assert_eq!(rust.len(), records);
        // The file exercises every decision, not just one.
        let reasons: std::collections::BTreeSet<&str> = rust
            .iter()
            .filter_map(|l| l.split(r#""reason":""#).nth(1))
            .filter_map(|r| r.split('"').next())
            .collect();
        assert!(reasons.len() >= 10, "{reasons:?}");
        assert!(rust.iter().any(|l| l.contains(r#""verdict":"accept""#)));
        for (language, name) in &LANGUAGES[1..] {
            let (ok, other, stderr) = test_plugin(&guest(name), &input, config);
            assert!(ok, "{language}: {stderr}");
            assert_eq!(other.len(), rust.len(), "{language}: one line per record");
            for (r, o) in rust.iter().zip(&other) {
                assert_eq!(o, r, "{language} differs from Rust ({config:?})");
            }
        }
    }
}

#[test]
fn each_language_refuses_a_bad_configuration_at_load() {
    let input = orders();
    for (language, name) in LANGUAGES {
        let (ok, lines, stderr) = test_plugin(&guest(name), &input, &["max-quantity=lots"]);
        assert!(!ok, "{language} accepted max-quantity=lots");
        assert!(lines.is_empty(), "{language}: nothing judged");
        assert!(
            stderr.contains("init refused the configuration") && stderr.contains("max-quantity"),
            "{language}: {stderr}"
        );
    }
}

#[test]
fn python_runs_on_demand_and_says_why_rust_and_javascript_in_the_pool() {
    let input = orders();
    for (language, name, allocator) in [
        ("Rust", "order_validator", "pooling"),
        ("Python", "order_validator_py", "on-demand"),
        ("JavaScript", "order_validator_js", "pooling"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sharehost"))
            .arg("test-plugin")
            .arg(guest(name))
            .arg("--input")
            .arg(&input)
            .env("SHAREHOST_LOG", "off")
            .output()
            .expect("run sharehost");
        assert!(out.status.success(), "{language}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let summary: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("summary");
        let summary = &summary["summary"];
        assert_eq!(summary["allocator"], allocator, "{language}: {summary}");
        if allocator == "on-demand" {
            let reason = summary["allocator_reason"].as_str().unwrap_or_default();
            assert!(reason.contains("core module instances"), "{reason}");
        }
    }
}

/// componentize-js 0.23 components grow by about a batch's bytes on every call (memory the
/// toolchain never frees). The host replaces an instance that used 3/4 of its memory headroom
/// between batches: 60 batches of 500 × 1 KiB under a 32 MiB limit, where the first instance
/// alone would run out after about two dozen, all judged without a fault.
#[tokio::test]
async fn a_javascript_instance_that_leaks_per_call_is_replaced_before_it_runs_out_of_memory() {
    let rt = plugin_runtime();
    let limits = PluginLimits {
        max_memory: 32 << 20,
        ..PluginLimits::default()
    };
    let mut plugin = rt
        .load(&guest("order_validator_js"), limits, Vec::new())
        .await
        .expect("loads");
    let batch: Vec<_> = (0..500)
        .map(|i| {
            let head = format!(r#"{{"id":"o{i}","sku":"S","quantity":1,"price":1.5,"note":""#);
            let value = format!("{head}{}\"}}", "x".repeat(1024 - head.len() - 2));
            plugin_record(i, &value, &[])
        })
        .collect();
    for n in 0..60 {
        match plugin.handle(&batch).await {
            BatchOutcome::Verdicts(v) => assert!(v.iter().all(|v| *v == Verdict::Accept)),
            BatchOutcome::Fault(f) => panic!("batch {n} faulted: {f:?}"),
        }
    }
    let stats = plugin.stats();
    assert!(stats.recycled_for_memory >= 1, "{stats:?}");
    assert_eq!(stats.faults, 0);
}
