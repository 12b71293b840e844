//! `share_bench`: the share consumer engine's throughput benchmark, the engine alone.
//!
//! Starts one [`ShareConsumer`] on an existing topic with a no-op handler that accepts every
//! record, stops after `--records` accepted records, closes, and prints one machine-readable
//! line on stdout:
//!
//! ```text
//! sharehost records=N seconds=S records_per_sec=R mb_per_sec=M total_seconds=T total_records_per_sec=TR ...
//! ```
//!
//! - `seconds`/`records_per_sec`/`mb_per_sec`: from the first delivered record to the N-th
//!   accepted one (steady state, without the group join).
//! - `total_seconds`/`total_records_per_sec`/`total_mb_per_sec`: from before connecting to the N-th accepted record;
//!   this is how Apache's `ShareConsumerPerformance` measures (consumer creation to the N-th
//!   record), so it is the figure to compare with it.
//! - MB are key + value bytes / 2^20, as `ShareConsumerPerformance` counts them.
//! - The remaining fields are diagnostics: deliveries and their mean size, the time spent waiting
//!   in `poll`, how many polls waited long (a stalled fetch loop), the peak of records in flight,
//!   the close time, the engine's counters, and the acknowledgement outcomes read while running
//!   (one per partition per request that carried acks) with their mean size in offsets.
//!
//! The group should start from the earliest offset: pass `--earliest` (sets
//! `share.auto.offset.reset=earliest` on the group before joining) or set it beforehand with
//! `dev/kafka share-earliest GROUP`. `dev/bench` compares the real host with Apache's client and
//! the other share consumers; this stays for looking at the engine alone (docs/benchmarks.md,
//! "The engine alone").
//!
//! Logging goes to stderr, filtered by `SHAREHOST_LOG` (default `warn`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use sharehost::kafka::{ConnectionConfig, KafkaClient};
use sharehost::share::consumer::{AcquireMode, ShareConsumer, ShareConsumerConfig};
use sharehost::share::ledger::AckKind;

/// Measures records/s acquired and accepted by one share consumer with a no-op handler.
#[derive(Debug, Parser)]
#[command(name = "share_bench")]
struct Args {
    /// Bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    /// Topic to consume (must exist and hold at least `--records` records).
    #[arg(long)]
    topic: String,
    /// Share group to consume in.
    #[arg(long)]
    group: String,
    /// How many records to accept before stopping.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Set `share.auto.offset.reset=earliest` on the group before joining.
    #[arg(long)]
    earliest: bool,
    /// Engine setting `max_in_flight` (default: the engine's).
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// ShareFetch MaxRecords (default: the engine's, like `max.poll.records`).
    #[arg(long)]
    max_records: Option<i32>,
    /// ShareFetch BatchSize (default: the engine's).
    #[arg(long)]
    batch_size: Option<i32>,
    /// ShareFetch MaxBytes (default: the engine's).
    #[arg(long)]
    max_bytes: Option<i32>,
    /// ShareFetch MaxWaitMs (default: the engine's).
    #[arg(long)]
    max_wait_ms: Option<u64>,
    /// Acquire in record-limit mode (ShareFetch v2) instead of whole batches.
    #[arg(long)]
    record_limit: bool,
    /// Give up when no record arrives for this many seconds.
    #[arg(long, default_value_t = 60)]
    idle_timeout_secs: u64,
    /// Time allowed for `close`.
    #[arg(long, default_value_t = 30)]
    close_timeout_secs: u64,
}

impl Args {
    /// The engine settings: its defaults, overridden by the flags given.
    fn config(&self) -> ShareConsumerConfig {
        let mut c = ShareConsumerConfig::new(&self.group, &[&self.topic]);
        if let Some(v) = self.max_in_flight {
            c.max_in_flight = v;
        }
        if let Some(v) = self.max_records {
            c.max_records = v;
        }
        if let Some(v) = self.batch_size {
            c.batch_size = v;
        }
        if let Some(v) = self.max_bytes {
            c.max_bytes = v;
        }
        if let Some(v) = self.max_wait_ms {
            c.max_wait = Duration::from_millis(v);
        }
        if self.record_limit {
            c.acquire_mode = AcquireMode::RecordLimit;
        }
        c
    }
}

/// A poll that waited at least this long while records were still expected counts as a stall.
const STALL: Duration = Duration::from_millis(100);

/// What the consume loop observed.
#[derive(Debug, Default)]
struct Observed {
    /// Every record accepted (the last delivery may go past N).
    accepted: u64,
    /// Key + value bytes of the first N records.
    bytes: u64,
    deliveries: u64,
    poison: u64,
    first_record: Option<Instant>,
    nth_accepted: Option<Instant>,
    poll_wait: Duration,
    stalls: u64,
    peak_in_flight: usize,
    /// Acknowledgement outcomes read (one per partition per request carrying acks).
    ack_outcomes: u64,
    /// Offsets those outcomes covered.
    acked_offsets: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHAREHOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    if args.records == 0 {
        bail!("--records must be at least 1");
    }

    let start = Instant::now();
    let client = Arc::new(
        KafkaClient::connect(&args.bootstrap, ConnectionConfig::new("sharehost-bench"))
            .await
            .with_context(|| format!("connecting to {}", args.bootstrap))?,
    );
    if args.earliest {
        client
            .alter_group_configs(&args.group, &[("share.auto.offset.reset", "earliest")])
            .await
            .with_context(|| format!("setting share.auto.offset.reset on {}", args.group))?;
    }
    let consumer = ShareConsumer::start(client, args.config())
        .await
        .context("starting the share consumer")?;

    let consumed = consume(&consumer, &args).await;
    let close_start = Instant::now();
    consumer
        .close(Duration::from_secs(args.close_timeout_secs))
        .await;
    let close_secs = close_start.elapsed().as_secs_f64();
    let seen = consumed?;

    let (Some(first), Some(nth)) = (seen.first_record, seen.nth_accepted) else {
        bail!("no record was delivered");
    };
    let secs = nth.duration_since(first).as_secs_f64();
    let total_secs = nth.duration_since(start).as_secs_f64();
    let mb = seen.bytes as f64 / (1024.0 * 1024.0);
    let n = args.records as f64;
    let per_sec = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let stats = consumer.stats();
    println!(
        "sharehost records={} seconds={:.3} records_per_sec={:.1} mb_per_sec={:.3} \
         total_seconds={:.3} total_records_per_sec={:.1} total_mb_per_sec={:.3} first_record_after_s={:.3} \
         deliveries={} records_per_delivery={:.1} poll_wait_s={:.3} stalled_polls={} \
         peak_in_flight={} close_s={:.3} poison={} gaps={} released_by_broker={} \
         session_resets={} acks_ok={} acks_failed={} ack_outcomes={} offsets_per_ack_outcome={:.1} \
         accepted_total={}",
        args.records,
        secs,
        per_sec(n, secs),
        per_sec(mb, secs),
        total_secs,
        per_sec(n, total_secs),
        per_sec(mb, total_secs),
        first.duration_since(start).as_secs_f64(),
        seen.deliveries,
        per_sec(seen.accepted as f64, seen.deliveries as f64),
        seen.poll_wait.as_secs_f64(),
        seen.stalls,
        seen.peak_in_flight,
        close_secs,
        seen.poison,
        stats.gaps.load(Ordering::Relaxed),
        stats.released_by_broker.load(Ordering::Relaxed),
        stats.session_resets.load(Ordering::Relaxed),
        stats.acks_ok.load(Ordering::Relaxed),
        stats.acks_failed.load(Ordering::Relaxed),
        seen.ack_outcomes,
        per_sec(seen.acked_offsets as f64, seen.ack_outcomes as f64),
        seen.accepted,
    );
    Ok(())
}

/// Polls and accepts until `--records` records are accepted; fails on an engine error or when
/// nothing arrives for `--idle-timeout-secs`.
async fn consume(consumer: &ShareConsumer, args: &Args) -> anyhow::Result<Observed> {
    let mut seen = Observed::default();
    let idle = Duration::from_secs(args.idle_timeout_secs);
    let mut last_record = Instant::now();
    while seen.accepted < args.records {
        let polled = Instant::now();
        let delivery = consumer
            .poll(Duration::from_millis(100))
            .await
            .context("poll")?;
        let waited = polled.elapsed();
        // Before the first record the wait is the group join, not the engine's throughput.
        if seen.first_record.is_some() {
            seen.poll_wait += waited;
            if waited >= STALL {
                seen.stalls += 1;
            }
        }
        let Some(delivery) = delivery else {
            if last_record.elapsed() >= idle {
                bail!(
                    "no record for {}s after {} accepted records (does the topic hold {} records, \
                     and does the group start from earliest?)",
                    args.idle_timeout_secs,
                    seen.accepted,
                    args.records
                );
            }
            continue;
        };
        // A real host reads the acknowledgement outcomes (unread, the engine queues them). Each is
        // one partition's acknowledgements in one request: their count and size show how the
        // engine batches acks.
        for outcome in consumer.take_outcomes() {
            seen.ack_outcomes += 1;
            seen.acked_offsets += outcome.offsets();
        }
        seen.deliveries += 1;
        seen.poison += delivery.poison.len() as u64;
        seen.peak_in_flight = seen.peak_in_flight.max(consumer.in_flight());
        if !delivery.records.is_empty() {
            last_record = Instant::now();
            seen.first_record.get_or_insert(last_record);
        }
        // The no-op handler: count the bytes and accept. Records beyond the N-th are accepted
        // too (rather than left locked) but not timed.
        for record in &delivery.records {
            if seen.accepted < args.records {
                let r = &record.record;
                seen.bytes += r.key.as_ref().map_or(0, |k| k.len() as u64)
                    + r.value.as_ref().map_or(0, |v| v.len() as u64);
            }
            consumer
                .acknowledge(record, AckKind::Accept)
                .context("acknowledge")?;
            seen.accepted += 1;
            if seen.accepted == args.records {
                seen.nth_accepted = Some(Instant::now());
            }
        }
    }
    Ok(seen)
}
