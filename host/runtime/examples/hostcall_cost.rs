//! `hostcall_cost`: what one call of a contract import (`emit`, `log`) costs the host, so a
//! change to how the imports are linked can be measured against the one before it.
//!
//! ```text
//! dev/build-guests
//! cargo run --release -p sharehost-runtime --example hostcall_cost
//! ```
//!
//! - `emit`: `fixture_actor` judging 100 records whose values make it emit a 16 B value 50
//!   times each (`emit:valid:TEXT:50`, 5,000 emits a batch), against the same batch with plain
//!   values of the same length, which it parses the same way and accepts. The difference per
//!   emit is the host call: lifting its arguments, the bound checks, keeping the emit.
//! - `log`: `fixture_log_flood` judging one record `bad` (20,000 `log` calls of 1,000 B, of
//!   which 256 are written and the rest dropped by the per-batch budget, plus 2,000 lines of
//!   stdout and stderr each) against one record `good` (none). The difference per `log` call
//!   is mostly the bounded lift and the budget check.
//!
//! Time is the process's CPU time (guest and host run on the runtime's threads), the median
//! of 7 samples of about 300 ms each after a warm-up. Prints one line per import: ns per call.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sharehost_runtime::{
    BatchOutcome, InstanceMode, OutputGrant, Plugin, PluginLimits, PluginRuntime, Record,
    RuntimeConfig, Verdict,
};

const SAMPLE: Duration = Duration::from_millis(300);
const SAMPLES: usize = 7;

fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn guest(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/guests")
        .join(format!("{name}.wasm"));
    assert!(p.is_file(), "{} missing: run dev/build-guests", p.display());
    p
}

fn records(values: impl IntoIterator<Item = Vec<u8>>) -> Vec<Record> {
    let topic: Arc<str> = Arc::from("bench");
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| Record {
            topic: topic.clone(),
            partition: 0,
            offset: i as i64,
            timestamp: 0,
            delivery_count: 1,
            key: Some(Bytes::from(format!("key-{i:04}"))),
            value: Some(Bytes::from(v)),
            headers: Vec::new(),
        })
        .collect()
}

/// Median CPU ns of one `handle` call over `batch` (emits taken and dropped, as the pipeline
/// takes them).
async fn per_batch(plugin: &mut Plugin, batch: &[Record]) -> f64 {
    let once = async |plugin: &mut Plugin| match plugin.handle(batch).await {
        BatchOutcome::Verdicts(v) => {
            assert!(v.iter().all(|v| matches!(v, Verdict::Accept)), "{v:?}");
            black_box(plugin.take_emits());
        }
        BatchOutcome::Fault(f) => panic!("fault: {f:?}"),
    };
    let mut iters = 1u32;
    loop {
        let start = cpu();
        for _ in 0..iters {
            once(plugin).await;
        }
        let took = cpu() - start;
        if took >= SAMPLE / 4 {
            iters = ((f64::from(iters) * SAMPLE.as_secs_f64() / took.as_secs_f64()) as u32).max(1);
            break;
        }
        iters *= 4;
    }
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = cpu();
        for _ in 0..iters {
            once(plugin).await;
        }
        samples.push((cpu() - start).as_nanos() as f64 / f64::from(iters));
    }
    samples.sort_by(f64::total_cmp);
    samples[SAMPLES / 2]
}

async fn load(rt: &PluginRuntime, name: &str, outputs: &[&str]) -> Plugin {
    rt.load(
        &guest(name),
        PluginLimits {
            instance_mode: InstanceMode::Reuse {
                max_batches: u32::MAX,
            },
            batch_deadline: Duration::from_secs(30),
            outputs: Arc::new(OutputGrant {
                names: outputs.iter().map(|&n| Arc::from(n)).collect(),
                ..OutputGrant::default()
            }),
            ..PluginLimits::default()
        },
        Vec::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    const RECORDS: usize = 100;
    const PER_RECORD: usize = 50;
    let rt = PluginRuntime::new(RuntimeConfig::default()).expect("runtime");

    let mut actor = load(&rt, "fixture_actor", &["valid"]).await;
    let emitting = records(
        (0..RECORDS).map(|_| format!("emit:valid:{}:{PER_RECORD}", "e".repeat(16)).into_bytes()),
    );
    let plain = records(
        (0..RECORDS).map(|_| format!("plain:valid:{}:{PER_RECORD}", "e".repeat(16)).into_bytes()),
    );
    match actor.handle(&emitting).await {
        BatchOutcome::Verdicts(v) => assert!(v.iter().all(|v| matches!(v, Verdict::Accept))),
        BatchOutcome::Fault(f) => panic!("fault: {f:?}"),
    }
    assert_eq!(
        actor.take_emits().len(),
        RECORDS * PER_RECORD,
        "every emit kept"
    );
    let with = per_batch(&mut actor, &emitting).await;
    let without = per_batch(&mut actor, &plain).await;
    let emit = (with - without) / (RECORDS * PER_RECORD) as f64;

    let mut flood = load(&rt, "fixture_log_flood", &[]).await;
    let bad = records([b"bad".to_vec()]);
    let good = records([b"good".to_vec()]);
    let with = per_batch(&mut flood, &bad).await;
    let without = per_batch(&mut flood, &good).await;
    let log = (with - without) / 20_000.0;

    println!("emit: {emit:.1} ns per call ({RECORDS} records x {PER_RECORD} emits of 16 B)");
    println!("log: {log:.1} ns per call (20,000 calls of 1,000 B, 256 kept; includes the stdio)");
}
