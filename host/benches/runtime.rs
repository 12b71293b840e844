//! Plugin runtime benchmark: ns/record of a guest call across batch sizes and value sizes,
//! accept-all vs a value-reading guest vs the same logic in native Rust, reused vs fresh
//! instance, compile vs load from the precompiled cache, the columnar batch layout against
//! the naive `list<record>` layout, and the runtime cost of an emit (contract 0.2 outputs).
//!
//! Run (after `dev/build-guests`): `cargo bench -p sharehost --bench runtime`
//! (`SHAREHOST_BENCH_ONLY=emit` runs the emit case alone, `SHAREHOST_BENCH_ONLY=languages` the
//! order-validator in Rust, Python and JavaScript, `SHAREHOST_BENCH_ONLY=reader` the reused
//! instance table).
//! Method: per point a warm-up, then 7 samples of about 200 ms each; the median is printed.
//! Time is this thread's **CPU time** (from /proc/thread-self/schedstat, in ns) when the
//! kernel offers it, so that other processes competing for the two cores (parallel builds)
//! do not inflate the figures; wall time otherwise. The guest runs on this same thread.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sharehost::runtime::{
    BatchOutcome, InstanceMode, OutputGrant, Plugin, PluginLimits, PluginRuntime, Record,
    RuntimeConfig, Verdict,
};

const SIZES: [usize; 5] = [1, 10, 100, 500, 1000];
const VALUES: [usize; 2] = [100, 1024];
// Long enough that the kernel's CPU-time accounting granularity (one scheduler tick, a few ms)
// stays within about 2% of a sample.
const SAMPLE: Duration = Duration::from_millis(200);
const SAMPLES: usize = 7;

fn guest(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/guests")
        .join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} missing: run dev/build-guests", p.display());
    p
}

/// Deterministic pseudo-random a–z text (like the spike's data), 8-byte keys, no headers.
fn batch(n: usize, value_len: usize) -> Vec<Record> {
    let topic: Arc<str> = Arc::from("bench");
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|i| {
            let mut v = Vec::with_capacity(value_len);
            v.push(b'{');
            while v.len() < value_len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                v.push(b'a' + (seed % 26) as u8);
            }
            Record {
                topic: topic.clone(),
                partition: 0,
                offset: i as i64,
                timestamp: 0,
                delivery_count: 1,
                key: Some(Bytes::from(format!("key-{:04}", i % 10_000))),
                value: Some(Bytes::from(v)),
                headers: Vec::new(),
            }
        })
        .collect()
}

/// Nanoseconds this thread has spent on a CPU, if the kernel reports it.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    (ns > 0).then_some(ns)
}

/// A stopwatch over thread CPU time (or wall time when CPU time is unavailable).
struct Clock {
    wall: Instant,
    cpu: Option<u64>,
}

impl Clock {
    fn start() -> Self {
        Self {
            cpu: thread_cpu_ns(),
            wall: Instant::now(),
        }
    }

    fn elapsed(&self) -> Duration {
        match (self.cpu, thread_cpu_ns()) {
            (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
            _ => self.wall.elapsed(),
        }
    }
}

/// Median ns per iteration of `$body` (which may `.await`), over SAMPLES samples of about
/// SAMPLE each, after a warm-up that calibrates the iteration count. A macro, not a closure,
/// because the body borrows the plugin mutably across an await.
macro_rules! measure {
    ($body:expr) => {{
        let mut iters = 1u64;
        loop {
            let t = Clock::start();
            for _ in 0..iters {
                $body;
            }
            let e = t.elapsed();
            if e >= SAMPLE / 4 {
                iters = ((iters as f64) * SAMPLE.as_secs_f64() / e.as_secs_f64()).max(1.0) as u64;
                break;
            }
            iters *= 4;
        }
        let mut samples = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let t = Clock::start();
            for _ in 0..iters {
                $body;
            }
            samples.push(t.elapsed().as_nanos() as f64 / iters as f64);
        }
        samples.sort_by(f64::total_cmp);
        samples[SAMPLES / 2]
    }};
}

#[path = "../../examples/value-reader/src/judge.rs"]
mod value_reader;

#[path = "../../examples/order-validator/src/check.rs"]
mod order_validator;

/// The value reader's logic, natively: the example's own source file.
fn judge(value: Option<&[u8]>) -> Verdict {
    if value_reader::accepts(value) {
        Verdict::Accept
    } else {
        Verdict::Reject(None)
    }
}

fn native_borrowed(records: &[Record], read: bool) -> Vec<Verdict> {
    records
        .iter()
        .map(|r| {
            if read {
                judge(r.value.as_deref())
            } else {
                Verdict::Accept
            }
        })
        .collect()
}

/// Native with the deep copy a sandbox boundary implies (key and value copied per record).
fn native_copied(records: &[Record], read: bool) -> Vec<Verdict> {
    type Copy = (Option<Vec<u8>>, Option<Vec<u8>>);
    let copies: Vec<Copy> = records
        .iter()
        .map(|r| {
            (
                r.key.as_deref().map(<[u8]>::to_vec),
                r.value.as_deref().map(<[u8]>::to_vec),
            )
        })
        .collect();
    copies
        .iter()
        .map(|(_, v)| {
            if read {
                judge(v.as_deref())
            } else {
                Verdict::Accept
            }
        })
        .collect()
}

async fn load(rt: &PluginRuntime, name: &str, mode: InstanceMode) -> Plugin {
    rt.load(
        &guest(name),
        PluginLimits {
            instance_mode: mode,
            batch_deadline: Duration::from_secs(10),
            ..PluginLimits::default()
        },
        Vec::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The batch with every value replaced by `value(i)` (same keys, offsets and topic).
fn with_values(mut records: Vec<Record>, value: impl Fn(usize) -> Vec<u8>) -> Vec<Record> {
    for (i, r) in records.iter_mut().enumerate() {
        r.value = Some(Bytes::from(value(i)));
    }
    records
}

/// The runtime side of an emit: `fixture_actor` judging 500 records whose values make it emit
/// one 100 B value each to output `valid` (`emit:valid:TEXT`), against the same batch with
/// plain values of the same length that it just accepts. Both go through the same parsing in
/// the guest, and the emits are taken from the plugin after each call (as the pipeline does),
/// so the difference is the emit: the host call, the bound checks, copying key, value and
/// header out of the guest, and handing them over. Producing them is the broker's cost and is
/// not in it (dev/bench-http measures that end to end).
async fn emit_case(rt: &PluginRuntime) {
    const N: usize = 500;
    const EMITTED: usize = 100;
    let mut plugin = rt
        .load(
            &guest("fixture_actor"),
            PluginLimits {
                instance_mode: InstanceMode::Reuse {
                    max_batches: u32::MAX,
                },
                batch_deadline: Duration::from_secs(10),
                outputs: Arc::new(OutputGrant {
                    names: vec!["valid".into()],
                    ..Default::default()
                }),
                ..PluginLimits::default()
            },
            Vec::new(),
        )
        .await
        .unwrap_or_else(|e| panic!("fixture_actor: {e}"));
    // a–z text without ':' (the fixture's separator), the same for every record.
    let text: Vec<u8> = (0..EMITTED).map(|i| b'a' + (i % 26) as u8).collect();
    let emitting = with_values(batch(N, 1), |_| [b"emit:valid:".as_slice(), &text].concat());
    let plain = with_values(batch(N, 1), |_| {
        let mut v = b"plain-value".to_vec();
        v.extend_from_slice(&text);
        v
    });
    assert_eq!(
        emitting[0].value.as_ref().map(Bytes::len),
        plain[0].value.as_ref().map(Bytes::len)
    );
    // Every record of the emitting batch must really emit (and be accepted), or the figure lies.
    match plugin.handle(&emitting).await {
        BatchOutcome::Verdicts(v) => assert!(
            v.iter().all(|v| matches!(v, Verdict::Accept)),
            "fixture_actor did not accept every emitting record: {:?}",
            v.iter().find(|v| !matches!(v, Verdict::Accept))
        ),
        BatchOutcome::Fault(f) => panic!("fault in benchmark: {f:?}"),
    }
    let emits = plugin.take_emits();
    assert_eq!(emits.len(), N, "one emit per record");
    assert!(
        emits
            .iter()
            .all(|e| e.value.as_ref().map(Bytes::len) == Some(EMITTED))
    );
    let mut run = async |records: &[Record]| {
        measure!(match plugin.handle(records).await {
            BatchOutcome::Verdicts(v) => {
                black_box(v);
                black_box(plugin.take_emits());
            }
            BatchOutcome::Fault(f) => panic!("fault in benchmark: {f:?}"),
        }) / N as f64
    };
    let with = run(&emitting).await;
    let without = run(&plain).await;
    println!(
        "\n### Emit cost (fixture_actor, {N} records per batch, reused instance, ns/record)\n"
    );
    println!("| batch | ns/record | ns per emit (difference) |");
    println!("|---|---|---|");
    println!(
        "| {N} × plain {} B values, accepted, no emit | {without:.1} | |",
        plain[0].value.as_ref().map_or(0, Bytes::len)
    );
    println!(
        "| {N} × `emit:valid:` + {EMITTED} B, one {EMITTED} B emit each, accepted | {with:.1} | {:.1} |",
        with - without
    );
}

/// 500 valid orders (every one accepted by order-validator), each padded with a `note` field
/// to `value_len` bytes: the work is parsing JSON, as in a real validator.
fn orders(n: usize, value_len: usize) -> Vec<Record> {
    with_values(batch(n, 8), |i| {
        let head = format!(
            r#"{{"id":"o{i}","sku":"SKU-{}","quantity":{},"price":{}.5,"note":""#,
            i % 97,
            1 + i % 9,
            i % 50
        );
        let pad = value_len.saturating_sub(head.len() + 2);
        format!("{head}{}\"}}", "x".repeat(pad)).into_bytes()
    })
}

/// The three order-validators (Rust, Python, JavaScript: same decisions, tests/languages.rs)
/// side by side: component size, compile and cached load, cold start (a fresh instance's
/// instantiate + init, then its first batch), warm ns/record, and what one instance holds in
/// linear memory.
async fn languages_case() {
    const N: usize = 500;
    let dir = std::env::temp_dir().join(format!("sharehost-bench-lang-{}", std::process::id()));
    let rt = PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(dir.clone()),
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let limits = || PluginLimits {
        instance_mode: InstanceMode::Reuse {
            max_batches: u32::MAX,
        },
        batch_deadline: Duration::from_secs(10),
        ..PluginLimits::default()
    };
    println!("\n### Plugin languages: order-validator in Rust, Python and JavaScript\n");
    println!(
        "| language | component | allocator | compile | load from cache | instantiate + init | first batch (500 × 100 B) | ns/record 500 × 100 B | ns/record 500 × 1 KiB | instance memory after a batch | instances replaced for memory / batches |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (language, name) in [
        ("Rust", "order_validator"),
        ("Python", "order_validator_py"),
        ("JavaScript", "order_validator_js"),
    ] {
        let path = guest(name);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let (compile, cached) = rt
            .measure_compile_and_cached_load(&path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Instantiate + init: a fresh instance per batch against a reused one, on a one-record
        // batch (the difference is what every fresh instance costs).
        let one = orders(1, 100);
        let mut fresh = rt
            .load(
                &path,
                PluginLimits {
                    instance_mode: InstanceMode::FreshPerBatch,
                    ..limits()
                },
                Vec::new(),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let fresh_one = per_record(&mut fresh, &one).await;
        drop(fresh);
        let mut plugin = rt
            .load(&path, limits(), Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let warm_one = per_record(&mut plugin, &one).await;
        let instantiate = Duration::from_nanos((fresh_one - warm_one).max(0.0) as u64);
        // The cold start's first batch: on the instance that was just created and init'ed.
        let mut plugin = rt
            .load(&path, limits(), Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let small = orders(N, 100);
        let t = Instant::now();
        match plugin.handle(&small).await {
            BatchOutcome::Verdicts(v) => assert!(
                v.iter().all(|v| *v == Verdict::Accept),
                "{name}: every bench order is valid"
            ),
            BatchOutcome::Fault(f) => panic!("{name}: {f:?}"),
        }
        let first = t.elapsed();
        // After one batch: what an instance holds in steady use (before the many calls of
        // the measurement, which a leaking toolchain would add to).
        let memory = plugin.instance_memory_bytes().unwrap_or(0);
        let ns_small = per_record(&mut plugin, &small).await;
        let ns_large = per_record(&mut plugin, &orders(N, 1024)).await;
        let stats = plugin.stats();
        println!(
            "| {language} | {:.1} MB | {} | {:.0} ms | {:.1} ms | {:.0} µs | {:.1} ms | {ns_small:.0} | {ns_large:.0} | {:.1} MiB | {} / {} |",
            size as f64 / 1e6,
            plugin.placement().allocator.name(),
            compile.as_secs_f64() * 1e3,
            cached.as_secs_f64() * 1e3,
            instantiate.as_secs_f64() * 1e6,
            first.as_secs_f64() * 1e3,
            memory as f64 / f64::from(1u32 << 20),
            stats.recycled_for_memory,
            stats.batches,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reused instances: accept-all and value-reader in Wasm against the value reader natively,
/// per batch size and value size (where a guest's own reading costs).
async fn reused_case(rt: &PluginRuntime, reuse: InstanceMode) {
    println!("\n### Reused instance: ns/record (median of {SAMPLES} samples)\n");
    println!(
        "| records × value | accept-all wasm | value-reader wasm | native accept (borrowed) | native read (borrowed) | native read (incl. copy) | value-reader wasm / native incl. copy |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut accept = load(rt, "accept_all", reuse).await;
    let mut reader = load(rt, "value_reader", reuse).await;
    for &v in &VALUES {
        for &n in &SIZES {
            let records = batch(n, v);
            let a = per_record(&mut accept, &records).await;
            let r = per_record(&mut reader, &records).await;
            let na = measure!(black_box(native_borrowed(black_box(&records), false))) / n as f64;
            let nr = measure!(black_box(native_borrowed(black_box(&records), true))) / n as f64;
            let nc = measure!(black_box(native_copied(black_box(&records), true))) / n as f64;
            println!(
                "| {n} × {v} B | {a:.1} | {r:.1} | {na:.1} | {nr:.1} | {nc:.1} | {:.1}× |",
                r / nc
            );
        }
    }
    println!("\n### Order validator, reused instance: ns/record (median of {SAMPLES} samples)\n");
    println!(
        "| records × value | order-validator wasm | native (same source, borrowed) | wasm / native |"
    );
    println!("|---|---|---|---|");
    let mut validator = load(rt, "order_validator", reuse).await;
    for &v in &VALUES {
        for n in [100, 500] {
            let records = orders(n, v);
            let w = per_record(&mut validator, &records).await;
            let native = measure!(black_box(
                black_box(&records)
                    .iter()
                    .map(|r| order_validator::check(r.value.as_deref(), 1000, |_| ()).is_ok())
                    .filter(|ok| *ok)
                    .count()
            )) / n as f64;
            println!(
                "| {n} × {v} B | {w:.1} | {native:.1} | {:.2}× |",
                w / native
            );
        }
    }
}

async fn per_record(plugin: &mut Plugin, records: &[Record]) -> f64 {
    let ns = measure!(match plugin.handle(records).await {
        BatchOutcome::Verdicts(v) => {
            black_box(v);
        }
        BatchOutcome::Fault(f) => panic!("fault in benchmark: {f:?}"),
    });
    ns / records.len() as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let reuse = InstanceMode::Reuse {
        max_batches: u32::MAX,
    };
    let cache_dir = std::env::temp_dir().join(format!("sharehost-bench-{}", std::process::id()));
    let rt = PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(cache_dir.clone()),
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    if let Some(n) = std::env::var_os("SHAREHOST_BENCH_PROFILE") {
        // A single hot loop for `perf record`: accept-all, N × 100 B (N = the variable's
        // value, 500 when it is not a number), reused instance.
        let n = n.to_str().and_then(|s| s.parse().ok()).unwrap_or(500);
        let mut plugin = load(&rt, "accept_all", reuse).await;
        let records = batch(n, 100);
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            black_box(plugin.handle(&records).await);
        }
        return;
    }
    if std::env::var_os("SHAREHOST_BENCH_ONLY").is_some_and(|v| v == "languages") {
        languages_case().await;
        let _ = std::fs::remove_dir_all(&cache_dir);
        return;
    }
    if std::env::var_os("SHAREHOST_BENCH_ONLY").is_some_and(|v| v == "reader") {
        reused_case(&rt, reuse).await;
        let _ = std::fs::remove_dir_all(&cache_dir);
        return;
    }
    if std::env::var_os("SHAREHOST_BENCH_ONLY").is_some_and(|v| v == "emit") {
        emit_case(&rt).await;
        let _ = std::fs::remove_dir_all(&cache_dir);
        return;
    }
    println!(
        "allocator: {:?}; clock: {}",
        rt.allocator(),
        if thread_cpu_ns().is_some() {
            "thread CPU time"
        } else {
            "wall time"
        }
    );

    reused_case(&rt, reuse).await;

    println!(
        "\n### Fresh instance per batch vs reused (µs per batch, accept-all / value-reader)\n"
    );
    println!("| records × value | accept reused | accept fresh | reader reused | reader fresh |");
    println!("|---|---|---|---|---|");
    let mut accept = load(&rt, "accept_all", reuse).await;
    let mut reader = load(&rt, "value_reader", reuse).await;
    let mut accept_fresh = load(&rt, "accept_all", InstanceMode::FreshPerBatch).await;
    let mut reader_fresh = load(&rt, "value_reader", InstanceMode::FreshPerBatch).await;
    for (n, v) in [(1, 100), (100, 1024), (500, 100), (1000, 1024)] {
        let records = batch(n, v);
        let us = |ns_per_rec: f64| ns_per_rec * n as f64 / 1000.0;
        let ar = us(per_record(&mut accept, &records).await);
        let af = us(per_record(&mut accept_fresh, &records).await);
        let rr = us(per_record(&mut reader, &records).await);
        let rf = us(per_record(&mut reader_fresh, &records).await);
        println!("| {n} × {v} B | {ar:.1} | {af:.1} | {rr:.1} | {rf:.1} |");
    }

    println!("\n### Compile vs load from the precompiled cache (ms)\n");
    println!("| guest | compile (Component::new) | load from cache (validate + mmap) |");
    println!("|---|---|---|");
    for name in ["accept_all", "value_reader", "order_validator"] {
        let (mut compile, mut load) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let (c, l) = rt
                .measure_compile_and_cached_load(&guest(name))
                .expect("measure");
            compile.push(c.as_secs_f64() * 1e3);
            load.push(l.as_secs_f64() * 1e3);
        }
        compile.sort_by(f64::total_cmp);
        load.sort_by(f64::total_cmp);
        println!("| {name} | {:.2} | {:.3} |", compile[2], load[2]);
    }
    emit_case(&rt).await;
    let _ = std::fs::remove_dir_all(&cache_dir);

    naive::run().await;
}

/// The naive layout, for comparison: `list<record>` with per-record `list<u8>` fields,
/// driven through its own bindings against `target/guests/fixture_naive_accept.wasm`.
mod naive {
    use super::*;
    use wasmtime::component::{Component, Linker, ResourceTable};
    use wasmtime::{Config, Engine, Store};
    use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

    wasmtime::component::bindgen!({
        path: "../tests/fixtures/guests/naive-accept/wit",
        world: "bench:naive/naive",
        exports: { default: async },
    });

    struct State {
        wasi: WasiCtx,
        table: ResourceTable,
    }

    impl WasiView for State {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }

    pub(super) async fn run() {
        let path = guest("fixture_naive_accept");
        let mut config = Config::new();
        config.epoch_interruption(true).concurrency_support(false);
        let engine = Engine::new(&config).expect("engine");
        let mut linker = Linker::<State>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).expect("wasi");
        let component = Component::from_file(&engine, &path).expect("component");
        let mut store = Store::new(
            &engine,
            State {
                wasi: WasiCtx::builder().build(),
                table: ResourceTable::new(),
            },
        );
        store.set_epoch_deadline(u64::MAX / 2);
        let naive = Naive::instantiate_async(&mut store, &component, &linker)
            .await
            .expect("instantiate");
        println!(
            "\n### Batch layout: naive `list<record>` vs columnar (accept-all guest, reused instance, ns/record)\n"
        );
        println!("| records × value | naive list<record> | columnar (sharehost:plugin) |");
        println!("|---|---|---|");
        let rt = PluginRuntime::new(RuntimeConfig::default()).expect("runtime");
        let mut flat = load(
            &rt,
            "accept_all",
            InstanceMode::Reuse {
                max_batches: u32::MAX,
            },
        )
        .await;
        for (n, v) in [(100, 100), (500, 100), (1000, 1024)] {
            let records = batch(n, v);
            let msgs: Vec<Message> = records
                .iter()
                .map(|r| Message {
                    partition: r.partition,
                    offset: r.offset,
                    timestamp: r.timestamp,
                    key: r.key.as_deref().map(<[u8]>::to_vec),
                    value: r.value.as_deref().map(<[u8]>::to_vec),
                    headers: Vec::new(),
                    delivery_count: r.delivery_count as i16,
                })
                .collect();
            let ns = measure!(black_box(
                naive
                    .call_handle(&mut store, &msgs)
                    .await
                    .expect("naive call")
            )) / n as f64;
            let f = per_record(&mut flat, &records).await;
            println!("| {n} × {v} B | {ns:.1} | {f:.1} |");
        }
    }
}
