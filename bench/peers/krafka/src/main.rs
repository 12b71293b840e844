//! dev/bench's krafka peer: krafka 0.28.1's share consumer (KIP-932) reads N records of one topic in one
//! share group, settles every record with an explicit accept (`ack`), and prints when it started, when the first
//! record arrived, when the N-th was accepted, and how many it read, so dev/bench can put krafka in the same table
//! as sharehost and Apache's consumers.
//!
//! Usage: `krafka-share-bench BOOTSTRAP TOPIC GROUP N`. The accepts ride on the next `ShareFetch`, as the client
//! intends (its docs: "Acknowledgements ride on the next ShareFetch"); `KRAFKA_COMMIT_PER_POLL=1` commits them
//! after every poll instead (one `ShareAcknowledge` round trip per poll). After the N-th record the consumer commits
//! what is left and closes (final `ShareAcknowledge`, leave). Output on stdout, one `key=value` per line:
//! `launch_us`, `first_us`, `last_us` (µs since the Unix epoch), `records`, `commit_failures`.

use std::error::Error;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use krafka::share_consumer::AcknowledgementMode;
use krafka::Kafka;

/// Microseconds since the Unix epoch: the time base dev/bench uses for every consumer kind.
fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// Seconds without a record after which the run gives up (dev/bench has its own idle timeout too).
const IDLE_LIMIT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let launch = now_us();
    let args: Vec<String> = std::env::args().collect();
    let [_, bootstrap, topic, group, n] = args.as_slice() else {
        return Err("usage: krafka-share-bench BOOTSTRAP TOPIC GROUP N".into());
    };
    let want: u64 = n.parse().map_err(|e| format!("N '{n}': {e}"))?;
    let commit_per_poll = std::env::var("KRAFKA_COMMIT_PER_POLL").is_ok_and(|v| v == "1");

    let kafka = Kafka::builder(bootstrap.clone())
        .client_id("krafka-share-bench")
        .connect()
        .await?;
    let consumer = kafka
        .share_consumer(group.clone())
        .acknowledgement_mode(AcknowledgementMode::Explicit)
        .build()
        .await?;
    consumer.subscribe([topic.as_str()]).await?;

    let mut read: u64 = 0;
    let mut first = 0u128;
    let mut last = 0u128;
    let mut failures: u64 = 0;
    let mut idle = Duration::ZERO;
    while read < want {
        let records = consumer.poll(Duration::from_secs(1)).await?;
        if records.is_empty() {
            idle += Duration::from_secs(1);
            if idle >= IDLE_LIMIT {
                return Err(format!("no record for {IDLE_LIMIT:?} after {read} of {want}").into());
            }
            continue;
        }
        idle = Duration::ZERO;
        if first == 0 {
            first = now_us();
        }
        for record in &records {
            consumer.ack(record)?;
        }
        read += records.len() as u64;
        if commit_per_poll {
            failures += count_failures(consumer.commit().await?);
        }
        if read >= want {
            last = now_us();
        }
    }
    // The accepts of the last poll have no next fetch to ride on: send them now.
    failures += count_failures(consumer.commit().await?);
    consumer.close().await?;
    println!("launch_us={launch}\nfirst_us={first}\nlast_us={last}\nrecords={read}\ncommit_failures={failures}");
    Ok(())
}

/// How many partitions' acknowledgements a commit reported as failed (each one is printed to stderr).
fn count_failures(results: krafka::share_consumer::CommitResults) -> u64 {
    let mut failed = 0;
    for (partition, outcome) in results {
        if let Err(error) = outcome {
            eprintln!(
                "acknowledging {}-{} failed: {error}",
                partition.topic, partition.partition
            );
            failed += 1;
        }
    }
    failed
}
