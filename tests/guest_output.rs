//! What a guest prints reaches the host's log, with the plugin's (and its pipeline's) name and
//! bounded.
//!
//! Its own test binary, with the process-wide subscriber, because the log is read through
//! `tracing`, and a thread-local subscriber (`set_default`) loses events in a binary whose
//! other tests run on other threads: every `tracing` call site caches, once for the whole
//! process, whether anyone listens, and while a single subscriber is registered that answer
//! comes from the thread that reaches the call site first. A test beside this one whose guest
//! panics reaches the host's stderr call site first (the panic message goes through it) on a
//! thread without a subscriber, and the call site then stays silent for this test too. Alone
//! in its process, with the global subscriber installed before anything logs, every call site
//! is registered with it.

use std::time::Duration;

use sharehost::runtime::{PluginInit, PluginLimits, Record};
use sharehost_tests::{CapturedLog, guest, plugin_record as record, plugin_runtime as runtime};

fn poison_batch() -> Vec<Record> {
    vec![
        record(20, "fine", &[]),
        record(21, "bad", &[]),
        record(22, "fine", &[]),
    ]
}

#[tokio::test]
async fn guest_output_is_logged_with_the_plugin_and_pipeline_names_and_bounded() {
    let captured = CapturedLog::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the only test of this binary installs the only subscriber");
    let rt = runtime();
    let mut plugin = rt
        .load(
            &guest("fixture_log_flood"),
            PluginLimits {
                max_memory: 16 << 20,
                // This test is about bounding output, not about time.
                batch_deadline: Duration::from_secs(30),
                ..PluginLimits::default()
            },
            Vec::new(),
        )
        .await
        .expect("loads");
    assert!(plugin.handle(&poison_batch()).await.fault().is_none());
    // The host logs what the guest printed before `handle` returns.
    let text = captured.text();
    let from_plugin: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("plugin=\"fixture_log_flood\""))
        .collect();
    let logged = from_plugin
        .iter()
        .filter(|l| !l.contains("stream="))
        .count();
    let stdout = from_plugin
        .iter()
        .filter(|l| l.contains("stream=\"stdout\""))
        .count();
    let stderr = from_plugin
        .iter()
        .filter(|l| l.contains("stream=\"stderr\""))
        .count();
    // The 64 KiB per-batch log budget holds 66 messages of 1000 bytes (+1 line saying how many
    // were dropped, +1 for dropped output), and at most 16 KiB of each stream is kept: 16
    // lines of 1000 characters, plus a cut one.
    assert!((66..=68).contains(&logged), "{logged} log lines");
    assert!((1..=17).contains(&stdout), "{stdout} stdout lines");
    assert!((1..=17).contains(&stderr), "{stderr} stderr lines");
    assert!(text.contains("were dropped"), "drops are reported");
    assert!(
        !from_plugin.iter().any(|l| l.contains("pipeline=")),
        "outside a pipeline, lines name the plugin only"
    );

    // Run by a pipeline, every line also names the pipeline: two pipelines may run one file.
    let mut plugin = rt
        .load_with(
            &guest("fixture_log_flood"),
            PluginLimits {
                max_memory: 16 << 20,
                batch_deadline: Duration::from_secs(30),
                ..PluginLimits::default()
            },
            PluginInit {
                tenant: Some("orders-eu".into()),
                ..PluginInit::default()
            },
        )
        .await
        .expect("loads");
    let before = captured.text().len();
    assert!(plugin.handle(&poison_batch()).await.fault().is_none());
    let text = captured.text();
    let lines: Vec<&str> = text
        .split_at(before) // the text only grew since
        .1
        .lines()
        .filter(|l| l.contains("plugin=\"fixture_log_flood\""))
        .collect();
    assert!(lines.len() > 60, "{} lines", lines.len());
    assert!(
        lines.iter().all(|l| l.contains("pipeline=\"orders-eu\"")),
        "every plugin line names its pipeline: {:?}",
        lines.iter().find(|l| !l.contains("pipeline="))
    );
}
