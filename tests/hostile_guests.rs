//! The sandbox against guests that attack the boundary itself rather than their records (the
//! bounded lift and the bounded host calls): verdicts freed by the guest before the host read
//! them, one host call that would outlast the deadline, and strings and lists that would make
//! the host copy far more than it keeps.
//!
//! The fixture `fixture_hostile` (tests/fixtures/guests/hostile) poisons every block it frees
//! and aliases one 48 MiB buffer from many strings. What the host allocates while it handles
//! a batch is measured by a counting global allocator: the bound under test is "the host
//! copies at most what it keeps", so the tests assert on bytes, never on time. The tests of
//! this file take one lock, so the counter sees one batch at a time.

use std::alloc::System;
use std::time::Duration;

use sharehost::runtime::{
    BatchOutcome, FaultKind, Plugin, PluginLimits, PluginRuntime, Record, RuntimeConfig, Verdict,
};
use sharehost_tests::{guest, plugin_record as record};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts every byte the host process allocates (all threads).
#[global_allocator]
static COUNTING: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One test at a time in this binary, so the allocation counter measures one batch.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the host may allocate for a hostile batch of a few records: what it keeps (a 1 KiB
/// reason or 4 KiB log message per record, the batch) plus the runtime's own bookkeeping.
/// The attacks below would cost 48 MiB to 192 MiB each when copied whole.
const HOST_BYTES_BOUND: usize = 8 << 20;

fn runtime() -> PluginRuntime {
    PluginRuntime::new(RuntimeConfig {
        max_plugin_memory: 128 << 20,
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

/// A deadline no batch here meets only on a machine too busy to run it: the attacks measure
/// bytes, not time (a 48 MiB buffer took more than 500 ms to fill beside other tests).
fn limits() -> PluginLimits {
    PluginLimits {
        max_memory: 128 << 20,
        batch_deadline: Duration::from_secs(60),
        ..PluginLimits::default()
    }
}

async fn hostile(rt: &PluginRuntime) -> Plugin {
    hostile_with(rt, limits()).await
}

async fn hostile_with(rt: &PluginRuntime, limits: PluginLimits) -> Plugin {
    rt.load(&guest("fixture_hostile"), limits, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("loading fixture_hostile: {e}"))
}

/// Handles `batch` and returns the outcome with the bytes the host allocated meanwhile.
async fn measured(plugin: &mut Plugin, batch: &[Record]) -> (BatchOutcome, usize) {
    let grown = || {
        let s = COUNTING.stats();
        s.bytes_allocated + s.bytes_reallocated.max(0).unsigned_abs()
    };
    let before = grown();
    let outcome = plugin.handle(batch).await;
    let allocated = grown() - before;
    eprintln!("the host allocated {allocated} bytes for this batch");
    (outcome, allocated)
}

/// The reason record `i` of the poison-on-free test rejects with: varied lengths (up to
/// 300 bytes, so batches of hundreds free blocks of every size class), multi-byte text.
fn reason(i: usize) -> String {
    format!("why-{i}-é✓-{}", "r".repeat(i % 300))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_are_read_before_the_guest_frees_them_at_every_batch_size() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let mut plugin = hostile(&rt).await;
    for size in 1..=500usize {
        let headers: Vec<(String, String)> = (0..size)
            .map(|i| match i % 4 {
                0 => ("verdict".into(), "accept".into()),
                1 => ("verdict".into(), "release".into()),
                2 => ("verdict".into(), "renew".into()),
                _ => ("verdict".into(), format!("reject:{}", reason(i))),
            })
            .collect();
        let batch: Vec<Record> = headers
            .iter()
            .enumerate()
            .map(|(i, (k, v))| record(i as i64, "fine", &[(k.as_str(), v.as_str())]))
            .collect();
        let expected: Vec<Verdict> = (0..size)
            .map(|i| match i % 4 {
                0 => Verdict::Accept,
                1 => Verdict::Release,
                2 => Verdict::Renew,
                _ => Verdict::Reject(Some(reason(i))),
            })
            .collect();
        assert_eq!(
            plugin.handle(&batch).await,
            BatchOutcome::Verdicts(expected),
            "batch of {size}"
        );
    }
    assert_eq!(plugin.stats().faults, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasons_aliasing_one_big_buffer_cost_the_host_only_what_it_keeps() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let mut plugin = hostile(&rt).await;
    let batch: Vec<Record> = (0..4).map(|i| record(i, "alias-reasons", &[])).collect();
    let (outcome, allocated) = measured(&mut plugin, &batch).await;
    let kept = "x".repeat(PluginLimits::default().max_reason_bytes);
    match &outcome {
        BatchOutcome::Verdicts(v) => {
            assert_eq!(v.len(), 4);
            assert!(
                v.iter()
                    .all(|v| matches!(v, Verdict::Reject(Some(r)) if *r == kept)),
                "every reason is the first 1 KiB of the buffer"
            );
        }
        BatchOutcome::Fault(f) => panic!("expected four rejects, got {f:?}"),
    }
    assert!(
        allocated < HOST_BYTES_BOUND,
        "the host allocated {allocated} bytes for four 1 KiB reasons of a 48 MiB buffer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_48_mib_log_message_costs_the_host_only_what_it_keeps() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let mut plugin = hostile(&rt).await;
    let batch = [record(0, "log-48m", &[]), record(1, "log-48m", &[])];
    let (outcome, allocated) = measured(&mut plugin, &batch).await;
    assert_eq!(outcome, BatchOutcome::Verdicts(vec![Verdict::Accept; 2]));
    assert!(
        allocated < HOST_BYTES_BOUND,
        "the host allocated {allocated} bytes for two 4 KiB log messages of 48 MiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_huge_stdout_write_is_refused_without_being_copied() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let mut plugin = hostile(&rt).await;
    let (outcome, allocated) = measured(&mut plugin, &[record(0, "stdout-32m", &[])]).await;
    let fault = outcome.fault().expect("a fault");
    assert_eq!(fault.kind, FaultKind::Trap, "{fault:?}");
    assert!(
        fault.message.contains("too much data"),
        "the fault says what happened: {fault:?}"
    );
    assert!(
        allocated < HOST_BYTES_BOUND,
        "the host allocated {allocated} bytes for a refused 32 MiB write"
    );
    let next = plugin.handle(&[record(1, "fine", &[])]).await;
    assert_eq!(next, BatchOutcome::Verdicts(vec![Verdict::Accept]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_bytes_request_over_the_per_call_cap_is_refused_not_served() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let mut plugin = hostile(&rt).await;
    let (outcome, allocated) = measured(&mut plugin, &[record(0, "random-64m", &[])]).await;
    let fault = outcome
        .fault()
        .expect("a fault, not 64 MiB of random bytes");
    assert_eq!(fault.kind, FaultKind::Trap, "{fault:?}");
    assert!(
        fault.message.contains("exceeds limit 65536"),
        "the fault names the cap: {fault:?}"
    );
    assert!(
        allocated < HOST_BYTES_BOUND,
        "the host allocated {allocated} bytes for a refused 64 MiB request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_asked_again_and_again_stop_at_the_deadline() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let short = PluginLimits {
        batch_deadline: Duration::from_millis(500),
        ..limits()
    };
    let mut plugin = hostile_with(&rt, short).await;
    let outcome = plugin.handle(&[record(0, "random-forever", &[])]).await;
    let fault = outcome.fault().expect("a fault");
    assert_eq!(fault.kind, FaultKind::Timeout, "{fault:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_that_is_not_utf8_is_an_unreadable_verdicts_fault_naming_the_verdict() {
    let _serial = SERIAL.lock().await;
    let rt = runtime();
    let mut plugin = hostile(&rt).await;
    let batch = [record(0, "fine", &[]), record(1, "bad-utf8-reason", &[])];
    let outcome = plugin.handle(&batch).await;
    let fault = outcome.fault().expect("a fault");
    assert_eq!(fault.kind, FaultKind::UnreadableVerdicts, "{fault:?}");
    assert!(
        fault.message.contains("reason of verdict 1") && fault.message.contains("UTF-8"),
        "the fault names the verdict and what is wrong: {fault:?}"
    );
    let next = plugin.handle(&[record(2, "fine", &[])]).await;
    assert_eq!(next, BatchOutcome::Verdicts(vec![Verdict::Accept]));
}
