//! `sharehost dlq`: reads a pipeline's dead-letter topic with plain Fetch (no group), shows
//! each dead letter with its provenance, and replays chosen ones to their original topic.
//!
//! A dead letter (see `dead_letter` in the pipeline) carries the original record's key, value
//! and headers plus the provenance headers `sharehost.original.topic/partition/offset`,
//! `sharehost.original.delivery-count`, `sharehost.reason`, `sharehost.pipeline`, `sharehost.plugin`,
//! `sharehost.plugin.version` and, with signed components, `sharehost.plugin.signer`. A
//! replay produces key, value and the original headers (the provenance ones removed) to the
//! original topic, with `sharehost.replayed-from = "DLQTOPIC/PARTITION/OFFSET"` added.
//!
//! Replay happens once per dead letter: the offsets replayed are remembered in a state file
//! (`dlq-replay-CLUSTER-TOPIC-TOPICID.json` in the host's state directory), keyed by cluster
//! id, DLQ topic (name and id), partition and offset, written atomically. Each produce batch (at most
//! [`PRODUCE_BATCH_RECORDS`] records or [`PRODUCE_BATCH_BYTES`] bytes, acks=all) is noted as
//! pending, with the end offset of its partition, before it is sent, and remembered as
//! replayed when the broker answers. A rerun skips what is remembered; a run that finds a
//! pending batch (the last one stopped or failed before the answer) reads that partition from
//! the noted offset and remembers the dead letters whose `sharehost.replayed-from` it finds
//! there, so they are not produced again. What can still duplicate: the client resends a
//! produce after a transport error within its request timeout, and if the first one had been
//! written both are in the log, with the same `sharehost.replayed-from` (the de-duplication
//! key).
//!
//! Memory is bounded by one Fetch response (the client asks for at most 8 MiB per partition):
//! records are listed or replayed chunk by chunk.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::MetadataRequest;
use serde::{Deserialize, Serialize};

use crate::kafka::partitioner;
use crate::kafka::{
    Compression, ConsumedRecord, Header, KafkaClient, OffsetSpec, ProduceRecord, TopicMeta,
};
use crate::manifest::Manifest;
pub use crate::provenance::REPLAYED_FROM;
use crate::provenance::{self as pv, DEAD_LETTER_HEADERS};
pub use sharehost_api::Summary;

/// Most records in one replay Produce request (and so the most a crash can replay twice).
pub const PRODUCE_BATCH_RECORDS: usize = 500;
/// Most record bytes (key + value + headers) in one replay Produce request: well under the
/// broker's default `message.max.bytes` (1 MiB).
pub const PRODUCE_BATCH_BYTES: usize = 512 * 1024;

/// What to do with the dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Show the dead letters with their provenance.
    List,
    /// Produce the chosen dead letters to their original topic, once.
    Replay,
}

/// `sharehost dlq MANIFEST --pipeline NAME list|replay [...]`.
#[derive(Debug, clap::Args)]
pub struct DlqArgs {
    /// The manifest (TOML) whose pipeline's `dead_letter_topic` and cluster are used.
    pub manifest: PathBuf,
    /// The pipeline whose dead letters to read.
    #[arg(long)]
    pub pipeline: String,
    /// `list` shows dead letters; `replay` produces them to their original topic once.
    #[arg(value_enum)]
    pub action: Action,
    /// Only dead letters whose `sharehost.reason` matches this regular expression (a search,
    /// anchor it with ^...$ for a whole match).
    #[arg(long, value_name = "REGEX")]
    pub reason: Option<String>,
    /// Only these dead-letter-topic offsets: `A..B` (B excluded), `A..=B`, `A..`, `..B` or `N`.
    #[arg(long, value_name = "A..B")]
    pub offsets: Option<String>,
    /// Only this partition of the dead-letter topic.
    #[arg(long, value_name = "P")]
    pub partition: Option<i32>,
    /// With `replay`: show what would be replayed, produce nothing and remember nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON object per line (each dead letter, then a summary) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Characters of key and value shown per dead letter.
    #[arg(long, default_value_t = 60)]
    pub preview: usize,
    /// Where the replay state is kept (default: $SHAREHOST_STATE_DIR or the host's state
    /// directory beside the precompiled cache).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Dead letters from other pipelines sharing the topic are skipped unless this is given.
    #[arg(long)]
    pub any_pipeline: bool,
}

/// A half-open range of offsets, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetRange {
    /// First offset included.
    pub start: i64,
    /// First offset excluded.
    pub end: i64,
}

impl OffsetRange {
    /// Every offset.
    pub const ALL: OffsetRange = OffsetRange {
        start: 0,
        end: i64::MAX,
    };

    /// Parses `A..B` (B excluded), `A..=B`, `A..`, `..B`, `..=B` or a single offset `N`, so an
    /// operator can paste offsets shown by `list`. Errors say what was expected.
    pub fn parse(text: &str) -> Result<OffsetRange> {
        let num = |s: &str, what: &str| -> Result<i64> {
            let s = s.trim();
            let n: i64 = s.parse().with_context(|| {
                format!("--offsets {text:?}: {what} {s:?} is not a whole number (expected A..B, A..=B, A.., ..B or N)")
            })?;
            if n < 0 {
                bail!("--offsets {text:?}: offsets are never negative");
            }
            Ok(n)
        };
        let range = match text.split_once("..") {
            None => {
                let n = num(text, "offset")?;
                OffsetRange {
                    start: n,
                    end: n.saturating_add(1),
                }
            }
            Some((a, b)) => {
                let start = if a.trim().is_empty() {
                    0
                } else {
                    num(a, "start")?
                };
                let end = match b.strip_prefix('=') {
                    Some(b) => num(b, "end")?.saturating_add(1),
                    None if b.trim().is_empty() => i64::MAX,
                    None => num(b, "end")?,
                };
                OffsetRange { start, end }
            }
        };
        if range.start >= range.end {
            bail!(
                "--offsets {text:?}: the range is empty (start {} is not below end {})",
                range.start,
                range.end
            );
        }
        Ok(range)
    }
}

/// A dead letter as read back: where it is, where it came from, and why.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Dead-letter topic partition.
    pub partition: i32,
    /// Offset in the dead-letter topic.
    pub offset: i64,
    /// The original record's topic (`sharehost.original.topic`), if the header is there.
    pub original_topic: Option<String>,
    /// The original record's partition.
    pub original_partition: Option<i32>,
    /// The original record's offset.
    pub original_offset: Option<i64>,
    /// Delivery count when it was rejected.
    pub delivery_count: Option<u32>,
    /// Why it was rejected (`sharehost.reason`).
    pub reason: String,
    /// The pipeline that dead-lettered it.
    pub pipeline: Option<String>,
    /// The plugin component.
    pub plugin: Option<String>,
    /// The plugin version (content hash) that rejected it.
    pub plugin_version: Option<String>,
    /// The key id that signed that version, when the pipeline requires signatures.
    pub plugin_signer: Option<String>,
    #[serde(skip)]
    key: Option<Bytes>,
    #[serde(skip)]
    value: Option<Bytes>,
    #[serde(skip)]
    headers: Vec<Header>,
}

fn header_text(headers: &[Header], key: &str) -> Option<String> {
    headers
        .iter()
        .rev()
        .find(|h| h.key == key)
        .and_then(|h| h.value.as_deref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

impl DeadLetter {
    /// The original record's value as the dead letter carries it (`None` for a null value, or
    /// for a dead letter written without it: see `sharehost.dropped-bytes`).
    pub fn value(&self) -> Option<&Bytes> {
        self.value.as_ref()
    }

    /// The original record's key as the dead letter carries it.
    pub fn key(&self) -> Option<&Bytes> {
        self.key.as_ref()
    }

    /// The text of the dead letter's header `key` (the last one of that name).
    pub fn header(&self, key: &str) -> Option<String> {
        header_text(&self.headers, key)
    }

    /// Reads the provenance headers of a record of dead-letter partition `partition`.
    pub fn from_record(partition: i32, r: ConsumedRecord) -> DeadLetter {
        let h = |k: &str| header_text(&r.headers, k);
        DeadLetter {
            partition,
            offset: r.offset,
            original_topic: h(pv::ORIGINAL_TOPIC),
            original_partition: h(pv::ORIGINAL_PARTITION).and_then(|v| v.parse().ok()),
            original_offset: h(pv::ORIGINAL_OFFSET).and_then(|v| v.parse().ok()),
            delivery_count: h(pv::ORIGINAL_DELIVERY_COUNT)
                .or_else(|| h(pv::LEGACY_DELIVERY_COUNT))
                .and_then(|v| v.parse().ok()),
            reason: h(pv::REASON).unwrap_or_default(),
            pipeline: h(pv::PIPELINE),
            plugin: h(pv::PLUGIN),
            plugin_version: h(pv::PLUGIN_VERSION),
            plugin_signer: h(pv::PLUGIN_SIGNER),
            key: r.key,
            value: r.value,
            headers: r.headers,
        }
    }

    /// The record a replay produces: key and value as they were, the original headers without
    /// the dead letter's provenance (and without an older `sharehost.replayed-from`), then
    /// `sharehost.replayed-from = "DLQTOPIC/PARTITION/OFFSET"`. The timestamp is the replay's
    /// (an old one could put the record behind the topic's retention at once).
    pub fn replay_record(&self, dlq_topic: &str) -> ProduceRecord {
        let mut headers: Vec<Header> = self
            .headers
            .iter()
            .filter(|h| h.key != REPLAYED_FROM && !DEAD_LETTER_HEADERS.contains(&h.key.as_str()))
            .cloned()
            .collect();
        headers.push(Header {
            key: REPLAYED_FROM.to_owned(),
            value: Some(Bytes::from(format!(
                "{dlq_topic}/{}/{}",
                self.partition, self.offset
            ))),
        });
        ProduceRecord {
            key: self.key.clone(),
            value: self.value.clone(),
            headers,
            timestamp: None,
        }
    }

    fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
            + 64
    }

    fn original(&self) -> String {
        match (
            &self.original_topic,
            self.original_partition,
            self.original_offset,
        ) {
            (Some(t), Some(p), Some(o)) => format!("{t}/{p}/{o}"),
            (Some(t), Some(p), None) => format!("{t}/{p}/?"),
            (Some(t), None, _) => format!("{t}/?/?"),
            _ => "-".to_owned(),
        }
    }
}

/// Text of `bytes` for a table: UTF-8 (lossy), control characters escaped, at most `max`
/// characters then `…`; `null` for a null field.
pub fn preview(bytes: Option<&[u8]>, max: usize) -> String {
    let Some(b) = bytes else {
        return "null".to_owned();
    };
    let text = String::from_utf8_lossy(&b[..b.len().min(max.saturating_mul(4))]);
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            return out;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if b.len() > max.saturating_mul(4) {
        out.push('…');
    }
    out
}

/// Offsets already replayed, per dead-letter partition, as merged half-open ranges.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplayState {
    /// The cluster id (or the bootstrap list when the broker gives none).
    pub cluster: String,
    /// The dead-letter topic.
    pub topic: String,
    /// Its topic id: offsets of a topic deleted and created again under the same name start
    /// at 0 again and are other dead letters, so the id is part of the key.
    #[serde(default)]
    pub topic_id: String,
    /// Partition → start → end (excluded) of each replayed range.
    pub replayed: BTreeMap<i32, BTreeMap<i64, i64>>,
    /// The produce in progress when the state was written last, if any: a run that stopped
    /// between writing it and the broker's answer left it, and the next run looks for its
    /// records in the original topic before replaying anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

/// One replay produce, remembered before it is sent: where it goes, the end of that partition
/// before it, and the dead letters in it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pending {
    /// Original topic produced to.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The partition's end offset just before the produce: its records, if any, are at or
    /// after it.
    pub from_offset: i64,
    /// The dead letters in the produce, as (dead-letter partition, offset).
    pub dead_letters: Vec<(i32, i64)>,
}

impl ReplayState {
    /// Whether `offset` of `partition` was replayed.
    pub fn contains(&self, partition: i32, offset: i64) -> bool {
        self.replayed
            .get(&partition)
            .and_then(|m| m.range(..=offset).next_back())
            .is_some_and(|(_, end)| offset < *end)
    }

    /// Remembers `offset` of `partition` as replayed, merging it with its neighbours so a
    /// contiguous replay stays one range.
    pub fn insert(&mut self, partition: i32, offset: i64) {
        if self.contains(partition, offset) {
            return;
        }
        let m = self.replayed.entry(partition).or_default();
        let (mut start, mut end) = (offset, offset + 1);
        if let Some((&s, &e)) = m.range(..=offset).next_back()
            && e == offset
        {
            start = s;
            m.remove(&s);
        }
        if let Some(&e) = m.get(&end) {
            m.remove(&end);
            end = e;
        }
        m.insert(start, end);
    }

    /// How many offsets are remembered.
    pub fn count(&self) -> u64 {
        self.replayed
            .values()
            .flat_map(|m| m.iter())
            .map(|(s, e)| (e - s) as u64)
            .sum()
    }
}

/// The state file of one cluster's dead-letter topic (name and id) in `dir`.
pub fn state_path(dir: &Path, cluster: &str, topic: &str, topic_id: &str) -> PathBuf {
    let safe = crate::persisted::file_name_part;
    dir.join(format!(
        "dlq-replay-{}-{}-{}.json",
        safe(cluster),
        safe(topic),
        safe(topic_id)
    ))
}

fn load_state(path: &Path, cluster: &str, topic: &str, topic_id: &str) -> Result<ReplayState> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let state: ReplayState = serde_json::from_slice(&bytes)
                .with_context(|| format!("replay state {}", path.display()))?;
            if state.cluster != cluster || state.topic != topic || state.topic_id != topic_id {
                bail!(
                    "replay state {}: written for {}/{} ({}), not {cluster}/{topic} ({topic_id})",
                    path.display(),
                    state.cluster,
                    state.topic,
                    state.topic_id
                );
            }
            Ok(state)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ReplayState {
            cluster: cluster.to_owned(),
            topic: topic.to_owned(),
            topic_id: topic_id.to_owned(),
            replayed: BTreeMap::new(),
            pending: None,
        }),
        Err(e) => Err(e).with_context(|| format!("replay state {}", path.display())),
    }
}

/// Takes the replay lock of a state file (`STATE.lock`, an advisory `flock` the kernel drops
/// when the process ends, so a crash leaves no stale lock): two replays of one topic at once
/// would each produce what the other has not remembered yet.
fn lock_replay(state: &Path) -> Result<std::fs::File> {
    let dir = state.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("state directory {}", dir.display()))?;
    let mut name = state.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("replay lock {}", path.display()))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => bail!(
            "another `sharehost dlq replay` of this dead-letter topic is running (it holds {})",
            path.display()
        ),
        Err(e) => Err(e).with_context(|| format!("replay lock {}", path.display())),
    }
}

fn save_state(path: &Path, state: &ReplayState) -> Result<()> {
    let bytes = serde_json::to_vec(state)?;
    crate::persisted::write_atomically(path, &bytes)
        .with_context(|| format!("writing the replay state {}", path.display()))
}

/// What the dead-letter reader is asked for: `sharehost dlq`'s options without its output
/// format (the console's requests are these too).
#[derive(Debug, Clone)]
pub struct Request {
    /// The manifest whose pipeline's `dead_letter_topic` and cluster are used.
    pub manifest: PathBuf,
    /// The pipeline whose dead letters to read.
    pub pipeline: String,
    /// Only dead letters whose `sharehost.reason` matches this regular expression.
    pub reason: Option<String>,
    /// Only these dead-letter-topic offsets (the forms of [`OffsetRange::parse`]).
    pub offsets: Option<String>,
    /// Only this partition of the dead-letter topic.
    pub partition: Option<i32>,
    /// With a replay: say what would be replayed, produce and remember nothing.
    pub dry_run: bool,
    /// Where the replay state is kept (default: the host's state directory).
    pub state_dir: Option<PathBuf>,
    /// Dead letters from other pipelines sharing the topic are skipped unless this is set.
    pub any_pipeline: bool,
}

impl From<&DlqArgs> for Request {
    fn from(a: &DlqArgs) -> Request {
        Request {
            manifest: a.manifest.clone(),
            pipeline: a.pipeline.clone(),
            reason: a.reason.clone(),
            offsets: a.offsets.clone(),
            partition: a.partition,
            dry_run: a.dry_run,
            state_dir: a.state_dir.clone(),
            any_pipeline: a.any_pipeline,
        }
    }
}

/// What became of one selected dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Listed (read only).
    Listed,
    /// Replayed by an earlier run, so skipped.
    AlreadyReplayed,
    /// Its original topic (named) no longer exists: not replayed.
    TopicMissing(String),
    /// A dry run: it would be produced to this topic and partition.
    WouldReplay {
        /// The original topic.
        topic: String,
        /// The partition it would go to.
        partition: i32,
    },
    /// Produced to this topic, partition and offset, and remembered.
    Replayed {
        /// The original topic.
        topic: String,
        /// The partition it went to.
        partition: i32,
        /// Its offset there.
        offset: i64,
    },
}

/// One selected dead letter as the reader hands it to its caller, in topic order.
#[derive(Debug)]
pub struct Seen<'a> {
    /// The dead-letter topic.
    pub topic: &'a str,
    /// The dead letter.
    pub dead_letter: &'a DeadLetter,
    /// What became of it.
    pub outcome: Outcome,
}

/// Why the dead-letter reader stopped. Its text (`{:#}`) is the whole chain of what was being
/// done, as `sharehost dlq` prints it.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// The request cannot be served as asked (a bad option, no such pipeline, no dead-letter
    /// topic, a partition it does not have): nothing was read or written.
    #[error("{0:#}")]
    Refused(anyhow::Error),
    /// Reading the cluster or keeping the replay state failed midway (or a replay of the same
    /// topic runs): what was replayed and remembered stays so.
    #[error("{0:#}")]
    Failed(anyhow::Error),
    /// The caller could not take a dead letter (`sharehost dlq` writing its output).
    #[error("{0}")]
    Output(#[from] std::io::Error),
}

impl DlqError {
    /// The error as an `anyhow` chain, for a command's edge.
    pub fn into_anyhow(self) -> anyhow::Error {
        match self {
            DlqError::Refused(e) | DlqError::Failed(e) => e,
            DlqError::Output(e) => e.into(),
        }
    }
}

impl From<anyhow::Error> for DlqError {
    fn from(e: anyhow::Error) -> DlqError {
        DlqError::Failed(e)
    }
}

/// A filter over dead letters: reason, pipeline.
struct Selection {
    reason: Option<regex_automata::meta::Regex>,
    pipeline: Option<String>,
}

impl Selection {
    fn new(req: &Request) -> Result<Selection> {
        let reason = match &req.reason {
            None => None,
            Some(r) => Some(regex_automata::meta::Regex::new(r).map_err(|e| {
                // The syntax error's text is several lines (pattern, caret, message): keep
                // the message, so the one-line error says what is wrong.
                let why = e.syntax_error().map_or_else(
                    || e.to_string(),
                    |s| {
                        let text = s.to_string();
                        text.lines()
                            .find_map(|l| l.strip_prefix("error: "))
                            .unwrap_or(text.trim())
                            .to_owned()
                    },
                );
                anyhow::anyhow!("--reason {r:?} is not a valid regular expression: {why}")
            })?),
        };
        Ok(Selection {
            reason,
            pipeline: (!req.any_pipeline).then(|| req.pipeline.clone()),
        })
    }
}

/// Runs `sharehost dlq`, writing its table or JSON lines to `out`: the lines are rendered from
/// what [`list`] or [`replay`] hand over.
pub async fn run(args: &DlqArgs, out: &mut dyn Write) -> Result<Summary> {
    let req = Request::from(args);
    // The table's header goes before the first line (or the summary, when none is shown).
    let mut header = !args.json && args.action == Action::List;
    let mut print = |seen: &Seen<'_>| -> std::io::Result<()> {
        if std::mem::take(&mut header) {
            write_header(out)?;
        }
        show(out, seen, args)
    };
    let summary = match args.action {
        Action::List => list(&req, &mut print).await,
        Action::Replay => replay(&req, &mut print).await,
    }
    .map_err(DlqError::into_anyhow)?;
    if header {
        write_header(out)?;
    }
    if args.json {
        writeln!(out, "{}", serde_json::json!({ "summary": summary }))?;
    } else {
        let verb = if args.dry_run {
            "would replay"
        } else {
            "replayed"
        };
        match args.action {
            Action::List => writeln!(
                out,
                "{} dead letters read, {} shown ({} from other pipelines, {} without provenance)",
                summary.read, summary.selected, summary.other_pipeline, summary.not_dead_letters
            )?,
            Action::Replay => writeln!(
                out,
                "{} dead letters read, {} selected, {verb} {}, {} already replayed before, {} found in the topic from an earlier run's unanswered produce, {} with their original topic missing ({} from other pipelines, {} without provenance)",
                summary.read,
                summary.selected,
                summary.replayed,
                summary.already_replayed,
                summary.recovered,
                summary.original_topic_missing,
                summary.other_pipeline,
                summary.not_dead_letters
            )?,
        }
    }
    Ok(summary)
}

fn write_header(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<4} {:>8}  {:<40} {:>3}  {:<30} {:<12} {:<20} VALUE",
        "PART", "OFFSET", "ORIGINAL", "DC", "REASON", "VERSION", "KEY"
    )
}

/// Reads the pipeline's dead letters (in the offsets, partition and reason asked for) and
/// hands each selected one to `each`, [`Outcome::Listed`], in topic order; returns what was
/// read. Memory holds one fetch at a time, never the whole topic.
pub async fn list<F>(req: &Request, each: F) -> Result<Summary, DlqError>
where
    F: FnMut(&Seen<'_>) -> std::io::Result<()>,
{
    visit(req, Action::List, each).await
}

/// Replays the selected dead letters to their original topics once (with `dry_run`, says
/// what it would do and writes nothing), handing each to `each` with what became of it;
/// returns what it did. Holds the replay state's lock while it runs.
pub async fn replay<F>(req: &Request, each: F) -> Result<Summary, DlqError>
where
    F: FnMut(&Seen<'_>) -> std::io::Result<()>,
{
    visit(req, Action::Replay, each).await
}

/// What [`list`] and [`replay`] share: the topic read partition by partition, chunk by chunk.
async fn visit<F>(req: &Request, action: Action, mut each: F) -> Result<Summary, DlqError>
where
    F: FnMut(&Seen<'_>) -> std::io::Result<()>,
{
    let selection = Selection::new(req).map_err(DlqError::Refused)?;
    let range = match &req.offsets {
        Some(t) => OffsetRange::parse(t).map_err(DlqError::Refused)?,
        None => OffsetRange::ALL,
    };
    if req.dry_run && action == Action::List {
        return Err(DlqError::Refused(anyhow::anyhow!(
            "--dry-run goes with replay (list never produces)"
        )));
    }
    let manifest = Manifest::load(&req.manifest).map_err(|e| DlqError::Refused(e.into()))?;
    let spec = manifest
        .pipelines
        .iter()
        .find(|p| p.name == req.pipeline)
        .with_context(|| {
            let names: Vec<&str> = manifest.pipelines.iter().map(|p| p.name.as_str()).collect();
            format!(
                "{}: no pipeline named {:?} (there are: {})",
                req.manifest.display(),
                req.pipeline,
                names.join(", ")
            )
        })
        .map_err(DlqError::Refused)?;
    let dlq = spec
        .dead_letter_topic
        .clone()
        .with_context(|| {
            format!(
                "pipeline {}: no dead_letter_topic in {} (rejected records are not kept)",
                spec.name,
                req.manifest.display()
            )
        })
        .map_err(DlqError::Refused)?;
    let config = manifest
        .cluster
        .connection_config()
        .map_err(anyhow::Error::msg)
        .map_err(DlqError::Refused)?;
    let client = KafkaClient::connect(&manifest.cluster.bootstrap, config)
        .await
        .map_err(anyhow::Error::from)?;
    if !topic_exists(&client, &dlq).await? {
        return Err(DlqError::Refused(anyhow::anyhow!(
            "the dead-letter topic {dlq} does not exist"
        )));
    }
    client
        .refresh_metadata(std::slice::from_ref(&dlq))
        .await
        .map_err(anyhow::Error::from)?;
    let meta = client
        .topic(&dlq)
        .with_context(|| format!("the dead-letter topic {dlq} does not exist"))
        .map_err(DlqError::Refused)?;
    let partitions: Vec<i32> = match req.partition {
        None => meta.partitions.iter().map(|p| p.index).collect(),
        Some(p) if meta.partitions.iter().any(|m| m.index == p) => vec![p],
        Some(p) => {
            return Err(DlqError::Refused(anyhow::anyhow!(
                "--partition {p}: the dead-letter topic {dlq} has partitions 0..{}",
                meta.partitions.len()
            )));
        }
    };

    let mut summary = Summary {
        dry_run: req.dry_run,
        ..Summary::default()
    };
    // Held until the run ends: a second replay of the same topic fails at once.
    let mut lock: Option<std::fs::File> = None;
    let mut replay = match action {
        Action::List => None,
        Action::Replay => {
            let cluster = cluster_id(&client)
                .await?
                .unwrap_or_else(|| manifest.cluster.bootstrap.clone());
            let dir = req
                .state_dir
                .clone()
                .unwrap_or_else(crate::persisted::default_state_dir);
            let topic_id = meta.id.simple().to_string();
            let path = state_path(&dir, &cluster, &dlq, &topic_id);
            lock = Some(lock_replay(&path)?);
            let state = load_state(&path, &cluster, &dlq, &topic_id)?;
            let mut r = Replayer {
                client: &client,
                dlq: dlq.clone(),
                path,
                state,
                topics: HashMap::new(),
                dry_run: req.dry_run,
            };
            r.recover(&mut summary).await?;
            Some(r)
        }
    };

    for p in partitions {
        let earliest = client
            .list_offset(&dlq, p, OffsetSpec::Earliest)
            .await
            .map_err(anyhow::Error::from)?;
        let latest = client
            .list_offset(&dlq, p, OffsetSpec::Latest)
            .await
            .map_err(anyhow::Error::from)?;
        let mut next = earliest.max(range.start);
        let end = latest.min(range.end);
        let mut empty_fetches = 0;
        while next < end {
            // Committed dead letters only: an exactly-once pipeline's aborted transactions may
            // hold dead letters that never counted (for another topic it reads the same).
            let fetched = client
                .fetch_committed(&dlq, p, next, Duration::from_millis(500))
                .await
                .with_context(|| format!("fetching {dlq}/{p} at offset {next}"))?;
            let past = fetched.next_offset;
            if fetched.records.is_empty() && past > next {
                // Transaction markers or aborted records only.
                next = past;
                continue;
            }
            if fetched.records.is_empty() {
                // Only control records (or nothing yet) at this offset: give up after a few.
                empty_fetches += 1;
                if empty_fetches >= 3 {
                    return Err(DlqError::Failed(anyhow::anyhow!(
                        "{dlq}/{p}: no records at offset {next} below the end {end} after {empty_fetches} fetches"
                    )));
                }
                continue;
            }
            empty_fetches = 0;
            let mut chunk = Vec::new();
            for r in fetched.records {
                next = next.max(r.offset + 1);
                if r.offset >= end {
                    break;
                }
                summary.read += 1;
                let d = DeadLetter::from_record(p, r);
                if d.original_topic.is_none() {
                    summary.not_dead_letters += 1;
                    continue;
                }
                if let Some(want) = &selection.pipeline
                    && d.pipeline.as_deref() != Some(want.as_str())
                {
                    summary.other_pipeline += 1;
                    continue;
                }
                if let Some(re) = &selection.reason
                    && !re.is_match(&d.reason)
                {
                    continue;
                }
                summary.selected += 1;
                chunk.push(d);
            }
            match &mut replay {
                None => {
                    for d in &chunk {
                        each(&Seen {
                            topic: &dlq,
                            dead_letter: d,
                            outcome: Outcome::Listed,
                        })?;
                    }
                }
                Some(r) => r.replay(chunk, &mut each, &mut summary).await?,
            }
        }
    }
    drop(lock);
    Ok(summary)
}

/// The cluster id from Metadata, the key of the replay state (so two spellings of one
/// bootstrap list share it, and two clusters behind one address do not). A failed request is
/// an error, never a fallback: a state file keyed differently on one run would replay again.
/// `None` only when the broker says it has no id.
async fn cluster_id(client: &KafkaClient) -> Result<Option<String>> {
    let resp = client
        .send_any(&MetadataRequest::default().with_topics(Some(Vec::new())))
        .await
        .context("asking the cluster for its id (the key of the replay state)")?;
    Ok(resp
        .cluster_id
        .map(|c| c.as_str().to_owned())
        .filter(|c| !c.is_empty()))
}

/// Whether `topic` exists, asked without letting the broker create it: the client's metadata
/// refresh allows auto-creation (as producers do), and neither a typo'd dead-letter topic nor
/// a deleted original topic should come back into existence because someone looked.
async fn topic_exists(client: &KafkaClient, topic: &str) -> Result<bool> {
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::protocol::StrBytes;
    let req = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(StrBytes::from_string(topic.to_owned())),
        ))]));
    let resp = client
        .send_any(&req)
        .await
        .with_context(|| format!("metadata of {topic}"))?;
    Ok(resp
        .topics
        .iter()
        .any(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic) && t.error_code == 0))
}

/// One line of `sharehost dlq`'s output for a dead letter: a JSON object with `--json`, else
/// a table row for a listed one and a status line for a replayed one (one replayed before is
/// shown only in JSON).
fn show(out: &mut dyn Write, seen: &Seen<'_>, args: &DlqArgs) -> std::io::Result<()> {
    let d = seen.dead_letter;
    let to = match &seen.outcome {
        Outcome::Listed => None,
        Outcome::AlreadyReplayed => Some(("already-replayed", serde_json::Value::Null)),
        Outcome::TopicMissing(topic) => Some(("topic-missing", topic.clone().into())),
        Outcome::WouldReplay { topic, partition } => {
            Some(("would-replay", format!("{topic}/{partition}").into()))
        }
        Outcome::Replayed {
            topic,
            partition,
            offset,
        } => Some(("replayed", format!("{topic}/{partition}/{offset}").into())),
    };
    if args.json {
        let mut v = serde_json::to_value(d)?;
        // Previews, and a null field stays JSON null.
        v["key"] = d
            .key
            .as_deref()
            .map(|k| preview(Some(k), args.preview))
            .into();
        v["value"] = d
            .value
            .as_deref()
            .map(|k| preview(Some(k), args.preview))
            .into();
        if let Some((status, target)) = to {
            v["replay"] = serde_json::json!({ "status": status, "to": target });
        }
        return writeln!(out, "{v}");
    }
    match to {
        None => {
            let version = d.plugin_version.as_deref().unwrap_or("-");
            writeln!(
                out,
                "{:<4} {:>8}  {:<40} {:>3}  {:<30} {:<12} {:<20} {}",
                d.partition,
                d.offset,
                d.original(),
                d.delivery_count.map_or("-".to_owned(), |c| c.to_string()),
                preview(Some(d.reason.as_bytes()), 30),
                crate::pipeline::short(version),
                preview(d.key.as_deref(), 20),
                preview(d.value.as_deref(), args.preview),
            )
        }
        Some(("already-replayed", _)) => Ok(()),
        Some((status, target)) => {
            let target = match target {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            writeln!(
                out,
                "{status:<16} {}/{}/{} -> {target}  reason {:?}",
                seen.topic, d.partition, d.offset, d.reason
            )
        }
    }
}

/// Produces chosen dead letters to their original topics and remembers what it produced.
struct Replayer<'a> {
    client: &'a KafkaClient,
    dlq: String,
    path: PathBuf,
    state: ReplayState,
    topics: HashMap<String, Option<TopicMeta>>,
    dry_run: bool,
}

impl Replayer<'_> {
    async fn topic(&mut self, name: &str) -> Option<TopicMeta> {
        if !self.topics.contains_key(name) {
            let meta = match topic_exists(self.client, name).await {
                Ok(true) => match self.client.refresh_metadata(&[name.to_owned()]).await {
                    Ok(()) => self.client.topic(name),
                    Err(_) => None,
                },
                _ => None,
            };
            self.topics.insert(name.to_owned(), meta);
        }
        self.topics.get(name).cloned().flatten()
    }

    /// Hands `d` to the caller with `outcome`.
    fn hand<F>(&self, each: &mut F, d: &DeadLetter, outcome: Outcome) -> Result<(), DlqError>
    where
        F: FnMut(&Seen<'_>) -> std::io::Result<()>,
    {
        Ok(each(&Seen {
            topic: &self.dlq,
            dead_letter: d,
            outcome,
        })?)
    }

    /// Replays the records of one fetched chunk: grouped by target partition (in dead-letter
    /// order within each), each group produced in batches, each batch remembered once the
    /// broker acknowledged it.
    async fn replay<F>(
        &mut self,
        chunk: Vec<DeadLetter>,
        each: &mut F,
        summary: &mut Summary,
    ) -> Result<(), DlqError>
    where
        F: FnMut(&Seen<'_>) -> std::io::Result<()>,
    {
        let mut groups: Vec<((String, i32), Vec<DeadLetter>)> = Vec::new();
        for d in chunk {
            if self.state.contains(d.partition, d.offset) {
                summary.already_replayed += 1;
                self.hand(each, &d, Outcome::AlreadyReplayed)?;
                continue;
            }
            let topic = d.original_topic.clone().unwrap_or_default();
            let Some(meta) = self.topic(&topic).await else {
                summary.original_topic_missing += 1;
                self.hand(each, &d, Outcome::TopicMissing(topic))?;
                continue;
            };
            let p = target_partition(&meta, d.original_partition, d.key.as_deref());
            let target = (topic, p);
            match groups.iter_mut().find(|(t, _)| *t == target) {
                Some((_, v)) => v.push(d),
                None => groups.push((target, vec![d])),
            }
        }
        for ((topic, p), records) in groups {
            let mut batch: Vec<DeadLetter> = Vec::new();
            let mut bytes = 0;
            for d in records {
                if !batch.is_empty()
                    && (batch.len() >= PRODUCE_BATCH_RECORDS
                        || bytes + d.size() > PRODUCE_BATCH_BYTES)
                {
                    self.produce(&topic, p, std::mem::take(&mut batch), each, summary)
                        .await?;
                    bytes = 0;
                }
                bytes += d.size();
                batch.push(d);
            }
            if !batch.is_empty() {
                self.produce(&topic, p, batch, each, summary).await?;
            }
        }
        Ok(())
    }

    async fn produce<F>(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Vec<DeadLetter>,
        each: &mut F,
        summary: &mut Summary,
    ) -> Result<(), DlqError>
    where
        F: FnMut(&Seen<'_>) -> std::io::Result<()>,
    {
        if self.dry_run {
            for d in &batch {
                summary.replayed += 1;
                let outcome = Outcome::WouldReplay {
                    topic: topic.to_owned(),
                    partition,
                };
                self.hand(each, d, outcome)?;
            }
            return Ok(());
        }
        let records: Vec<ProduceRecord> =
            batch.iter().map(|d| d.replay_record(&self.dlq)).collect();
        // Remember the produce before sending it, so that a run stopped before the answer
        // leaves enough for the next one to find what arrived (see `recover`).
        let from_offset = self
            .client
            .list_offset(topic, partition, OffsetSpec::Latest)
            .await
            .with_context(|| format!("end offset of {topic}/{partition}"))?;
        self.state.pending = Some(Pending {
            topic: topic.to_owned(),
            partition,
            from_offset,
            dead_letters: batch.iter().map(|d| (d.partition, d.offset)).collect(),
        });
        save_state(&self.path, &self.state)?;
        let base = self
            .client
            .produce(topic, partition, &records, Compression::None)
            .await
            .with_context(|| {
                format!(
                    "replaying {} dead letters to {topic}/{partition} (the next run looks for them there and replays only those that did not arrive)",
                    batch.len()
                )
            })?;
        for (i, d) in batch.iter().enumerate() {
            self.state.insert(d.partition, d.offset);
            summary.replayed += 1;
            let outcome = Outcome::Replayed {
                topic: topic.to_owned(),
                partition,
                offset: base + i as i64,
            };
            self.hand(each, d, outcome)?;
        }
        self.state.pending = None;
        Ok(save_state(&self.path, &self.state)?)
    }

    /// Settles a produce an earlier run did not see answered: reads its original partition
    /// from the end offset noted before it, and remembers as replayed each of its dead letters
    /// whose `sharehost.replayed-from` is there; the others are replayed like any other. A dry
    /// run looks too, but writes nothing.
    async fn recover(&mut self, summary: &mut Summary) -> Result<()> {
        let Some(p) = self.state.pending.clone() else {
            return Ok(());
        };
        let wanted: HashMap<String, (i32, i64)> = p
            .dead_letters
            .iter()
            .map(|&(dp, o)| (format!("{}/{dp}/{o}", self.dlq), (dp, o)))
            .collect();
        if topic_exists(self.client, &p.topic).await? {
            self.client
                .refresh_metadata(std::slice::from_ref(&p.topic))
                .await?;
            let earliest = self
                .client
                .list_offset(&p.topic, p.partition, OffsetSpec::Earliest)
                .await?;
            let end = self
                .client
                .list_offset(&p.topic, p.partition, OffsetSpec::Latest)
                .await?;
            let mut next = p.from_offset.max(earliest);
            let mut empty_fetches = 0;
            while next < end {
                let fetched = self
                    .client
                    .fetch_committed(&p.topic, p.partition, next, Duration::from_millis(500))
                    .await
                    .with_context(|| {
                        format!(
                            "looking for an unanswered replay in {}/{} at offset {next}",
                            p.topic, p.partition
                        )
                    })?;
                if fetched.records.is_empty() && fetched.next_offset > next {
                    next = fetched.next_offset;
                    continue;
                }
                if fetched.records.is_empty() {
                    empty_fetches += 1;
                    if empty_fetches >= 3 {
                        break;
                    }
                    continue;
                }
                empty_fetches = 0;
                for r in fetched.records {
                    next = next.max(r.offset + 1);
                    if let Some(&(dp, o)) =
                        header_text(&r.headers, REPLAYED_FROM).and_then(|v| wanted.get(&v))
                        && !self.state.contains(dp, o)
                    {
                        self.state.insert(dp, o);
                        summary.recovered += 1;
                    }
                }
            }
        }
        self.state.pending = None;
        if !self.dry_run {
            save_state(&self.path, &self.state)?;
        }
        Ok(())
    }
}

/// Where a replayed record goes: its original partition while the topic still has it, else by
/// key like the Java client's default partitioner (murmur2), else (no key) the original
/// partition modulo the partition count.
pub fn target_partition(meta: &TopicMeta, original: Option<i32>, key: Option<&[u8]>) -> i32 {
    if let Some(p) = original
        && meta.partitions.iter().any(|m| m.index == p)
    {
        return p;
    }
    partitioner::by_key_or(key, original.unwrap_or(0), meta.partitions.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_ranges_parse_like_rust_ranges_and_refuse_nonsense() {
        let r = |a, b| OffsetRange { start: a, end: b };
        assert_eq!(OffsetRange::parse("3..7").expect("a..b"), r(3, 7));
        assert_eq!(OffsetRange::parse("3..=7").expect("a..=b"), r(3, 8));
        assert_eq!(OffsetRange::parse("3..").expect("a.."), r(3, i64::MAX));
        assert_eq!(OffsetRange::parse("..7").expect("..b"), r(0, 7));
        assert_eq!(OffsetRange::parse("5").expect("n"), r(5, 6));
        for bad in ["7..3", "3..3", "x..4", "1..y", "-1..4", "", "..", "1...4"] {
            let e = OffsetRange::parse(bad);
            if bad == ".." {
                assert_eq!(e.expect("all"), OffsetRange::ALL);
                continue;
            }
            let e = e.expect_err(bad).to_string();
            assert!(e.contains("--offsets"), "{bad}: {e}");
        }
    }

    #[test]
    fn replay_state_merges_ranges_and_survives_json() {
        let mut s = ReplayState::default();
        for o in [5, 7, 6, 1, 2, 0, 9] {
            s.insert(0, o);
        }
        s.insert(1, 4);
        assert_eq!(
            s.replayed[&0]
                .iter()
                .map(|(a, b)| (*a, *b))
                .collect::<Vec<_>>(),
            [(0, 3), (5, 8), (9, 10)]
        );
        assert!(s.contains(0, 7) && s.contains(0, 0) && s.contains(1, 4));
        assert!(!s.contains(0, 3) && !s.contains(0, 8) && !s.contains(1, 5) && !s.contains(2, 4));
        assert_eq!(s.count(), 8);
        let back: ReplayState =
            serde_json::from_str(&serde_json::to_string(&s).expect("json")).expect("parse");
        assert_eq!(back, s);
    }

    #[test]
    fn a_replayed_record_loses_the_provenance_and_names_its_dead_letter() {
        let h = |k: &str, v: &str| Header {
            key: k.to_owned(),
            value: Some(Bytes::from(v.to_owned())),
        };
        let mut headers = vec![h("trace", "abc"), h(REPLAYED_FROM, "old/0/1")];
        headers.extend(DEAD_LETTER_HEADERS.iter().map(|k| h(k, "x")));
        headers[2].value = Some(Bytes::from_static(b"orders"));
        let d = DeadLetter::from_record(
            2,
            ConsumedRecord {
                offset: 41,
                timestamp: 0,
                key: Some(Bytes::from_static(b"k")),
                value: None,
                headers,
            },
        );
        assert_eq!(d.original_topic.as_deref(), Some("orders"));
        let r = d.replay_record("orders-dlq");
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.value, None);
        assert_eq!(
            r.headers,
            [h("trace", "abc"), h(REPLAYED_FROM, "orders-dlq/2/41")]
        );
    }

    #[test]
    fn one_replay_at_a_time_per_state_file() {
        let dir = std::env::temp_dir().join(format!("sharehost-dlq-lock-{}", std::process::id()));
        let state = dir.join("dlq-replay-c-t.json");
        let held = lock_replay(&state).expect("first lock");
        let e = lock_replay(&state).expect_err("second lock").to_string();
        assert!(e.contains("another `sharehost dlq replay`"), "{e}");
        let other = lock_replay(&dir.join("dlq-replay-c-u.json")).expect("another topic");
        drop((held, other));
        lock_replay(&state).expect("free again once dropped");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn previews_are_bounded_and_escaped() {
        assert_eq!(preview(None, 5), "null");
        assert_eq!(preview(Some(b"abc"), 5), "abc");
        assert_eq!(preview(Some(b"abcdefgh"), 5), "abcde…");
        assert_eq!(preview(Some(b"a\nb"), 5), "a\\nb");
        assert_eq!(preview(Some(&[0xff; 100]), 3), "\u{fffd}\u{fffd}\u{fffd}…");
    }

    #[test]
    fn a_replay_goes_to_the_original_partition_or_where_a_java_producer_puts_the_key() {
        let meta = TopicMeta {
            name: "t".into(),
            id: uuid::Uuid::nil(),
            partitions: (0..7)
                .map(|index| crate::kafka::client::PartitionMeta {
                    index,
                    leader: 1,
                    leader_epoch: 0,
                })
                .collect(),
        };
        assert_eq!(target_partition(&meta, Some(3), Some(b"21")), 3);
        assert_eq!(
            target_partition(&meta, Some(9), Some(b"21")),
            (-973_932_308i32 & 0x7fff_ffff) % 7
        );
        assert_eq!(target_partition(&meta, Some(9), None), 2);
    }
}
