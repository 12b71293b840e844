//! Plugins that act, against a real broker and the `sharehost` binary: a plugin's emits are
//! bound to their source record. Every accepted record's outputs are in the output topic,
//! produced before its Accept; the emits of a record released, rejected or retried are not;
//! a host killed mid-stream loses no output of an accepted record (duplicates possible,
//! counted); an output topic that cannot be written releases its sources until it can. And
//! the rest of what a plugin that acts may do, through the host: a 0.1.0 plugin still runs as
//! before, a secret never shows, a server's 429 becomes a `retry` whose record comes back after
//! its delay with the next delivery count, and a host outside the allow-list is never reached.
//!
//! The witness is outside the engine: the ledger plugin (tests/fixtures/guests/ledger with
//! `emit-to`) reports what it judged through the host's log, the broker says the group is
//! drained (ShareGroupCommand lag 0), and the output topic is read back with plain Fetch. Each
//! scenario prints `outputs NAME: produced, accepted, rejected, emitted, outputs found,
//! duplicates, lost` and fails if an accepted record lacks its output.
//!
//! Part of the host package's tests (it needs the `sharehost` binary), like tests/faults.rs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sharehost::dlq::DeadLetter;
use sharehost::kafka::KafkaClient;
use sharehost_tests::host::{HostProcess, PATIENCE, Seen, Watch};
use sharehost_tests::ledger::{Ledger, report};
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    FAULT_SETTINGS, blocking, bootstrap, client, committed_records, fresh_group_with, guest,
    ledger_manifest, produce_ids, serve_on_loopback, topic_records, topic_values,
    topic_with_dead_letters, unique, wait_until_drained,
};

const PARTITIONS: i32 = 3;
const OUTPUT_PARTITIONS: i32 = 2;

/// One output record as read back: its value (the source id) and provenance headers.
#[derive(Debug)]
struct Output {
    id: String,
    source_topic: String,
    source_partition: i32,
    source_offset: i64,
    delivery_count: u16,
}

struct Scenario {
    name: &'static str,
    /// Whether its pipelines run `guarantee = "exactly-once"`.
    exactly_once: bool,
    client: Arc<KafkaClient>,
    topic: String,
    output: String,
    dlq: String,
    group: String,
    dir: PathBuf,
    ids: Vec<String>,
}

impl Scenario {
    /// The same scenario with its pipelines exactly-once (`exactly_once`).
    fn guarantee(self, exactly_once: bool) -> Self {
        Scenario {
            exactly_once,
            ..self
        }
    }

    /// The manifest line of the scenario's guarantee.
    fn guarantee_line(&self) -> &'static str {
        if self.exactly_once {
            "guarantee = \"exactly-once\"\n"
        } else {
            ""
        }
    }

    /// A topic of `records` ids, a dead-letter topic, an output topic (created now or left to
    /// the test) and a fresh group with a `lock_ms` lock and a 6 s member session.
    async fn new(name: &'static str, records: u64, lock_ms: u32, create_output: bool) -> Self {
        let client = Arc::new(client().await);
        let (topic, dlq) = topic_with_dead_letters(&client, name, PARTITIONS, 1).await;
        let output = format!("{topic}-out");
        if create_output {
            client
                .create_topic(&output, OUTPUT_PARTITIONS, 1, &[])
                .await
                .expect("create output topic");
        }
        let group = fresh_group_with(
            &client,
            Some(lock_ms),
            &[("share.session.timeout.ms", "6000")],
        )
        .await;
        let ids = produce_ids(&client, &topic, PARTITIONS, 0..records).await;
        let dir = std::env::temp_dir().join(unique("sharehost-outputs"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scenario {
            name,
            exactly_once: false,
            client,
            topic,
            output,
            dlq,
            group,
            dir,
            ids,
        }
    }

    /// One ledger pipeline emitting every record's id to output `valid` (this scenario's
    /// output topic), every 7th id rejected and dead-lettered, plus `plugin_config`.
    fn manifest(&self, plugin_config: &str) -> PathBuf {
        self.manifest_with(
            plugin_config,
            &format!("dead_letter_topic = \"{}\"\n", self.dlq),
        )
    }

    /// [`Scenario::manifest`] without a dead-letter topic (every 7th id is rejected, and that
    /// is all), with `settings`, more pipeline lines.
    fn manifest_with(&self, plugin_config: &str, settings: &str) -> PathBuf {
        let text = ledger_manifest(
            &bootstrap(),
            &self.topic,
            &self.group,
            &guest("fixture_ledger"),
            &format!(r#"reject-every = "7", emit-to = "valid", {plugin_config}"#),
            &format!(
                "{FAULT_SETTINGS}{}{settings}[pipeline.outputs]\nvalid = \"{}\"\n",
                self.guarantee_line(),
                self.output
            ),
        );
        let path = self.dir.join(format!("{}.toml", unique("manifest")));
        std::fs::write(&path, text).expect("write manifest");
        path
    }

    /// The ids every host's plugin saw, once the broker has nothing left for the group: the
    /// engine-independent ledger, checked (nothing lost) and printed.
    async fn ledger(&self, seen: &[Seen]) -> Ledger {
        let group = self.group.clone();
        blocking(move || wait_until_drained(&group)).await;
        let mut ledger = Ledger::new(self.name, self.ids.iter().cloned());
        for s in seen {
            s.record(&mut ledger);
        }
        for (_, r) in committed_records(&self.client, &self.dlq, 1).await {
            ledger.dead_lettered(String::from_utf8_lossy(
                r.value.as_deref().unwrap_or_default(),
            ));
        }
        ledger.check();
        ledger
    }

    /// Every record of the output topic read `read_committed` (as a downstream consumer of an
    /// exactly-once pipeline reads it; the same as every record for an at-least-once one), with
    /// its provenance headers parsed.
    async fn outputs(&self) -> Vec<Output> {
        committed_records(&self.client, &self.output, OUTPUT_PARTITIONS)
            .await
            .into_iter()
            .map(|(_, r)| {
                let header = |k: &str| {
                    r.headers
                        .iter()
                        .find(|h| h.key == k)
                        .and_then(|h| h.value.as_deref())
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_else(|| panic!("output record lacks header {k}: {r:?}"))
                };
                Output {
                    id: String::from_utf8_lossy(r.value.as_deref().unwrap_or_default())
                        .into_owned(),
                    source_topic: header("sharehost.source.topic"),
                    source_partition: header("sharehost.source.partition")
                        .parse()
                        .expect("partition"),
                    source_offset: header("sharehost.source.offset").parse().expect("offset"),
                    delivery_count: header("sharehost.source.delivery-count")
                        .parse()
                        .expect("delivery count"),
                }
            })
            .collect()
    }

    /// Each source id's (partition, offset), read back from the source topic.
    async fn coordinates(&self) -> HashMap<String, (i32, i64)> {
        topic_records(&self.client, &self.topic, PARTITIONS)
            .await
            .into_iter()
            .map(|(p, r)| {
                (
                    String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned(),
                    (p, r.offset),
                )
            })
            .collect()
    }

    /// Runs one host on `manifest` until its plugin has judged every id, then stops it;
    /// returns the host's status taken before the stop and what the plugin reported.
    async fn run_until_judged(&self, manifest: PathBuf) -> (serde_json::Value, Seen) {
        sharehost_tests::host::run_until_judged(
            sharehost_bin!(),
            manifest,
            self.ids.len(),
            &self.group,
        )
        .await
    }

    /// Checks the outputs against the ledger: every accepted id has an output whose
    /// provenance names its source record, no rejected id has one; prints the ledger line and
    /// returns the outputs per id.
    async fn check_outputs(&self, ledger: &Ledger, accepted: &HashSet<String>) -> OutputLedger {
        self.check_outputs_with(ledger, accepted, Vec::new()).await
    }

    /// [`Scenario::check_outputs`] counting `earlier` too: the outputs read from an output
    /// topic that was deleted since.
    async fn check_outputs_with(
        &self,
        ledger: &Ledger,
        accepted: &HashSet<String>,
        earlier: Vec<Output>,
    ) -> OutputLedger {
        let mut outputs = earlier;
        outputs.extend(self.outputs().await);
        let coordinates = self.coordinates().await;
        let mut by_id: BTreeMap<String, Vec<Output>> = BTreeMap::new();
        for o in outputs {
            assert_eq!(o.source_topic, self.topic, "{o:?}");
            assert_eq!(
                coordinates.get(&o.id),
                Some(&(o.source_partition, o.source_offset)),
                "{}: the provenance of output {o:?} names its source record",
                self.name
            );
            by_id.entry(o.id.clone()).or_default().push(o);
        }
        let found: usize = by_id.values().map(Vec::len).sum();
        let lost: Vec<&String> = accepted
            .iter()
            .filter(|id| !by_id.contains_key(*id))
            .collect();
        let stray: Vec<&String> = by_id.keys().filter(|id| !accepted.contains(*id)).collect();
        let duplicates = found - by_id.len();
        report(&format!(
            "outputs {}: produced {}, accepted {}, rejected {}, emitted (outputs found) {found}, distinct {}, duplicates {duplicates}, lost {}",
            self.name,
            ledger.produced(),
            accepted.len(),
            ledger.rejected_ids(),
            by_id.len(),
            lost.len()
        ));
        assert!(
            lost.is_empty(),
            "{}: accepted records without their output: {lost:?}",
            self.name
        );
        assert!(
            stray.is_empty(),
            "{}: outputs of records that were not accepted (released or rejected emits must be discarded): {stray:?}",
            self.name
        );
        OutputLedger { by_id, duplicates }
    }
}

struct OutputLedger {
    by_id: BTreeMap<String, Vec<Output>>,
    duplicates: usize,
}

impl OutputLedger {
    /// Sources with an output written on a later delivery (a delivery spent on the way).
    fn redelivered(&self) -> usize {
        self.by_id
            .values()
            .filter(|o| o.iter().any(|o| o.delivery_count >= 2))
            .count()
    }
}

/// The accepted ids of a scenario: every id the plugins reported accepting.
fn accepted(seen: &[&Seen]) -> HashSet<String> {
    seen.iter()
        .flat_map(|s| s.accepted.iter().cloned())
        .collect()
}

fn status_counter(status: &serde_json::Value, key: &str) -> u64 {
    status[0]["versions"]
        .as_object()
        .map(|m| m.values().map(|c| c[key].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// Polls the host's `GET /pipelines` until `number(status, key)` reaches `at_least` (the
/// host's own events; there is nothing finer to wait on from outside).
fn reaches(
    host: &HostProcess,
    number: fn(&serde_json::Value, &str) -> u64,
    key: &str,
    at_least: u64,
) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = host.status();
        if number(&status, key) >= at_least {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{key} never reached {at_least}: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`reaches`] for a version counter summed over versions.
fn status_reaches(host: &HostProcess, key: &str, at_least: u64) -> serde_json::Value {
    reaches(host, status_counter, key, at_least)
}

async fn accepted_records_have_their_outputs_and_no_emit_of_a_released_or_rejected_one_is_produced_in(
    exactly_once: bool,
) {
    let name = if exactly_once {
        "outputs-bound-eo"
    } else {
        "outputs-bound"
    };
    let s = Scenario::new(name, 700, 30_000, true)
        .await
        .guarantee(exactly_once);
    // Every id emits; multiples of 7 are then rejected, multiples of 5 released once (their
    // first emit must be discarded) and accepted on their second delivery.
    let manifest = s.manifest(r#"release-first-every = "5""#);
    let (status, seen) = s.run_until_judged(manifest).await;
    let ledger = s.ledger(std::slice::from_ref(&seen)).await;
    let accepted = accepted(&[&seen]);
    let outputs = s.check_outputs(&ledger, &accepted).await;
    assert_eq!(outputs.duplicates, 0, "no crash, no duplicate output");
    for (id, outs) in &outputs.by_id {
        let n: u64 = id.parse().expect("id");
        let want = if n.is_multiple_of(5) { 2 } else { 1 };
        assert_eq!(
            outs[0].delivery_count, want,
            "output of {id} carries its source's delivery count"
        );
    }
    let rejected = s
        .ids
        .iter()
        .filter(|id| id.parse::<u64>().is_ok_and(|n| n % 7 == 0))
        .count();
    let released_once = s
        .ids
        .iter()
        .filter(|id| id.parse::<u64>().is_ok_and(|n| n % 5 == 0 && n % 7 != 0))
        .count();
    let discarded = status_counter(&status, "emits_discarded");
    report(&format!(
        "outputs {}: emits discarded {discarded} (rejected {rejected} + released once {released_once})",
        s.name
    ));
    assert_eq!(
        discarded,
        (rejected + released_once) as u64,
        "every emit of a rejected or released record was discarded and counted: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_records_have_their_outputs_and_no_emit_of_a_released_or_rejected_one_is_produced()
{
    accepted_records_have_their_outputs_and_no_emit_of_a_released_or_rejected_one_is_produced_in(
        false,
    )
    .await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_records_have_their_outputs_and_no_emit_of_a_released_or_rejected_one_is_produced_exactly_once()
 {
    accepted_records_have_their_outputs_and_no_emit_of_a_released_or_rejected_one_is_produced_in(
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_stream_and_restarted_loses_no_output_of_an_accepted_record() {
    // A 2 s lock: what the killed host held comes back quickly.
    let s = Scenario::new("outputs-sigkill", 2000, 2000, true).await;
    let manifest = s.manifest(r#"pause-ms = "100""#);
    let m = manifest.clone();
    let first = blocking(move || {
        let host = HostProcess::start(sharehost_bin!(), &m, "first");
        // The 5th call is in its 100 ms pause when the kill lands: emitted, not yet produced.
        host.wait_for("five plugin calls begun", |s| s.calls >= 5);
        host.kill()
    })
    .await;
    assert!(
        first.judged() < s.ids.len(),
        "killed mid-stream ({} judged)",
        first.judged()
    );
    let watch = Watch::default();
    let second = Arc::new(
        blocking(move || HostProcess::start_watched(sharehost_bin!(), &manifest, "second", &watch))
            .await,
    );
    let (h, n, first_seen) = (second.clone(), s.ids.len(), first.clone());
    blocking(move || {
        h.wait_for("every id judged across both runs", |seen| {
            let mut all = first_seen.distinct();
            all.extend(seen.distinct());
            all.len() >= n
        })
    })
    .await;
    let second = Arc::try_unwrap(second).ok().expect("sole owner");
    let (_, second_seen) = blocking(move || second.stop()).await;
    let ledger = s.ledger(&[first.clone(), second_seen.clone()]).await;
    // Accepted: what the second host accepted plus what the first accepted and the broker
    // took (its verdicts may have died with it; the record then came back to the second).
    let accepted = accepted(&[&first, &second_seen]);
    let outputs = s.check_outputs(&ledger, &accepted).await;
    report(&format!(
        "outputs {}: duplicates after the kill {} (at-least-once: a record emitted and produced, whose Accept died with the host, is emitted again)",
        s.name, outputs.duplicates
    ));
}

/// The pipeline-level number `key` of the host's `GET /pipelines` (its one pipeline).
fn pipeline_number(status: &serde_json::Value, key: &str) -> u64 {
    status[0][key].as_u64().unwrap_or(0)
}

/// [`reaches`] for a pipeline-level number.
fn pipeline_reaches(host: &HostProcess, key: &str, at_least: u64) -> serde_json::Value {
    reaches(host, pipeline_number, key, at_least)
}

/// Keeps a fault in place for `outage` (a fault's duration, not a wait for an event): checks
/// every second that the host shows writes waiting and itself not running normally (degraded,
/// or joining if a busy machine also delays a heartbeat), and returns how many of its writes
/// had failed by the end.
fn hold_outage(host: &HostProcess, outage: Duration) -> u64 {
    let started = Instant::now();
    loop {
        let status = host.status();
        assert!(
            pipeline_number(&status, "writes_waiting") > 0 && status[0]["state"] != "running",
            "the pipeline shows its writes waiting, and itself degraded: {status}"
        );
        if started.elapsed() >= outage {
            return pipeline_number(&status, "write_failures");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// How many ids of `ids` the ledger plugin accepts (all but the multiples of 7).
fn to_accept(ids: &[String]) -> u64 {
    ids.iter()
        .filter(|id| id.parse::<u64>().is_ok_and(|n| n % 7 != 0))
        .count() as u64
}

async fn an_output_topic_missing_at_start_is_waited_for_before_anything_is_acquired_in(
    exactly_once: bool,
) {
    // No output topic yet: the pipeline says so (failed, naming the manifest key, not ready)
    // and acquires nothing until the topic exists; then every record ends accepted with its
    // output on its first delivery.
    let name = if exactly_once {
        "outputs-missing-topic-eo"
    } else {
        "outputs-missing-topic"
    };
    let s = Scenario::new(name, 300, 30_000, false)
        .await
        .guarantee(exactly_once);
    let manifest = s.manifest("");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let (status, ready) = blocking(move || {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let status = h.status();
            if status[0]["last_error"].is_string() {
                return (status, h.http("GET", "/readyz", ""));
            }
            assert!(Instant::now() < deadline, "never reported: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await;
    let error = status[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("pipeline.outputs.valid") && error.contains(&s.output),
        "the pipeline names the missing output topic: {status}"
    );
    assert_eq!(status_counter(&status, "accepted"), 0, "{status}");
    assert_eq!(
        pipeline_number(&status, "acquired"),
        0,
        "nothing acquired: {status}"
    );
    assert_eq!(ready.0, 503, "not ready meanwhile: {ready:?}");
    s.client
        .create_topic(&s.output, OUTPUT_PARTITIONS, 1, &[])
        .await
        .expect("create the output topic");
    let want = to_accept(&s.ids);
    let h = host.clone();
    let status = blocking(move || status_reaches(&h, "accepted", want)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    let ledger = s.ledger(std::slice::from_ref(&seen)).await;
    let outputs = s.check_outputs(&ledger, &accepted(&[&seen])).await;
    let redelivered = outputs.redelivered();
    report(&format!(
        "outputs {}: waited for its output topic, then sources redelivered {redelivered}, released unwritten {}",
        s.name,
        pipeline_number(&status, "released_unwritten"),
    ));
    assert_eq!(
        redelivered, 0,
        "nothing was acquired before it could be written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_topic_missing_at_start_is_waited_for_before_anything_is_acquired() {
    an_output_topic_missing_at_start_is_waited_for_before_anything_is_acquired_in(false).await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_topic_missing_at_start_is_waited_for_before_anything_is_acquired_exactly_once() {
    an_output_topic_missing_at_start_is_waited_for_before_anything_is_acquired_in(true).await;
}

async fn an_output_topic_deleted_for_40_s_mid_stream_loses_nothing_and_spends_no_delivery_in(
    exactly_once: bool,
) {
    // No dead-letter topic (the splitter example's own setup), a 10 s lock that the engine
    // renews while the writes wait. A host that released its sources at every failed write
    // spent their five deliveries within seconds, and the broker archived them.
    let name = if exactly_once {
        "outputs-deleted-eo"
    } else {
        "outputs-deleted"
    };
    let s = Scenario::new(name, 700, 10_000, true)
        .await
        .guarantee(exactly_once);
    let manifest = s.manifest_with("", "");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let (h, first) = (host.clone(), to_accept(&s.ids));
    blocking(move || status_reaches(&h, "accepted", first)).await;
    // What was written before the topic goes; the host writes nothing more until new ids come.
    let earlier = s.outputs().await;
    s.client
        .delete_topic(&s.output)
        .await
        .expect("delete the output topic");
    let mut ids = s.ids.clone();
    ids.extend(produce_ids(&s.client, &s.topic, PARTITIONS, 700..1400).await);
    let h = host.clone();
    blocking(move || pipeline_reaches(&h, "writes_waiting", 1)).await;
    let h = host.clone();
    let failures = blocking(move || hold_outage(&h, Duration::from_secs(40))).await;
    s.client
        .create_topic(&s.output, OUTPUT_PARTITIONS, 1, &[])
        .await
        .expect("create the output topic again");
    let (h, all) = (host.clone(), to_accept(&ids));
    let status = blocking(move || status_reaches(&h, "accepted", all)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    let s = Scenario { ids, ..s };
    let ledger = s.ledger(std::slice::from_ref(&seen)).await;
    let outputs = s
        .check_outputs_with(&ledger, &accepted(&[&seen]), earlier)
        .await;
    let redelivered = outputs.redelivered();
    report(&format!(
        "outputs {}: output topic gone 40 s, failed produce requests {failures}, sources redelivered {redelivered}, released unwritten {}",
        s.name,
        pipeline_number(&status, "released_unwritten"),
    ));
    assert!(failures > 1, "the writes were retried during the outage");
    assert_eq!(
        redelivered, 0,
        "a failed write spends no delivery of its source"
    );
    assert_eq!(outputs.duplicates, 0, "no crash, no duplicate output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_topic_deleted_for_40_s_mid_stream_loses_nothing_and_spends_no_delivery() {
    an_output_topic_deleted_for_40_s_mid_stream_loses_nothing_and_spends_no_delivery_in(false)
        .await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_topic_deleted_for_40_s_mid_stream_loses_nothing_and_spends_no_delivery_exactly_once()
 {
    an_output_topic_deleted_for_40_s_mid_stream_loses_nothing_and_spends_no_delivery_in(true).await;
}

async fn a_dead_letter_topic_unwritable_for_60_s_dead_letters_every_reject_with_its_reason_in(
    exactly_once: bool,
) {
    // The dead-letter topic refuses every record (max.message.bytes 1) for 60 s; accepted
    // records flow on meanwhile, the rejected ones stay acquired until their dead letters land.
    let name = if exactly_once {
        "dlq-unwritable-eo"
    } else {
        "dlq-unwritable"
    };
    let s = Scenario::new(name, 700, 10_000, true)
        .await
        .guarantee(exactly_once);
    s.client
        .alter_topic_configs(&s.dlq, &[("max.message.bytes", Some("1"))])
        .await
        .expect("make the dead-letter topic refuse every record");
    let manifest = s.manifest("");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let (h, accepts) = (host.clone(), to_accept(&s.ids));
    blocking(move || {
        pipeline_reaches(&h, "writes_waiting", 1);
        // Nobody starved: the accepted records end while the dead letters wait.
        status_reaches(&h, "accepted", accepts)
    })
    .await;
    let h = host.clone();
    let failures = blocking(move || hold_outage(&h, Duration::from_secs(60))).await;
    s.client
        .alter_topic_configs(&s.dlq, &[("max.message.bytes", None)])
        .await
        .expect("let the dead-letter topic take records again");
    let rejects = s.ids.len() as u64 - accepts;
    let h = host.clone();
    let status = blocking(move || pipeline_reaches(&h, "dead_lettered", rejects)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    let ledger = s.ledger(std::slice::from_ref(&seen)).await;
    let letters = s.dead_letters().await;
    let text =
        |d: &DeadLetter| String::from_utf8_lossy(d.value().map_or(&[][..], |v| v)).into_owned();
    let ids: HashSet<String> = letters.iter().map(text).collect();
    let rejected: HashSet<String> = seen.rejected.iter().cloned().collect();
    report(&format!(
        "outputs {}: dead-letter topic unwritable 60 s, failed produce requests {failures}, rejected {}, dead letters {}, lost {}",
        s.name,
        rejected.len(),
        letters.len(),
        ledger.lost().len()
    ));
    assert_eq!(ids, rejected, "every reject has its dead letter");
    assert_eq!(letters.len(), rejected.len(), "and only one");
    for d in &letters {
        assert_eq!(d.reason, format!("ledger: {} is divisible by 7", text(d)));
        assert_eq!(d.delivery_count, Some(1), "no delivery spent: {d:?}");
    }
    assert_eq!(pipeline_number(&status, "dead_letters_shrunk"), 0);
    assert_eq!(pipeline_number(&status, "released_unwritten"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_unwritable_for_60_s_dead_letters_every_reject_with_its_reason() {
    a_dead_letter_topic_unwritable_for_60_s_dead_letters_every_reject_with_its_reason_in(false)
        .await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_unwritable_for_60_s_dead_letters_every_reject_with_its_reason_exactly_once()
 {
    a_dead_letter_topic_unwritable_for_60_s_dead_letters_every_reject_with_its_reason_in(true)
        .await;
}

async fn a_retried_record_comes_back_with_the_next_delivery_count_and_only_its_last_emit_in(
    exactly_once: bool,
) {
    let name = if exactly_once {
        "outputs-retry-eo"
    } else {
        "outputs-retry"
    };
    let s = Scenario::new(name, 400, 30_000, true)
        .await
        .guarantee(exactly_once);
    let manifest = s.manifest(r#"retry-first-every = "4", retry-ms = "1500""#);
    let (status, seen) = s.run_until_judged(manifest).await;
    let ledger = s.ledger(std::slice::from_ref(&seen)).await;
    let outputs = s.check_outputs(&ledger, &accepted(&[&seen])).await;
    assert_eq!(outputs.duplicates, 0);
    let retried: Vec<&String> = outputs
        .by_id
        .keys()
        .filter(|id| id.parse::<u64>().is_ok_and(|n| n % 4 == 0))
        .collect();
    assert!(!retried.is_empty());
    for id in retried {
        assert_eq!(
            outputs.by_id[id][0].delivery_count, 2,
            "{id} was retried once and came back on its second delivery"
        );
    }
    let want = s
        .ids
        .iter()
        .filter(|id| id.parse::<u64>().is_ok_and(|n| n % 4 == 0 && n % 7 != 0))
        .count() as u64;
    assert_eq!(status_counter(&status, "retried"), want, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_record_comes_back_with_the_next_delivery_count_and_only_its_last_emit() {
    a_retried_record_comes_back_with_the_next_delivery_count_and_only_its_last_emit_in(false).await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_record_comes_back_with_the_next_delivery_count_and_only_its_last_emit_exactly_once()
 {
    a_retried_record_comes_back_with_the_next_delivery_count_and_only_its_last_emit_in(true).await;
}

/// A scenario of plain text values (not ids) and a manifest running `component` on them with
/// `extra` pipeline lines (and a dead-letter topic).
async fn text_scenario(name: &'static str, values: &[&str]) -> Scenario {
    let values: Vec<Bytes> = values
        .iter()
        .map(|v| Bytes::from((*v).to_owned()))
        .collect();
    bytes_scenario(name, &values).await
}

/// A scenario of one partition holding `values` (any bytes), with a dead-letter topic of
/// one partition; its ids are the values' positions.
async fn bytes_scenario(name: &'static str, values: &[Bytes]) -> Scenario {
    let client = Arc::new(client().await);
    let (topic, dlq) = topic_with_dead_letters(&client, name, 1, 1).await;
    // In produce requests of at most 512 KiB, like the host's own writes.
    for chunk in values.chunks(16) {
        let records: Vec<sharehost::kafka::ProduceRecord> = chunk
            .iter()
            .map(|v| sharehost::kafka::ProduceRecord {
                value: Some(v.clone()),
                ..Default::default()
            })
            .collect();
        client
            .produce(&topic, 0, &records, sharehost::kafka::Compression::None)
            .await
            .expect("produce");
    }
    let group = fresh_group_with(&client, Some(30_000), &[]).await;
    let dir = std::env::temp_dir().join(unique("sharehost-outputs"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Scenario {
        name,
        exactly_once: false,
        client,
        output: format!("{topic}-out"),
        topic,
        dlq,
        group,
        dir,
        ids: (0..values.len()).map(|i| i.to_string()).collect(),
    }
}

impl Scenario {
    /// One pipeline running `component` (no plugin configuration) with a dead-letter topic
    /// and `extra` pipeline lines.
    fn text_manifest(&self, component: &Path, extra: &str) -> PathBuf {
        let text = ledger_manifest(
            &bootstrap(),
            &self.topic,
            &self.group,
            component,
            "",
            &format!(
                "dead_letter_topic = \"{}\"\n{}{extra}",
                self.dlq,
                self.guarantee_line()
            ),
        );
        let path = self.dir.join(format!("{}.toml", unique("manifest")));
        std::fs::write(&path, text).expect("write manifest");
        path
    }

    /// Every dead letter of the scenario's dead-letter topic (one partition), as the host's
    /// own reader (`sharehost dlq`) sees it.
    async fn dead_letters(&self) -> Vec<DeadLetter> {
        committed_records(&self.client, &self.dlq, 1)
            .await
            .into_iter()
            .map(|(p, r)| DeadLetter::from_record(p, r))
            .collect()
    }

    /// The dead-letter topic's `sharehost.reason` headers, in order.
    async fn dead_letter_reasons(&self) -> Vec<String> {
        committed_records(&self.client, &self.dlq, 1)
            .await
            .into_iter()
            .map(|(_, r)| {
                r.headers
                    .iter()
                    .find(|h| h.key == "sharehost.reason")
                    .and_then(|h| h.value.as_deref())
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default()
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_0_1_plugin_runs_in_the_host_exactly_as_before() {
    let s = text_scenario(
        "contract-v01",
        &[
            "accept",
            "reject:too big",
            "accept",
            "reject:no sku",
            "other",
        ],
    )
    .await;
    let manifest = s.text_manifest(&guest("fixture_contract_v01"), "");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let status = blocking(move || status_reaches(&h, "rejected", 2)).await;
    let h = host.clone();
    let status_accepted = blocking(move || status_reaches(&h, "accepted", 3)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    blocking(move || host.stop()).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    assert_eq!(status_counter(&status_accepted, "accepted"), 3, "{status}");
    assert_eq!(s.dead_letter_reasons().await, ["too big", "no sku"]);
    report(&format!(
        "outputs {}: produced {}, accepted 3, rejected 2 (dead-lettered with their reasons), lost 0",
        s.name,
        s.ids.len()
    ));
}

async fn a_secret_reaches_the_plugin_but_never_the_log_the_status_or_a_dead_letter_in(
    exactly_once: bool,
) {
    const VALUE: &str = "s3cr3t-t0ken-value";
    let name = if exactly_once {
        "secrets-eo"
    } else {
        "secrets"
    };
    let s = text_scenario(name, &["secret:api-token", "fine"])
        .await
        .guarantee(exactly_once);
    let file = s.dir.join("token");
    std::fs::write(&file, format!("{VALUE}\n")).expect("write the secret file");
    let manifest = s.text_manifest(
        &guest("fixture_actor"),
        &format!(
            "[pipeline.secrets]\napi-token = {{ file = \"{}\" }}\n",
            file.display()
        ),
    );
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let status = blocking(move || {
        status_reaches(&h, "rejected", 1);
        status_reaches(&h, "accepted", 1)
    })
    .await;
    let text = status.to_string();
    assert!(
        !text.contains(VALUE),
        "GET /pipelines shows no secret value: {text}"
    );
    assert_eq!(
        status[0]["grants"]["secrets"],
        serde_json::json!(["api-token"])
    );
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, _, log) = blocking(move || host.stop_with_log()).await;
    assert!(
        log.iter()
            .any(|l| l.contains("the secret is [secret api-token]")),
        "the plugin logged the secret, and the host log shows its name instead"
    );
    let leaked: Vec<&String> = log.iter().filter(|l| l.contains(VALUE)).collect();
    assert!(
        leaked.is_empty(),
        "secret value in the host log: {leaked:?}"
    );
    // The plugin had the value (it rejected with it as the reason); the dead letter has not.
    assert_eq!(
        s.dead_letter_reasons().await,
        ["leaking [secret api-token]"]
    );
    report(&format!(
        "outputs {}: secret handed to init, redacted in log, status and dead letter",
        s.name
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_the_plugin_but_never_the_log_the_status_or_a_dead_letter() {
    a_secret_reaches_the_plugin_but_never_the_log_the_status_or_a_dead_letter_in(false).await;
}

/// The same in an exactly-once pipeline: its dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_the_plugin_but_never_the_log_the_status_or_a_dead_letter_exactly_once() {
    a_secret_reaches_the_plugin_but_never_the_log_the_status_or_a_dead_letter_in(true).await;
}

/// What a loopback test server saw of one path: the `x-delivery-count` the http-fetch fixture
/// sends, and when.
type Hits = Arc<std::sync::Mutex<BTreeMap<String, Vec<(u16, Instant)>>>>;

/// A loopback HTTP server that answers 429 to the first request for each path and 200 to the
/// others, and records every request.
async fn retry_server() -> (String, Hits) {
    use axum::extract::{Path as UrlPath, State};
    use axum::http::{HeaderMap, StatusCode};
    let hits: Hits = Arc::default();
    let app = axum::Router::new()
        .route(
            "/item/{n}",
            axum::routing::get(
                |State(hits): State<Hits>, UrlPath(n): UrlPath<String>, headers: HeaderMap| async move {
                    let count = headers
                        .get("x-delivery-count")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(0);
                    let mut hits = hits.lock().unwrap_or_else(|p| p.into_inner());
                    let seen = hits.entry(n).or_default();
                    seen.push((count, Instant::now()));
                    if seen.len() == 1 {
                        StatusCode::TOO_MANY_REQUESTS
                    } else {
                        StatusCode::OK
                    }
                },
            ),
        )
        .with_state(hits.clone());
    let addr = serve_on_loopback(app).await;
    (format!("http://{addr}"), hits)
}

async fn a_server_answering_429_gets_retry_and_the_record_comes_back_after_the_delay_in(
    exactly_once: bool,
) {
    let (listed, hits) = retry_server().await;
    // A second server, not on the allow-list: the host must never reach it.
    let (unlisted, unlisted_hits) = retry_server().await;
    let mut values: Vec<String> = (0..20).map(|i| format!("{listed}/item/{i}")).collect();
    values.extend((0..3).map(|i| format!("{unlisted}/item/{i}")));
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let name = if exactly_once {
        "http-retry-eo"
    } else {
        "http-retry"
    };
    let s = text_scenario(name, &refs).await.guarantee(exactly_once);
    let manifest = s.text_manifest(
        &guest("fixture_http_fetch"),
        &format!("allowed_outbound_hosts = [\"{listed}\"]\nwall_deadline_ms = 10000\n"),
    );
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let status = blocking(move || {
        status_reaches(&h, "rejected", 3);
        status_reaches(&h, "accepted", 20)
    })
    .await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    blocking(move || host.stop()).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    assert_eq!(status_counter(&status, "retried"), 20, "{status}");
    let hits = hits.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(hits.len(), 20);
    let mut shortest = Duration::MAX;
    for (path, seen) in &hits {
        let counts: Vec<u16> = seen.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            counts,
            [1, 2],
            "{path}: 429 on the first delivery, back on the second"
        );
        let waited = seen[1].1.duration_since(seen[0].1);
        shortest = shortest.min(waited);
        assert!(
            waited >= Duration::from_millis(1000),
            "{path}: came back after {waited:?}, before its 1000 ms retry delay"
        );
    }
    assert!(
        unlisted_hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty(),
        "a host outside the allow-list never sees a request"
    );
    assert_eq!(
        s.dead_letter_reasons().await,
        vec!["ErrorCode::HttpRequestDenied"; 3],
        "the plugin saw the refusal as an error value"
    );
    report(&format!(
        "outputs {}: 20 records answered 429, retried (1000 ms) and accepted on delivery 2 (shortest wait {shortest:?}); 3 requests outside the allow-list refused in the host, server saw 0",
        s.name
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_429_gets_retry_and_the_record_comes_back_after_the_delay() {
    a_server_answering_429_gets_retry_and_the_record_comes_back_after_the_delay_in(false).await;
}

/// The same in an exactly-once pipeline: a retried record is looked up in the settled log on
/// its second delivery, not found, and judged; its dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_429_gets_retry_and_the_record_comes_back_after_the_delay_exactly_once()
{
    a_server_answering_429_gets_retry_and_the_record_comes_back_after_the_delay_in(true).await;
}

async fn a_retry_delay_over_the_manifests_maximum_is_cut_to_it_in(exactly_once: bool) {
    let name = if exactly_once {
        "outputs-retry-cap-eo"
    } else {
        "outputs-retry-cap"
    };
    let s = Scenario::new(name, 60, 30_000, true)
        .await
        .guarantee(exactly_once);
    // Every id asks for a ten-minute delay on its first delivery; the manifest allows 500 ms.
    let manifest = s.manifest_with(
        r#"retry-first-every = "1", retry-ms = "600000""#,
        "max_retry_delay_ms = 500\n",
    );
    // Without the cap nothing would come back for ten minutes, and this wait would give up.
    let (_, seen) = s.run_until_judged(manifest).await;
    let ledger = s.ledger(std::slice::from_ref(&seen)).await;
    let outputs = s.check_outputs(&ledger, &accepted(&[&seen])).await;
    assert!(
        outputs.by_id.values().all(|o| o[0].delivery_count == 2),
        "every id came back once, on its second delivery"
    );
    assert_eq!(outputs.duplicates, 0, "no crash, no duplicate output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_delay_over_the_manifests_maximum_is_cut_to_it() {
    a_retry_delay_over_the_manifests_maximum_is_cut_to_it_in(false).await;
}

/// The same in an exactly-once pipeline: its outputs read `read_committed`, each id's once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_delay_over_the_manifests_maximum_is_cut_to_it_exactly_once() {
    a_retry_delay_over_the_manifests_maximum_is_cut_to_it_in(true).await;
}

/// `n` values of `bytes` bytes each that neither compress nor parse as an id: `N:` then bytes
/// of a xorshift stream (the ledger plugin rejects them as "not a decimal id").
fn incompressible_values(n: usize, bytes: usize) -> Vec<Bytes> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|i| {
            let mut v = format!("{i}:").into_bytes();
            while v.len() < bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.truncate(bytes);
            Bytes::from(v)
        })
        .collect()
}

async fn a_hundred_rejects_of_20_kb_are_all_dead_lettered_with_their_reason_in(exactly_once: bool) {
    // 2 MB of dead letters from one batch: over the broker's 1 MiB limit as one request.
    let values = incompressible_values(100, 20 << 10);
    let name = if exactly_once {
        "dlq-20kb-eo"
    } else {
        "dlq-20kb"
    };
    let s = bytes_scenario(name, &values).await.guarantee(exactly_once);
    let manifest = s.text_manifest(&guest("fixture_ledger"), "batch_size = 100\n");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let status = blocking(move || pipeline_reaches(&h, "dead_lettered", 100)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    blocking(move || host.stop()).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let letters = s.dead_letters().await;
    let written: HashSet<&[u8]> = letters
        .iter()
        .filter_map(|d| d.value().map(|v| &v[..]))
        .collect();
    let produced: HashSet<&[u8]> = values.iter().map(|v| &v[..]).collect();
    report(&format!(
        "outputs {}: 100 rejects of 20 KiB, dead letters {}, whole {}, failed produce requests {}",
        s.name,
        letters.len(),
        written.len(),
        pipeline_number(&status, "write_failures")
    ));
    assert_eq!(letters.len(), 100, "one dead letter per reject");
    assert_eq!(written, produced, "each with its value");
    for d in &letters {
        assert_eq!(d.reason, "ledger: value is not a decimal id", "{d:?}");
        assert_eq!(d.delivery_count, Some(1), "on its first delivery: {d:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_rejects_of_20_kb_are_all_dead_lettered_with_their_reason() {
    a_hundred_rejects_of_20_kb_are_all_dead_lettered_with_their_reason_in(false).await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_rejects_of_20_kb_are_all_dead_lettered_with_their_reason_exactly_once() {
    a_hundred_rejects_of_20_kb_are_all_dead_lettered_with_their_reason_in(true).await;
}

async fn a_reject_larger_than_the_dead_letter_topic_accepts_is_dead_lettered_without_its_value_in(
    exactly_once: bool,
) {
    let values = vec![
        Bytes::from_static(b"small"),
        incompressible_values(1, 20 << 10).remove(0),
    ];
    let name = if exactly_once {
        "dlq-too-large-eo"
    } else {
        "dlq-too-large"
    };
    let s = bytes_scenario(name, &values).await.guarantee(exactly_once);
    s.client
        .alter_topic_configs(&s.dlq, &[("max.message.bytes", Some("8192"))])
        .await
        .expect("limit the dead-letter topic's record size");
    let manifest = s.text_manifest(&guest("fixture_ledger"), "");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    let status = blocking(move || pipeline_reaches(&h, "dead_lettered", 2)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    blocking(move || host.stop()).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let letters = s.dead_letters().await;
    assert_eq!(letters.len(), 2, "{letters:?}");
    let whole: Vec<&DeadLetter> = letters.iter().filter(|d| d.value().is_some()).collect();
    let shrunk: Vec<&DeadLetter> = letters.iter().filter(|d| d.value().is_none()).collect();
    assert_eq!(whole.len(), 1, "the small reject is dead-lettered whole");
    assert_eq!(whole[0].value().map(|v| &v[..]), Some(&b"small"[..]));
    assert_eq!(shrunk.len(), 1, "the large one without its value");
    let d = shrunk[0];
    assert_eq!(d.reason, "ledger: value is not a decimal id");
    assert_eq!(d.original_offset, Some(1), "with its provenance: {d:?}");
    assert_eq!(
        d.header("sharehost.dropped-bytes").as_deref(),
        Some("20480"),
        "and the size of what was left out"
    );
    assert_eq!(pipeline_number(&status, "dead_letters_shrunk"), 1);
    report(&format!(
        "outputs {}: a 20 KiB reject against an 8 KiB dead-letter limit: dead-lettered without its value, with its reason and provenance",
        s.name
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_larger_than_the_dead_letter_topic_accepts_is_dead_lettered_without_its_value() {
    a_reject_larger_than_the_dead_letter_topic_accepts_is_dead_lettered_without_its_value_in(false)
        .await;
}

/// The same in an exactly-once pipeline: its outputs and dead letters read `read_committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_larger_than_the_dead_letter_topic_accepts_is_dead_lettered_without_its_value_exactly_once()
 {
    a_reject_larger_than_the_dead_letter_topic_accepts_is_dead_lettered_without_its_value_in(true)
        .await;
}

/// An output larger than its topic accepts rejects its record with the reason, and the other
/// records go on: in an at-least-once pipeline once the broker refused it, in an exactly-once
/// one before its transaction (a refused write there would fail every batch that joined it, on
/// every try, until the records reached their delivery cap).
async fn an_output_larger_than_its_topic_accepts_rejects_its_record_alone_in(exactly_once: bool) {
    let name = if exactly_once {
        "outputs-too-large-eo"
    } else {
        "outputs-too-large"
    };
    let s = Scenario::new(name, 350, 30_000, true)
        .await
        .guarantee(exactly_once);
    s.client
        .alter_topic_configs(&s.output, &[("max.message.bytes", Some("8192"))])
        .await
        .expect("limit the output topic's record size");
    // Ids divisible by 5 emit 20 KB that lz4 cannot shrink; multiples of 7 are rejected.
    let manifest = s.manifest(r#"pad-every = "5", pad-bytes = "20000""#);
    let (status, _seen) = s.run_until_judged(manifest).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let n = |id: &str| id.parse::<u64>().expect("id");
    let mut outputs: Vec<String> = s.outputs().await.into_iter().map(|o| o.id).collect();
    outputs.sort_by_key(|id| n(id));
    let mut letters: Vec<(String, String)> = s
        .dead_letters()
        .await
        .into_iter()
        .map(|d| {
            let id = String::from_utf8_lossy(d.value().map_or(&[][..], |v| v)).into_owned();
            (id, d.reason)
        })
        .collect();
    letters.sort_by_key(|(id, _)| n(id));
    let want_outputs: Vec<String> = s
        .ids
        .iter()
        .filter(|id| n(id) % 5 != 0 && n(id) % 7 != 0)
        .cloned()
        .collect();
    let want_letters: Vec<String> = s
        .ids
        .iter()
        .filter(|id| n(id) % 5 == 0 || n(id) % 7 == 0)
        .cloned()
        .collect();
    report(&format!(
        "outputs {}: {} ids, outputs {}, dead letters {} ({} for an output too large), failed produce requests or transactions {}",
        s.name,
        s.ids.len(),
        outputs.len(),
        letters.len(),
        letters
            .iter()
            .filter(|(_, r)| r.starts_with("output not writable"))
            .count(),
        pipeline_number(&status, "write_failures"),
    ));
    assert_eq!(outputs, want_outputs, "each output that fits, once");
    let ids: Vec<String> = letters.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids, want_letters, "one dead letter per rejected record");
    for (id, reason) in &letters {
        if n(id) % 7 == 0 {
            assert_eq!(reason, &format!("ledger: {id} is divisible by 7"));
        } else {
            let topic = format!("a record larger than topic {} accepts", s.output);
            assert!(
                reason.starts_with("output not writable: ") && reason.contains(&topic),
                "{id}: {reason}"
            );
        }
    }
    if exactly_once {
        assert_eq!(
            pipeline_number(&status, "write_failures"),
            0,
            "no transaction tried the output that cannot fit: {status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_larger_than_its_topic_accepts_rejects_its_record_alone() {
    an_output_larger_than_its_topic_accepts_rejects_its_record_alone_in(false).await;
}

/// The same in an exactly-once pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_larger_than_its_topic_accepts_rejects_its_record_alone_exactly_once() {
    an_output_larger_than_its_topic_accepts_rejects_its_record_alone_in(true).await;
}

/// The value of header `key` of `r` as text.
fn header_text(r: &sharehost::kafka::ConsumedRecord, key: &str) -> Option<String> {
    r.headers
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| h.value.as_ref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_kills_the_host_on_every_delivery_is_dead_lettered_by_the_broker() {
    // Record 0 takes the host down every time it is judged (the ledger waits, the test sends
    // SIGKILL: an out-of-memory kill, a crash in the runtime). The host never lives to see its
    // last delivery, so its own delivery cap cannot dead-letter it; at the group's delivery
    // limit (2) the broker archives it, into the broker dead-letter topic the host set up
    // (KIP-1191). The host's own rejects (ids divisible by 5) are dead-lettered once, with
    // their reasons, in the host's topic, and not a second time by the broker.
    let client = Arc::new(client().await);
    let (topic, dlq) = topic_with_dead_letters(&client, "outputs-doomed", 1, 1).await;
    let broker_dlq = format!("dlq.{topic}");
    client
        .create_topic(&broker_dlq, 1, 1, &[])
        .await
        .expect("create the broker dead-letter topic");
    let group = fresh_group_with(&client, None, &[("share.delivery.count.limit", "2")]).await;
    let ids = produce_ids(&client, &topic, 1, 0..20).await;
    let dir = std::env::temp_dir().join(unique("sharehost-doomed"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let manifest = dir.join("manifest.toml");
    let text = ledger_manifest(
        &bootstrap(),
        &topic,
        &group,
        &guest("fixture_ledger"),
        r#"crash-on = "0", reject-every = "5""#,
        &format!(
            "batch_size = 1\ndead_letter_topic = \"{dlq}\"\nbroker_dead_letter_topic = \"{broker_dlq}\"\n"
        ),
    );
    std::fs::write(&manifest, text).expect("write manifest");
    let mut kills = 0;
    let mut seen = Vec::new();
    // Every incarnation is killed once it reports the doomed record; the one that never
    // sees it (the broker archived it) judges the rest.
    let last = loop {
        assert!(kills <= 3, "record 0 came back after its delivery limit");
        let m = manifest.clone();
        let host =
            Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &m, "doomed")).await);
        let h = host.clone();
        let doomed = blocking(move || {
            let deadline = Instant::now() + PATIENCE;
            loop {
                if h.log_lines()
                    .iter()
                    .any(|l| l.contains("ledger crashing on=0"))
                {
                    return true;
                }
                if h.seen().distinct().len() >= 19 {
                    return false;
                }
                assert!(
                    Instant::now() < deadline,
                    "neither the doomed record nor the rest"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await;
        let host = Arc::try_unwrap(host).ok().expect("sole owner");
        if !doomed {
            break host;
        }
        seen.push(blocking(move || host.kill()).await);
        kills += 1;
    };
    let (_, at_end) = blocking(move || last.stop()).await;
    seen.push(at_end);
    assert_eq!(kills, 2, "killed at each of the record's two deliveries");
    // The broker writes its dead letter asynchronously: wait for it.
    let (c, t) = (client.clone(), broker_dlq.clone());
    let deadline = Instant::now() + PATIENCE;
    let broker_letters = loop {
        let letters = topic_records(&c, &t, 1).await;
        if !letters.is_empty() {
            break letters;
        }
        assert!(
            Instant::now() < deadline,
            "the broker never dead-lettered record 0"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let own: Vec<String> = topic_values(&client, &dlq, 1).await;
    let mut judged: HashSet<String> = HashSet::new();
    for s in &seen {
        judged.extend(s.distinct().into_iter().map(str::to_owned));
    }
    report(&format!(
        "outputs doomed: {} ids, host killed {kills} times by record 0, broker dead letters {}, host dead letters {}, judged {}",
        ids.len(),
        broker_letters.len(),
        own.len(),
        judged.len()
    ));
    assert_eq!(
        broker_letters.len(),
        1,
        "one broker dead letter, for record 0 alone"
    );
    let (_, letter) = &broker_letters[0];
    assert_eq!(letter.value.as_deref(), Some(&b"0"[..]), "its value copied");
    assert_eq!(
        header_text(letter, "__dlq.errors.offset").as_deref(),
        Some("0")
    );
    assert_eq!(
        header_text(letter, "__dlq.errors.delivery.count").as_deref(),
        Some("2")
    );
    assert_eq!(
        own.len(),
        3,
        "ids 5, 10, 15 dead-lettered by the host once: {own:?}"
    );
    assert_eq!(judged.len(), 19, "every id but the doomed one judged");
    wait_until_drained(&group);
}
