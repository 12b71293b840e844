//! `guarantee = "exactly-once"` against the faults that make an at-least-once pipeline write
//! twice: a host killed mid-batch and restarted (ten times), its connections cut, a broker
//! restart, a host paused past its locks while another takes its records, a host whose share
//! session the broker ended without the host seeing it (its connection cut on the broker's side
//! only), its transactional id taken by another producer twice mid-stream, and the settled log
//! refusing writes. (The transaction coordinator's node killed mid-commit is in
//! `tests/exactly_once_cluster.rs`, on the three-node cluster.)
//!
//! The ledger is kept outside the host: the ids produced, against the output topic and the
//! dead-letter topic read `read_committed` as a downstream consumer reads them (aborted
//! transactions' records are not there), and the broker must end with nothing left for the
//! group. Every id must be in exactly one of them exactly once: an accepted id's output, a
//! rejected id's dead letter. Each scenario prints `exactly-once NAME: ...` with what the plugin
//! judged more than once (allowed: a judging whose transaction never committed).
//!
//! Below them, the parts on their own against the broker: what a `read_committed` reader sees
//! of committed, aborted and open transactions, how a new holder of a transactional id fences
//! the old one, that the coordinator aborts a transaction past its timeout and refuses its
//! commit, and that a settled-log lookup answers only once every transaction that could hold a
//! record is decided.

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord, TransactionalProducer, TxnError};
use sharehost::pipeline::settled::{SettledIndex, settled_records};
use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig, ShareRecord};
use sharehost::share::ledger::AckKind;
use sharehost_tests::host::{HostProcess, Seen};
use sharehost_tests::ledger::{Written, check_exactly_once, report};
use sharehost_tests::proxy::Proxy;
use sharehost_tests::sharehost_bin;
use sharehost_tests::{
    blocking, bootstrap, client, committed_records, fresh_group_with, guest, harness,
    ledger_manifest, produce_ids, proxied_listener, topic_records, topic_with_dead_letters, unique,
    wait_until_drained,
};

const PARTITIONS: i32 = 3;

/// One scenario: a source topic of ids, its dead-letter and output topics, and a group.
struct Scenario {
    name: &'static str,
    client: Arc<KafkaClient>,
    topic: String,
    dlq: String,
    output: String,
    group: String,
    dir: PathBuf,
    ids: Vec<String>,
    partitions: i32,
}

impl Scenario {
    /// `records` ids on three partitions and a group with a `lock_ms` record lock and a 6 s
    /// member session.
    async fn new(name: &'static str, records: u64, lock_ms: u32) -> Scenario {
        Scenario::with(name, records, lock_ms, PARTITIONS, 6000).await
    }

    /// [`Scenario::new`] on `partitions` partitions, with a `session_ms` member session.
    async fn with(
        name: &'static str,
        records: u64,
        lock_ms: u32,
        partitions: i32,
        session_ms: u32,
    ) -> Scenario {
        let client = Arc::new(client().await);
        let (topic, dlq) = topic_with_dead_letters(&client, name, partitions, 1).await;
        let output = format!("{topic}-out");
        client
            .create_topic(&output, partitions, 1, &[])
            .await
            .expect("create output topic");
        let session = session_ms.to_string();
        let group = fresh_group_with(
            &client,
            Some(lock_ms),
            &[("share.session.timeout.ms", session.as_str())],
        )
        .await;
        let ids = produce_ids(&client, &topic, partitions, 0..records).await;
        let dir = std::env::temp_dir().join(unique("sharehost-exactly-once"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scenario {
            name,
            client,
            topic,
            dlq,
            output,
            group,
            dir,
            ids,
            partitions,
        }
    }

    /// An exactly-once pipeline of the ledger plugin: every id emitted to the output, every
    /// 7th rejected and dead-lettered, each plugin call `pause_ms` long; `file` names the
    /// manifest (a host's state, its member id among it, lives beside it).
    fn manifest(&self, bootstrap: &str, pause_ms: u32, file: &str) -> PathBuf {
        self.manifest_with(
            bootstrap,
            &format!(r#"reject-every = "7", emit-to = "out", pause-ms = "{pause_ms}""#),
            "",
            file,
        )
    }

    /// [`Scenario::manifest`] with the ledger plugin configured by `plugin_config` and more
    /// pipeline settings.
    fn manifest_with(
        &self,
        bootstrap: &str,
        plugin_config: &str,
        settings: &str,
        file: &str,
    ) -> PathBuf {
        let text = ledger_manifest(
            bootstrap,
            &self.topic,
            &self.group,
            &guest("fixture_ledger"),
            plugin_config,
            &format!(
                "batch_size = 50\nmax_in_flight = 500\nconcurrency = 2\nguarantee = \"exactly-once\"\ndead_letter_topic = \"{}\"\noutputs = {{ out = \"{}\" }}\n{settings}",
                self.dlq, self.output
            ),
        );
        let dir = self.dir.join(file);
        std::fs::create_dir_all(&dir).expect("manifest dir");
        let path = dir.join("sharehost.toml");
        std::fs::write(&path, text).expect("write manifest");
        path
    }

    /// Starts host "other" on `manifest` and waits until it and a stopped host (which judged
    /// `before`) have judged every id between them.
    async fn take_over(&self, manifest: PathBuf, before: Seen) -> HostProcess {
        let n = self.ids.len();
        blocking(move || {
            let host = HostProcess::start(sharehost_bin!(), &manifest, "other");
            host.wait_for("every id judged by the two", |now| {
                let mut all = now.distinct();
                all.extend(before.distinct());
                all.len() >= n
            });
            host
        })
        .await
    }

    /// Waits until the broker has nothing left for the group, then the exactly-once ledger
    /// ([`check_exactly_once`]).
    async fn ledger(&self, seen: &[Seen]) {
        let group = self.group.clone();
        blocking(move || wait_until_drained(&group)).await;
        let written = Written {
            source: (&self.topic, self.partitions),
            output: (&self.output, self.partitions),
            dead_letters: (&self.dlq, 1),
        };
        let judged = seen.iter().map(Seen::judged).sum();
        check_exactly_once(self.name, &self.client, &self.ids, written, judged).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_ten_times_mid_batch_writes_each_output_once() {
    let s = Scenario::new("killed-ten-times", 3000, 3000).await;
    let manifest = s.manifest(&bootstrap(), 50, "host");
    let mut seen = Vec::new();
    for kill in 0..10 {
        let m = manifest.clone();
        let killed = blocking(move || {
            let host = HostProcess::start(sharehost_bin!(), &m, &format!("run-{kill}"));
            // In its fourth plugin call's pause: batches are judged, written and committed
            // beside it, so the kill lands among transactions at every stage.
            host.wait_for("four plugin calls begun", |s| s.calls >= 4);
            host.kill()
        })
        .await;
        seen.push(killed);
    }
    let (m, n, before) = (manifest.clone(), s.ids.len(), seen.clone());
    let last = blocking(move || {
        let host = HostProcess::start(sharehost_bin!(), &m, "last");
        host.wait_for("every id judged across the runs", |now| {
            let mut all = now.distinct();
            for b in &before {
                all.extend(b.distinct());
            }
            all.len() >= n
        });
        host
    })
    .await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let (_, last_seen) = blocking(move || last.stop()).await;
    seen.push(last_seen);
    s.ledger(&seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_write_each_output_once() {
    let s = Scenario::new("cut-connections", 3000, 30_000).await;
    let (listen, target) = proxied_listener();
    let proxy = Proxy::start(&listen, &target).await;
    let manifest = s.manifest(&listen, 20, "host");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let n = s.ids.len();
    let mut cut = 0;
    for part in [4, 2] {
        let h = host.clone();
        blocking(move || h.wait_for("records judged", |seen| seen.judged() >= n / part)).await;
        cut += proxy.cut_all();
    }
    let h = host.clone();
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    s.ledger(&[seen]).await;
    assert!(cut >= 2, "connections were open when cut ({cut})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_paused_past_its_locks_never_commits_what_another_took() {
    // A 6 s lock and plugin calls of 1.5 s: a batch commits well within its lock, and a host
    // stopped in a call stays stopped far past it.
    let s = Scenario::new("paused-host", 600, 6000).await;
    let first = s.manifest(&bootstrap(), 1500, "first");
    let second = s.manifest(&bootstrap(), 0, "second");
    let paused = blocking(move || {
        let host = HostProcess::start(sharehost_bin!(), &first, "paused");
        // Stopped in its third call's pause, holding that batch (and the next) under lock.
        host.wait_for("three plugin calls begun", |s| s.calls >= 3);
        signal(host.pid(), "-STOP");
        host
    })
    .await;
    // Everything, the paused host's batches among it once their locks ran out.
    let other = s.take_over(second, paused.seen()).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    // The paused host resumes with a judged batch whose locks ran out long ago: it must abort.
    signal(paused.pid(), "-CONT");
    let log = blocking(move || {
        let line = paused.wait_for_log("did not commit");
        (line, paused)
    })
    .await;
    let (lines, paused) = log;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("a lock would run out")
                || l.contains("records go back to the broker")),
        "the resumed host gave its batch back: {lines:?}"
    );
    let (_, paused_seen) = blocking(move || paused.stop()).await;
    let (_, other_seen) = blocking(move || other.stop()).await;
    s.ledger(&[paused_seen, other_seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_session_the_broker_ended_unseen_never_commits_what_another_took() {
    // One partition, which both members are assigned; a 60 s lock and a 60 s member session
    // (the broker's largest): the stranded host stays a member and its own lock clock shows
    // time left all along, so only the broker can tell it that its records are gone.
    let s = Scenario::with("session-ended-unseen", 600, 60_000, 1, 60_000).await;
    let (listen, target) = proxied_listener();
    let proxy = Proxy::start(&listen, &target).await;
    let first = s.manifest(&listen, 1000, "stranded");
    let second = s.manifest(&bootstrap(), 0, "other");
    let stranded = blocking(move || {
        let host = HostProcess::start(sharehost_bin!(), &first, "stranded");
        // Stopped in its third call: that batch is judged but not written yet.
        host.wait_for("three plugin calls begun", |s| s.calls >= 3);
        signal(host.pid(), "-STOP");
        host
    })
    .await;
    // The broker ends the stopped host's share session and releases what it held; the host's
    // end of the connection stays open and silent.
    let stranded_sessions = proxy.strand_share_sessions();
    assert!(stranded_sessions >= 1, "a share session to strand");
    let other = s.take_over(second, stranded.seen()).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    // Resumed, the host writes its judged batch in a transaction and asks the broker to confirm
    // its records before the commit: no answer comes, the request times out and the session
    // ends for the host too; the batch must have been aborted by then.
    signal(stranded.pid(), "-CONT");
    let stranded = blocking(move || {
        stranded.wait_for_log("share session ended");
        stranded
    })
    .await;
    let (_, stranded_seen, lines) = blocking(move || stranded.stop_with_log()).await;
    let (_, other_seen) = blocking(move || other.stop()).await;
    let reason = lines
        .iter()
        .find(|l| l.contains("did not commit"))
        .cloned()
        .unwrap_or_default();
    report(&format!(
        "exactly-once session-ended-unseen: the resumed host's batch: {reason}"
    ));
    // The ledger first: a commit that should not have happened shows there as ids written twice.
    s.ledger(&[stranded_seen, other_seen]).await;
    // Aborted because the hold was not proven: the renewal unconfirmed, a lock about to run
    // out, or (a busy machine: the write over the stranded connection timed out first) the
    // locks no longer renewable in time.
    assert!(
        reason.contains("did not confirm")
            || reason.contains("lock would run out")
            || reason.contains("could not be renewed in time"),
        "the resumed host aborted its batch: {lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_writes_each_output_once() {
    // On a broker of its own (profile ci-broker-stops): the restart would disturb every other
    // test.
    let s = Scenario::new("broker-restart", 3000, 30_000).await;
    let manifest = s.manifest(&bootstrap(), 20, "host");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let (h, n) = (host.clone(), s.ids.len());
    blocking(move || h.restart_broker_mid_stream(n)).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen, lines) = blocking(move || host.stop_with_log()).await;
    // The repair of a confirmed commit whose markers the restart lost, when it happened.
    let recommitted = lines
        .iter()
        .filter(|l| l.contains("its partitions are committed again"))
        .count();
    report(&format!(
        "exactly-once {}: commits written again for a missing marker: {recommitted}",
        s.name
    ));
    s.ledger(&[seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_settled_before_their_leader_died_come_back_as_first_deliveries_and_are_not_written_again()
 {
    // On a broker of its own (profile ci-broker-stops): it kills and restarts it.
    let s = Scenario::with("first-delivery-again", 20, 30_000, 1, 6000).await;
    // Another member takes every record, and one transaction writes their outputs and settles
    // them, as a host's commit does; the broker dies before any acknowledgement reaches it.
    let member = ShareConsumer::start(
        s.client.clone(),
        ShareConsumerConfig::new(&s.group, &[&s.topic]),
    )
    .await
    .expect("join");
    let mut held: Vec<ShareRecord> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while held.len() < s.ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} records delivered",
            held.len(),
            s.ids.len()
        );
        if let Some(d) = member.poll(Duration::from_secs(1)).await.expect("poll") {
            held.extend(d.records);
        }
    }
    assert!(
        held.iter().all(|r| r.delivery_count == 1),
        "first deliveries"
    );
    let log = sharehost::pipeline::settled_topic(&s.group).expect("the settled log's name");
    s.client
        .create_topic(&log, 1, 1, &[("cleanup.policy", "delete")])
        .await
        .expect("create the settled log");
    let settles: Vec<(&str, i32, i64, AckKind)> = held
        .iter()
        .map(|r| (s.topic.as_str(), 0, r.record.offset, AckKind::Accept))
        .collect();
    let settled: Vec<ProduceRecord> = settled_records(&settles)
        .iter()
        .map(|r| r.produce())
        .collect();
    let outputs: Vec<ProduceRecord> = held
        .iter()
        .map(|r| ProduceRecord {
            value: r.record.value.clone(),
            ..Default::default()
        })
        .collect();
    let p = TransactionalProducer::new(s.client.clone(), &unique("tid"), Duration::from_secs(30));
    let mut txn = p.begin().await.expect("begin");
    txn.send(&s.output, 0, &outputs, Compression::Lz4)
        .await
        .expect("outputs");
    txn.send(&log, 0, &settled, Compression::Lz4)
        .await
        .expect("settled");
    txn.commit().await.expect("commit");
    // The broker persists no acquisition: the share partition it rebuilds after a SIGKILL
    // hands the records out again with delivery count 1, as if nobody had had them.
    blocking(|| harness("kill-broker")).await;
    drop(member);
    blocking(|| harness("start-broker")).await;
    // A host starting now gets them as first deliveries of a new stint below its mark: it looks
    // them up, finds the committed transaction, and neither judges nor writes them again.
    let manifest = s.manifest_with(&bootstrap(), r#"emit-to = "out""#, "", "host");
    let host = blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let (_, seen, lines) = blocking(move || host.stop_with_log()).await;
    assert_eq!(seen.judged(), 0, "no record was judged again: {seen:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("were settled by a committed transaction")),
        "the host found them in the settled log"
    );
    s.ledger(&[seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_fenced_mid_stream_writes_each_output_once() {
    let s = Scenario::new("fenced", 3000, 30_000).await;
    let manifest = s.manifest(&bootstrap(), 20, "host");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    // The pipeline's transactional id, from its member id as the host logs it.
    let h = host.clone();
    let member = blocking(move || h.member_id()).await;
    let id = format!("sharehost.{}.{member}", s.group);
    let n = s.ids.len();
    for part in [4, 2] {
        let h = host.clone();
        blocking(move || h.wait_for("records judged", |seen| seen.judged() >= n / part)).await;
        // Another producer takes the id: the coordinator aborts the host's open transaction and
        // refuses its epoch from now on; this one leaves a transaction of its own open, which
        // the host's next InitProducerId aborts.
        let thief = TransactionalProducer::new(s.client.clone(), &id, Duration::from_secs(30));
        let mut txn = thief.begin().await.expect("take the transactional id");
        // The host may take the id back first (its next InitProducerId fences this one): then
        // the write is refused, and the fence has happened all the same.
        match txn
            .send(
                &s.output,
                0,
                &plain_records(&["not-an-id"]),
                Compression::None,
            )
            .await
        {
            Ok(()) | Err(TxnError::Fenced { .. }) => {}
            Err(e) => panic!("a write of the thief's: {e}"),
        }
        drop(txn); // left open
    }
    let h = host.clone();
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen, lines) = blocking(move || host.stop_with_log()).await;
    let fenced = lines.iter().filter(|l| l.contains("fenced")).count();
    report(&format!(
        "exactly-once fenced: the host's transactions refused as fenced: {fenced}"
    ));
    assert!(fenced > 0, "the host met the fence: {lines:#?}");
    s.ledger(&[seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_at_the_delivery_cap_are_dead_lettered_and_none_is_lost() {
    // Every plugin call traps: each record is released, comes back, and at its second delivery
    // (the cap) is dead-lettered by the host without a plugin call, through the plain write
    // path (at least once: the ledger allows such a dead letter twice, and counts it). The
    // connections are cut twice meanwhile.
    let s = Scenario::new("delivery-cap", 600, 30_000).await;
    let (listen, target) = proxied_listener();
    let proxy = Proxy::start(&listen, &target).await;
    let manifest = s.manifest_with(&listen, r#"trap-every = "1""#, "delivery_cap = 2\n", "host");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let group = s.group.clone();
    for traps in [1, 20] {
        let h = host.clone();
        blocking(move || {
            // Traps end a call before the plugin logs anything: count them in the host's log.
            let deadline = std::time::Instant::now() + sharehost_tests::host::PATIENCE;
            while h
                .log_lines()
                .iter()
                .filter(|l| l.contains("planned trap"))
                .count()
                < traps
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "fewer than {traps} planned traps"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await;
        proxy.cut_all();
    }
    blocking(move || wait_until_drained(&group)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    // Nothing judged: every id must be in the dead-letter topic, once.
    assert_eq!(seen.judged(), 0, "the plugin never returned a verdict");
    s.ledger(&[seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_log_that_refuses_writes_degrades_the_pipeline_and_loses_or_doubles_nothing() {
    // No record yet: they come once the settled log refuses writes, so every batch meets it.
    let mut s = Scenario::new("settled-unwritable", 0, 30_000).await;
    let manifest = s.manifest(&bootstrap(), 20, "host");
    let host =
        Arc::new(blocking(move || HostProcess::start(sharehost_bin!(), &manifest, "host")).await);
    let h = host.clone();
    blocking(move || h.wait_for_log("exactly-once: each batch's writes commit")).await;
    // The host made the settled log at its start; now it refuses every settled record: 120
    // bytes per batch, which a transaction marker (78 bytes) still fits and a settled record
    // never does. (A topic that refuses even a marker leaves Kafka's transaction coordinator
    // unable to end the transaction: the transactional id stays wedged until the broker
    // restarts.)
    let settled = sharehost::pipeline::settled_topic(&s.group).expect("a settled topic");
    s.client
        .alter_topic_configs(&settled, &[("max.message.bytes", Some("120"))])
        .await
        .expect("make the settled log refuse every record");
    s.ids = produce_ids(&s.client, &s.topic, s.partitions, 0..1000).await;
    let h = host.clone();
    let status = blocking(move || {
        let deadline = std::time::Instant::now() + sharehost_tests::host::PATIENCE;
        loop {
            // Polled: the status is the operator's view, and it has no push.
            let status = h.status();
            if status[0]["writes_waiting"].as_u64().unwrap_or(0) > 0 {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pipeline never showed its transactions waiting: {status}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    })
    .await;
    assert_eq!(status[0]["state"], "degraded", "{status}");
    s.client
        .alter_topic_configs(&settled, &[("max.message.bytes", None)])
        .await
        .expect("let the settled log take records again");
    let (h, n) = (host.clone(), s.ids.len());
    blocking(move || h.wait_for("every id judged", |seen| seen.distinct().len() >= n)).await;
    let group = s.group.clone();
    blocking(move || wait_until_drained(&group)).await;
    let host = Arc::try_unwrap(host).ok().expect("sole owner");
    let (_, seen) = blocking(move || host.stop()).await;
    s.ledger(&[seen]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_locks_are_too_short_or_a_settled_log_that_compacts_is_refused_by_name() {
    // Locks of 2 s: a batch commits only with more than 2 s left, so none ever would.
    let short = Scenario::new("locks-too-short", 10, 2000).await;
    // A settled log made beforehand with compaction, which would drop what a transaction settled.
    let compacted = Scenario::new("settled-compacted", 10, 30_000).await;
    let settled = sharehost::pipeline::settled_topic(&compacted.group).expect("a settled topic");
    compacted
        .client
        .create_topic(&settled, 1, 1, &[("cleanup.policy", "compact")])
        .await
        .expect("create a compacted settled log");
    for (s, says) in [
        (
            &short,
            "share.record.lock.duration.ms is 2000 ms; exactly-once needs at least 3000 ms",
        ),
        (&compacted, "has cleanup.policy Some(\"compact\")"),
    ] {
        let manifest = s.manifest(&bootstrap(), 0, "host");
        let (status, seen) = blocking(move || {
            let host = HostProcess::start(sharehost_bin!(), &manifest, "host");
            host.wait_for_log(says);
            let status = host.status();
            (status, host.stop().1)
        })
        .await;
        let error = status[0]["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains("guarantee = \"exactly-once\"") && error.contains(says),
            "{}: the pipeline names what is wrong: {status}",
            s.name
        );
        assert_eq!(status[0]["acquired"], 0, "nothing acquired: {status}");
        assert_eq!(seen.judged(), 0);
        report(&format!("exactly-once {}: refused: {error}", s.name));
    }
}

/// Sends `sig` (`-STOP`, `-CONT`) to a process with kill(1).
fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

fn plain_records(values: &[&str]) -> Vec<ProduceRecord> {
    values
        .iter()
        .map(|v| ProduceRecord {
            value: Some(Bytes::from(v.to_string())),
            ..Default::default()
        })
        .collect()
}

async fn read_values(client: &KafkaClient, topic: &str, committed: bool) -> Vec<String> {
    let rs = if committed {
        committed_records(client, topic, 2).await
    } else {
        topic_records(client, topic, 2).await
    };
    let mut v: Vec<String> = rs
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    v.sort();
    v
}

async fn two_partition_topic(client: &KafkaClient) -> String {
    let t = unique("txn");
    client.create_topic(&t, 2, 1, &[]).await.expect("create");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_is_read_whole_and_an_aborted_one_never() {
    let client = Arc::new(client().await);
    let t = two_partition_topic(&client).await;
    let p = TransactionalProducer::new(client.clone(), &unique("tid"), Duration::from_secs(30));
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 0, &plain_records(&["a0", "a1"]), Compression::Lz4)
        .await
        .expect("send");
    txn.send(&t, 1, &plain_records(&["a2"]), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 0, &plain_records(&["b0"]), Compression::Lz4)
        .await
        .expect("send");
    txn.send(&t, 1, &plain_records(&["b1"]), Compression::Lz4)
        .await
        .expect("send");
    txn.abort().await.expect("abort");
    // The next transaction of the same producer (a new epoch after the abort) commits.
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 1, &plain_records(&["c0"]), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    assert_eq!(
        read_values(&client, &t, true).await,
        ["a0", "a1", "a2", "c0"]
    );
    // The aborted records are in the log all the same: only a committed reader skips them.
    assert_eq!(
        read_values(&client, &t, false).await,
        ["a0", "a1", "a2", "b0", "b1", "c0"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_holder_of_the_id_fences_the_old_one_and_aborts_what_it_left_open() {
    let client = Arc::new(client().await);
    let t = two_partition_topic(&client).await;
    let id = unique("tid");
    let old = TransactionalProducer::new(client.clone(), &id, Duration::from_secs(30));
    let mut open = old.begin().await.expect("begin");
    open.send(&t, 0, &plain_records(&["left-open"]), Compression::Lz4)
        .await
        .expect("send");
    // A restarted host with the same id: its InitProducerId aborts the open transaction.
    let new = TransactionalProducer::new(client.clone(), &id, Duration::from_secs(30));
    let mut txn = new.begin().await.expect("begin");
    txn.send(&t, 1, &plain_records(&["new"]), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    match open.commit().await {
        Err(TxnError::Fenced { .. }) => {}
        other => panic!("the old producer's commit must be refused as fenced: {other:?}"),
    }
    assert_eq!(read_values(&client, &t, true).await, ["new"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_did_not_commit_is_ended_by_the_producer_in_each_of_its_partitions_before_it_writes_again()
 {
    let client = Arc::new(client().await);
    let t = two_partition_topic(&client).await;
    let p = TransactionalProducer::new(client.clone(), &unique("tid"), Duration::from_secs(30));
    let mut failed = p.begin().await.expect("begin");
    failed
        .send(&t, 0, &plain_records(&["failed"]), Compression::None)
        .await
        .expect("send");
    let producer = failed.identity().id;
    let at = failed.written_at(&t, 0).expect("where it landed");
    // Left without commit or abort, as a transaction a write failure ended.
    drop(failed);
    let mut next = p.begin().await.expect("begin");
    next.send(&t, 0, &plain_records(&["next"]), Compression::None)
        .await
        .expect("send");
    next.commit().await.expect("commit");
    // The coordinator's abort (the InitProducerId before the next transaction) ends what it
    // knew of the failed one; the producer's own ABORT follows it, so that a partition whose
    // records the coordinator did not know of is ended too, before anything is written there.
    let first = client
        .transaction_end(&t, 0, at, producer, at)
        .await
        .expect("read the partition")
        .0
        .expect("a marker after the failed transaction");
    let second = client
        .transaction_end(&t, 0, first.offset, producer, first.offset)
        .await
        .expect("read the partition")
        .0
        .expect("a marker after that");
    assert!(
        !first.commit && !second.commit,
        "the failed transaction is followed by two ABORT markers (the coordinator's and the producer's), then the next transaction's records: {first:?}, {second:?}"
    );
    assert_eq!(read_values(&client, &t, true).await, ["next"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_finds_what_committed_transactions_settled_and_waits_for_an_open_one() {
    let client = Arc::new(client().await);
    let source = unique("source");
    client
        .create_topic(&source, 1, 1, &[])
        .await
        .expect("create");
    let log = unique("settled");
    client.create_topic(&log, 1, 1, &[]).await.expect("create");
    let settled = |offset: i64, kind: AckKind| {
        settled_records(&[(source.as_str(), 0, offset, kind)])
            .iter()
            .map(|r| r.produce())
            .collect::<Vec<_>>()
    };
    let p = TransactionalProducer::new(client.clone(), &unique("tid"), Duration::from_secs(30));
    // Committed: offset 5 accepted. Aborted: offset 6. Open while the lookup runs: offset 7.
    let mut txn = p.begin().await.expect("begin");
    txn.send(&log, 0, &settled(5, AckKind::Accept), Compression::Lz4)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    let mut txn = p.begin().await.expect("begin");
    txn.send(&log, 0, &settled(6, AckKind::Accept), Compression::Lz4)
        .await
        .expect("send");
    txn.abort().await.expect("abort");
    let mut open = p.begin().await.expect("begin");
    open.send(&log, 0, &settled(7, AckKind::Reject), Compression::Lz4)
        .await
        .expect("send");
    let index = Arc::new(SettledIndex::new(
        &log,
        &unique("group"),
        std::slice::from_ref(&source),
        Duration::from_secs(60),
    ));
    let lookup = {
        let (index, client, source) = (index.clone(), client.clone(), source.clone());
        tokio::spawn(async move {
            index
                .lookup(
                    &client,
                    &[(&source, 0, 5), (&source, 0, 6), (&source, 0, 7)],
                )
                .await
        })
    };
    // The open transaction holds the last stable offset back: the lookup cannot answer for
    // offset 7 before it is decided, whichever way; committed, it is found.
    open.commit().await.expect("commit");
    let found = lookup.await.expect("join").expect("lookup");
    assert_eq!(
        found,
        vec![Some(AckKind::Accept), None, Some(AckKind::Reject)]
    );
    assert_eq!(index.verdicts_held().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_past_its_timeout_is_aborted_by_the_coordinator_and_its_commit_refused() {
    let client = Arc::new(client().await);
    let t = two_partition_topic(&client).await;
    let p = TransactionalProducer::new(client.clone(), &unique("tid"), Duration::from_secs(1));
    let mut txn = p.begin().await.expect("begin");
    txn.send(&t, 0, &plain_records(&["late"]), Compression::None)
        .await
        .expect("send");
    // A read_committed reader waits for the open transaction to be decided: the coordinator
    // aborts it once past its 1 s timeout (its check runs every 10 s by default).
    assert_eq!(read_values(&client, &t, true).await, Vec::<String>::new());
    match txn.commit().await {
        Err(TxnError::Fenced { .. }) => {}
        other => panic!("a commit after the coordinator aborted the transaction: {other:?}"),
    }
    // The producer starts again with a new epoch and commits.
    let mut txn = p.begin().await.expect("begin again");
    txn.send(&t, 1, &plain_records(&["again"]), Compression::None)
        .await
        .expect("send");
    txn.commit().await.expect("commit");
    assert_eq!(
        read_values(&client, &t, true).await,
        vec!["again".to_owned()]
    );
}
