//! The fleet's control plane under many hosts: N simulated hosts each publish a status (three
//! pipelines, a canary's tallies) every interval to a fleet's status topic and read everyone's,
//! as a fleet host's agent does; the broker's CPU is read from /proc before and during, and
//! compared with the same time idle. Figures in docs/benchmarks.md ("The fleet's control
//! plane").
//!
//! Usage: cargo run --release -p sharehost --example fleet_status_bench -- \
//!   BOOTSTRAP BROKER_PID [HOSTS=100] [SECONDS=60] [INTERVAL_MS=2000]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use sharehost::fleet::records::{CanaryReport, HostStatus, PipelineReport};
use sharehost::fleet::topics;
use sharehost::kafka::{Compression, ConnectionConfig, KafkaClient, OffsetSpec, ProduceRecord};
use sharehost::manifest::FleetSpec;
use sharehost::runtime::{TrustPolicy, TrustedKey};
use sharehost_api::Tally;

/// The broker process's CPU time (user + system), from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("no process {pid}"))?;
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<f64> {
        f.get(i)
            .with_context(|| format!("/proc/{pid}/stat has no field {}", i + 3))?
            .parse::<f64>()
            .with_context(|| format!("/proc/{pid}/stat field {} is not a number", i + 3))
    };
    let ticks = field(11)? + field(12)?;
    let hz = 100.0; // USER_HZ on Linux
    Ok(ticks / hz)
}

fn status(host: usize, at_ms: u64) -> HostStatus {
    let tally = Tally {
        batches: 1000,
        faulted_batches: 0,
        records: 100_000,
        rejected: 1200,
        released: 0,
    };
    HostStatus {
        host: format!("sim-{host:03}"),
        instance: format!("instance-{host}"),
        at_ms,
        version: "bench".into(),
        pipelines: (0..3)
            .map(|p| PipelineReport {
                name: format!("pipeline-{p}"),
                state: "running".into(),
                active: "ab".repeat(32),
                applied_seq: 7,
                refused: None,
                canary: (p == 0).then(|| CanaryReport {
                    seq: 7,
                    candidate: "cd".repeat(32),
                    candidate_tally: tally,
                    active_tally: tally,
                }),
                shadow: None,
                records_per_second: 12345.6,
                faults: 0,
                judged: 1_000_000,
            })
            .collect(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bootstrap = args.first().context("BOOTSTRAP")?.clone();
    let pid: u32 = args.get(1).context("BROKER_PID")?.parse()?;
    let hosts: usize = args.get(2).map_or(Ok(100), |a| a.parse())?;
    let seconds: u64 = args.get(3).map_or(Ok(60), |a| a.parse())?;
    let interval = Duration::from_millis(args.get(4).map_or(Ok(2000), |a| a.parse())?);

    let kp = minisign::KeyPair::generate_unencrypted_keypair()?;
    let trust =
        TrustPolicy::new([TrustedKey::parse(&kp.pk.to_base64()).map_err(anyhow::Error::msg)?])
            .context("a policy")?;
    let spec = FleetSpec {
        name: format!("bench-{}", std::process::id()),
        host_id: None,
        topic_prefix: "sharehost.bench.".into(),
        replication_factor: Some(1),
        status_interval_ms: interval.as_millis() as u64,
        stale_after_ms: 30_000,
        status_retention_ms: 3_600_000,
        max_hosts: 1_000,
        trust: Arc::new(trust),
    };
    let admin =
        KafkaClient::connect(&bootstrap, ConnectionConfig::new("fleet-status-bench")).await?;
    let t = topics::ensure(&admin, &spec).await?;

    let window = Duration::from_secs(seconds);
    let idle_start = cpu_seconds(pid)?;
    tokio::time::sleep(window).await;
    let idle = cpu_seconds(pid)? - idle_start;

    let produced = Arc::new(AtomicU64::new(0));
    let read = Arc::new(AtomicU64::new(0));
    let read_bytes = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let mut tasks = Vec::new();
    for h in 0..hosts {
        let (bootstrap, topic) = (bootstrap.clone(), t.status.clone());
        let (produced, read, read_bytes) = (produced.clone(), read.clone(), read_bytes.clone());
        tasks.push(tokio::spawn(async move {
            let client =
                KafkaClient::connect(&bootstrap, ConnectionConfig::new("fleet-status-bench"))
                    .await?;
            let mut at = client.list_offset(&topic, 0, OffsetSpec::Latest).await?;
            // Hosts start spread over one interval, as hosts started at different times are.
            tokio::time::sleep(interval.mul_f64(h as f64 / hosts as f64)).await;
            let mut tick = tokio::time::interval(interval);
            while Instant::now() < deadline {
                tick.tick().await;
                let now_ms = sharehost::kafka::now_ms();
                let value = serde_json::to_vec(&status(h, now_ms))?;
                let record = ProduceRecord {
                    key: Some(Bytes::from(format!("sim-{h:03}"))),
                    value: Some(Bytes::from(value)),
                    headers: Vec::new(),
                    timestamp: None,
                };
                client
                    .produce(&topic, 0, &[record], Compression::None)
                    .await?;
                produced.fetch_add(1, Ordering::Relaxed);
                loop {
                    let got = client.fetch(&topic, 0, at, Duration::ZERO).await?;
                    let Some(last) = got.records.last().map(|r| r.offset) else {
                        break;
                    };
                    for r in &got.records {
                        read_bytes.fetch_add(
                            r.value.as_ref().map_or(0, |v| v.len() as u64),
                            Ordering::Relaxed,
                        );
                    }
                    read.fetch_add(got.records.len() as u64, Ordering::Relaxed);
                    at = last + 1;
                    if at >= got.high_watermark {
                        break;
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    let busy_start = cpu_seconds(pid)?;
    let started = Instant::now();
    for task in tasks {
        task.await??;
    }
    let busy = cpu_seconds(pid)? - busy_start;
    let elapsed = started.elapsed().as_secs_f64();
    let produced = produced.load(Ordering::Relaxed) as f64;
    println!(
        "fleet control plane: {hosts} simulated hosts, a status every {} ms, {:.0} s",
        interval.as_millis(),
        elapsed
    );
    println!(
        "  status records written {:.1}/s ({} B each), read {:.0}/s by all hosts ({:.1} MB/s)",
        produced / elapsed,
        serde_json::to_vec(&status(0, 0))?.len(),
        read.load(Ordering::Relaxed) as f64 / elapsed,
        read_bytes.load(Ordering::Relaxed) as f64 / elapsed / 1e6
    );
    println!(
        "  broker CPU: {:.3} s per s idle, {:.3} s per s with the hosts (+{:.3}, {:.1} ms per status record)",
        idle / window.as_secs_f64(),
        busy / elapsed,
        busy / elapsed - idle / window.as_secs_f64(),
        (busy - idle * elapsed / window.as_secs_f64()) / produced * 1e3
    );
    Ok(())
}
