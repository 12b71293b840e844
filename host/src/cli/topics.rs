//! `sharehost create-topics`, `produce` and `consume`: topics made, and test data in and out of
//! them, with the host's own Kafka client, in the JSON lines `test-plugin` reads, so an author
//! needs no Java tools to feed a pipeline and read back what it wrote (outputs, dead letters).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use bytes::Bytes;
use clap::Args;
use serde_json::{Value, json};
use sharehost::kafka::{
    Compression, ConnectionConfig, ConsumedRecord, Header, KafkaClient, OffsetSpec, ProduceRecord,
    partitioner,
};
use sharehost::manifest::Manifest;
use sharehost::runtime::offline::{MAX_INPUT_LINE_BYTES, read_jsonl};

use super::probe::ClusterArgs;

/// Records per produce request: a few hundred kilobytes of small records, well under the
/// broker's default 1 MiB batch limit for records of up to about 2 KiB.
const PRODUCE_CHUNK: usize = 500;

/// Produced bytes per request at most (keys, values and headers), under the broker's default
/// `message.max.bytes` of 1 MiB with room for the batch's own framing.
const PRODUCE_CHUNK_BYTES: usize = 900 << 10;

/// How long one fetch waits for new records while following a topic.
const FOLLOW_WAIT: Duration = Duration::from_millis(500);

/// Where the cluster is: the flags, or a manifest's `[cluster]`.
#[derive(Args)]
pub(crate) struct Target {
    /// Take the cluster (bootstrap, TLS, SASL) from this manifest's `[cluster]` instead of the
    /// flags below.
    #[arg(long)]
    manifest: Option<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
}

impl Target {
    async fn connect(&self) -> Result<KafkaClient> {
        let (bootstrap, config): (String, ConnectionConfig) = match &self.manifest {
            Some(path) => {
                let manifest = Manifest::load(path)?;
                let config = manifest
                    .cluster
                    .connection_config()
                    .map_err(anyhow::Error::msg)?;
                (manifest.cluster.bootstrap.clone(), config)
            }
            None => (
                self.cluster.bootstrap().to_owned(),
                self.cluster.connection_config()?,
            ),
        };
        KafkaClient::connect(&bootstrap, config)
            .await
            .with_context(|| format!("cannot reach the cluster at {bootstrap}"))
    }
}

/// `sharehost produce TOPIC`.
#[derive(Args)]
pub(crate) struct ProduceArgs {
    /// The topic to write to (it must exist).
    topic: String,
    /// JSON lines to produce, in `test-plugin`'s input format (`key`, `value`, `headers`,
    /// `timestamp`; text, `{"base64": ...}` or null); standard input when not given or `-`.
    /// A record goes to its key's partition (as the Java client's default partitioner puts
    /// it), records without a key round-robin; `topic`, `partition`, `offset` and
    /// `delivery_count` are ignored.
    #[arg(long)]
    input: Option<PathBuf>,
    /// How the record batches are compressed: lz4 (as most producers are set), or none (as
    /// the Java producer's default; what a benchmark that compares topics wants).
    #[arg(long, default_value = "lz4", value_parser = ["lz4", "none"])]
    compression: String,
    #[command(flatten)]
    target: Target,
}

/// `sharehost consume TOPIC`.
#[derive(Args)]
pub(crate) struct ConsumeArgs {
    /// The topic to read (plain fetch, read committed, no group: nothing is acknowledged).
    topic: String,
    /// Start at each partition's first record and stop at the end it had when reading began
    /// (unless --follow); without it, only records produced from now on, until --max or a
    /// signal.
    #[arg(long)]
    from_beginning: bool,
    /// With --from-beginning: keep waiting for new records after the end.
    #[arg(long)]
    follow: bool,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    max: Option<u64>,
    #[command(flatten)]
    target: Target,
}

/// `sharehost create-topics NAME...`.
#[derive(Args)]
pub(crate) struct CreateTopicsArgs {
    /// The topics to create (a pipeline's input, outputs and dead-letter topic).
    #[arg(required = true)]
    names: Vec<String>,
    /// Partitions of each.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// Replicas of each partition.
    #[arg(long, default_value_t = 1)]
    replication_factor: i16,
    /// A topic that exists already is fine (its partitions are left as they are).
    #[arg(long)]
    if_not_exists: bool,
    #[command(flatten)]
    target: Target,
}

/// Creates the topics, one after the other; says each on stderr.
pub(crate) async fn create_topics(args: CreateTopicsArgs) -> Result<()> {
    if args.partitions < 1 {
        bail!("--partitions must be at least 1 (got {})", args.partitions);
    }
    let client = args.target.connect().await?;
    for name in &args.names {
        match client
            .create_topic(name, args.partitions, args.replication_factor, &[])
            .await
        {
            Ok(_) => eprintln!(
                "created {name} ({} partition{})",
                args.partitions,
                if args.partitions == 1 { "" } else { "s" }
            ),
            Err(e)
                if args.if_not_exists
                    && e.code() == Some(kafka_protocol::ResponseError::TopicAlreadyExists) =>
            {
                eprintln!("{name} exists already");
            }
            Err(e) => return Err(e).with_context(|| format!("creating topic {name}")),
        }
    }
    Ok(())
}

/// Produces the input's records; says how many went to which partitions on stderr.
pub(crate) async fn produce(args: ProduceArgs) -> Result<()> {
    let records = match args.input.as_deref().filter(|p| p.as_os_str() != "-") {
        None => read_jsonl(&mut std::io::stdin().lock(), MAX_INPUT_LINE_BYTES)
            .context("standard input")?,
        Some(p) => {
            let file = std::fs::File::open(p)
                .with_context(|| format!("cannot read the input {}", p.display()))?;
            read_jsonl(&mut std::io::BufReader::new(file), MAX_INPUT_LINE_BYTES)
                .with_context(|| p.display().to_string())?
        }
    };
    let client = args.target.connect().await?;
    let meta = topic_meta(&client, &args.topic).await?;
    let mut by_partition: Vec<Vec<ProduceRecord>> = vec![Vec::new(); meta.len()];
    for (i, r) in records.into_iter().enumerate() {
        let round_robin = i32::try_from(i % meta.len()).unwrap_or(0);
        let p = partitioner::by_key_or(r.key.as_deref(), round_robin, meta.len());
        let slot = usize::try_from(p).unwrap_or(0).min(meta.len() - 1);
        by_partition[slot].push(ProduceRecord {
            key: r.key,
            value: r.value,
            headers: r
                .headers
                .into_iter()
                .map(|h| Header {
                    key: h.key,
                    value: h.value,
                })
                .collect(),
            // 0 is the input format's default: stamped now, as a producer would.
            timestamp: (r.timestamp != 0).then_some(r.timestamp),
        });
    }
    let compression = match args.compression.as_str() {
        "none" => Compression::None,
        _ => Compression::Lz4,
    };
    let mut total = 0usize;
    for (slot, records) in by_partition.iter().enumerate() {
        let partition = meta[slot];
        for chunk in chunks(records) {
            client
                .produce(&args.topic, partition, chunk, compression)
                .await
                .with_context(|| format!("producing to {}-{partition}", args.topic))?;
            total += chunk.len();
        }
    }
    let spread: Vec<String> = by_partition
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.is_empty())
        .map(|(slot, r)| format!("{}: {}", meta[slot], r.len()))
        .collect();
    eprintln!(
        "produced {total} records to {} (partition: records {})",
        args.topic,
        spread.join(", ")
    );
    Ok(())
}

/// Consecutive runs of `records` within [`PRODUCE_CHUNK`] records and [`PRODUCE_CHUNK_BYTES`]
/// (a single larger record is a run of its own: the broker decides whether it fits).
fn chunks(records: &[ProduceRecord]) -> Vec<&[ProduceRecord]> {
    let size = |r: &ProduceRecord| {
        r.key.as_ref().map_or(0, Bytes::len)
            + r.value.as_ref().map_or(0, Bytes::len)
            + r.headers
                .iter()
                .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    };
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, r) in records.iter().enumerate() {
        let n = size(r);
        if i > start && (i - start >= PRODUCE_CHUNK || bytes + n > PRODUCE_CHUNK_BYTES) {
            out.push(&records[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < records.len() {
        out.push(&records[start..]);
    }
    out
}

/// The partitions of `topic`, ascending; an error naming the topic when it does not exist.
async fn topic_meta(client: &KafkaClient, topic: &str) -> Result<Vec<i32>> {
    client
        .refresh_metadata(&[topic.to_owned()])
        .await
        .with_context(|| format!("cannot read the metadata of {topic}"))?;
    let meta = client
        .topic(topic)
        .filter(|m| !m.partitions.is_empty())
        .with_context(|| {
            format!(
                "topic {topic} does not exist (create it first: sharehost create-topics {topic})"
            )
        })?;
    Ok(meta.partitions.iter().map(|p| p.index).collect())
}

/// Prints the topic's records as JSON lines until the end it had (with --from-beginning), --max,
/// or for ever (following).
pub(crate) async fn consume(args: ConsumeArgs, out: &mut dyn Write) -> Result<()> {
    if args.follow && !args.from_beginning {
        bail!("--follow goes with --from-beginning (without it, consume follows anyway)");
    }
    let client = args.target.connect().await?;
    let partitions = topic_meta(&client, &args.topic).await?;
    let follow = args.follow || !args.from_beginning;
    let start = if args.from_beginning {
        OffsetSpec::Earliest
    } else {
        OffsetSpec::Latest
    };
    // Per partition: where to read next, and where reading stops when not following.
    let mut cursors = Vec::with_capacity(partitions.len());
    for &p in &partitions {
        let from = client.list_offset(&args.topic, p, start).await?;
        let end = client
            .list_offset(&args.topic, p, OffsetSpec::Latest)
            .await?;
        cursors.push((p, from, end));
    }
    let mut printed = 0u64;
    let max = args.max.unwrap_or(u64::MAX);
    loop {
        let mut open = false;
        for (p, next, end) in cursors.iter_mut() {
            if printed >= max {
                return Ok(());
            }
            if !follow && *next >= *end {
                continue;
            }
            open = true;
            let wait = if follow {
                FOLLOW_WAIT / u32::try_from(partitions.len()).unwrap_or(1).max(1)
            } else {
                Duration::ZERO
            };
            let read = client
                .fetch_committed(&args.topic, *p, *next, wait)
                .await
                .with_context(|| format!("reading {}-{p} at {next}", args.topic))?;
            for r in &read.records {
                if printed >= max {
                    break;
                }
                writeln!(out, "{}", record_line(&args.topic, *p, r))?;
                printed += 1;
            }
            // An open transaction holds the stable end below the log's: read up to where it
            // stands now rather than wait for its end.
            if !follow && read.records.is_empty() && read.next_offset >= read.last_stable_offset {
                *end = (*end).min(read.next_offset);
            }
            *next = read.next_offset.max(*next);
        }
        out.flush()?;
        if !open {
            return Ok(());
        }
    }
}

/// One record as a JSON line in `test-plugin`'s input format: text where the bytes are UTF-8,
/// else `{"base64": ...}`; headers as `[[key, value], ...]`.
fn record_line(topic: &str, partition: i32, r: &ConsumedRecord) -> String {
    json!({
        "topic": topic,
        "partition": partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": bytes_json(r.key.as_ref()),
        "value": bytes_json(r.value.as_ref()),
        "headers": r
            .headers
            .iter()
            .map(|h| json!([h.key, bytes_json(h.value.as_ref())]))
            .collect::<Value>(),
    })
    .to_string()
}

fn bytes_json(b: Option<&Bytes>) -> Value {
    match b {
        None => Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => json!(s),
            Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumed_record_reads_back_as_the_input_format() {
        let r = ConsumedRecord {
            offset: 7,
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from_static(b"k1")),
            value: Some(Bytes::from_static(b"\xff\x00")),
            headers: vec![Header {
                key: "type".into(),
                value: None,
            }],
        };
        let line = record_line("orders", 2, &r);
        let back = sharehost::runtime::offline::parse_jsonl(&line).expect("parses");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(back[0].value.as_deref(), Some(&b"\xff\x00"[..]));
        assert_eq!((back[0].partition, back[0].offset), (2, 7));
        assert_eq!(back[0].headers.len(), 1);
        assert_eq!(back[0].headers[0].value, None);
    }

    #[test]
    fn produce_chunks_bound_records_and_bytes_and_keep_order() {
        let rec = |n: usize| ProduceRecord {
            value: Some(Bytes::from(vec![b'x'; n])),
            ..Default::default()
        };
        let small: Vec<ProduceRecord> = (0..1201).map(|_| rec(10)).collect();
        let sizes: Vec<usize> = chunks(&small).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [500, 500, 201]);
        let big: Vec<ProduceRecord> = (0..5).map(|_| rec(400 << 10)).collect();
        let sizes: Vec<usize> = chunks(&big).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        let huge = [rec(3 << 20)];
        assert_eq!(chunks(&huge).len(), 1);
        assert!(chunks(&[]).is_empty());
    }
}
