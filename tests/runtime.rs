//! The plugin runtime against real components: the example plugins and the adversarial
//! fixtures in tests/fixtures/guests, built by `dev/build-guests` into target/guests/.
//!
//! Every misbehaving fixture is harmless until a record's value is `bad`; each test sends a
//! poison batch, checks the fault and the policy verdicts, then sends a good batch to the same
//! `Plugin` and checks it is judged normally (by a fresh instance).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sharehost::runtime::Header;
use sharehost::runtime::{
    AllocatorKind, BatchOutcome, FaultKind, ISOLATION_DEADLINES, InstanceMode, LoadError, Plugin,
    PluginInit, PluginLimits, PluginRuntime, Record, RuntimeConfig, Secrets, Verdict,
};
use sharehost_tests::{guest, plugin_record as record, plugin_runtime as runtime};

fn limits() -> PluginLimits {
    PluginLimits {
        max_memory: 16 << 20,
        batch_deadline: Duration::from_millis(300),
        ..PluginLimits::default()
    }
}

fn good_batch() -> Vec<Record> {
    vec![record(10, "fine", &[]), record(11, "also fine", &[])]
}

fn poison_batch() -> Vec<Record> {
    vec![
        record(20, "fine", &[]),
        record(21, "bad", &[]),
        record(22, "fine", &[]),
    ]
}

async fn load(rt: &PluginRuntime, name: &str) -> Plugin {
    rt.load(&guest(name), limits(), Vec::new())
        .await
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Sends a poison batch and then a good one; returns the fault kind of the first.
async fn contained(name: &str) -> (FaultKind, String) {
    let rt = runtime();
    let mut plugin = load(&rt, name).await;
    let outcome = plugin.handle(&poison_batch()).await;
    let fault = outcome
        .fault()
        .cloned()
        .unwrap_or_else(|| panic!("{name}: expected a fault, got {outcome:?}"));
    assert_eq!(fault.records, 3);
    assert_eq!(
        outcome.verdicts_or(&Verdict::Release),
        vec![Verdict::Release; 3],
        "every record of the faulted batch gets the policy verdict"
    );
    let instances_before = plugin.stats().instances;
    let next = plugin.handle(&good_batch()).await;
    assert_eq!(
        next,
        BatchOutcome::Verdicts(vec![Verdict::Accept, Verdict::Accept]),
        "{name}: the next good batch is judged normally"
    );
    assert_eq!(
        plugin.stats().instances,
        instances_before + 1,
        "{name}: the next batch ran on a fresh instance"
    );
    assert_eq!(plugin.stats().faults, 1);
    (fault.kind, fault.message)
}

#[tokio::test]
async fn good_batch_gets_one_verdict_per_record_in_order() {
    let rt = runtime();
    let mut plugin = load(&rt, "fixture_echo").await;
    let batch = vec![
        record(1, "a", &[]),
        record(2, "b", &[("verdict", "release")]),
        record(3, "c", &[("other", "x"), ("verdict", "renew")]),
        record(4, "d", &[("verdict", "reject:bad order")]),
        record(5, "e", &[("verdict", "reject")]),
    ];
    assert_eq!(
        plugin.handle(&batch).await,
        BatchOutcome::Verdicts(vec![
            Verdict::Accept,
            Verdict::Release,
            Verdict::Renew,
            Verdict::Reject(Some("bad order".into())),
            Verdict::Reject(None),
        ])
    );
    assert_eq!(plugin.handle(&[]).await, BatchOutcome::Verdicts(vec![]));
}

#[tokio::test]
async fn records_reach_the_guest_intact_through_the_columnar_batch() {
    // The router reads headers and keys; the value reader reads values. Mixed topics,
    // null keys/values and null headers all cross the boundary.
    let rt = runtime();
    let mut router = rt
        .load(
            &guest("router"),
            limits(),
            vec![("accept".into(), "order".into())],
        )
        .await
        .expect("router loads");
    let mut other_topic = record(2, "x", &[("type", "spam")]);
    other_topic.topic = Arc::from("refunds");
    let mut null_header = record(3, "x", &[]);
    null_header.headers.push(Header {
        key: "type".into(),
        value: None,
    });
    null_header.key = None;
    null_header.value = None;
    let batch = vec![
        record(1, "x", &[("type", "order")]),
        other_topic,
        null_header,
    ];
    assert_eq!(
        router.handle(&batch).await,
        BatchOutcome::Verdicts(vec![
            Verdict::Accept,
            Verdict::Reject(Some("filtered: type=spam".into())),
            Verdict::Release,
        ])
    );
}

#[tokio::test]
async fn init_error_refuses_the_configuration_at_load() {
    let rt = runtime();
    let err = rt
        .load(
            &guest("fixture_echo"),
            limits(),
            vec![("fail-init".into(), "bad configuration".into())],
        )
        .await
        .expect_err("init must refuse");
    assert!(matches!(err, LoadError::Init { .. }), "{err}");
    assert!(err.to_string().contains("bad configuration"), "{err}");
}

#[tokio::test]
async fn a_long_init_error_is_redacted_then_cut() {
    let rt = runtime();
    // The secret crosses the cut at 1 KiB: cut first, its first part would be left.
    let message = format!(
        "{}tok-0123456789{}",
        "a".repeat(1020),
        "b".repeat(200 << 10)
    );
    let init = PluginInit {
        config: vec![("fail-init".into(), message)],
        secrets: Arc::new(Secrets::new(vec![(
            "token".into(),
            "tok-0123456789".into(),
        )])),
        ..PluginInit::default()
    };
    let err = rt
        .load_with(&guest("fixture_echo"), limits(), init)
        .await
        .expect_err("init must refuse");
    let text = err.to_string();
    assert!(matches!(err, LoadError::Init { .. }), "{text}");
    assert!(text.len() < 2048, "{} bytes of init error", text.len());
    assert!(!text.contains("tok-"), "{text}");
    // Redacted before the cut: the marker's start is what remains at the cut.
    assert!(text.contains("aaaa[sec"), "{text}");
}

#[tokio::test]
async fn spinning_guest_is_stopped_by_its_deadline() {
    let (kind, _) = contained("fixture_spin").await;
    assert_eq!(kind, FaultKind::Timeout);
}

#[test]
fn the_cpu_deadline_counts_the_guests_own_cpu_not_its_wait_for_a_turn() {
    // Two guests spinning on one executor thread take turns at every epoch tick, so each
    // computes about half the time. A CPU deadline measured by the wall clock cut each after
    // half its budget; measured by the guest's own CPU time, each gets its whole budget, and
    // the pair takes at least twice the budget of wall time (more on a busy machine, never
    // less).
    let cpu = Duration::from_millis(300);
    let elapsed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let rt = runtime();
            let spinner = || PluginLimits {
                wall_deadline: Some(Duration::from_secs(60)),
                ..limits()
            };
            let spin = guest("fixture_spin");
            let mut a = rt.load(&spin, spinner(), Vec::new()).await.expect("load");
            let mut b = rt.load(&spin, spinner(), Vec::new()).await.expect("load");
            let batch = poison_batch();
            let started = std::time::Instant::now();
            let (fa, fb) = tokio::join!(a.handle(&batch), b.handle(&batch));
            let elapsed = started.elapsed();
            for f in [fa, fb] {
                let fault = f.fault().cloned().expect("a spin is stopped");
                assert_eq!(fault.kind, FaultKind::Timeout, "{}", fault.message);
                assert!(
                    fault.message.contains("CPU"),
                    "stopped by its CPU deadline, not the wall clock: {}",
                    fault.message
                );
            }
            elapsed
        });
    assert!(
        elapsed >= cpu * 3 / 2,
        "two guests sharing one thread each got their whole {cpu:?} of CPU: {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_with_many_spinning_instances_gets_no_more_guest_time_than_one_with_one() {
    // One guest thread. Pipeline A runs three instances that spin to their CPU deadline,
    // pipeline B one. Handed out per instance, the thread would give each of the four a
    // quarter, and all would reach their deadline together; shared per pipeline, B gets
    // half, so it uses up its budget while A's three have had half of theirs between them:
    // B's call ends before every one of A's. Ordering of events, not a timing threshold: a
    // busy machine slows all four alike.
    let rt = PluginRuntime::new(RuntimeConfig {
        guest_threads: 1,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let spinner = || PluginLimits {
        wall_deadline: Some(Duration::from_secs(120)),
        ..limits()
    };
    let spin = guest("fixture_spin");
    let load = |tenant: &'static str| {
        let (rt, spin) = (rt.clone(), spin.clone());
        async move {
            let init = PluginInit {
                tenant: Some(tenant.into()),
                ..PluginInit::default()
            };
            Box::new(rt.load_with(&spin, spinner(), init).await.expect("load"))
        }
    };
    // Loaded first, all of them: a guest started while the next one compiles would be done
    // before the last starts.
    let mut plugins = Vec::new();
    for tenant in ["a", "a", "a", "b"] {
        plugins.push((tenant, load(tenant).await));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (tenant, plugin) in plugins {
        let tx = tx.clone();
        tokio::spawn(async move {
            let batch = poison_batch();
            let (_, outcome) = plugin
                .on_guest_threads(move |p| Box::pin(async move { p.handle(&batch).await }))
                .await
                .expect("the call finishes");
            let _ = tx.send((tenant, outcome));
        });
    }
    drop(tx);
    let mut order = Vec::new();
    while let Some((tenant, outcome)) = rx.recv().await {
        let fault = outcome.fault().cloned().expect("a spin is stopped");
        assert!(
            fault.message.contains("CPU"),
            "stopped by its CPU deadline: {}",
            fault.message
        );
        order.push(tenant);
    }
    assert_eq!(order.first(), Some(&"b"), "finished in the order {order:?}");
    assert_eq!(order.len(), 4);
    assert!(rt.turns_granted("b") > 0 && rt.turns_granted("a") > 0);
}

#[tokio::test]
async fn a_faulted_record_rejected_by_the_fault_policy_says_which_fault() {
    let rt = runtime();
    let mut plugin = rt
        .load(&guest("fixture_panic"), limits(), Vec::new())
        .await
        .expect("load");
    let batch: Vec<Record> = ["ok", "bad", "ok"]
        .iter()
        .enumerate()
        .map(|(i, v)| record(i as i64, v, &[]))
        .collect();
    let judged = plugin
        .handle_isolating(&batch, &Verdict::Reject(None), 16)
        .await;
    assert_eq!(judged.verdicts[0], Verdict::Accept);
    assert_eq!(judged.verdicts[2], Verdict::Accept);
    match &judged.verdicts[1] {
        Verdict::Reject(Some(reason)) => {
            assert!(reason.starts_with("plugin fault (panic): "), "{reason}");
            assert!(reason.contains("poison record at offset 1"), "{reason}");
        }
        other => panic!("rejected naming the fault, not {other:?}"),
    }
    // Without isolation (a budget of no extra calls), every record of the batch says so.
    let judged = plugin
        .handle_isolating(&batch, &Verdict::Reject(None), 0)
        .await;
    for v in &judged.verdicts {
        assert!(
            matches!(v, Verdict::Reject(Some(r)) if r.starts_with("plugin fault (panic)")),
            "{v:?}"
        );
    }
}

#[tokio::test]
async fn isolating_a_batch_that_spins_on_every_record_is_bounded_in_time() {
    // Twenty records, every one spinning: without a time budget, isolation would spend one
    // deadline per call, up to sixteen extra calls. With it, the extra calls stop once they
    // used ISOLATION_DEADLINES deadlines: at most one more than that is started.
    let rt = runtime();
    let mut plugin = rt
        .load(&guest("fixture_spin"), limits(), Vec::new())
        .await
        .expect("load");
    let batch: Vec<Record> = (0..20).map(|i| record(i, "bad", &[])).collect();
    let judged = plugin.handle_isolating(&batch, &Verdict::Release, 16).await;
    assert!(judged.verdicts.iter().all(|v| *v == Verdict::Release));
    assert!(judged.faults.iter().all(|f| f.kind == FaultKind::Timeout));
    let calls = judged.faults.len();
    assert!(
        calls <= 1 + ISOLATION_DEADLINES as usize + 1,
        "{calls} calls, each a whole deadline"
    );
    assert!(calls >= 2, "isolation was tried: {calls} calls");
}

#[test]
fn a_guest_spinning_in_init_is_stopped_by_its_deadline() {
    // The epoch ticker parks while no guest runs and must be woken for instantiation and init
    // too: without it this load never returns (a spinning guest never yields to the timers).
    // The load runs on its own thread so that a regression fails here instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                runtime()
                    .load(
                        &guest("fixture_spin"),
                        limits(),
                        vec![("spin-in-init".into(), "1".into())],
                    )
                    .await
                    .map(|_| ())
            });
        let _ = tx.send(outcome);
    });
    let outcome = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the load never returned: nothing stopped the spinning init");
    let err = outcome.expect_err("a spinning init cannot load");
    assert!(matches!(err, LoadError::Init { .. }), "{err}");
}

#[tokio::test]
async fn guest_blocked_in_a_host_call_is_stopped_by_its_deadline() {
    let (kind, _) = contained("fixture_sleep").await;
    assert_eq!(kind, FaultKind::Timeout);
}

#[tokio::test]
async fn memory_bomb_is_an_out_of_memory_fault() {
    let (kind, message) = contained("fixture_memory_bomb").await;
    assert_eq!(kind, FaultKind::OutOfMemory, "{message}");
}

#[tokio::test]
async fn deep_recursion_is_contained() {
    let (kind, message) = contained("fixture_deep_recursion").await;
    // Depending on frame sizes the guest exhausts the wasm stack (stack overflow) or runs its
    // shadow stack out of linear memory (an out-of-bounds trap): both are contained.
    assert!(
        matches!(kind, FaultKind::StackOverflow | FaultKind::Trap),
        "{kind}: {message}"
    );
}

#[tokio::test]
async fn panic_is_a_panic_fault_with_the_message() {
    let (kind, message) = contained("fixture_panic").await;
    assert_eq!(kind, FaultKind::Panic);
    assert!(message.contains("poison record at offset 21"), "{message}");
}

#[tokio::test]
async fn wrong_verdict_count_is_a_fault() {
    let (kind, message) = contained("fixture_wrong_count").await;
    assert_eq!(kind, FaultKind::WrongVerdictCount);
    assert_eq!(
        message,
        "2 verdicts for 3 records: return exactly one verdict per record, in the records' \
         order (a handle_batch that skips a record or adds one)"
    );
}

#[tokio::test]
async fn a_flood_of_verdicts_is_refused_before_it_is_lifted() {
    let rt = runtime();
    let mut plugin = load(&rt, "fixture_wrong_count").await;
    let outcome = plugin
        .handle(&[record(1, "fine", &[]), record(2, "flood", &[])])
        .await;
    let fault = outcome.fault().expect("a fault");
    assert_eq!(fault.kind, FaultKind::WrongVerdictCount);
    assert!(
        fault
            .message
            .starts_with("100002 verdicts for 2 records: return exactly one verdict per record")
    );
    assert_eq!(
        plugin.handle(&good_batch()).await,
        BatchOutcome::Verdicts(vec![Verdict::Accept; 2])
    );
}

#[tokio::test]
async fn log_flood_is_bounded_and_judged_normally() {
    // What the host logs of the flood is checked in guest_output.rs, a test binary of its own.
    let rt = runtime();
    // A generous deadline: this test is about bounding output, not about time.
    let mut plugin = rt
        .load(
            &guest("fixture_log_flood"),
            PluginLimits {
                batch_deadline: Duration::from_secs(30),
                ..limits()
            },
            Vec::new(),
        )
        .await
        .expect("loads");
    let outcome = plugin.handle(&poison_batch()).await;
    assert_eq!(outcome, BatchOutcome::Verdicts(vec![Verdict::Accept; 3]));
    let stats = plugin.stats().clone();
    assert!(
        stats.log_messages_dropped >= 20_000 - 256,
        "log messages beyond the budget are dropped: {stats:?}"
    );
    assert!(stats.output_bytes_dropped > 0, "{stats:?}");
    assert_eq!(
        plugin.handle(&good_batch()).await,
        BatchOutcome::Verdicts(vec![Verdict::Accept; 2])
    );
}

async fn refused_import(name: &str, import: &str) {
    let rt = runtime();
    let err = rt
        .load(&guest(name), limits(), Vec::new())
        .await
        .expect_err("must be refused");
    match &err {
        LoadError::ForbiddenImport { imports, .. } => {
            assert!(
                imports.iter().any(|i| i.starts_with(import)),
                "{import} not named in {imports:?}"
            );
        }
        other => panic!("expected ForbiddenImport, got {other}"),
    }
    assert!(err.to_string().contains(import), "{err}");
}

#[tokio::test]
async fn filesystem_import_is_refused_at_load() {
    refused_import("fixture_import_filesystem", "wasi:filesystem/").await;
}

#[tokio::test]
async fn sockets_import_is_refused_at_load() {
    refused_import("fixture_import_sockets", "wasi:sockets/").await;
}

#[tokio::test]
async fn http_import_is_refused_at_load() {
    refused_import("fixture_import_http", "wasi:http/handler").await;
}

#[tokio::test]
async fn missing_handle_export_is_refused_as_wrong_world() {
    let rt = runtime();
    let err = rt
        .load(&guest("fixture_missing_handle"), limits(), Vec::new())
        .await
        .expect_err("must be refused");
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err}");
    assert!(err.to_string().contains("missing export `handle`"), "{err}");
}

#[tokio::test]
async fn bytes_that_are_not_a_component_are_refused() {
    let dir = scratch_dir("not-a-component");
    let path = dir.join("junk.wasm");
    std::fs::write(&path, b"\0asm not really").expect("write");
    let err = runtime()
        .load(&path, limits(), Vec::new())
        .await
        .expect_err("must be refused");
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
    let missing = runtime()
        .load(&dir.join("absent.wasm"), limits(), Vec::new())
        .await
        .expect_err("must be refused");
    assert!(matches!(missing, LoadError::Read { .. }), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn plugin_memory_limit_above_the_runtime_maximum_is_refused() {
    let err = runtime()
        .load(
            &guest("accept_all"),
            PluginLimits {
                max_memory: 1 << 30,
                ..limits()
            },
            Vec::new(),
        )
        .await
        .expect_err("must be refused");
    assert!(matches!(err, LoadError::MemoryLimit { .. }), "{err}");
}

#[tokio::test]
async fn reused_instance_is_recycled_after_max_batches() {
    let rt = runtime();
    let mut plugin = rt
        .load(
            &guest("fixture_echo"),
            PluginLimits {
                instance_mode: InstanceMode::Reuse { max_batches: 2 },
                ..limits()
            },
            Vec::new(),
        )
        .await
        .expect("loads");
    for _ in 0..5 {
        assert!(plugin.handle(&good_batch()).await.fault().is_none());
    }
    // One instance at load serves batches 1-2, then 3-4, then 5.
    assert_eq!(plugin.stats().instances, 3);
}

#[tokio::test]
async fn fresh_instance_per_batch_mode_instantiates_every_batch() {
    let rt = runtime();
    let mut plugin = rt
        .load(
            &guest("fixture_echo"),
            PluginLimits {
                instance_mode: InstanceMode::FreshPerBatch,
                ..limits()
            },
            Vec::new(),
        )
        .await
        .expect("loads");
    for _ in 0..3 {
        assert!(plugin.handle(&good_batch()).await.fault().is_none());
    }
    assert_eq!(
        plugin.stats().instances,
        4,
        "one at load plus one per batch"
    );
}

#[tokio::test]
async fn repeated_faults_do_not_exhaust_the_instance_pool() {
    // The pool holds 8 instances; 30 faults in a row must each release their slot.
    let rt = runtime();
    let mut plugin = load(&rt, "fixture_panic").await;
    for _ in 0..30 {
        assert_eq!(
            plugin.handle(&poison_batch()).await.fault().map(|f| f.kind),
            Some(FaultKind::Panic)
        );
    }
    assert_eq!(
        plugin.handle(&good_batch()).await,
        BatchOutcome::Verdicts(vec![Verdict::Accept; 2])
    );
}

fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sharehost-runtime-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[tokio::test]
async fn precompiled_cache_is_written_once_and_reused() {
    let cache = scratch_dir("cache").join("cwasm");
    let rt = PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(cache.clone()),
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let entries = || {
        std::fs::read_dir(&cache)
            .expect("cache dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cwasm"))
            .collect::<Vec<_>>()
    };
    let mut a = load(&rt, "accept_all").await;
    let mut b = load(&rt, "accept_all").await;
    let _c = load(&rt, "fixture_echo").await;
    let names = entries();
    assert_eq!(
        names.len(),
        2,
        "one entry per distinct component: {names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with(a.content_hash())),
        "entries are named by content hash: {names:?}"
    );
    assert_eq!(a.content_hash(), b.content_hash());
    assert!(a.handle(&good_batch()).await.fault().is_none());
    assert!(b.handle(&good_batch()).await.fault().is_none());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "the cache directory is private");
    }
    let _ = std::fs::remove_dir_all(cache.parent().unwrap_or(&cache));
}

#[tokio::test]
async fn corrupt_cache_entry_is_replaced_not_trusted() {
    let cache = scratch_dir("corrupt").join("cwasm");
    let rt = PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(cache.clone()),
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let plugin = load(&rt, "accept_all").await;
    let entry = std::fs::read_dir(&cache)
        .expect("cache dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("an entry");
    drop(plugin);
    std::fs::write(&entry, b"garbage").expect("corrupt it");
    let mut again = load(&rt, "accept_all").await;
    assert!(again.handle(&good_batch()).await.fault().is_none());
    assert!(std::fs::metadata(&entry).expect("rewritten").len() > 1000);
    let _ = std::fs::remove_dir_all(cache.parent().unwrap_or(&cache));
}

#[tokio::test]
async fn example_plugins_judge_their_records() {
    let rt = runtime();
    let mut validator = load(&rt, "order_validator").await;
    let batch = vec![
        record(1, r#"{"id":"o1","sku":"A","quantity":2,"price":3.5}"#, &[]),
        record(2, "{oops", &[]),
        record(3, r#"{"id":"o3","sku":"A","quantity":0,"price":1}"#, &[]),
    ];
    let verdicts = plugin_verdicts(&mut validator, &batch).await;
    assert_eq!(verdicts[0], Verdict::Accept);
    assert!(matches!(&verdicts[1], Verdict::Reject(Some(r)) if r.starts_with("not JSON")));
    assert_eq!(
        verdicts[2],
        Verdict::Reject(Some("`quantity` 0 outside 1..=1000".into()))
    );

    let mut slow = rt
        .load(
            &guest("slow_renew"),
            limits(),
            vec![("budget".into(), "1".into())],
        )
        .await
        .expect("loads");
    let verdicts = plugin_verdicts(&mut slow, &good_batch()).await;
    assert_eq!(verdicts, vec![Verdict::Accept, Verdict::Renew]);
}

async fn plugin_verdicts(plugin: &mut Plugin, batch: &[Record]) -> Vec<Verdict> {
    match plugin.handle(batch).await {
        BatchOutcome::Verdicts(v) => v,
        BatchOutcome::Fault(f) => panic!("unexpected fault: {f:?}"),
    }
}

#[tokio::test]
async fn isolating_a_faulted_batch_judges_the_innocent_records_normally() {
    let rt = runtime();
    let mut plugin = load(&rt, "fixture_panic").await;
    let mut batch = good_batch();
    batch.extend(poison_batch());
    batch.push(record(30, "bad", &[]));
    let sharehost::runtime::Judged {
        verdicts, faults, ..
    } = plugin.handle_isolating(&batch, &Verdict::Release, 64).await;
    assert_eq!(
        verdicts,
        vec![
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Release,
            Verdict::Accept,
            Verdict::Release,
        ]
    );
    assert!(faults.iter().all(|f| f.kind == FaultKind::Panic));
    assert!(
        faults.len() >= 3,
        "the batch, and each poison record: {faults:?}"
    );

    // With no budget for extra calls, the whole batch gets the policy.
    let verdicts = plugin
        .handle_isolating(&batch, &Verdict::Release, 0)
        .await
        .verdicts;
    assert!(verdicts.iter().all(|v| *v == Verdict::Release));
}

#[tokio::test]
async fn on_demand_allocation_runs_plugins_too() {
    let rt = PluginRuntime::new(RuntimeConfig {
        pooling: false,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    assert_eq!(rt.allocator(), AllocatorKind::OnDemand);
    let mut plugin = load(&rt, "fixture_echo").await;
    assert!(plugin.handle(&good_batch()).await.fault().is_none());
    let mut bomb = load(&rt, "fixture_memory_bomb").await;
    assert_eq!(
        bomb.handle(&poison_batch()).await.fault().map(|f| f.kind),
        Some(FaultKind::OutOfMemory),
        "the memory cap holds without the pool as well"
    );
}

#[tokio::test]
async fn a_pool_too_large_for_the_address_space_falls_back() {
    // 1 million instances x 2 memories x (4 GiB + guard) cannot be reserved on any 64-bit
    // machine; the runtime steps down (compact pool or on-demand) instead of failing.
    let rt = PluginRuntime::new(RuntimeConfig {
        max_instances: 1_000_000,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    assert_ne!(rt.allocator(), AllocatorKind::Pooling);
    let mut plugin = load(&rt, "fixture_echo").await;
    assert!(plugin.handle(&good_batch()).await.fault().is_none());
}

#[tokio::test]
async fn versions_loaded_one_after_another_take_over_the_pool_slots_their_predecessors_left() {
    // Every load compiles a new module, as a hot swap does: with wasmtime's default each one
    // took a cold slot and its predecessor's slot stayed warm (1 MiB resident per memory), so
    // a long-running host grew by every swap.
    let rt = runtime();
    let mut after_first = None;
    for version in 0..12 {
        let mut plugin = load(&rt, "accept_all").await;
        assert!(matches!(
            plugin.handle(&good_batch()).await,
            BatchOutcome::Verdicts(_)
        ));
        drop(plugin);
        let (warm, resident) = rt
            .pool_unused_warm_memories()
            .expect("the test runtime has an instance pool");
        let first = *after_first.get_or_insert((warm, resident));
        assert!(
            warm <= first.0 && resident <= first.1,
            "version {version}: {warm} unused warm memories holding {resident} B, \
             after the first version {} holding {} B",
            first.0,
            first.1
        );
    }
}
